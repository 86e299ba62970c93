// Package upstream builds the upstream programs that tests run beside caa:
// the stock peer-pods pod VM's programs and adaptor (cloud-api-adaptor at a
// pinned commit), kata's Go shim with its remote hypervisor configuration
// (kata 4.1.0), and the test kata agent (test/kataagent) compiled against
// kata 4.1.0's own agent protocol. Sources come from $UPSTREAM_SRC: a
// directory of the pinned source archives, or of clones of the two
// repositories. Builds are cached beside the control plane's binaries
// (test/e2e/cluster) in a directory named after the sources' hash, and are
// serialised with them by the same lock. Nothing here enters caa's go.mod:
// each program builds in its own module with the go command.
package upstream

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/caa-project/caa/test/e2e/cluster"
)

// SrcEnv names the environment variable that says where the upstream
// sources are: a directory holding the archives
// cloud-api-adaptor-fbdde756.tar.gz, kata-containers-cf82bb35.tar.gz and
// kata-containers-4.1.0.tar.gz, or one holding clones named
// cloud-api-adaptor and kata-containers (with the pinned commits in them).
const SrcEnv = "UPSTREAM_SRC"

// Kind is one build: a directory of programs.
type Kind string

const (
	// PodVM is upstream's pod VM programs: ProcessUserData and Forwarder.
	PodVM Kind = "podvm"
	// Adaptor is upstream's cloud-api-adaptor (AdaptorBin), with the AWS,
	// Azure and IBM Cloud providers built in.
	Adaptor Kind = "adaptor"
	// KataShim is kata 4.1.0's Go shim (ShimBin) and the remote
	// hypervisor configuration its Makefile generates (RemoteConfig).
	KataShim Kind = "kata-shim"
	// KataAgent is the test kata agent of test/kataagent (AgentBin), built
	// against kata 4.1.0's agent protocol.
	KataAgent Kind = "kata-agent"
)

// Kinds lists every build, in the order the command builds them.
var Kinds = []Kind{PodVM, Adaptor, KataShim, KataAgent}

// The programs' names in their build's directory.
const (
	ProcessUserData = "process-user-data"
	Forwarder       = "agent-protocol-forwarder"
	AdaptorBin      = "cloud-api-adaptor"
	ShimBin         = "containerd-shim-kata-v2"
	RemoteConfig    = "configuration-remote.toml"
	AgentBin        = "kata-agent"
)

// recipeVersion is part of every cache key: change it when a recipe below
// changes what it builds.
const recipeVersion = "1"

// buildTimeout bounds one build; a cold adaptor build fetches and compiles
// three clouds' SDKs.
const buildTimeout = 45 * time.Minute

// kataRuntimeModule is the Go module of kata's shim and its protocols.
const kataRuntimeModule = "github.com/kata-containers/kata-containers/src/runtime"

// tree is one pinned source tree: an archive in $UPSTREAM_SRC, or the same
// paths taken with git archive from a clone there. Both put the tree under
// a top directory named as the clone.
type tree struct {
	name    string   // cache directory prefix
	archive string   // archive file name in $UPSTREAM_SRC
	clone   string   // clone directory name in $UPSTREAM_SRC, the archive's top directory
	rev     string   // commit the archive was taken at
	paths   []string // what the archive holds
}

var (
	adaptorTree = tree{
		name: "cloud-api-adaptor-fbdde756", archive: "cloud-api-adaptor-fbdde756.tar.gz", clone: "cloud-api-adaptor",
		rev: "fbdde756207826872ba4bcee1f5c6788d7aee707", paths: []string{"src"},
	}
	// kataRuntimeTree is the kata runtime the adaptor's go.mod requires.
	kataRuntimeTree = tree{
		name: "kata-containers-cf82bb35", archive: "kata-containers-cf82bb35.tar.gz", clone: "kata-containers",
		rev: "cf82bb35c80320178bf7570252fe75d6fb263209", paths: []string{"src/runtime", "src/libs", "VERSION"},
	}
	// kataTree is kata 4.1.0, the release users run.
	kataTree = tree{
		name: "kata-containers-4.1.0", archive: "kata-containers-4.1.0.tar.gz", clone: "kata-containers",
		rev: "ddcb1ad8d23cbb4323f86c209f132b89592902df", paths: []string{"src/runtime", "src/libs", "VERSION"},
	}
)

