package main

import (
	"archive/tar"
	"bytes"
	"debug/buildinfo"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// DefaultSource is the label org.opencontainers.image.source.
const DefaultSource = "https://github.com/caa-project/caa"

// The image's layout: where the binary lives and who runs it by default.
// The DaemonSet overrides the user with UID 0 and no capabilities, for the
// hostPath ledger (deploy/README.md, Running as root).
const (
	BinaryPath = "/usr/local/bin/caa"
	User       = "65532:65532"
	modulePath = "github.com/caa-project/caa"
)

// Labels of the image.
const (
	LabelVersion  = "org.opencontainers.image.version"
	LabelSource   = "org.opencontainers.image.source"
	LabelRevision = "org.opencontainers.image.revision"
	LabelClouds   = "dev.caa.clouds"
)

// Options say what to build.
type Options struct {
	Binary, Cloud, Version, Repo, Source, Revision, Out string
	// Created is the image's creation time (SOURCE_DATE_EPOCH); zero is
	// 1970, so the same binary always gives the same image digest.
	Created time.Time
}

// Image is what Write wrote.
type Image struct {
	Tag    string
	Digest v1.Hash
}

var clouds = []string{"aws", "azure", "ibmcloud"}

// Write builds the image and writes it to o.Out as a tarball.
func Write(o Options) (Image, error) {
	if !slices.Contains(clouds, o.Cloud) {
		return Image{}, fmt.Errorf("-cloud=%q: want aws, azure or ibmcloud (one image per cloud)", o.Cloud)
	}
	if o.Version == "" || o.Out == "" || o.Binary == "" {
		return Image{}, errors.New("-binary, -version and -out are required")
	}
	arch, err := CheckBinary(o.Binary, o.Cloud)
	if err != nil {
		return Image{}, err
	}
	tag, err := name.NewTag(o.Repo + ":" + o.Version + "-" + o.Cloud)
	if err != nil {
		return Image{}, fmt.Errorf("-repo=%q -version=%q: not an image tag: %w", o.Repo, o.Version, err)
	}
	bin, err := os.ReadFile(o.Binary)
	if err != nil {
		return Image{}, fmt.Errorf("read the binary: %w", err)
	}
	img, err := build(o, arch, bin)
	if err != nil {
		return Image{}, err
	}
	digest, err := img.Digest()
	if err != nil {
		return Image{}, fmt.Errorf("image digest: %w", err)
	}
	if err := writeArchive(o.Out, tag, arch, img); err != nil {
		return Image{}, fmt.Errorf("write %s: %w", o.Out, err)
	}
	return Image{Tag: tag.String(), Digest: digest}, nil
}

// Annotations of the image in the archive's index.json: the OCI tag, and
// the full name `docker load` and containerd give the loaded image.
const (
	annotationRefName = "org.opencontainers.image.ref.name"
	annotationName    = "io.containerd.image.name"
)

// writeArchive writes img as an OCI image layout (oci-layout, index.json,
// blobs/sha256/...) in a tar file: the "oci-archive" that docker load,
// podman load and skopeo read, and whose manifest is byte for byte the
// one a registry gets (a docker-save tarball would rewrite its media
// types, and so its digest). Entries are sorted, with fixed times.
func writeArchive(out string, tag name.Tag, arch string, img v1.Image) error {
	dir, err := os.MkdirTemp("", "imagebuild-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return fmt.Errorf("OCI layout: %w", err)
	}
	if err := p.AppendImage(img,
		layout.WithAnnotations(map[string]string{annotationRefName: tag.TagStr(), annotationName: tag.String()}),
		layout.WithPlatform(v1.Platform{OS: "linux", Architecture: arch})); err != nil {
		return fmt.Errorf("OCI layout: %w", err)
	}
	tmp := out + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	defer os.Remove(tmp)
	tw := tar.NewWriter(f)
	err = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || path == dir {
			return err
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil {
			return err
		}
		h := &tar.Header{Name: filepath.ToSlash(rel), ModTime: time.Unix(0, 0), Format: tar.FormatPAX}
		if d.IsDir() {
			h.Typeflag, h.Name, h.Mode = tar.TypeDir, h.Name+"/", 0o755
			return tw.WriteHeader(h)
		}
		body, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		h.Typeflag, h.Mode, h.Size = tar.TypeReg, 0o644, int64(len(body))
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		_, err = tw.Write(body)
		return err
	})
	if err == nil {
		err = tw.Close()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return os.Rename(tmp, out)
}

// Read opens an archive Write wrote (any OCI archive of one image) into
// dir, and returns the image and its tag (the full name annotation).
func Read(archive, dir string) (v1.Image, string, error) {
	f, err := os.Open(archive)
	if err != nil {
		return nil, "", err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, "", fmt.Errorf("%s: %w", archive, err)
		}
		target := filepath.Join(dir, filepath.FromSlash(h.Name))
		if !strings.HasPrefix(target, filepath.Clean(dir)+string(filepath.Separator)) {
			return nil, "", fmt.Errorf("%s: entry %q leaves the archive", archive, h.Name)
		}
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(target, 0o755); err != nil {
				return nil, "", err
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
				return nil, "", err
			}
			body, err := io.ReadAll(tr)
			if err != nil {
				return nil, "", err
			}
			if err := os.WriteFile(target, body, 0o644); err != nil {
				return nil, "", err
			}
		default:
			return nil, "", fmt.Errorf("%s: entry %q is neither file nor directory", archive, h.Name)
		}
	}
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, "", fmt.Errorf("%s: not an OCI layout: %w", archive, err)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		return nil, "", err
	}
	if len(m.Manifests) != 1 {
		return nil, "", fmt.Errorf("%s: %d images, want 1", archive, len(m.Manifests))
	}
	img, err := idx.Image(m.Manifests[0].Digest)
	if err != nil {
		return nil, "", err
	}
	return img, m.Manifests[0].Annotations[annotationName], nil
}

