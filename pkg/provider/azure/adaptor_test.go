package azure_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/test/conformance"
	armfake "github.com/caa-project/caa/test/mocks/azure"
	"github.com/caa-project/caa/test/mocks/cloud"
)

// TestListAdaptorVMsFindsThePodvmNames: the resource group's VMs named
// podvm-… with no caa tags, each with its power state (read by name, as a
// list gives none): a running one, a stopped one; not caa's own, not other
// names, not a deleted one.
func TestListAdaptorVMsFindsThePodvmNames(t *testing.T) {
	e := newEnv(t, armfake.WithoutListInstanceView())
	mk := func(name string, tags map[string]string) string {
		t.Helper()
		in, err := e.Cloud.Create(cloud.CreateRequest{Name: name, UniqueName: true, Tags: tags,
			InstanceType: conformance.TypeSmall, Image: conformance.ImageGood})
		require.NoError(t, err)
		return in.ID
	}
	mk("podvm-web-a1b2c3d4", map[string]string{"team": "blue"})
	db := mk("podvm-db-0-b1b2c3d4", nil)
	require.NoError(t, e.Cloud.Stop(db))
	mk("bastion", nil)
	mk("podvm-caa-c1c2c3c4", conformance.Spec(1, "node-a").Tags())
	gone := mk("podvm-old-d1d2d3d4", nil)
	require.NoError(t, e.Cloud.Delete(gone))
	_, err := e.Provider.Create(e.ctx, conformance.Spec(2, "node-a"))
	require.NoError(t, err)

	lister, ok := e.Provider.(provider.AdaptorLister)
	require.True(t, ok)
	vms, err := lister.ListAdaptorVMs(e.ctx)
	require.NoError(t, err)
	got := map[string]provider.State{}
	for _, vm := range vms {
		got[vm.Name] = vm.State
	}
	assert.Equal(t, map[string]provider.State{"podvm-web-a1b2c3d4": provider.StateRunning, "podvm-db-0-b1b2c3d4": provider.StateStopped}, got)
}
