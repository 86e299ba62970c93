//go:build !linux

package relayd

import (
	"errors"
	"net"
)

// peerOf: the relay daemon runs on Linux nodes; elsewhere no peer is
// accepted (the control socket's peer check cannot be made).
func peerOf(net.Conn) (peer, error) {
	return peer{}, errors.New("the control socket's peer check needs Linux (SO_PEERCRED)")
}
