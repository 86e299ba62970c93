package handover

import (
	"encoding/json"
	"net"
	"syscall"
	"time"

	"github.com/caa-project/caa/internal/unixsock"
)

// Cred is the kernel's word on the process at the other end of a unix
// socket, as of its connect (SO_PEERCRED).
type Cred struct {
	PID int
	UID int
}

func peerCred(c net.Conn) Cred {
	u, err := unixsock.Peer(c)
	if err != nil {
		return Cred{}
	}
	return Cred{PID: int(u.PID), UID: int(u.UID)}
}

// connAlive peeks at the socket without blocking: end of stream means the
// peer hung up; nothing to read yet (or data) means it is still there.
func connAlive(c *conn) bool {
	if c.r.Buffered() > 0 {
		return true
	}
	uc, ok := c.c.(*net.UnixConn)
	if !ok {
		return true
	}
	rc, err := uc.SyscallConn()
	if err != nil {
		return false
	}
	alive := true
	_ = rc.Read(func(fd uintptr) bool {
		var b [1]byte
		n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		switch {
		case err == syscall.EAGAIN || err == syscall.EWOULDBLOCK:
		case err != nil || n == 0:
			alive = false
		}
		return true // one look, never wait
	})
	return alive
}

// buffered returns a message already waiting on the connection, if a whole
// one is there, without waiting for more.
func (c *conn) buffered() (message, bool) {
	_ = c.c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	defer func() { _ = c.c.SetReadDeadline(time.Time{}) }()
	line, err := c.r.ReadBytes('\n')
	if err != nil {
		return message{}, false
	}
	var m message
	return m, json.Unmarshal(line, &m) == nil
}
