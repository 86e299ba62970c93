package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestBuildWithOneCloud builds caa with only the AWS provider (the build
// tag make build CLOUDS=aws passes) and checks the other clouds are gone
// from its flags and refused by name.
func TestBuildWithOneCloud(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: builds a binary")
	}
	bin := filepath.Join(t.TempDir(), "caa-aws")
	build := exec.Command("go", "build", "-tags", "caa_aws", "-o", bin, ".")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "build with -tags caa_aws: %s", out)

	run := func(args ...string) (int, string, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Env = append(os.Environ(), "CAA_PROVIDER=", "NODE_NAME=")
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		code := 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		} else {
			require.NoError(t, err)
		}
		return code, stdout.String(), stderr.String()
	}

	code, help, _ := run("run", "--help")
	require.Zero(t, code)
	assert.Contains(t, help, "--aws-region")
	assert.Contains(t, help, "cloud provider: aws (env CAA_PROVIDER)")
	assert.NotContains(t, help, "--azure-")
	assert.NotContains(t, help, "--ibmcloud-")

	code, stdout, stderr := run("run", "--provider", "azure", "--node-name", "n")
	assert.Equal(t, 2, code, "a provider left out of the build is a usage error; stderr: %s", stderr)
	assert.Empty(t, stdout)
	assert.Contains(t, stderr, "built without azure")
}
