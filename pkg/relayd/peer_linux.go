package relayd

import (
	"errors"
	"fmt"
	"net"

	"golang.org/x/sys/unix"
)

// peerOf reads the credentials the kernel recorded for the process that
// connected c (SO_PEERCRED: its pid, uid and gid at connect time; they
// cannot be forged by the peer).
func peerOf(c net.Conn) (peer, error) {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return peer{}, fmt.Errorf("a %T is not a unix socket connection", c)
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return peer{}, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return peer{}, err
	}
	if cerr != nil {
		return peer{}, fmt.Errorf("SO_PEERCRED: %w", cerr)
	}
	if cred == nil {
		return peer{}, errors.New("SO_PEERCRED: no credentials")
	}
	return peer{pid: cred.Pid, uid: cred.Uid, gid: cred.Gid}, nil
}
