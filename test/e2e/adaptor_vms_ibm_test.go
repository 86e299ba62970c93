package e2e

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/IBM/go-sdk-core/v5/core"
	"github.com/IBM/vpc-go-sdk/vpcv1"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/pkg/adaptorvm"
	"github.com/caa-project/caa/test/e2e/cluster"
	vpcfake "github.com/caa-project/caa/test/mocks/ibmcloud"
)

// TestAdaptorVMsOnIBMCloud: collect on IBM Cloud VPC through the real
// binary, with the adaptor's instances made through the VPC API as the
// adaptor makes them (named podvm-…, caa's tags nowhere): the dead one is
// deleted; the live one, the untied one and the one a forged record ties
// to a pod alive on another node stay.
func TestAdaptorVMsOnIBMCloud(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	c := cluster.Start(ctx, t)
	fc := newIBMCloudFake(t)
	vpc, err := vpcv1.NewVpcV1(&vpcv1.VpcV1Options{URL: fc.url + "/v1",
		Authenticator: &core.IamAuthenticator{ApiKey: fc.secrets["API key"], URL: fc.url}})
	require.NoError(t, err)
	const node = "worker-1"
	for _, n := range []string{node, "worker-2"} {
		_, err := c.CreateNode(ctx, n)
		require.NoError(t, err)
	}
	for _, p := range []struct{ name, node string }{{"live", node}, {"elsewhere", "worker-2"}} {
		_, err := c.CreatePeerPod(ctx, "team", p.name, p.node, nil)
		require.NoError(t, err)
	}
	an := newAdaptorNode(t)
	seed := func(pod, sandbox string, at time.Time) string {
		name := adaptorvm.Name(pod, sandbox)
		in, _, err := vpc.CreateInstanceWithContext(ctx, &vpcv1.CreateInstanceOptions{InstancePrototype: &vpcv1.InstancePrototypeInstanceByImage{
			Name:    &name,
			Image:   &vpcv1.ImageIdentityByID{ID: ptrTo(ibmImage)},
			Profile: &vpcv1.InstanceProfileIdentityByName{Name: ptrTo(ibmProfile)},
			Zone:    &vpcv1.ZoneIdentityByName{Name: ptrTo(ibmZone)},
			VPC:     &vpcv1.VPCIdentityByID{ID: ptrTo(vpcfake.DefaultVPC)},
			PrimaryNetworkAttachment: &vpcv1.InstanceNetworkAttachmentPrototype{
				VirtualNetworkInterface: &vpcv1.InstanceNetworkAttachmentPrototypeVirtualNetworkInterfaceVirtualNetworkInterfacePrototypeInstanceNetworkAttachmentContext{
					AutoDelete: ptrTo(true), Subnet: &vpcv1.SubnetIdentityByID{ID: ptrTo(vpcfake.DefaultSubnet)},
				},
			},
			ResourceGroup: &vpcv1.ResourceGroupIdentityByID{ID: ptrTo(vpcfake.DefaultResourceGroup)},
		}})
		require.NoError(t, err, "seed %s", name)
		require.NoError(t, fc.core.Backdate(*in.ID, at))
		return *in.ID
	}
	an.record(t, sid("1111aaaa"), "team", "gone")
	dead := seed("gone", sid("1111aaaa"), time.Now().Add(-time.Hour))
	an.record(t, sid("2222bbbb"), "team", "live")
	live := seed("live", sid("2222bbbb"), time.Now())
	an.record(t, sid("5555eeee"), "team", "elsewhere")
	forged := seed("elsewhere", sid("5555eeee"), time.Now())
	untied := seed("stray", sid("7777aaaa"), time.Now().Add(-time.Hour))

	ledgerPath := filepath.Join(t.TempDir(), "caa", "ledger.db")
	d := startCloudDaemon(t, c, fc, node, ledgerPath,
		"--adaptor-pods-dir", an.pods, "--adaptor-kata-dir", an.kata, "--gc-grace", "2s", "--adaptor-vms", "collect")
	d.waitReady(t, func() {})
	require.Eventually(t, func() bool { in, err := fc.core.Get(dead); return err != nil || !in.State.Alive() }, time.Minute, 100*time.Millisecond,
		"the dead adaptor VM is deleted")
	for what, id := range map[string]string{"live": live, "forged": forged, "untied": untied} {
		assert.True(t, mustGet(t, fc.core, id).State.Alive(), "%s is kept", what)
	}
	snap := statusOf(t, d)
	require.NotNil(t, snap.AdaptorVMs)
	actions := map[string]string{}
	for _, vm := range snap.AdaptorVMs.VMs {
		actions[vm.ID] = vm.Action
	}
	assert.Equal(t, adaptorvm.ActionKeep, actions[live])
	assert.Equal(t, adaptorvm.ActionKeep, actions[forged])
	assert.Equal(t, adaptorvm.ActionReport, actions[untied])
	d.stop(t)
}

func ptrTo[T any](v T) *T { return &v }
