package cluster

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
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
)

// CacheEnv names the environment variable that overrides the directory the
// built binaries are cached in (default: the user cache directory, that is
// $XDG_CACHE_HOME or ~/.cache, then caa-e2e).
const CacheEnv = "CAA_E2E_CACHE"

// buildTimeout bounds one `go build`; a cold kube-apiserver build takes about
// seven minutes on two idle cores, so this leaves room for a busy machine.
const buildTimeout = 45 * time.Minute

// Binaries are the paths of the binaries the harness runs: the control
// plane, kubectl (kustomize rendering and dry-runs) and kwok (fake nodes).
// A path is empty when OnlyEnv left that binary out.
type Binaries struct {
	Etcd              string
	APIServer         string
	ControllerManager string
	Scheduler         string
	Kubectl           string
	Kwok              string
}

// component is one binary built from a wrapper module in test/e2e/tools.
type component struct {
	name    string // binary name, and the prefix of its cache directory
	module  string // wrapper module directory under test/e2e/tools
	pin     string // the module whose required version names the build
	pkg     string // main package to build
	ldflags func(version string) string
	// cgo builds with CGO_ENABLED=1 (runc's nsenter is C); tags are the
	// build tags. Both are part of the cache key.
	cgo  bool
	tags string
}

var (
	etcdComponent = component{
		name:   "etcd",
		module: "etcd",
		pin:    "go.etcd.io/etcd/server/v3",
		pkg:    "go.etcd.io/etcd/server/v3",
		ldflags: func(string) string {
			return "-s -w"
		},
	}
	apiserverComponent = kubeComponent("kube-apiserver")
	kwokComponent      = component{
		name:   "kwok",
		module: "kwok",
		pin:    "sigs.k8s.io/kwok",
		pkg:    "sigs.k8s.io/kwok/cmd/kwok",
		ldflags: func(string) string {
			return "-s -w"
		},
	}
)

// kubeComponent is one command of the Kubernetes release pinned by the
// kubernetes wrapper module; every Kubernetes binary comes from that one
// module, so they are always the same release.
func kubeComponent(name string) component {
	return component{
		name:    name,
		module:  "kubernetes",
		pin:     "k8s.io/kubernetes",
		pkg:     "k8s.io/kubernetes/cmd/" + name,
		ldflags: kubeVersionLDFlags,
	}
}

// kubeVersionLDFlags stamps the release into component-base, as Kubernetes'
// own build does; without it the apiserver reports v0.0.0-master.
func kubeVersionLDFlags(version string) string {
	flags := []string{"-s", "-w"}
	set := func(name, value string) {
		flags = append(flags, "-X", "k8s.io/component-base/version."+name+"="+value)
	}
	set("gitVersion", version)
	if parts := strings.SplitN(strings.TrimPrefix(version, "v"), ".", 3); len(parts) >= 2 {
		set("gitMajor", parts[0])
		set("gitMinor", parts[1])
	}
	set("gitTreeState", "clean")
	return strings.Join(flags, " ")
}

// OnlyEnv names the environment variable that limits EnsureBinaries to some
// of the binaries: a comma-separated list of names (etcd, kube-apiserver,
// kube-controller-manager, kube-scheduler, kubectl, kwok). Unset or empty
// means every one, which the tests need. The demo sets it to the two servers
// it starts, so a first run builds neither the controllers, kubectl nor kwok.
const OnlyEnv = "CAA_E2E_BINARIES"

// target is one binary and the Binaries field its path goes to.
type target struct {
	c    component
	path *string
}

// targets lists every binary EnsureBinaries can build, in build order.
func (b *Binaries) targets() []target {
	return []target{
		{etcdComponent, &b.Etcd},
		{apiserverComponent, &b.APIServer},
		{kubeComponent("kube-controller-manager"), &b.ControllerManager},
		{kubeComponent("kube-scheduler"), &b.Scheduler},
		{kubeComponent("kubectl"), &b.Kubectl},
		{kwokComponent, &b.Kwok},
	}
}

// selected parses an OnlyEnv value into the set of names to build; nil
// means all of them.
func selected(only string) (map[string]bool, error) {
	if strings.TrimSpace(only) == "" {
		return nil, nil
	}
	var known []string
	for _, t := range (&Binaries{}).targets() {
		known = append(known, t.c.name)
	}
	want := map[string]bool{}
	for name := range strings.SplitSeq(only, ",") {
		name = strings.TrimSpace(name)
		if name == "" {
			continue
		}
		if !slices.Contains(known, name) {
			return nil, fmt.Errorf("%s=%q: no binary named %q (known: %s)", OnlyEnv, only, name, strings.Join(known, ", "))
		}
		want[name] = true
	}
	return want, nil
}

// ensureMu keeps one process from building twice at once; the file lock in
// the cache directory does the same across processes. ensured remembers
// each binary found or built, by name.
var (
	ensureMu sync.Mutex
	ensured  = map[string]string{}
)

