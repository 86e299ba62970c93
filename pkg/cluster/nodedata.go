package cluster

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"github.com/caa-project/caa/pkg/ledger"
	"github.com/caa-project/caa/pkg/pki"
)

// caaMarkers are files only caa's directory holds: one of them must be
// there before RemoveNodeData empties a directory.
var caaMarkers = []string{filepath.Base(ledger.DefaultPath), pki.CurrentFile, "relay"}

// RemoveNodeData empties caa's host directory on a node (`caa uninstall
// node`): the ledger and its lease, the agent CA, the relay's directory.
// It refuses a directory that is not caa's (none of its files there), a
// ledger a caa still holds (its lock), and a relay still serving its
// control socket: both would go on writing there. It is the last step:
// with the ledger go the records of the node's VMs, so the cloud must be
// clean first (`caa uninstall`). A missing or empty directory is done.
func RemoveNodeData(dir string, out io.Writer) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return fmt.Errorf("--dir %q: %w", dir, err)
	}
	if abs == "/" {
		return errors.New("--dir /: give caa's own directory (/var/lib/caa), never the root")
	}
	entries, err := os.ReadDir(abs)
	if errors.Is(err, os.ErrNotExist) || (err == nil && len(entries) == 0) {
		fmt.Fprintf(out, "%s: nothing of caa's left\n", abs)
		return nil
	}
	if err != nil {
		return fmt.Errorf("read %s: %w", abs, err)
	}
	if !slices.ContainsFunc(entries, func(e os.DirEntry) bool { return slices.Contains(caaMarkers, e.Name()) }) {
		return fmt.Errorf("--dir %s holds none of caa's files (%v): not caa's directory, left as it is", abs, caaMarkers)
	}
	ledgerPath := filepath.Join(abs, filepath.Base(ledger.DefaultPath))
	if held, err := locked(ledgerPath); err != nil {
		return err
	} else if held {
		return fmt.Errorf("%s is held by a running caa: remove caa's DaemonSet first (and wait for its pods to end)", ledgerPath)
	}
	relaySock := filepath.Join(abs, "relay", "relay.sock")
	if c, err := net.DialTimeout("unix", relaySock, time.Second); err == nil {
		c.Close()
		return fmt.Errorf("%s is served by a running caa relay: remove the caa-relay DaemonSet first", relaySock)
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(abs, e.Name())); err != nil {
			return fmt.Errorf("remove %s: %w", filepath.Join(abs, e.Name()), err)
		}
		fmt.Fprintf(out, "removed %s\n", filepath.Join(abs, e.Name()))
	}
	return nil
}

// locked reports whether a process holds the ledger's lock (bbolt's flock).
func locked(path string) (bool, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("open %s: %w", path, err)
	}
	defer f.Close()
	err = syscall.Flock(int(f.Fd()), syscall.LOCK_SH|syscall.LOCK_NB)
	if errors.Is(err, syscall.EWOULDBLOCK) {
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("lock %s: %w", path, err)
	}
	_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	return false, nil
}
