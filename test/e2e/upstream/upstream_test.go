package upstream

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestCheckNamesUpstreamSrc(t *testing.T) {
	t.Setenv(SrcEnv, "")
	err := Check(KataShim)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "UPSTREAM_SRC is not set")
	assert.Contains(t, err.Error(), kataTree.archive)

	dir := t.TempDir()
	t.Setenv(SrcEnv, dir)
	err = Check(PodVM)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "UPSTREAM_SRC="+dir+" holds neither "+adaptorTree.archive+" nor a clone cloud-api-adaptor")

	_, err = Build(t.Context(), Kind("nope"))
	assert.ErrorContains(t, err, `no build named "nope"`)
}

// tarGz is a .tar.gz of the given entries (name to content; a trailing
// slash makes a directory).
func tarGz(t *testing.T, entries map[string]string) []byte {
	t.Helper()
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	tw := tar.NewWriter(zw)
	for name, content := range entries {
		hdr := &tar.Header{Name: name, Mode: 0o644, Size: int64(len(content)), Typeflag: tar.TypeReg}
		if name[len(name)-1] == '/' {
			hdr.Typeflag, hdr.Size, hdr.Mode = tar.TypeDir, 0, 0o755
		}
		require.NoError(t, tw.WriteHeader(hdr))
		_, err := tw.Write([]byte(content))
		require.NoError(t, err)
	}
	require.NoError(t, tw.Close())
	require.NoError(t, zw.Close())
	return b.Bytes()
}

func TestArchiveKeyAndExtract(t *testing.T) {
	src, cache := t.TempDir(), t.TempDir()
	archive := filepath.Join(src, kataTree.archive)
	require.NoError(t, os.WriteFile(archive, tarGz(t, map[string]string{
		"kata-containers/":             "",
		"kata-containers/VERSION":      "4.1.0\n",
		"kata-containers/src/runtime/": "",
	}), 0o644))
	key, err := kataTree.key(src)
	require.NoError(t, err)
	root, err := kataTree.extract(t.Context(), src, cache, key)
	require.NoError(t, err)
	b, err := os.ReadFile(filepath.Join(root, "kata-containers", "VERSION"))
	require.NoError(t, err)
	assert.Equal(t, "4.1.0\n", string(b))

	// Another archive is another tree.
	require.NoError(t, os.WriteFile(archive, tarGz(t, map[string]string{"kata-containers/VERSION": "4.1.1\n"}), 0o644))
	key2, err := kataTree.key(src)
	require.NoError(t, err)
	assert.NotEqual(t, key, key2)
}

func TestUntarRefusesEntriesOutsideTheTree(t *testing.T) {
	src := t.TempDir()
	archive := filepath.Join(src, "evil.tar.gz")
	require.NoError(t, os.WriteFile(archive, tarGz(t, map[string]string{"../escape": "x"}), 0o644))
	err := extractArchive(archive, t.TempDir())
	assert.ErrorContains(t, err, "leaves the tree")
	_, err = os.Stat(filepath.Join(src, "escape"))
	assert.ErrorIs(t, err, os.ErrNotExist)
}
