package main

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// peerPodsCM writes a directory laid out as a mounted ConfigMap volume.
func peerPodsCM(t *testing.T, keys map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for k, v := range keys {
		require.NoError(t, os.WriteFile(filepath.Join(dir, k), []byte(v), 0o644))
	}
	return dir
}

// TestRunReadsTheAdaptorsConfigMap starts the binary with upstream's
// peer-pods-cm as a directory and reads back, from its log, what each flag
// holds once the mapping is applied: the keys' values, upstream's defaults
// for absent keys, and the flag given on the command line kept over the
// ConfigMap. (It then stops at the missing kubeconfig, before any cloud.)
func TestRunReadsTheAdaptorsConfigMap(t *testing.T) {
	cm := peerPodsCM(t, map[string]string{"CLOUD_PROVIDER": "aws", "AWS_REGION": "eu-west-1", "AWS_SUBNET_ID": "subnet-cm",
		"PODVM_AMI_ID": "ami-1", "AWS_SG_IDS": "sg-1,sg-2", "PEERPODS_LIMIT_PER_NODE": "7", "VXLAN_PORT": "4789"})
	state := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, caaBin, "run", "--adaptor-config-dir", cm, "--aws-subnet-id", "subnet-flag",
		"--ledger", filepath.Join(state, "ledger.db"), "--agent-socket-dir", filepath.Join(state, "pods"),
		"--health-addr", "127.0.0.1:0", "--log-format", "json")
	cmd.Env = append(os.Environ(), "NODE_NAME=n1", "NODE_IP=10.0.0.1", "KUBECONFIG="+filepath.Join(state, "missing"),
		"CAA_PROVIDER=", "CAA_AWS_REGION=", "CAA_AWS_SUBNET_ID=", "CAA_AWS_IMAGE=", "CAA_MAX_POD_VMS=", "CAA_HYPERVISOR_SOCKET=")
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	got := map[string]string{}
	sc := bufio.NewScanner(stderr)
	for sc.Scan() {
		var line map[string]any
		require.NoError(t, json.Unmarshal(sc.Bytes(), &line), "%s", sc.Text())
		if line["msg"] == "adaptor setting" {
			if flag, ok := line["flag"].(string); ok {
				got[flag] = line["value"].(string)
			}
		}
	}
	err = cmd.Wait()
	require.NoError(t, ctx.Err())
	require.Error(t, err, "caa stops at the missing kubeconfig")
	assert.Equal(t, map[string]string{
		"--provider":               "aws",
		"--aws-region":             "eu-west-1",
		"--aws-subnet-id":          "subnet-flag", // the flag given wins
		"--aws-image":              "ami-1",
		"--aws-security-group-ids": "[sg-1,sg-2]",
		"--aws-instance-type":      "m6a.large", // upstream's default
		"--max-pod-vms":            "7",
		"--hypervisor-socket":      "/run/peerpod/hypervisor.sock", // upstream's default
	}, got)
}

// TestRunRefusesAnUnknownAdaptorKey: a key caa does not know, or one it
// cannot honour, stops caa before it starts, named in its one-line error.
func TestRunRefusesAnUnknownAdaptorKey(t *testing.T) {
	cm := peerPodsCM(t, map[string]string{"CLOUD_PROVIDER": "aws", "AWS_REGOIN": "eu-west-1", "TUNNEL_TYPE": "peerpod"})
	r := caa(t, "run", "--adaptor-config-dir", cm)
	oneLineError(t, r, exitUsage, `AWS_REGOIN="eu-west-1": unknown`, `TUNNEL_TYPE="peerpod": unsupported: caa makes VXLAN tunnels only`)
}
