package unixsock

import (
	"errors"
	"fmt"
	"io/fs"
	"syscall"
)

// Inode is fi's device and inode number; ok is false where the platform
// does not say.
func Inode(fi fs.FileInfo) (id FileID, ok bool) {
	if st, isStat := fi.Sys().(*syscall.Stat_t); isStat {
		return FileID{Dev: uint64(st.Dev), Ino: st.Ino}, true //nolint:unconvert // Dev's type differs by architecture
	}
	return FileID{}, false
}

// lockDir takes an exclusive flock of the directory dir, waiting for it;
// wait, when set, is called first if another holds it. The lock is the
// open file description's: two opens in one process exclude each other as
// two processes do. unlock releases it.
func lockDir(dir string, wait func()) (unlock func(), err error) {
	fd, err := syscall.Open(dir, syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open the socket's directory to lock it: %w", err)
	}
	err = flock(fd, syscall.LOCK_EX|syscall.LOCK_NB)
	if errors.Is(err, syscall.EWOULDBLOCK) {
		if wait != nil {
			wait()
		}
		err = flock(fd, syscall.LOCK_EX)
	}
	if err != nil {
		_ = syscall.Close(fd)
		return nil, fmt.Errorf("lock the socket's directory %s: %w", dir, err)
	}
	return func() { _ = syscall.Close(fd) }, nil // closing the last descriptor releases the lock
}

func flock(fd, how int) error {
	for {
		err := syscall.Flock(fd, how)
		if !errors.Is(err, syscall.EINTR) {
			return err
		}
	}
}
