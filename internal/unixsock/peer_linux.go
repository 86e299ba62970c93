package unixsock

import (
	"errors"
	"fmt"
	"net"

	"golang.org/x/sys/unix"
)

// Peer reads the credentials the kernel recorded for the process that
// connected c (SO_PEERCRED: its pid, uid and gid as of its connect; the
// peer cannot forge them).
func Peer(c net.Conn) (Cred, error) {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return Cred{}, fmt.Errorf("a %T is not a unix socket connection", c)
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return Cred{}, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return Cred{}, err
	}
	if cerr != nil {
		return Cred{}, fmt.Errorf("SO_PEERCRED: %w", cerr)
	}
	if cred == nil {
		return Cred{}, errors.New("SO_PEERCRED: no credentials")
	}
	return Cred{PID: cred.Pid, UID: cred.Uid, GID: cred.Gid}, nil
}
