package cluster

import (
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/pkg/ledger"
	"github.com/caa-project/caa/pkg/pki"
)

// TestRemoveNodeData: caa's host directory is emptied once neither caa
// nor the relay runs there; a held ledger, a served relay socket and a
// directory that is not caa's are refused, touching nothing.
func TestRemoveNodeData(t *testing.T) {
	dir, err := os.MkdirTemp("", "nd") // unix socket paths are capped at 108 bytes
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	led, err := ledger.Open(ledger.Options{Path: filepath.Join(dir, "ledger.db"), Node: "n1", Cluster: "c1", Timeout: time.Second})
	require.NoError(t, err)
	_, err = pki.LoadOrCreateCA(dir)
	require.NoError(t, err)
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "relay"), 0o700))

	err = RemoveNodeData(dir, io.Discard)
	require.ErrorContains(t, err, "held by a running caa")
	require.NoError(t, led.Close())

	ln, err := net.Listen("unix", filepath.Join(dir, "relay", "relay.sock"))
	require.NoError(t, err)
	err = RemoveNodeData(dir, io.Discard)
	require.ErrorContains(t, err, "running caa relay")
	ln.Close()
	_, err = os.Stat(filepath.Join(dir, "ledger.db"))
	require.NoError(t, err, "a refusal removes nothing")

	var out strings.Builder
	require.NoError(t, RemoveNodeData(dir, &out))
	left, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Empty(t, left)
	assert.Contains(t, out.String(), filepath.Join(dir, pki.CurrentFile))
	require.NoError(t, RemoveNodeData(dir, io.Discard), "again: nothing to do")
	require.NoError(t, RemoveNodeData(filepath.Join(dir, "none"), io.Discard))

	other := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(other, "notes.txt"), []byte("x"), 0o600))
	require.ErrorContains(t, RemoveNodeData(other, io.Discard), "not caa's directory")
	require.ErrorContains(t, RemoveNodeData("/", io.Discard), "never the root")
	_, err = os.Stat(filepath.Join(other, "notes.txt"))
	require.NoError(t, err)
}