// EnsureBinaries returns the binaries for the versions pinned in
// test/e2e/tools, building whichever is not in the cache yet with `go build`
// in its wrapper module: all of them, or only those named in $CAA_E2E_BINARIES
// (OnlyEnv); a binary left out has an empty path. Builds are serialised
// across processes by a lock file in the cache directory. Progress goes to
// the standard logger: a cold kube-apiserver build takes minutes.
func EnsureBinaries(ctx context.Context) (Binaries, error) {
	want, err := selected(os.Getenv(OnlyEnv))
	if err != nil {
		return Binaries{}, err
	}
	ensureMu.Lock()
	defer ensureMu.Unlock()
	var b Binaries
	var tools, cache string
	for _, e := range b.targets() {
		if want != nil && !want[e.c.name] {
			continue
		}
		if path, ok := ensured[e.c.name]; ok {
			*e.path = path
			continue
		}
		if tools == "" {
			if tools, err = toolsDir(); err != nil {
				return Binaries{}, err
			}
			if cache, err = cacheDir(); err != nil {
				return Binaries{}, err
			}
			if err := os.MkdirAll(cache, 0o755); err != nil {
				return Binaries{}, fmt.Errorf("create e2e binary cache: %w", err)
			}
		}
		if *e.path, err = e.c.ensure(ctx, cache, tools); err != nil {
			return Binaries{}, err
		}
		ensured[e.c.name] = *e.path
	}
	return b, nil
}

// ensure returns the cached binary of c, building it under the cache lock
// when it is missing.
func (c component) ensure(ctx context.Context, cache, tools string) (string, error) {
	modDir := filepath.Join(tools, c.module)
	version, key, err := c.identity(modDir)
	if err != nil {
		return "", err
	}
	dir := filepath.Join(cache, c.name+"-"+version+"-"+key)
	bin := filepath.Join(dir, c.name)
	if isFile(bin) {
		return bin, nil
	}

	unlock, err := lockFile(ctx, filepath.Join(cache, "build.lock"), func(holder string) {
		log.Printf("e2e: waiting for another process (%s) to finish building into %s", holder, cache)
	})
	if err != nil {
		return "", err
	}
	defer unlock()
	if isFile(bin) { // built by the process we waited for
		return bin, nil
	}
	if err := c.build(ctx, modDir, version, dir, bin); err != nil {
		return "", err
	}
	return bin, nil
}

// identity reads the pinned version from the wrapper's go.mod and hashes
// everything that decides the binary (go.mod, go.sum, flags, platform), so a
// changed wrapper gets a fresh cache entry instead of a stale binary.
func (c component) identity(modDir string) (version, key string, err error) {
	gomod, err := os.ReadFile(filepath.Join(modDir, "go.mod"))
	if err != nil {
		return "", "", fmt.Errorf("read %s wrapper module: %w", c.name, err)
	}
	gosum, err := os.ReadFile(filepath.Join(modDir, "go.sum"))
	if err != nil {
		return "", "", fmt.Errorf("read %s wrapper module: %w", c.name, err)
	}
	version = requiredVersion(gomod, c.pin)
	if version == "" {
		return "", "", fmt.Errorf("%s/go.mod requires no version of %s", modDir, c.pin)
	}
	h := sha256.New()
	parts := [][]byte{gomod, gosum, []byte(c.pkg), []byte(c.ldflags(version)), []byte(runtime.GOOS + "/" + runtime.GOARCH)}
	if c.cgo || c.tags != "" {
		// Only when set, so the keys of the binaries cached before these
		// fields existed stay the same.
		parts = append(parts, fmt.Appendf(nil, "cgo=%t tags=%s", c.cgo, c.tags))
	}
	for _, part := range parts {
		fmt.Fprintf(h, "%d\n", len(part))
		h.Write(part)
	}
	return version, hex.EncodeToString(h.Sum(nil))[:12], nil
}

// requiredVersion finds the version go.mod requires of module path, in a
// require block or a single require line.
func requiredVersion(gomod []byte, path string) string {
	for line := range strings.SplitSeq(string(gomod), "\n") {
		fields := strings.Fields(line)
		if len(fields) > 0 && fields[0] == "require" {
			fields = fields[1:]
		}
		if len(fields) >= 2 && fields[0] == path && strings.HasPrefix(fields[1], "v") {
			return fields[1]
		}
	}
	return ""
}

