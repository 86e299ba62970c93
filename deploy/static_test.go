package deploy_test

import (
	"context"
	"debug/elf"
	"os/exec"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestStaticBuild runs the build `make image` puts in the image (`make
// static`) for the image an overlay deploys (CLOUDS=aws), and checks the
// result is a static ELF that runs, carries the version and holds that
// cloud only. internal/imagebuild's tests read the image itself back.
func TestStaticBuild(t *testing.T) {
	t.Parallel() // waits on caa's link, which the apiserver tests need not wait for
	needBinaries(t)
	const version = testVersion
	bin := repoCaa(t, "aws")

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

// TestSettingsAreCaaFlags checks that every setting the manifests pass
// to caa (ConfigMap keys and the container's env) is an environment
// variable `caa run --help` names, so a misspelt key cannot be silently
// ignored. Each overlay is checked against its own cloud's build, the one
// its image holds (the base against the every-cloud build).
func TestSettingsAreCaaFlags(t *testing.T) {
	t.Parallel() // waits on caa's link, which the apiserver tests need not wait for
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
