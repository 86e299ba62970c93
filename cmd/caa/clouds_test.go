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

func TestFindCloud(t *testing.T) {
	clouds := compiledClouds()
	require.Len(t, clouds, 3, "the default build has every cloud")
	assert.Equal(t, "aws, azure or ibmcloud", cloudNames(clouds))
	for _, name := range knownClouds {
		c, err := findCloud(clouds, name)
		require.NoError(t, err)
		assert.Equal(t, name, c.name)
	}
	_, err := findCloud(clouds, "gcp")
	assert.ErrorContains(t, err, `--provider "gcp": want aws, azure or ibmcloud`)
	_, err = findCloud(clouds[:1], "ibmcloud")
	assert.ErrorContains(t, err, "built without ibmcloud", "a known cloud left out of the build says so")

	// Each command gets settings of its own.
	a, b := compiledClouds(), compiledClouds()
	assert.NotSame(t, a[0], b[0])
}

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
