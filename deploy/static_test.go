package deploy_test

import (
	"bufio"
	"context"
	"debug/elf"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestStaticBuild runs the build the Dockerfile runs (`make static`) from a
// copy of exactly the files .dockerignore lets into the build context, for
// the image an overlay deploys (CLOUDS=aws), and checks the result is a
// static ELF that runs, carries the version and holds that cloud only.
func TestStaticBuild(t *testing.T) {
	needBinaries(t)
	root := repoRoot(t)
	checkDockerfile(t, root)

	buildContext := t.TempDir()
	copied := copyBuildContext(t, root, buildContext)
	require.Contains(t, copied, "go.mod")
	require.Contains(t, copied, "Makefile")

	const version = testVersion
	bin := buildCaa(t, buildContext, t.TempDir(), version, "aws")

	f, err := elf.Open(bin)
	require.NoError(t, err)
	defer f.Close()
	for _, p := range f.Progs {
		assert.NotEqual(t, elf.PT_INTERP, p.Type, "a static binary asks for no dynamic loader")
		assert.NotEqual(t, elf.PT_DYNAMIC, p.Type, "a static binary has no dynamic section")
	}
	libs, err := f.ImportedLibraries()
	require.NoError(t, err)
	assert.Empty(t, libs, "no DT_NEEDED libraries")

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "version").CombinedOutput()
	require.NoError(t, err, "caa version:\n%s", out)
	assert.Equal(t, "caa "+version+"\n", string(out), "VERSION reaches the binary")

	// CLOUDS reaches the build: the EC2-only binary knows no Azure.
	run := exec.CommandContext(ctx, bin, "run", "--provider", "azure", "--node-name", "n")
	run.Env = []string{} // no CAA_* of the caller's
	out, err = run.CombinedOutput()
	require.Error(t, err, "an EC2-only caa started with --provider azure:\n%s", out)
	assert.Contains(t, string(out), "built without azure", "the EC2-only build says Azure was left out")
}

// checkDockerfile guards against drift: the builder stage builds with make
// static into the path the final stage copies, on the minimal non-root base.
func checkDockerfile(t *testing.T, root string) {
	raw, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	require.NoError(t, err)
	text := string(raw)
	build := regexp.MustCompile(`(?m)make static VERSION="\$VERSION" STATIC_OUT=(\S+)\s*$`).FindStringSubmatch(text)
	require.NotNil(t, build, "the Dockerfile builds caa with `make static`")
	assert.Contains(t, text, "COPY --from=build "+build[1]+" /usr/local/bin/caa", "the image takes the binary make static built")
	assert.Regexp(t, `(?m)^FROM gcr\.io/distroless/static-debian\d+:nonroot$`, text)
	assert.Regexp(t, `(?m)^ARG VERSION=`, text)
	// The per-cloud images: the CLOUDS build argument reaches make static.
	assert.Regexp(t, `(?m)^ARG CLOUDS=`, text)
	assert.Regexp(t, `CLOUDS="\$CLOUDS" [^\n]*make static `, text, "the builder passes CLOUDS to make static")
	assert.Regexp(t, `(?m)^USER 65532`, text)
}

// copyBuildContext copies into dst the files of root that .dockerignore
// admits, and returns their relative paths. It understands the allow-list
// form the file uses (everything excluded, then `!/path` re-included, then
// `**/name` excluded anywhere) and fails on anything else, so a change to
// .dockerignore has to come with a change here.
func copyBuildContext(t *testing.T, root, dst string) []string {
	t.Helper()
	f, err := os.Open(filepath.Join(root, ".dockerignore"))
	require.NoError(t, err)
	defer f.Close()
	var include, exclude []string
	first := true
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#"):
			continue
		case first:
			require.Equal(t, "*", line, ".dockerignore starts by excluding everything")
		case strings.HasPrefix(line, "!/"):
			include = append(include, strings.TrimSuffix(strings.TrimPrefix(line, "!/"), "/"))
		case strings.HasPrefix(line, "**/"):
			exclude = append(exclude, strings.TrimSuffix(strings.TrimPrefix(line, "**/"), "/"))
		default:
			t.Fatalf(".dockerignore: pattern %q is not one this test understands", line)
		}
		first = false
	}
	require.NoError(t, sc.Err())
	excluded := func(name string) bool {
		for _, pat := range exclude {
			if ok, _ := filepath.Match(pat, name); ok {
				return true
			}
		}
		return false
	}

	var copied []string
	for _, top := range include {
		err := filepath.WalkDir(filepath.Join(root, top), func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if excluded(d.Name()) {
				if d.IsDir() {
					return filepath.SkipDir
				}
				return nil
			}
			rel, err := filepath.Rel(root, path)
			if err != nil {
				return err
			}
			target := filepath.Join(dst, rel)
			if d.IsDir() {
				return os.MkdirAll(target, 0o755)
			}
			data, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			copied = append(copied, rel)
			return os.WriteFile(target, data, 0o644)
		})
		require.NoError(t, err, "copy %s of the build context", top)
	}
	return copied
}

// TestSettingsAreCaaFlags checks that every setting the manifests pass
// to caa (ConfigMap keys and the container's env) is an environment
// variable `caa run --help` names, so a misspelt key cannot be silently
// ignored. Each overlay is checked against its own cloud's build, the one
// its image holds (the base against the every-cloud build).
func TestSettingsAreCaaFlags(t *testing.T) {
	needBinaries(t)
	for name, m := range renderAll(t) {
		bin := repoCaa(t, providerOf[name])
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		help, err := exec.CommandContext(ctx, bin, "run", "--help").CombinedOutput()
		cancel()
		require.NoError(t, err, "caa run --help:\n%s", help)
		known := map[string]bool{}
		for _, v := range regexp.MustCompile(`\b[A-Z][A-Z0-9_]*[A-Z0-9]\b`).FindAllString(string(help), -1) {
			known[v] = true
		}
		require.True(t, known["CAA_PROVIDER"] && known["NODE_NAME"], "the help names the environment variables:\n%s", help)
		cm := m.configMap(t)
		require.NotEmpty(t, cm.Data, name)
		for k := range cm.Data {
			assert.True(t, known[k], "%s: ConfigMap key %s is no variable caa reads", name, k)
		}
		for _, e := range container(t, m.daemonSet(t)).Env {
			assert.True(t, known[e.Name], "%s: env %s is no variable caa reads", name, e.Name)
		}
	}
}