// recipe is how one Kind is built into out from its extracted trees (roots,
// each the directory holding the tree's top directory).
type recipe struct {
	trees []tree
	// local, when set, names a directory of this repository whose files
	// are part of the build's identity.
	local string
	build func(ctx context.Context, b *builder, roots []string, local, out string) error
}

var recipes = map[Kind]recipe{
	PodVM: {
		trees: []tree{adaptorTree, kataRuntimeTree},
		build: func(ctx context.Context, b *builder, roots []string, _, out string) error {
			mod, err := adaptorModule(ctx, b, roots)
			if err != nil {
				return err
			}
			return b.goCmd(ctx, mod, nil, "build", "-trimpath", "-buildvcs=false", "-ldflags", "-s -w", "-o", out+"/",
				"./cmd/"+ProcessUserData, "./cmd/"+Forwarder)
		},
	},
	Adaptor: {
		trees: []tree{adaptorTree, kataRuntimeTree},
		build: func(ctx context.Context, b *builder, roots []string, _, out string) error {
			mod, err := adaptorModule(ctx, b, roots)
			if err != nil {
				return err
			}
			// The providers caa has; upstream's Makefile names them the same.
			version := "-X 'github.com/confidential-containers/cloud-api-adaptor/src/cloud-api-adaptor/cmd.VERSION=fbdde756'"
			return b.goCmd(ctx, mod, nil, "build", "-trimpath", "-buildvcs=false", "-tags", "aws,azure,ibmcloud",
				"-ldflags", "-s -w "+version, "-o", filepath.Join(out, AdaptorBin), "./cmd/"+AdaptorBin)
		},
	},
	KataShim: {
		trees: []tree{kataTree},
		build: func(ctx context.Context, b *builder, roots []string, _, out string) error {
			rt := filepath.Join(roots[0], kataTree.clone, "src", "runtime")
			// The Makefile reads the commit from .git-commit when there
			// is no .git; it generates the shim's compiled-in defaults
			// and the remote hypervisor's configuration from its .in.
			if err := os.WriteFile(filepath.Join(rt, ".git-commit"), []byte(kataTree.rev+"\n"), 0o644); err != nil {
				return err
			}
			if err := b.run(ctx, rt, nil, "make", "pkg/katautils/config-settings.go", "config/"+RemoteConfig, "SKIP_GO_VERSION_CHECK=1"); err != nil {
				return err
			}
			if err := b.goCmd(ctx, rt, nil, "build", "-trimpath", "-buildvcs=false", "-ldflags", "-s -w",
				"-o", filepath.Join(out, ShimBin), "./cmd/"+ShimBin); err != nil {
				return err
			}
			return copyFile(filepath.Join(rt, "config", RemoteConfig), filepath.Join(out, RemoteConfig))
		},
	},
	KataAgent: {
		trees: []tree{kataTree},
		local: filepath.Join("test", "kataagent"),
		build: func(ctx context.Context, b *builder, roots []string, local, out string) error {
			// The module's go.mod, with kata's runtime module replaced by
			// the 4.1.0 tree, in a copy beside the build (-modfile), so
			// the repository's go.mod never names a local path.
			modfile := out + ".mod"
			defer os.Remove(modfile)
			defer os.Remove(out + ".sum")
			if err := copyFile(filepath.Join(local, "go.mod"), modfile); err != nil {
				return err
			}
			if err := copyFile(filepath.Join(local, "go.sum"), out+".sum"); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return err
			}
			rt := filepath.Join(roots[0], kataTree.clone, "src", "runtime")
			if err := b.goCmd(ctx, local, nil, "mod", "edit", "-modfile", modfile, "-replace", kataRuntimeModule+"="+rt); err != nil {
				return err
			}
			return b.goCmd(ctx, local, nil, "build", "-modfile", modfile, "-trimpath", "-buildvcs=false", "-ldflags", "-s -w",
				"-o", filepath.Join(out, AgentBin), ".")
		},
	},
}

