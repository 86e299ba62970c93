package daemon

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	kubefake "k8s.io/client-go/kubernetes/fake"

	"github.com/caa-project/caa/pkg/pki"
	"github.com/caa-project/caa/pkg/sandbox"
)

// TestPullSecretsKubeconfig: --pull-secrets-kubeconfig makes caa read the
// pull secrets as the node (AsNode, with the kubeconfig's client, not
// caa's own); a kubeconfig that cannot be loaded stops the start naming the
// flag; without it caa's own client reads them.
func TestPullSecretsKubeconfig(t *testing.T) {
	on := hypervisorFlags{socket: "/run/peerpod/hypervisor.sock", nodeIP: "10.0.0.4", startLimit: time.Minute,
		readyBound: defaultSandboxReady, clientTTL: pki.DefaultClientTTL, pullSecrets: true}
	own := kubefake.NewClientset()

	plain := on
	require.NoError(t, plain.check())
	assert.Equal(t, sandbox.KubePullSecrets{Client: own}, plain.pullSecretsSource(own), "no kubeconfig: caa's own client")

	missing := on
	missing.pullKubeconfig = filepath.Join(t.TempDir(), "kubeconfig")
	assert.ErrorContains(t, missing.check(), "--pull-secrets-kubeconfig "+missing.pullKubeconfig)

	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	require.NoError(t, os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://apiserver.example:6443", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: node-token}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`), 0o600))
	node := on
	node.pullKubeconfig = kubeconfig
	require.NoError(t, node.check())
	src, ok := node.pullSecretsSource(own).(sandbox.KubePullSecrets)
	require.True(t, ok)
	assert.True(t, src.AsNode, "read as the node: the pod's secrets only")
	assert.NotSame(t, own, src.Client, "the kubeconfig's client, not caa's own")

	off := node
	off.pullSecrets = false
	off.pullAsNode = nil
	require.NoError(t, off.check(), "--pull-secrets=false reads no kubeconfig")
}
