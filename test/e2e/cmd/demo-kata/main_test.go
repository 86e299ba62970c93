package main

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/test/e2e/cluster"
	"github.com/caa-project/caa/test/e2e/katanode"
	podvmfake "github.com/caa-project/caa/test/mocks/podvm"
)

// runMainEnv makes the test binary run the demo's main instead of the
// tests, so that TestDemoKata sees the exit status a user of make
// demo-kata sees.
const runMainEnv = "CAA_DEMO_KATA_RUN_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(runMainEnv) == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestDemoKata runs make demo-kata's program as make does (a process of
// its own, the caa binary built once) and checks its exit status and the
// lines that carry its claims; then runs it with faults during the upgrade
// (a pod VM killed, a cloud write) and checks that it fails, naming them.
func TestDemoKata(t *testing.T) {
	podvmfake.RequireNetNS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	bin := filepath.Join(t.TempDir(), "caa")
	require.NoError(t, cluster.BuildCaa(ctx, bin, "demo-test", "caa_aws"))

	t.Run("its claims hold and it exits 0", func(t *testing.T) {
		cmd := exec.CommandContext(ctx, os.Args[0], "-caa", bin)
		cmd.Env = append(os.Environ(), runMainEnv+"=1")
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		require.NoError(t, err, "make demo-kata's program exits 0; its output:\n%s", out.String())
		o := out.String()
		for _, want := range []string{
			"agent SERVING",
			"caa-v2 took_over from caa-v1",
			"missed: 0",
			"cloud writes during the upgrade: 0 (RunInstances 0, TerminateInstances 0)",
			"the cloud has no live VM",
			"done: 3 peer pods kept every health check",
		} {
			assert.Contains(t, o, want)
		}
		assert.Equal(t, 3, strings.Count(o, "agent SERVING"), "each sandbox's agent answers through the relay")
		assert.Equal(t, 3, strings.Count(o, "Terminated in the fake EC2"), "each VM terminated after StopVM")
		ledgerRows := slices.DeleteFunc(strings.Split(o, "\n"), func(l string) bool {
			return !strings.Contains(l, " demo ") || !strings.Contains(l, " Running ")
		})
		assert.Len(t, ledgerRows, 3, "caa ledger ls lists the three sandboxes Running:\n%s", o)
	})

	t.Run("a missed check or a cloud write during the upgrade fails it", func(t *testing.T) {
		var out bytes.Buffer
		err := run(ctx, &out, config{caa: bin, sandboxes: 2, period: 100 * time.Millisecond, timeout: time.Second,
			duringUpgrade: func(ctx context.Context, node *katanode.Node, ids []string) error {
				// The first sandbox's VM dies behind caa's back, and a
				// RunInstances reaches the fake EC2.
				vms := node.LiveSandboxVMs(ids[0])
				require.Len(t, vms, 1)
				require.NoError(t, node.Core.Kill(vms[0].ID))
				return postRunInstances(ctx, node)
			}})
		require.Error(t, err, "the demo fails; its output:\n%s", out.String())
		assert.Contains(t, err.Error(), "not seamless")
		assert.Contains(t, err.Error(), "sandbox "+sandboxID("web-0")[:12], "the missed checks are named")
		assert.Contains(t, err.Error(), "the upgrade wrote to the cloud")
		assert.NotContains(t, out.String(), "done:")
	})
}

// postRunInstances sends a RunInstances to the node's fake EC2 (from the
// node's namespace, where it listens); what it answers does not matter,
// the call was made.
func postRunInstances(ctx context.Context, node *katanode.Node) error {
	args := node.CloudArgs()
	i := slices.Index(args, "--aws-endpoint")
	if i < 0 {
		return fmt.Errorf("no --aws-endpoint in %v", args)
	}
	hc := &http.Client{Transport: &http.Transport{DialContext: podvmfake.DialIn(node.Net.NodeNS)}}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, args[i+1], strings.NewReader("Action=RunInstances&Version=2016-11-15"))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	return resp.Body.Close()
}
