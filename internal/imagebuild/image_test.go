package main

import (
	"archive/tar"
	"context"
	"debug/buildinfo"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const testVersion = "v0.0.0-image-test"

// makeImage runs `make image CLOUDS=aws` from the repository into dir, as
// a user does, and returns the tarball's path.
func makeImage(t *testing.T, dir string) string {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: this test builds caa")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "make", "--no-print-directory", "-C", "../..", "image",
		"CLOUDS=aws", "VERSION="+testVersion, "IMAGE_DIR="+dir, "IMAGE_REPO=registry.example.com/caa",
		"REVISION=0123456789abcdef", "SOURCE_DATE_EPOCH=1700000000")
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=readonly", "GOOS="+runtime.GOOS, "GOARCH="+runtime.GOARCH)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "make image:\n%s", out)
	path := filepath.Join(dir, "caa-"+testVersion+"-aws.tar")
	require.FileExists(t, path)
	return path
}

// TestMakeImage reads the tarball `make image CLOUDS=aws` writes back as a
// registry or a container engine would: its tag, config (entrypoint, user,
// labels, platform), layers and files; then runs the binary taken out of
// the image and reads its build information.
func TestMakeImage(t *testing.T) {
	dir := t.TempDir()
	path := makeImage(t, dir)
	tag, err := name.NewTag("registry.example.com/caa:" + testVersion + "-aws")
	require.NoError(t, err)
	img, ref, err := Read(path, t.TempDir())
	require.NoError(t, err, "read the archive back")
	assert.Equal(t, tag.String(), ref, "the archive names the image by its tag")

	mt, err := img.MediaType()
	require.NoError(t, err)
	assert.Equal(t, types.OCIManifestSchema1, mt)
	cf, err := img.ConfigFile()
	require.NoError(t, err)
	assert.Equal(t, []string{"/usr/local/bin/caa"}, cf.Config.Entrypoint)
	assert.Equal(t, []string{"run"}, cf.Config.Cmd)
	assert.Equal(t, "65532:65532", cf.Config.User, "non-root by default")
	assert.Equal(t, map[string]string{
		"org.opencontainers.image.version":  testVersion,
		"org.opencontainers.image.source":   "https://github.com/caa-project/caa",
		"org.opencontainers.image.revision": "0123456789abcdef",
		"dev.caa.clouds":                    "aws",
	}, cf.Config.Labels)
	assert.Equal(t, "linux", cf.OS)
	assert.Equal(t, runtime.GOARCH, cf.Architecture)
	assert.Equal(t, time.Unix(1700000000, 0).UTC(), cf.Created.UTC(), "SOURCE_DATE_EPOCH")

	layers, err := img.Layers()
	require.NoError(t, err)
	require.Len(t, layers, 2, "the base files, then the binary")
	files := map[string]*tar.Header{}
	var binary []byte
	for _, l := range layers {
		lmt, err := l.MediaType()
		require.NoError(t, err)
		assert.Equal(t, types.OCILayer, lmt)
		rc, err := l.Uncompressed()
		require.NoError(t, err)
		tr := tar.NewReader(rc)
		for {
			h, err := tr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			require.NoError(t, err)
			files[h.Name] = h
			if h.Name == "usr/local/bin/caa" {
				binary, err = io.ReadAll(tr)
				require.NoError(t, err)
			}
		}
		require.NoError(t, rc.Close())
	}
	require.NotEmpty(t, binary, "the image holds /usr/local/bin/caa")
	assert.EqualValues(t, 0o755, files["usr/local/bin/caa"].Mode)
	assert.Equal(t, 0, files["usr/local/bin/caa"].Uid, "root owns the binary; the user cannot change it")
	assert.EqualValues(t, 0o1777, files["tmp/"].Mode)
	assert.Equal(t, 65532, files["home/nonroot/"].Uid)
	require.Contains(t, files, "etc/passwd")
	assert.NotContains(t, files, "bin/sh", "no shell")

	// The binary is the one `make static` built: the same bytes.
	built, err := os.ReadFile(filepath.Join(dir, "caa-aws"))
	require.NoError(t, err)
	assert.Equal(t, built, binary, "the image's binary is make static's")

	extracted := filepath.Join(t.TempDir(), "caa")
	require.NoError(t, os.WriteFile(extracted, binary, 0o755))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, extracted, "version").CombinedOutput()
	require.NoError(t, err, "caa version:\n%s", out)
	assert.Equal(t, "caa "+testVersion+"\n", string(out))
	info, err := buildinfo.ReadFile(extracted)
	require.NoError(t, err)
	settings := map[string]string{}
	for _, s := range info.Settings {
		settings[s.Key] = s.Value
	}
	assert.Equal(t, "caa_aws", settings["-tags"], "the EC2-only build")
	assert.Equal(t, "0", settings["CGO_ENABLED"])
	var roots bool
	for _, d := range info.Deps {
		roots = roots || d.Path == "golang.org/x/crypto/x509roots/fallback"
	}
	assert.True(t, roots, "the binary carries its CA roots: the image has no CA bundle")

	// The same binary makes the same image: the digest is reproducible.
	digest, err := img.Digest()
	require.NoError(t, err)
	again, err := Write(Options{Binary: filepath.Join(dir, "caa-aws"), Cloud: "aws", Version: testVersion,
		Repo: "registry.example.com/caa", Source: DefaultSource, Revision: "0123456789abcdef",
		Created: time.Unix(1700000000, 0), Out: filepath.Join(t.TempDir(), "again.tar")})
	require.NoError(t, err)
	assert.Equal(t, digest, again.Digest, "a rebuild of the same binary has the same digest")
	assert.Equal(t, tag.String(), again.Tag)
}

// TestWriteRefusesAnotherBuild: an image labelled for one cloud never holds
// another build, and only caa's static build goes in.
func TestWriteRefusesAnotherBuild(t *testing.T) {
	dir := t.TempDir()
	makeImage(t, dir)
	bin := filepath.Join(dir, "caa-aws")
	for _, tc := range []struct {
		o    Options
		want string
	}{
		{Options{Binary: bin, Cloud: "azure", Version: "v1", Out: filepath.Join(dir, "x.tar")},
			`was built with tags "caa_aws", not caa_azure`},
		{Options{Binary: bin, Cloud: "gcp", Version: "v1", Out: filepath.Join(dir, "x.tar")}, `-cloud="gcp"`},
		{Options{Binary: os.Args[0], Cloud: "aws", Version: "v1", Out: filepath.Join(dir, "x.tar")}, "not caa"},
		{Options{Binary: filepath.Join(dir, "missing"), Cloud: "aws", Version: "v1", Out: filepath.Join(dir, "x.tar")}, "no Go build information"},
		{Options{Binary: bin, Cloud: "aws", Version: "v1", Repo: "Not A Repo", Out: filepath.Join(dir, "x.tar")}, "not an image tag"},
	} {
		_, err := Write(tc.o)
		require.Error(t, err, "%+v", tc.o)
		assert.Contains(t, err.Error(), tc.want)
	}
	assert.NoFileExists(t, filepath.Join(dir, "x.tar"))
}
