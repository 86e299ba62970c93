package aws

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/test/conformance"
	"github.com/caa-project/caa/test/mocks/cloud"
)

// TestListAdaptorVMsFindsThePodvmNames: the adaptor's instances (Name tag
// podvm-…, no caa tags) and only those, in one filtered listing; caa's own
// VMs, other instances, a name with podvm- inside it and terminated ones
// are left out.
func TestListAdaptorVMsFindsThePodvmNames(t *testing.T) {
	ctx := context.Background()
	f := newFakeEC2(t, suiteOptions(), nil)
	mk := func(tags map[string]string) string {
		t.Helper()
		in, err := f.cloud.Create(cloud.CreateRequest{Tags: tags, InstanceType: conformance.TypeSmall, Image: conformance.ImageGood})
		require.NoError(t, err)
		return in.ID
	}
	want := map[string]string{
		mk(map[string]string{"Name": "podvm-web-a1b2c3d4"}):                  "podvm-web-a1b2c3d4",
		mk(map[string]string{"Name": "podvm-db-0-b1b2c3d4", "team": "blue"}): "podvm-db-0-b1b2c3d4",
	}
	caaTags := conformance.Spec(1, "node-a").Tags()
	caaTags["Name"] = "podvm-looks-like-it-c1c2c3c4" // caa's tags win: caa's own VM
	mk(caaTags)
	mk(map[string]string{"Name": "bastion"})
	mk(map[string]string{"Name": "my-podvm-web-a1b2c3d4"})
	mk(nil)
	gone := mk(map[string]string{"Name": "podvm-old-d1d2d3d4"})
	require.NoError(t, f.cloud.Delete(gone))

	f.cloud.ResetCounters()
	vms, err := f.provider.ListAdaptorVMs(ctx)
	require.NoError(t, err)
	got := map[string]string{}
	for _, vm := range vms {
		got[vm.ID] = vm.Name
	}
	assert.Equal(t, want, got)
	assert.Equal(t, int64(1), f.cloud.Counters()[cloud.OpList], "one listing")
}
