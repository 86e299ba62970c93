package cluster

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestBuildCaaLinksOnce: a second build of the same caa (version and
// tags) reuses the cached link, where a test of another package asked for
// it; each caller gets its own copy, stamped as asked.
func TestBuildCaaLinksOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("links caa")
	}
	t.Setenv(CacheEnv, t.TempDir())
	dir := t.TempDir()
	first, second := filepath.Join(dir, "first"), filepath.Join(dir, "second")
	if err := BuildCaa(t.Context(), first, "v0.0.0-cache-test", "caa_aws"); err != nil {
		t.Fatal(err)
	}
	cached, err := filepath.Glob(filepath.Join(os.Getenv(CacheEnv), "caa", "*", "caa"))
	if err != nil || len(cached) != 1 {
		t.Fatalf("one cached caa, got %v (%v)", cached, err)
	}
	before := inode(t, cached[0])
	if err := BuildCaa(t.Context(), second, "v0.0.0-cache-test", "caa_aws"); err != nil {
		t.Fatal(err)
	}
	if after := inode(t, cached[0]); after != before {
		t.Errorf("the second build linked caa again (the cached file is new: inode %d, was %d)", after, before)
	}
	if inode(t, first) == inode(t, second) || inode(t, first) == before {
		t.Error("the callers share a file with each other or with the cache")
	}
	out, err := exec.CommandContext(t.Context(), second, "version").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "v0.0.0-cache-test") {
		t.Errorf("caa version: %s (%v)", out, err)
	}
}

func inode(t *testing.T, path string) uint64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t).Ino
}
