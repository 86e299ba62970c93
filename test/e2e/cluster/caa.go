package cluster

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/caa-project/caa/internal/logbuf"
)

// caaPackage is the main package the tests, the demo and the benchmarks run.
const caaPackage = "github.com/caa-project/caa/cmd/caa"

// BuildCaa builds the caa binary into out with `go build`, stamped with
// version when it is not empty, and with only the clouds named in tags
// (the caa_aws, caa_azure, caa_ibmcloud build tags; none: every cloud).
// The go command's output goes to this process's stderr. The link is
// shared through the binary cache (CachedBuild).
func BuildCaa(ctx context.Context, out, version string, tags ...string) error {
	// The module's directory keeps checkouts apart, so they do not take
	// turns relinking one cached copy.
	key := append([]string{"go build -trimpath", moduleDir(), version}, tags...)
	return CachedBuild(ctx, key, out, func(cached string) error { return goBuildCaa(ctx, cached, version, tags) })
}

// CachedBuild gives out a copy of a build kept in the binary cache
// (cacheDir, caa/), one per key (what names the build: its command, the
// version, the tags). build makes or updates the cached file with go
// build -o (directly or through make): go build links it again only when
// its build ID says the sources or settings changed, so the packages and
// runs that build the same caa share one link (a link of caa is seconds
// of both cores). A lock keeps two builders of one key apart; out is a
// copy, so a later link never changes a binary a test is running.
func CachedBuild(ctx context.Context, key []string, out string, build func(cached string) error) error {
	cache, err := cacheDir()
	if err != nil {
		return err
	}
	h := sha256.New()
	for _, part := range append(key, runtime.GOOS+"/"+runtime.GOARCH) {
		fmt.Fprintf(h, "%d\n%s", len(part), part)
	}
	dir := filepath.Join(cache, "caa", hex.EncodeToString(h.Sum(nil))[:12])
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("build caa: %w", err)
	}
	unlock, err := lockFile(ctx, filepath.Join(dir, "build.lock"), func(holder string) {
		fmt.Fprintf(os.Stderr, "e2e: waiting for %s's build of caa in %s\n", holder, dir)
	})
	if err != nil {
		return fmt.Errorf("build caa: %w", err)
	}
	defer unlock()
	cached := filepath.Join(dir, "caa")
	if err := build(cached); err != nil {
		return err
	}
	return copyExecutable(cached, out)
}

// moduleDir is the directory of the go.mod above the working directory
// (a test's package), or the working directory when there is none.
func moduleDir() string {
	wd, err := os.Getwd()
	if err != nil {
		return ""
	}
	for dir := wd; ; dir = filepath.Dir(dir) {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		if filepath.Dir(dir) == dir {
			return wd
		}
	}
}

// goBuildCaa runs go build for BuildCaa.
func goBuildCaa(ctx context.Context, out, version string, tags []string) error {
	args := []string{"build", "-trimpath"}
	if version != "" {
		args = append(args, "-ldflags", "-X main.version="+version)
	}
	if len(tags) > 0 {
		args = append(args, "-tags", strings.Join(tags, ","))
	}
	cmd := exec.CommandContext(ctx, "go", append(args, "-o", out, caaPackage)...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("build caa (%s): %w", shellJoin(args), err)
	}
	return nil
}

// copyExecutable copies the file src to dst (mode 0755) through a
// temporary file beside dst, so dst is never seen half written.
func copyExecutable(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("copy caa: %w", err)
	}
	defer in.Close()
	tmp, err := os.CreateTemp(filepath.Dir(dst), ".caa-*.partial")
	if err != nil {
		return fmt.Errorf("copy caa: %w", err)
	}
	defer os.Remove(tmp.Name()) // a no-op once renamed
	if _, err := io.Copy(tmp, in); err != nil {
		tmp.Close()
		return fmt.Errorf("copy caa to %s: %w", dst, err)
	}
	if err := tmp.Chmod(0o755); err != nil {
		tmp.Close()
		return fmt.Errorf("copy caa to %s: %w", dst, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("copy caa to %s: %w", dst, err)
	}
	if err := os.Rename(tmp.Name(), dst); err != nil {
		return fmt.Errorf("copy caa to %s: %w", dst, err)
	}
	return nil
}

// FreePort returns a port on 127.0.0.1 that was free a moment ago.
func FreePort() (int, error) {
	ports, err := freePorts(1)
	if err != nil {
		return 0, err
	}
	return ports[0], nil
}

// SyncBuffer collects a process's output while a test reads it.
type SyncBuffer = logbuf.Buffer
