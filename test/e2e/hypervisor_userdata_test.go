package e2e

import (
	"bytes"
	"compress/gzip"
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/pkg/sandbox"
	"github.com/caa-project/caa/test/e2e/cluster"
	katafake "github.com/caa-project/caa/test/mocks/kata"
)

// TestHypervisorPrivateImageAndInitDataAcrossARestart: a pod that pulls
// from a private registry (an image-pull secret named by the pod) and
// carries initdata in its annotation, gzip and base64 as users write it.
// The shim's CreateVM hands caa the decoded document; caa is SIGKILLed
// before StartVM, so the restarted caa has only the pod's encoded
// annotation. The VM still gets the document once decoded (upstream's
// process-user-data refuses it encoded twice) and the pod's credentials as
// /run/peerpod/auth.json, and the sandbox works.
func TestHypervisorPrivateImageAndInitDataAcrossARestart(t *testing.T) {
	t.Parallel()
	ctx, e := newHVEnv(t, 3*time.Minute)
	const ns, name = "vault", "private-0"
	const doc = "algorithm = \"sha384\"\nversion = \"0.1.0\"\n[data]\n\"policy.rego\" = \"e2e-restart-policy-51c2\"\n"
	encoded := gzipBase64(t, doc)
	client := e.c.Client()
	require.NoError(t, e.c.EnsureNamespace(ctx, ns))
	const registry = "registry.e2e.example:5000"
	creds := base64.StdEncoding.EncodeToString([]byte("robot:e2e-pull-password-9d1e"))
	cfgJSON, err := json.Marshal(map[string]any{"auths": map[string]any{registry: map[string]string{"auth": creds}}})
	require.NoError(t, err)
	_, err = client.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "regcred"}, Type: corev1.SecretTypeDockerConfigJson,
		Data: map[string][]byte{corev1.DockerConfigJsonKey: cfgJSON},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	rc := cluster.RuntimeClassName
	created, err := client.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{sandbox.AnnotationInitData: encoded}},
		Spec: corev1.PodSpec{NodeName: e.node, RuntimeClassName: &rc,
			ImagePullSecrets: []corev1.LocalObjectReference{{Name: "regcred"}},
			Containers:       []corev1.Container{{Name: "app", Image: registry + "/team/app:1"}}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	pod := e.podNetFor(t, ns, name)

	d := e.startReady(t)
	id := sandboxID(7)
	// kata's shim decodes the pod's annotation and sends the document.
	sock, err := e.shim.CreateVM(ctx, id, pod.annotations(map[string]string{sandbox.AnnotationInitData: doc}), pod.net.NSPath)
	require.NoError(t, err)
	d.kill(t)
	d = e.startReady(t)
	require.NoError(t, e.shim.StartVM(ctx, id), "failed boots: %v", e.fleet.Failed())

	vms := e.liveSandboxVMs(id)
	require.Len(t, vms, 1)
	vm := e.fleet.VM(vms[0].ID)
	require.NotNil(t, vm)
	assert.Equal(t, string(created.UID), vms[0].Tags[provider.TagPodUID])
	assert.Equal(t, doc, vm.Files.Config.InitData, "the VM got the document, decoded once, from the pod's annotation")
	var auth struct {
		Auths map[string]struct {
			Auth string `json:"auth"`
		} `json:"auths"`
	}
	require.NoError(t, json.Unmarshal(vm.Files.Config.AuthJSON, &auth), "the VM got the pod's credentials as an auth file")
	assert.Equal(t, creds, auth.Auths[registry].Auth)
	if vm.RunDir != "" {
		// Upstream's process-user-data took both.
		policy, err := os.ReadFile(filepath.Join(vm.RunDir, "policy.rego"))
		require.NoError(t, err)
		assert.Equal(t, "e2e-restart-policy-51c2", string(policy))
		onVM, err := os.ReadFile(filepath.Join(vm.RunDir, "auth.json"))
		require.NoError(t, err)
		assert.JSONEq(t, string(vm.Files.Config.AuthJSON), string(onVM))
	}
	require.NoError(t, katafake.CheckAgent(ctx, sock), "the agent answers through caa")
	assert.NotContains(t, d.logs.String(), "e2e-pull-password", "the credentials are in caa's logs")
	assert.NotContains(t, d.logs.String(), creds, "the credentials are in caa's logs")
	require.NoError(t, e.shim.StopVM(ctx, id))
	d.stop(t)
	raw, err := os.ReadFile(e.ledger)
	require.NoError(t, err)
	assert.False(t, bytes.Contains(raw, []byte(creds)), "the credentials are in the ledger (I7)")
}

// gzipBase64 is initdata as a pod's annotation carries it.
func gzipBase64(t *testing.T, doc string) string {
	t.Helper()
	var b bytes.Buffer
	w := gzip.NewWriter(&b)
	_, err := w.Write([]byte(doc))
	require.NoError(t, err)
	require.NoError(t, w.Close())
	return base64.StdEncoding.EncodeToString(b.Bytes())
}
