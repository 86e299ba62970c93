package azure_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/pkg/provider/azure"
	"github.com/caa-project/caa/test/conformance"
	armfake "github.com/caa-project/caa/test/mocks/azure"
)

// TestListClusterGroupsByNode: every caa VM of the cluster, whatever its
// node, from a count and one query grouped by node: ten VMs cost two
// queries where a row a VM would have cost three pages of four. VMs of
// another cluster are filtered out by the query itself.
func TestListClusterGroupsByNode(t *testing.T) {
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
		assert.NotEmpty(t, vm.InstanceType, vm.ID)
	}
	assert.Equal(t, want, got)
	assert.Equal(t, 2, q.count()-before, "a count and one grouped query")

	_, err = lister.ListCluster(ctx, "")
	assert.ErrorContains(t, err, "no cluster id")

	// No VM of the cluster: the count alone.
	before = q.count()
	vms, err = lister.ListCluster(ctx, "no-such-cluster")
	require.NoError(t, err)
	assert.Empty(t, vms)
	assert.Equal(t, 1, q.count()-before)
}

// TestListClusterSplitsNodesThatDoNotFit: Resource Graph answers a
// summarize with its first page only (resultTruncated, no $skipToken).
// With more nodes than an answer holds (here 4), the listing splits the
// nodes by a hash of their name and doubles the parts until no answer is
// truncated, and still returns every VM exactly once: the fake's hash is
// negative for about half the names, so a split that took hash % n for
// the part would lose them.
func TestListClusterSplitsNodesThatDoNotFit(t *testing.T) {
	q := &queries{}
	h, _ := newHarnessOn(t, conformance.Options(&conformance.Clock{}), staticToken(testToken),
		[]armfake.Option{armfake.WithGraphPageSize(4)}, nil, q.wrap)
	ctx := context.Background()
	want := map[string]string{}
	for i := range 24 {
		node := fmt.Sprintf("node-%02d", i%12)
		vm, err := h.Provider.Create(ctx, conformance.Spec(i, node))
		require.NoError(t, err)
		want[vm.ID] = node
	}
	lister := h.Provider.(provider.ClusterLister)
	before := q.count()
	vms, err := lister.ListCluster(ctx, conformance.Cluster)
	require.NoError(t, err)
	got := map[string]string{}
	for _, vm := range vms {
		_, dup := got[vm.ID]
		assert.False(t, dup, "%s listed twice", vm.ID)
		got[vm.ID] = vm.Owner().Node
	}
	assert.Equal(t, want, got)
	sent := q.all[before:]
	assert.Contains(t, sent[0], "dcount(node)", "the count comes first")
	parted := 0
	for _, s := range sent[1:] {
		assert.Contains(t, s, "make_list(vm) by node")
		if strings.Contains(s, "abs(hash(node)") {
			parted++
		}
	}
	assert.Positive(t, parted, "12 nodes do not fit answers of 4: the nodes were split")
	assert.LessOrEqual(t, len(sent), 1+1+2+4+8+16, "at most four doublings past one part")
}

// TestClusterParts: the queries a cluster costs after the count, for the
// benchmark's extrapolation: an answer is sized for 800 nodes and 5,000
// VMs.
func TestClusterParts(t *testing.T) {
	assert.Equal(t, 0, azure.ClusterParts(0, 0))
	assert.Equal(t, 1, azure.ClusterParts(24, 720))
	assert.Equal(t, 6, azure.ClusterParts(1000, 30000))
	assert.Equal(t, 7, azure.ClusterParts(5000, 5000))
}
