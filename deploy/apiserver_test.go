package deploy_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/caa-project/caa/test/e2e/cluster"
)

// TestOnTheAPIServer runs the manifests against a real kube-apiserver:
// every kustomization passes a server-side dry-run (schema, defaulting,
// admission), and then caa runs under the base's ServiceAccount token
// (rbac_test.go). One cluster serves both.
func TestOnTheAPIServer(t *testing.T) {
	t.Parallel() // an apiserver of its own: its start-up and waits overlap the others'
	needBinaries(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	bin := kubectl(t)
	c := cluster.Start(ctx, t)
	// A dry-run creates nothing, so the namespaced objects would find no
	// namespace; a real cluster has it from the first apply.
	require.NoError(t, c.EnsureNamespace(ctx, namespace))

	t.Run("dry-run", func(t *testing.T) {
		renders := map[string][]byte{}
		for _, k := range kustomizations {
			renders[k] = render(t, bin, k)
		}
		for _, component := range components {
			for overlay := range providerOf {
				renders[overlay+"+"+component] = withComponent(t, bin, overlay, component)
			}
		}
		for k, rendered := range renders {
			out, err := runKubectl(ctx, bin, rendered, "--kubeconfig", c.Kubeconfig(),
				"apply", "--server-side", "--dry-run=server", "--field-manager=caa-deploy-test", "-f", "-")
			require.NoError(t, err, "%s is refused by the apiserver", k)
			for _, obj := range []string{"daemonset.apps/caa", "clusterrole.rbac.authorization.k8s.io/caa", "serviceaccount/caa"} {
				assert.Contains(t, string(out), obj+" serverside-applied (server dry run)", "%s", k)
			}
		}
		// The dry-run left nothing behind...
		_, err := c.Client().AppsV1().DaemonSets(namespace).Get(ctx, "caa", metav1.GetOptions{})
		assert.True(t, apierrors.IsNotFound(err), "a dry-run creates no DaemonSet: %v", err)
		// ...and it does judge: the same DaemonSet with maxSurge 0 as well
		// as maxUnavailable 0 (a rollout that could never progress) is
		// refused by the apiserver's validation.
		aws := string(render(t, bin, "overlays/aws"))
		require.Contains(t, aws, "maxSurge: 1")
		broken := strings.Replace(aws, "maxSurge: 1", "maxSurge: 0", 1)
		_, err = runKubectl(ctx, bin, []byte(broken), "--kubeconfig", c.Kubeconfig(),
			"apply", "--server-side", "--dry-run=server", "--field-manager=caa-deploy-test", "-f", "-")
		require.Error(t, err, "the dry-run accepted a DaemonSet whose rollout cannot progress")
		assert.Contains(t, err.Error(), "maxUnavailable")
	})

	t.Run("rbac", func(t *testing.T) {
		runUnderServiceAccount(ctx, t, c, bin)
	})
}