// adaptorModule is the adaptor's module directory, its go.mod replacing
// kata's runtime module by the cf82bb35 tree (the version it requires; the
// module proxy does not serve it here).
func adaptorModule(ctx context.Context, b *builder, roots []string) (string, error) {
	mod := filepath.Join(roots[0], adaptorTree.clone, "src", "cloud-api-adaptor")
	rt := filepath.Join(roots[1], kataRuntimeTree.clone, "src", "runtime")
	return mod, b.goCmd(ctx, mod, nil, "mod", "edit", "-replace", kataRuntimeModule+"="+rt)
}

// built remembers each Kind's directory once found or built in this process.
var (
	buildMu sync.Mutex
	built   = map[Kind]string{}
)

// Build returns the directory holding kind's programs, building them from
// $UPSTREAM_SRC when the cache has no build of these sources yet. Progress
// goes to the standard logger: a cold build takes minutes.
func Build(ctx context.Context, kind Kind) (string, error) {
	r, ok := recipes[kind]
	if !ok {
		return "", fmt.Errorf("upstream: no build named %q (known: %s)", kind, kindNames())
	}
	buildMu.Lock()
	defer buildMu.Unlock()
	if dir, ok := built[kind]; ok {
		return dir, nil
	}
	src, err := srcDir()
	if err != nil {
		return "", err
	}
	keys := make([]string, len(r.trees))
	for i, t := range r.trees {
		if keys[i], err = t.key(src); err != nil {
			return "", err
		}
	}
	var local string
	h := sha256.New()
	fmt.Fprintf(h, "%s\n%s\n%s/%s\n%s\n", recipeVersion, kind, runtime.GOOS, runtime.GOARCH, strings.Join(keys, " "))
	if r.local != "" {
		if local, err = cluster.RepoDir(r.local); err != nil {
			return "", err
		}
		if err := hashTree(h, local); err != nil {
			return "", err
		}
	}
	cache, err := cluster.CacheDir()
	if err != nil {
		return "", err
	}
	dir := filepath.Join(cache, "upstream-"+string(kind)+"-"+hex.EncodeToString(h.Sum(nil))[:12])
	if isDir(dir) {
		built[kind] = dir
		return dir, nil
	}
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return "", fmt.Errorf("create e2e binary cache: %w", err)
	}
	unlock, err := cluster.LockBuilds(ctx, cache, func(holder string) {
		log.Printf("upstream: waiting for another process (%s) to finish building into %s", holder, cache)
	})
	if err != nil {
		return "", err
	}
	defer unlock()
	if isDir(dir) { // built by the process we waited for
		built[kind] = dir
		return dir, nil
	}
	roots := make([]string, len(r.trees))
	for i, t := range r.trees {
		if roots[i], err = t.extract(ctx, src, cache, keys[i]); err != nil {
			return "", err
		}
	}
	partial := fmt.Sprintf("%s.%d.partial", dir, os.Getpid())
	_ = os.RemoveAll(partial)
	if err := os.MkdirAll(partial, 0o755); err != nil {
		return "", err
	}
	logPath := dir + ".log"
	logFile, err := os.Create(logPath)
	if err != nil {
		return "", err
	}
	defer logFile.Close()
	b := &builder{kind: kind, log: logFile}
	ctx, cancel := context.WithTimeout(ctx, buildTimeout)
	defer cancel()
	start := time.Now()
	log.Printf("upstream: building %s from %s=%s (a cold build takes minutes; output in %s)", kind, SrcEnv, src, logPath)
	stop := ticker(kind, start)
	err = r.build(ctx, b, roots, local, partial)
	stop()
	if err != nil {
		_ = os.RemoveAll(partial)
		return "", fmt.Errorf("upstream: build %s from %s=%s: %w", kind, SrcEnv, src, err)
	}
	if err := os.Rename(partial, dir); err != nil {
		return "", fmt.Errorf("upstream: build %s: %w", kind, err)
	}
	log.Printf("upstream: built %s in %s: %s", kind, time.Since(start).Round(time.Second), dir)
	built[kind] = dir
	return dir, nil
}

