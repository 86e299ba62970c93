package ledger

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// isNoSpace reports whether err is a write refused for lack of space or
// quota. bbolt formats some of its errors (growing the file) with %s, which
// drops the errno, so the text is checked too.
func isNoSpace(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
		return true
	}
	msg := err.Error()
	return strings.Contains(msg, syscall.ENOSPC.Error()) || strings.Contains(msg, syscall.EDQUOT.Error())
}

// noSpace returns err unchanged unless it is a write refused for lack of
// space or quota; then it returns an ErrNoSpace that names the ledger, the
// file system it lives on and what to do, and keeps err as the cause.
func (l *Ledger) noSpace(err error) error {
	if !isNoSpace(err) || errors.Is(err, ErrNoSpace) {
		return err
	}
	dir := filepath.Dir(l.path)
	where := fmt.Sprintf("the file system holding %s", dir)
	if mnt := mountPoint(dir); mnt != "" {
		where = fmt.Sprintf("the file system mounted at %s", mnt)
	}
	room := ""
	var st syscall.Statfs_t
	if syscall.Statfs(dir, &st) == nil && st.Bsize > 0 {
		bs := uint64(st.Bsize)
		room = fmt.Sprintf(" (%s free of %s)", sizeIEC(st.Bavail*bs), sizeIEC(st.Blocks*bs))
	}
	what := fmt.Sprintf("%s is full%s", where, room)
	if errors.Is(err, syscall.EDQUOT) || strings.Contains(err.Error(), syscall.EDQUOT.Error()) {
		what = fmt.Sprintf("the disk quota of user %d on %s is used up%s", os.Geteuid(), where, room)
	}
	return fmt.Errorf("ledger %s: %w: %s; the write was not made and the ledger keeps its last good state; "+
		"free space on that file system (in a caa pod it is the node's disk behind the ledger's hostPath, %s) "+
		"and writes can go on (%v)",
		l.path, ErrNoSpace, what, dir, err)
}

// mountPoint is the directory where the file system holding dir is
// mounted: the highest ancestor of dir on the same device. It returns ""
// when dir cannot be examined.
func mountPoint(dir string) string {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return ""
	}
	dev, ok := deviceOf(dir)
	if !ok {
		return ""
	}
	for {
		parent := filepath.Dir(dir)
		if parent == dir {
			return dir
		}
		if pdev, ok := deviceOf(parent); !ok || pdev != dev {
			return dir
		}
		dir = parent
	}
}

func deviceOf(path string) (uint64, bool) {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return 0, false
	}
	return uint64(st.Dev), true // Dev is narrower on some platforms
}

// sizeIEC prints a byte count in the largest binary unit that keeps it at
// or above one, with one decimal.
func sizeIEC(n uint64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	v, i := float64(n)/unit, 0
	for v >= unit && i < 4 {
		v /= unit
		i++
	}
	return fmt.Sprintf("%.1f %ciB", v, "KMGTP"[i])
}
