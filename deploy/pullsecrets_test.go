package deploy_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/caa-project/caa/internal/cli"
	"github.com/caa-project/caa/pkg/sandbox"
	"github.com/caa-project/caa/test/e2e/cluster"
)

// TestPullSecretsOnlyAsTheNode (issue 42.1), on a real kube-apiserver with
// the Node authorizer: caa reads a pod VM's image-pull secret with its
// node's kubelet identity (a client certificate for system:node:node-a,
// named by path from a kubeconfig as a kubelet's is), which reaches the
// secret of a pod bound to node A and not that of a pod on node B; and
// caa's own ServiceAccount, with every role deploy/ and the kata component
// give it, reads no secret at all.
func TestPullSecretsOnlyAsTheNode(t *testing.T) {
	t.Parallel() // an apiserver of its own: its start-up and waits overlap the others'
	needBinaries(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	c := cluster.Start(ctx, t)
	require.NoError(t, c.EnsureNamespace(ctx, namespace))
	files := []string{"base/serviceaccount.yaml", "base/rbac.yaml"}
	kata, err := filepath.Glob(filepath.Join(deployDir(t), "components/kata-remote-hypervisor/*.yaml"))
	require.NoError(t, err)
	for _, f := range kata {
		if filepath.Base(f) != "kustomization.yaml" {
			files = append(files, strings.TrimPrefix(f, deployDir(t)+string(os.PathSeparator)))
		}
	}
	for _, f := range files {
		createAll(ctx, t, c.Client(), f)
	}

	client := c.Client()
	creds := map[string]string{}
	pods := map[string]*corev1.Pod{}
	for _, n := range []string{"a", "b"} {
		node, ns := "node-"+n, "team-"+n
		_, err := c.CreateNode(ctx, node)
		require.NoError(t, err)
		require.NoError(t, c.EnsureNamespace(ctx, ns))
		creds[n] = base64.StdEncoding.EncodeToString([]byte("robot-" + n + ":pull-password-" + n))
		cfg, err := json.Marshal(map[string]any{"auths": map[string]any{"registry-" + n + ".example": map[string]string{"auth": creds[n]}}})
		require.NoError(t, err)
		_, err = client.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: "regcred"}, Type: corev1.SecretTypeDockerConfigJson,
			Data: map[string][]byte{corev1.DockerConfigJsonKey: cfg},
		}, metav1.CreateOptions{})
		require.NoError(t, err)
		rc := cluster.RuntimeClassName
		pods[n], err = client.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "peer-" + n},
			Spec: corev1.PodSpec{NodeName: node, RuntimeClassName: &rc,
				ImagePullSecrets: []corev1.LocalObjectReference{{Name: "regcred"}},
				Containers:       []corev1.Container{{Name: "app", Image: "registry-" + n + ".example/app:1"}}},
		}, metav1.CreateOptions{})
		require.NoError(t, err)
	}

	kubeconfig, err := c.NodeKubeconfig("node-a")
	require.NoError(t, err)
	asNodeA, err := cli.KubeClient(kubeconfig, "caa-pull-secrets", 5)
	require.NoError(t, err)
	ks := sandbox.KubePullSecrets{Client: asNodeA, AsNode: true}

	// The Node authorizer learns pods' bindings from its informers: poll
	// until node A may read its own pod's secret.
	var auth []byte
	require.NoError(t, wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		auth, err = ks.AuthJSON(ctx, "team-a", "peer-a", string(pods["a"].UID))
		return err == nil, nil
	}), "node A reads its own pod's pull secret: %v", err)
	assert.Contains(t, string(auth), creds["a"])

	_, err = ks.AuthJSON(ctx, "team-b", "peer-b", string(pods["b"].UID))
	require.Error(t, err, "node A reads node B's pod's pull secret")
	assert.True(t, apierrors.IsForbidden(err), "%v", err)
	_, err = asNodeA.CoreV1().Secrets("team-b").Get(ctx, "regcred", metav1.GetOptions{})
	assert.True(t, apierrors.IsForbidden(err), "node A reads node B's pod's secret by name: %v", err)

	// caa's own token, bound to its pod on node A as the kubelet gives it.
	own := boundClient(ctx, t, c, "caa", "caa-node-a", "node-a")
	for _, n := range []string{"a", "b"} {
		_, err := own.CoreV1().Secrets("team-"+n).Get(ctx, "regcred", metav1.GetOptions{})
		assert.True(t, apierrors.IsForbidden(err), "caa's own ServiceAccount reads team-%s's secret: %v", n, err)
	}
	_, err = sandbox.KubePullSecrets{Client: own}.AuthJSON(ctx, "team-b", "peer-b", string(pods["b"].UID))
	assert.Error(t, err, "caa's own ServiceAccount reads a pod's pull secrets")
}
