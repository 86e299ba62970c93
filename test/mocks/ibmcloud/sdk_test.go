package vpcfake_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/IBM/go-sdk-core/v5/core"
	"github.com/IBM/vpc-go-sdk/vpcv1"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/test/mocks/cloud"
	vpcfake "github.com/caa-project/caa/test/mocks/ibmcloud"
)

// TestOfficialSDK drives the fake with the VPC Go SDK as it ships, its
// IAM authenticator and its pager included; only the URLs change.
func TestOfficialSDK(t *testing.T) {
	c := cloud.New(cloud.Options{PageSize: 2, Images: []string{image}, Types: []string{profile}})
	srv := httptest.NewServer(vpcfake.NewServer(c, vpcfake.WithAPIKey(apiKey)))
	t.Cleanup(srv.Close)
	auth, err := core.NewIamAuthenticatorBuilder().SetApiKey(apiKey).SetURL(srv.URL).Build()
	require.NoError(t, err)
	vpc, err := vpcv1.NewVpcV1(&vpcv1.VpcV1Options{URL: srv.URL + "/v1", Authenticator: auth})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	var ids []string
	for _, name := range []string{"sdk-a", "sdk-b", "sdk-c"} {
		in, _, err := vpc.CreateInstanceWithContext(ctx, &vpcv1.CreateInstanceOptions{
			InstancePrototype: &vpcv1.InstancePrototypeInstanceByImage{
				Name:    core.StringPtr(name),
				Image:   &vpcv1.ImageIdentityByID{ID: core.StringPtr(image)},
				Profile: &vpcv1.InstanceProfileIdentityByName{Name: core.StringPtr(profile)},
				Zone:    &vpcv1.ZoneIdentityByName{Name: core.StringPtr("us-south-2")},
				PrimaryNetworkInterface: &vpcv1.NetworkInterfacePrototype{
					Subnet: &vpcv1.SubnetIdentityByID{ID: core.StringPtr("0727-subnet")},
				},
				BootVolumeAttachment: &vpcv1.VolumeAttachmentPrototypeInstanceByImageContext{
					Volume: &vpcv1.VolumePrototypeInstanceByImageContext{
						Profile:  &vpcv1.VolumeProfileIdentityByName{Name: core.StringPtr("10iops-tier")},
						UserTags: []string{"team:" + name},
					},
				},
			},
		})
		require.NoError(t, err)
		assert.Equal(t, name, *in.Name)
		assert.Equal(t, "us-south-2", *in.Zone.Name)
		assert.Equal(t, "0727-subnet", *in.PrimaryNetworkInterface.Subnet.ID)
		assert.NotEmpty(t, *in.PrimaryNetworkInterface.PrimaryIP.Address)
		assert.False(t, time.Time(*in.CreatedAt).IsZero())
		ids = append(ids, *in.ID)
	}

	pager, err := vpc.NewInstancesPager(&vpcv1.ListInstancesOptions{Limit: core.Int64Ptr(1)})
	require.NoError(t, err)
	all, err := pager.GetAllWithContext(ctx)
	require.NoError(t, err)
	var listed []string
	for _, in := range all {
		listed = append(listed, *in.ID)
	}
	assert.Equal(t, ids, listed, "the SDK's pager follows the fake's start tokens")

	vols, _, err := vpc.ListVolumesWithContext(ctx, &vpcv1.ListVolumesOptions{Tag: core.StringPtr("team:sdk-b")})
	require.NoError(t, err)
	require.Len(t, vols.Volumes, 1)
	assert.Equal(t, ids[1], *vols.Volumes[0].VolumeAttachments[0].Instance.ID)
	assert.Equal(t, "10iops-tier", *vols.Volumes[0].Profile.Name)
	assert.True(t, *vols.Volumes[0].VolumeAttachments[0].DeleteVolumeOnInstanceDelete, "the default for a boot volume")

	_, err = vpc.DeleteInstanceWithContext(ctx, &vpcv1.DeleteInstanceOptions{ID: &ids[1]})
	require.NoError(t, err)
	_, resp, err := vpc.GetInstanceWithContext(ctx, &vpcv1.GetInstanceOptions{ID: &ids[1]})
	require.Error(t, err)
	require.NotNil(t, resp)
	assert.Equal(t, http.StatusNotFound, resp.StatusCode)
	errs := resp.Result.(map[string]any)["errors"].([]any)
	assert.Equal(t, "not_found", errs[0].(map[string]any)["code"])
	assert.Len(t, c.Resources(""), 4, "two instances' boot volumes and interfaces remain")
	assert.Equal(t, int64(1), c.Counters()[vpcfake.OpIAMToken], "one token served every call")
}
