package ibmcloud_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/pkg/provider/ibmcloud"
	"github.com/caa-project/caa/test/conformance"
)

// TestListAdaptorVMsFindsThePodvmNames: the VPC's instances named podvm-…
// (made through the VPC API as the adaptor makes them), not caa's own, not
// another VPC's, not other names.
func TestListAdaptorVMsFindsThePodvmNames(t *testing.T) {
	f := newFixture(t, nil)
	web, err := ibmcloud.CreateNamed(f.p, conformance.Spec(1, "node-a"), "podvm-web-a1b2c3d4")
	require.NoError(t, err)
	db, err := ibmcloud.CreateNamed(f.p, conformance.Spec(2, "node-a"), "podvm-db-0-b1b2c3d4")
	require.NoError(t, err)
	_, err = ibmcloud.CreateNamed(f.p, conformance.Spec(3, "node-a"), "bastion")
	require.NoError(t, err)
	_, err = f.p.Create(f.ctx, conformance.Spec(4, "node-a")) // caa's own
	require.NoError(t, err)
	other, err := ibmcloud.New(f.ctx, func() ibmcloud.Config {
		c := testConfig(f.url)
		c.VPCID = "r006-other-vpc"
		return c
	}())
	require.NoError(t, err)
	_, err = ibmcloud.CreateNamed(other, conformance.Spec(5, "node-a"), "podvm-elsewhere-c1c2c3c4")
	require.NoError(t, err)
	gone, err := ibmcloud.CreateNamed(f.p, conformance.Spec(6, "node-a"), "podvm-old-d1d2d3d4")
	require.NoError(t, err)
	require.NoError(t, f.p.Delete(f.ctx, gone))

	vms, err := f.p.ListAdaptorVMs(f.ctx)
	require.NoError(t, err)
	got := map[string]string{}
	for _, vm := range vms {
		got[vm.ID] = vm.Name
	}
	assert.Equal(t, map[string]string{web: "podvm-web-a1b2c3d4", db: "podvm-db-0-b1b2c3d4"}, got)
}