// Check says whether $UPSTREAM_SRC names usable sources for kind, without
// building: nil, or an error naming the variable and what is missing.
func Check(kind Kind) error {
	r, ok := recipes[kind]
	if !ok {
		return fmt.Errorf("upstream: no build named %q (known: %s)", kind, kindNames())
	}
	src, err := srcDir()
	if err != nil {
		return err
	}
	for _, t := range r.trees {
		if _, err := t.key(src); err != nil {
			return err
		}
	}
	return nil
}

func kindNames() string {
	names := make([]string, len(Kinds))
	for i, k := range Kinds {
		names[i] = string(k)
	}
	return strings.Join(names, ", ")
}

// srcDir is $UPSTREAM_SRC, made absolute, or an error saying what to set.
func srcDir() (string, error) {
	src := os.Getenv(SrcEnv)
	if src == "" {
		return "", fmt.Errorf("%s is not set: point it at a directory holding the pinned source archives (%s, %s, %s) or clones named %s and %s of github.com/confidential-containers/cloud-api-adaptor and github.com/kata-containers/kata-containers holding commits %.8s, %.8s and %.8s (kata 4.1.0)",
			SrcEnv, adaptorTree.archive, kataRuntimeTree.archive, kataTree.archive, adaptorTree.clone, kataTree.clone,
			adaptorTree.rev, kataRuntimeTree.rev, kataTree.rev)
	}
	abs, err := filepath.Abs(src)
	if err != nil {
		return "", fmt.Errorf("%s=%s: %w", SrcEnv, src, err)
	}
	if !isDir(abs) {
		return "", fmt.Errorf("%s=%s is not a directory: point it at the directory of the pinned source archives or clones", SrcEnv, src)
	}
	return abs, nil
}

// key identifies the tree's sources: the archive's hash, or the pinned
// commit when it comes from a clone.
func (t tree) key(src string) (string, error) {
	archive := filepath.Join(src, t.archive)
	if f, err := os.Open(archive); err == nil {
		defer f.Close()
		h := sha256.New()
		if _, err := io.Copy(h, f); err != nil {
			return "", fmt.Errorf("%s: read %s: %w", SrcEnv, archive, err)
		}
		return "a" + hex.EncodeToString(h.Sum(nil))[:12], nil
	}
	clone := filepath.Join(src, t.clone)
	if !isDir(clone) {
		return "", fmt.Errorf("%s=%s holds neither %s nor a clone %s: put the pinned archive there, or clone the repository there", SrcEnv, src, t.archive, t.clone)
	}
	out, err := exec.Command("git", "-C", clone, "rev-parse", "--verify", "--quiet", t.rev+"^{commit}").Output()
	if err != nil {
		return "", fmt.Errorf("%s: the clone %s has no commit %s (git fetch it): %w", SrcEnv, clone, t.rev, err)
	}
	return "g" + strings.TrimSpace(string(out))[:12], nil
}

