package ledgerapi

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/caa-project/caa/pkg/ledger"
)

// Open finds the best reader for the ledger at path: the daemon that holds
// it, when one answers on its socket, else the file itself opened
// read-only. It never waits longer than timeout for either.
func Open(ctx context.Context, path string, timeout time.Duration) (Reader, error) {
	sock := SocketPath(path)
	var sockErr error
	if _, err := os.Stat(sock); err == nil {
		c := NewClient(sock, timeout)
		if _, err := c.Meta(ctx); err == nil {
			return c, nil
		} else {
			sockErr = err
		}
		_ = c.Close()
	}
	l, err := ledger.Open(ledger.Options{Path: path, ReadOnly: true, Timeout: timeout})
	if err != nil {
		if errors.Is(err, ledger.ErrLocked) {
			if sockErr != nil {
				return nil, fmt.Errorf("%w; its socket %s did not answer either: %v", err, sock, sockErr)
			}
			return nil, fmt.Errorf("%w; no daemon socket at %s (a caa older than the socket API, or another tool, holds the file)", err, sock)
		}
		return nil, err
	}
	return &Local{L: l}, nil
}
