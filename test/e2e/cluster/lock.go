package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// lockFile takes an exclusive flock on path, polling so that ctx can end the
// wait. waiting is called once, with the holder's pid, if another holder
// makes it wait. The lock goes with the process, so a crashed builder never
// leaves it held.
func lockFile(ctx context.Context, path string, waiting func(holder string)) (unlock func(), err error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open build lock: %w", err)
	}
	fd := int(f.Fd())
	told := false
	for {
		err := syscall.Flock(fd, syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR) {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		if !told {
			told = true
			holder := "unknown pid"
			if b, err := os.ReadFile(path); err == nil && len(strings.TrimSpace(string(b))) > 0 {
				holder = "pid " + strings.TrimSpace(string(b))
			}
			waiting(holder)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("wait for build lock %s: %w", path, ctx.Err())
		case <-time.After(250 * time.Millisecond):
		}
	}
	// Only for the waiting message above; the flock is what excludes.
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return func() {
		_ = f.Truncate(0)
		_ = syscall.Flock(fd, syscall.LOCK_UN)
		f.Close()
	}, nil
}
