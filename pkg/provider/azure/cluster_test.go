package azure_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/test/conformance"
	armfake "github.com/caa-project/caa/test/mocks/azure"
)

// TestListClusterIsOneGraphQuery: every caa VM of the cluster, whatever its
// node, from one Resource Graph query (paged); VMs of another cluster are
// filtered out by the query itself.
func TestListClusterIsOneGraphQuery(t *testing.T) {
	q := &queries{}
	h, _ := newHarnessOn(t, conformance.Options(&conformance.Clock{}), staticToken(testToken),
		[]armfake.Option{armfake.WithGraphPageSize(4)}, nil, q.wrap)
	ctx := context.Background()
	want := map[string]string{}
	for i := range 10 {
		node := []string{"node-a", "node-b"}[i%2]
		vm, err := h.Provider.Create(ctx, conformance.Spec(i, node))
		require.NoError(t, err)
		want[vm.ID] = node
	}
	other := conformance.Spec(99, "node-a")
	other.Cluster = "another-cluster"
	_, err := h.Provider.Create(ctx, other)
	require.NoError(t, err)

	lister, ok := h.Provider.(provider.ClusterLister)
	require.True(t, ok)
	before := q.count()
	vms, err := lister.ListCluster(ctx, conformance.Cluster)
	require.NoError(t, err)
	got := map[string]string{}
	for _, vm := range vms {
		got[vm.ID] = vm.Owner().Node
		assert.True(t, vm.State.Alive(), "%s: %s", vm.ID, vm.State)
	}
	assert.Equal(t, want, got)
	assert.Equal(t, 3, q.count()-before, "10 VMs in pages of 4: three queries")

	_, err = lister.ListCluster(ctx, "")
	assert.ErrorContains(t, err, "no cluster id")
}
