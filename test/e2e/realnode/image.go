package realnode

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// PauseImage is the sandbox image of the node's pods: a local build of
// ./internal/pause (containerd's pinned "sandbox" image, which the kubelet
// takes from the CRI), imported at start. Nothing is pulled.
const PauseImage = "localhost/caa-e2e/pause:1"

// imageFile is one regular file of a built image.
type imageFile struct {
	path string // absolute, in the image
	mode int64
	data []byte
}

// writeImage writes a one-layer linux image of files, run as entrypoint, to
// archive as a `docker save` tarball named tag, which `ctr images import`
// reads.
func writeImage(archive, tag string, files []imageFile, entrypoint []string) error {
	ref, err := name.NewTag(tag)
	if err != nil {
		return fmt.Errorf("image tag %q: %w", tag, err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs := map[string]bool{}
	for _, f := range files {
		// Parent directories first, as a layer lists them.
		var parents []string
		for d := filepath.Dir(f.path); d != "/" && !dirs[d]; d = filepath.Dir(d) {
			dirs[d] = true
			parents = append([]string{d}, parents...)
		}
		for _, d := range parents {
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d[1:] + "/", Mode: 0o755, ModTime: time.Unix(0, 0)}); err != nil {
				return err
			}
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: f.path[1:], Mode: f.mode, Size: int64(len(f.data)), ModTime: time.Unix(0, 0)}); err != nil {
			return err
		}
		if _, err := tw.Write(f.data); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	layerBytes := buf.Bytes()
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerBytes)), nil
	})
	if err != nil {
		return fmt.Errorf("image layer: %w", err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return fmt.Errorf("image: %w", err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return fmt.Errorf("image config: %w", err)
	}
	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture = "linux", runtime.GOARCH
	cfg.Config = v1.Config{Entrypoint: entrypoint}
	if img, err = mutate.ConfigFile(img, cfg); err != nil {
		return fmt.Errorf("image config: %w", err)
	}
	if err := tarball.WriteToFile(archive, ref, img); err != nil {
		return fmt.Errorf("write image %s: %w", archive, err)
	}
	return nil
}

// buildStatic builds the main package pkg (an import path of this module)
// into out, static, for the image of a container.
func buildStatic(ctx context.Context, pkg, out string) error {
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags=-s -w", "-o", out, pkg)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s: %w: %s", pkg, err, b)
	}
	return nil
}

// pauseArchive builds the pause image into dir and returns its archive.
func pauseArchive(ctx context.Context, dir string) (string, error) {
	bin := filepath.Join(dir, "pause")
	if err := buildStatic(ctx, "github.com/caa-project/caa/test/e2e/realnode/internal/pause", bin); err != nil {
		return "", fmt.Errorf("the pause image: %w", err)
	}
	data, err := os.ReadFile(bin)
	if err != nil {
		return "", err
	}
	archive := filepath.Join(dir, "pause.tar")
	if err := writeImage(archive, PauseImage, []imageFile{{path: "/pause", mode: 0o755, data: data}}, []string{"/pause"}); err != nil {
		return "", err
	}
	return archive, nil
}
