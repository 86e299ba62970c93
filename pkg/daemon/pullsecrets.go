package daemon

import (
	"fmt"

	"k8s.io/client-go/kubernetes"

	"github.com/caa-project/caa/internal/cli"
	"github.com/caa-project/caa/pkg/sandbox"
)

// checkPullSecrets makes the client of --pull-secrets-kubeconfig, so that a
// missing or unreadable kubeconfig stops caa at start with the flag's name
// rather than leaving every VM without credentials.
func (h *hypervisorFlags) checkPullSecrets() error {
	if !h.pullSecrets || h.pullKubeconfig == "" {
		return nil
	}
	client, err := cli.KubeClient(h.pullKubeconfig, "caa-pull-secrets", 5)
	if err != nil {
		return fmt.Errorf("--pull-secrets-kubeconfig %s: %w: mount the node's kubelet kubeconfig (and the certificate files it names) "+
			"read-only at that path, or set --pull-secrets=false", h.pullKubeconfig, err)
	}
	h.pullAsNode = sandbox.KubePullSecrets{Client: client, AsNode: true}
	return nil
}

// pullSecretsSource is where the VMs' image-pull credentials come from:
// the node's own identity when --pull-secrets-kubeconfig is set (what the
// node's kubelet may read, no more: docs/design.md, "Image-pull
// credentials"), else caa's own client.
func (h *hypervisorFlags) pullSecretsSource(own kubernetes.Interface) sandbox.PullSecrets {
	if h.pullAsNode != nil {
		return h.pullAsNode
	}
	return sandbox.KubePullSecrets{Client: own}
}