// build runs `go build` in the wrapper module and moves the result into place
// only once it is complete, so a killed build never leaves a binary behind.
func (c component) build(ctx context.Context, modDir, version, dir, bin string) error {
	goTool, err := exec.LookPath("go")
	if err != nil {
		return fmt.Errorf("build %s %s: the go command is not on PATH: %w", c.name, version, err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("build %s %s: %w", c.name, version, err)
	}
	partial := filepath.Join(dir, fmt.Sprintf(".%s.%d.partial", c.name, os.Getpid()))
	logPath := filepath.Join(dir, "build.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return fmt.Errorf("build %s %s: %w", c.name, version, err)
	}
	defer logFile.Close()

	ctx, cancel := context.WithTimeout(ctx, buildTimeout)
	defer cancel()
	args := []string{"build", "-trimpath", "-buildvcs=false", "-ldflags", c.ldflags(version)}
	if c.tags != "" {
		args = append(args, "-tags", c.tags)
	}
	args = append(args, "-o", partial, c.pkg)
	cmd := exec.CommandContext(ctx, goTool, args...)
	cmd.Dir = modDir
	// -mod=mod lets the go command fill a go.sum line the wrapper lacks
	// instead of failing; GOWORK=off keeps a go.work elsewhere from pulling
	// the wrapper into another build list.
	cgo := "CGO_ENABLED=0"
	if c.cgo {
		cgo = "CGO_ENABLED=1"
	}
	cmd.Env = append(os.Environ(), cgo, "GOWORK=off", "GOFLAGS=-mod=mod")
	var out bytes.Buffer
	cmd.Stdout = io.MultiWriter(logFile, &out)
	cmd.Stderr = cmd.Stdout
	// The go command and its compilers share a process group, so a timeout
	// ends them all; Pdeathsig ends the go command if this process dies
	// (a test timeout) so that it never outlives the lock it built under.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second

	start := time.Now()
	log.Printf("e2e: building %s %s in %s (a cold build of a Kubernetes binary takes minutes; output in %s)", c.name, version, modDir, logPath)
	stopTicker := make(chan struct{})
	var tickerDone sync.WaitGroup
	tickerDone.Go(func() {
		tick := time.NewTicker(time.Minute)
		defer tick.Stop()
		for {
			select {
			case <-tick.C:
				log.Printf("e2e: still building %s (%s)", c.name, time.Since(start).Round(time.Second))
			case <-stopTicker:
				return
			}
		}
	})
	err = cmd.Run()
	close(stopTicker)
	tickerDone.Wait()
	if err != nil {
		_ = os.Remove(partial)
		if ctxErr := ctx.Err(); ctxErr != nil {
			err = fmt.Errorf("%w (%w)", err, ctxErr)
		}
		err = fmt.Errorf("build %s %s: go %s in %s: %w", c.name, version, shellJoin(args), modDir, err)
		if out.Len() > 0 {
			err = fmt.Errorf("%w\n%s", err, LastLines(out.Bytes(), 30))
		}
		return err
	}
	if err := os.Rename(partial, bin); err != nil {
		return fmt.Errorf("build %s %s: %w", c.name, version, err)
	}
	log.Printf("e2e: built %s %s in %s: %s", c.name, version, time.Since(start).Round(time.Second), bin)
	return nil
}

// toolsDir locates test/e2e/tools: beside this source file when the test
// binary was built without -trimpath, else under the main module's root.
func toolsDir() (string, error) {
	dir, err := RepoDir(filepath.Join("test", "e2e", "tools", apiserverComponent.module))
	if err != nil {
		return "", err
	}
	return filepath.Dir(dir), nil
}

// RepoDir is the directory rel (holding a go.mod) of this repository:
// found beside this source file when it is on disk, else under the main
// module of the working directory.
func RepoDir(rel string) (string, error) {
	if _, file, _, ok := runtime.Caller(0); ok && filepath.IsAbs(file) {
		dir := filepath.Join(filepath.Dir(file), "..", "..", "..", rel)
		if isFile(filepath.Join(dir, "go.mod")) {
			return filepath.Clean(dir), nil
		}
	}
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("locate %s: go env GOMOD: %w", rel, err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", fmt.Errorf("locate %s: not inside the caa module (run from the repository)", rel)
	}
	dir := filepath.Join(filepath.Dir(gomod), rel)
	if !isFile(filepath.Join(dir, "go.mod")) {
		return "", fmt.Errorf("locate %s: no module at %s", rel, dir)
	}
	return dir, nil
}

func cacheDir() (string, error) {
	if dir := os.Getenv(CacheEnv); dir != "" {
		return filepath.Abs(dir)
	}
	base, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("e2e binary cache: %w (set %s)", err, CacheEnv)
	}
	return filepath.Join(base, "caa-e2e"), nil
}

// shellJoin quotes the arguments that hold spaces, for an error message a
// reader can paste into a shell.
func shellJoin(args []string) string {
	quoted := make([]string, len(args))
	for i, a := range args {
		if strings.ContainsAny(a, " \t") {
			a = "'" + a + "'"
		}
		quoted[i] = a
	}
	return strings.Join(quoted, " ")
}

func isFile(path string) bool {
	info, err := os.Stat(path)
	return err == nil && info.Mode().IsRegular()
}

// LastLines returns at most n trailing lines of b, for errors and logs.
func LastLines(b []byte, n int) string {
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
