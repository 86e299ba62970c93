package e2e

import (
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
	t.Parallel()
	ctx := testContext(t, 10*time.Minute)
	c := cluster.Start(ctx, t)
	fc := newIBMCloudFake(t)
	vpc, err := vpcv1.NewVpcV1(&vpcv1.VpcV1Options{URL: fc.url + "/v1",
		Authenticator: &core.IamAuthenticator{ApiKey: fc.secrets["API key"], URL: fc.url}})
	require.NoError(t, err)
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
	d, vms := adaptorCollect(ctx, t, c, fc, an, seed)
	snap := statusOf(t, d)
	require.NotNil(t, snap.AdaptorVMs)
	actions := map[string]string{}
	for _, vm := range snap.AdaptorVMs.VMs {
		actions[vm.ID] = vm.Action
	}
	assert.Equal(t, adaptorvm.ActionKeep, actions[vms.live])
	assert.Equal(t, adaptorvm.ActionKeep, actions[vms.forged])
	assert.Equal(t, adaptorvm.ActionReport, actions[vms.untied])
	d.stop(t)
}

func ptrTo[T any](v T) *T { return &v }
