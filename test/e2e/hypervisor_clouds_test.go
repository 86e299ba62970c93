package e2e

import (
	"testing"
	"time"

	"github.com/caa-project/caa/test/e2e/cluster"
	podvmfake "github.com/caa-project/caa/test/mocks/podvm"
)

// TestHypervisorOnAzureAndIBMCloud is kata's life of a sandbox on the two
// clouds whose pod VMs read their user data another way than EC2's: Azure's
// VM reads compute/userData from its instance metadata (the VM's
// properties.userData; custom data never reaches it) and IBM Cloud's reads
// the cidata volume. The real SDK providers against the fakes; one
// apiserver, one node and cloud network per cloud.
func TestHypervisorOnAzureAndIBMCloud(t *testing.T) {
	serial(t, "it asserts StopVM answers within kata's one second, a latency other tests' load would stretch")
	ctx := testContext(t, 4*time.Minute)
	c := cluster.Start(ctx, t)
	for i, name := range []string{"azure", "ibmcloud"} {
		t.Run(name, func(t *testing.T) {
			e := newHVEnvIn(ctx, t, c, podvmfake.NewCloudNetwork(t), "worker-"+name, name)
			pod := e.newPod(ctx, t, "shop", "web-"+name, nil)
			d := e.startReady(t)
			e.serveOnePod(ctx, t, pod, sandboxID(100+i))
			d.stop(t)
		})
	}
}
