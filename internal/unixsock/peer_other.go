//go:build !linux

package unixsock

import (
	"errors"
	"net"
)

// Peer needs Linux (SO_PEERCRED); elsewhere it always fails, so a peer
// check refuses everyone rather than no one.
func Peer(net.Conn) (Cred, error) {
	return Cred{}, errors.New("reading a unix socket peer's credentials needs Linux (SO_PEERCRED)")
}