// extract unpacks the tree into the cache once (a directory named after
// its key) and returns that directory. The caller holds the build lock.
func (t tree) extract(ctx context.Context, src, cache, key string) (string, error) {
	dir := filepath.Join(cache, "src-"+t.name+"-"+key)
	if isDir(dir) {
		return dir, nil
	}
	partial := fmt.Sprintf("%s.%d.partial", dir, os.Getpid())
	_ = os.RemoveAll(partial)
	if err := os.MkdirAll(partial, 0o755); err != nil {
		return "", err
	}
	var err error
	if strings.HasPrefix(key, "a") {
		err = extractArchive(filepath.Join(src, t.archive), partial)
	} else {
		err = t.extractClone(ctx, filepath.Join(src, t.clone), partial)
	}
	if err != nil {
		_ = os.RemoveAll(partial)
		return "", fmt.Errorf("upstream: unpack %s: %w", t.name, err)
	}
	if err := os.Rename(partial, dir); err != nil {
		return "", err
	}
	return dir, nil
}

// extractClone writes the tree's paths at its commit with git archive.
func (t tree) extractClone(ctx context.Context, clone, dst string) error {
	args := append([]string{"-C", clone, "archive", "--prefix=" + t.clone + "/", t.rev}, t.paths...)
	cmd := exec.CommandContext(ctx, "git", args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("git %s: %w", strings.Join(args, " "), err)
	}
	untarErr := untar(out, dst)
	_, _ = io.Copy(io.Discard, out)
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("git %s: %w: %s", strings.Join(args, " "), err, stderr.String())
	}
	return untarErr
}

// builder runs the build's commands, their output to its log.
type builder struct {
	kind Kind
	log  io.Writer
}

// goCmd runs the go command in dir with the module proxy's modules (never a
// go.work elsewhere) and cgo off.
func (b *builder) goCmd(ctx context.Context, dir string, env []string, args ...string) error {
	goTool, err := exec.LookPath("go")
	if err != nil {
		return fmt.Errorf("the go command is not on PATH: %w", err)
	}
	env = append([]string{"CGO_ENABLED=0", "GOWORK=off", "GOFLAGS=-mod=mod"}, env...)
	return b.run(ctx, dir, env, goTool, args...)
}

// run runs one command of the build in its own process group, so that a
// timeout or the test's death ends its children too.
func (b *builder) run(ctx context.Context, dir string, env []string, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var out bytes.Buffer
	cmd.Stdout = io.MultiWriter(b.log, &out)
	cmd.Stderr = cmd.Stdout
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	fmt.Fprintf(b.log, "$ cd %s && %s %s\n", dir, name, strings.Join(args, " "))
	if err := cmd.Run(); err != nil {
		if ctxErr := ctx.Err(); ctxErr != nil {
			err = fmt.Errorf("%w (%w)", err, ctxErr)
		}
		err = fmt.Errorf("%s %s in %s: %w", filepath.Base(name), strings.Join(args, " "), dir, err)
		if out.Len() > 0 {
			err = fmt.Errorf("%w\n%s", err, cluster.LastLines(out.Bytes(), 30))
		}
		return err
	}
	return nil
}

// ticker logs that the build is still going, once a minute, until stopped.
func ticker(kind Kind, start time.Time) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(time.Minute)
		defer tick.Stop()
		for {
			select {
			case <-tick.C:
				log.Printf("upstream: still building %s (%s)", kind, time.Since(start).Round(time.Second))
			case <-done:
				return
			}
		}
	})
	return func() { close(done); wg.Wait() }
}

// hashTree adds every regular file under dir (names and contents, in
// order) to h.
func hashTree(h io.Writer, dir string) error {
	var files []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			files = append(files, path)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("hash %s: %w", dir, err)
	}
	slices.Sort(files)
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, f)
		fmt.Fprintf(h, "%s %d\n", rel, len(b))
		_, _ = h.Write(b)
	}
	return nil
}

func copyFile(from, to string) error {
	b, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	return os.WriteFile(to, b, 0o644)
}

func isDir(path string) bool {
	info, err := os.Stat(path)
	return err == nil && info.IsDir()
}