// build assembles the image: a base layer (the user, /tmp) and the binary's
// layer, OCI media types throughout.
func build(o Options, arch string, bin []byte) (v1.Image, error) {
	base, err := layer(baseFiles())
	if err != nil {
		return nil, err
	}
	binLayer, err := layer([]file{{path: BinaryPath, mode: 0o755, body: bin}})
	if err != nil {
		return nil, err
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.Append(img,
		mutate.Addendum{Layer: base, MediaType: types.OCILayer, History: v1.History{CreatedBy: "imagebuild: /etc/passwd, /etc/group, /home/nonroot, /tmp", Created: v1.Time{Time: o.Created}}},
		mutate.Addendum{Layer: binLayer, MediaType: types.OCILayer, History: v1.History{CreatedBy: "imagebuild: " + BinaryPath + " from make static CLOUDS=" + o.Cloud, Created: v1.Time{Time: o.Created}}},
	)
	if err != nil {
		return nil, fmt.Errorf("append the layers: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", arch
	cf.Created = v1.Time{Time: o.Created}
	cf.Config.Entrypoint = []string{BinaryPath}
	cf.Config.Cmd = []string{"run"}
	cf.Config.User = User
	cf.Config.WorkingDir = "/"
	cf.Config.Labels = map[string]string{LabelVersion: o.Version, LabelSource: o.Source, LabelClouds: o.Cloud}
	if o.Revision != "" {
		cf.Config.Labels[LabelRevision] = o.Revision
	}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("set the config: %w", err)
	}
	return img, nil
}

type file struct {
	path     string
	mode     int64
	dir      bool
	uid, gid int
	body     []byte
}

// baseFiles are what the binary needs around it: a passwd and group that
// name the default user (so tools and libraries that look a UID up find
// it), its home, and a /tmp. No shell, no libc, no CA bundle (the binary
// carries Mozilla's roots as a fallback: cmd/caa/roots.go).
func baseFiles() []file {
	return []file{
		{path: "/etc/", dir: true, mode: 0o755},
		{path: "/etc/passwd", mode: 0o644, body: []byte("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n")},
		{path: "/etc/group", mode: 0o644, body: []byte("root:x:0:\nnonroot:x:65532:\n")},
		{path: "/home/", dir: true, mode: 0o755},
		{path: "/home/nonroot/", dir: true, mode: 0o700, uid: 65532, gid: 65532},
		{path: "/tmp/", dir: true, mode: 0o1777},
		{path: "/usr/", dir: true, mode: 0o755},
		{path: "/usr/local/", dir: true, mode: 0o755},
		{path: "/usr/local/bin/", dir: true, mode: 0o755},
	}
}

// layer makes a layer of files with fixed times and owners, so the same
// input is the same digest.
func layer(files []file) (v1.Layer, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range files {
		h := &tar.Header{Name: strings.TrimPrefix(f.path, "/"), Mode: f.mode, Uid: f.uid, Gid: f.gid,
			ModTime: time.Unix(0, 0), Format: tar.FormatPAX}
		if f.dir {
			h.Typeflag = tar.TypeDir
		} else {
			h.Typeflag, h.Size = tar.TypeReg, int64(len(f.body))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("layer %s: %w", f.path, err)
		}
		if _, err := tw.Write(f.body); err != nil {
			return nil, fmt.Errorf("layer %s: %w", f.path, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("layer: %w", err)
	}
	raw := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(raw)), nil
	}, tarball.WithMediaType(types.OCILayer))
}

// CheckBinary refuses a binary that is not the image's: not caa, not
// static, built with cgo, or built for other clouds than cloud. It returns
// the image architecture of the ELF.
func CheckBinary(path, cloud string) (string, error) {
	info, err := buildinfo.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("%s: no Go build information (%w): give the binary `make static CLOUDS=%s` built", path, err, cloud)
	}
	if info.Path != modulePath+"/cmd/caa" {
		return "", fmt.Errorf("%s is %s, not caa (%s/cmd/caa)", path, info.Path, modulePath)
	}
	settings := map[string]string{}
	for _, s := range info.Settings {
		settings[s.Key] = s.Value
	}
	if settings["CGO_ENABLED"] != "0" {
		return "", fmt.Errorf("%s was built with CGO_ENABLED=%q: the image has no libc; build it with make static", path, settings["CGO_ENABLED"])
	}
	if tags := settings["-tags"]; tags != "caa_"+cloud {
		return "", fmt.Errorf("%s was built with tags %q, not caa_%s: it is not the %s-only build (make static CLOUDS=%s)", path, tags, cloud, cloud, cloud)
	}
	f, err := elf.Open(path)
	if err != nil {
		return "", fmt.Errorf("%s: %w", path, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return "", fmt.Errorf("%s asks for a dynamic loader: the image has none", path)
		}
	}
	switch f.Machine {
	case elf.EM_X86_64:
		return "amd64", nil
	case elf.EM_AARCH64:
		return "arm64", nil
	case elf.EM_PPC64:
		return "ppc64le", nil
	case elf.EM_S390:
		return "s390x", nil
	}
	return "", fmt.Errorf("%s: ELF machine %v is none of amd64, arm64, ppc64le, s390x", path, f.Machine)
}
