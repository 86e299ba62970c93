package aws

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/test/conformance"
	"github.com/caa-project/caa/test/mocks/cloud"
)

// TestListClusterIsOnePagedFilteredListing: every caa VM of the cluster,
// whatever its node, in ceil(n/1000) DescribeInstances calls; VMs of
// another cluster and VMs caa does not manage are filtered out by EC2.
func TestListClusterIsOnePagedFilteredListing(t *testing.T) {
	ctx := context.Background()
	opts := suiteOptions()
	opts.PageSize = 1000
	f := newFakeEC2(t, opts, nil)
	want := map[string]string{}
	for i := range 2100 {
		node := []string{"node-a", "node-b", "node-c"}[i%3]
		in, err := f.cloud.Create(cloud.CreateRequest{
			Tags:         conformance.Spec(i, node).Tags(),
			InstanceType: conformance.TypeSmall, Image: conformance.ImageGood,
		})
		require.NoError(t, err)
		want[in.ID] = node
	}
	other := conformance.Spec(9001, "node-a")
	other.Cluster = "another-cluster"
	_, err := f.cloud.Create(cloud.CreateRequest{Tags: other.Tags(), InstanceType: conformance.TypeSmall, Image: conformance.ImageGood})
	require.NoError(t, err)
	unmanaged := conformance.Spec(9002, "node-a").Tags()
	delete(unmanaged, provider.TagManagedBy)
	_, err = f.cloud.Create(cloud.CreateRequest{Tags: unmanaged, InstanceType: conformance.TypeSmall, Image: conformance.ImageGood})
	require.NoError(t, err)

	f.cloud.ResetCounters()
	vms, err := f.provider.ListCluster(ctx, conformance.Cluster)
	require.NoError(t, err)
	got := map[string]string{}
	for _, vm := range vms {
		got[vm.ID] = vm.Owner().Node
	}
	assert.Equal(t, want, got)
	assert.Equal(t, int64(3), f.cloud.Counters()[cloud.OpList], "2,100 VMs in three pages of 1,000")

	_, err = f.provider.ListCluster(ctx, "")
	assert.ErrorContains(t, err, "no cluster id")
}
