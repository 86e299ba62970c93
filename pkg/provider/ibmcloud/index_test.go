package ibmcloud_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/pkg/provider/ibmcloud"
	"github.com/caa-project/caa/test/conformance"
	"github.com/caa-project/caa/test/mocks/cloud"
	vpcfake "github.com/caa-project/caa/test/mocks/ibmcloud"
)

// indexRig is a provider on the fake, with the fake's server (for its
// tagging record and index controls), its clock and a meter.
type indexRig struct {
	p     *ibmcloud.Provider
	cloud *cloud.Cloud
	fake  *vpcfake.Server
	clock *conformance.Clock
	m     *meter
}

func newIndexRig(t *testing.T, fakeOpts ...vpcfake.Option) *indexRig {
	t.Helper()
	return newIndexRigTypes(t, nil, fakeOpts...)
}

// newIndexRigTypes is newIndexRig whose cloud also offers types.
func newIndexRigTypes(t *testing.T, types []string, fakeOpts ...vpcfake.Option) *indexRig {
	t.Helper()
	clock := &conformance.Clock{}
	clock.Advance(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC).Sub(time.Time{}))
	opts := conformance.Options(clock)
	opts.PageSize = 100
	opts.Types = append(opts.Types, types...)
	c := cloud.New(opts)
	fake := vpcfake.NewServer(c, append([]vpcfake.Option{vpcfake.WithAPIKey(testAPIKey), vpcfake.WithAccessToken(testAccessToken)}, fakeOpts...)...).(*vpcfake.Server)
	m := &meter{next: fake}
	srv := httptest.NewServer(m)
	t.Cleanup(srv.Close)
	t.Setenv(ibmcloud.EnvAPIKey, testAPIKey)
	p, err := ibmcloud.New(context.Background(), testConfig(srv.URL))
	require.NoError(t, err)
	return &indexRig{p: p, cloud: c, fake: fake, clock: clock, m: m}
}

// create makes n VMs of node through the provider and returns them.
func (r *indexRig) create(t *testing.T, from, n int, node string) []provider.VM {
	t.Helper()
	var vms []provider.VM
	for i := range n {
		vm, err := r.p.Create(context.Background(), conformance.Spec(from+i, node))
		require.NoError(t, err)
		vms = append(vms, vm)
	}
	return vms
}

func (r *indexRig) attaches() int {
	r.m.mu.Lock()
	defer r.m.mu.Unlock()
	return r.m.attaches
}

// TestCreateTagsTheInstance: every create attaches caa's tags to the
// instance itself through Global Tagging, the same user tags its boot
// volume carries, in one attach call.
func TestCreateTagsTheInstance(t *testing.T) {
	r := newIndexRig(t)
	vm, err := r.p.Create(context.Background(), conformance.Spec(1, "node-a"))
	require.NoError(t, err)
	assert.Equal(t, 1, r.attaches())
	tags := r.fake.InstanceTags(vm.ID)
	require.NotEmpty(t, tags)
	for _, want := range []string{"caa-managed-by:caa", "caa-cluster:" + conformance.Cluster, "caa-node:node-a", "caa-key:uid-0001-a1"} {
		assert.Contains(t, tags, want)
	}
	// A retry with the same key adopts the instance, and attaches again
	// (idempotent), never a second VM.
	again, err := r.p.Create(context.Background(), conformance.Spec(1, "node-a"))
	require.NoError(t, err)
	assert.Equal(t, vm.ID, again.ID)
	assert.Len(t, r.cloud.Live(), 1)
	assert.Equal(t, slices.Sorted(slices.Values(tags)), r.fake.InstanceTags(vm.ID))
}

// TestIdleNodeAuditsInAtMostEightReadsAnHour is issue 20's IBM target: a
// node with 30 running VMs, auditing alone at the default interval (10
// min: six audits an hour), costs at most 8 calls an hour in all, search
// pages and VPC reads together. Before the index carried the instances it
// cost a search plus two reads per VM per audit: 366 an hour.
func TestIdleNodeAuditsInAtMostEightReadsAnHour(t *testing.T) {
	r := newIndexRig(t)
	sel := provider.Selector{Cluster: conformance.Cluster, Node: "node-idle"}
	r.create(t, 0, 30, sel.Node)
	r.create(t, 100, 30, "node-other")
	r.clock.Advance(time.Minute) // all booted
	_, err := r.p.List(context.Background(), provider.Selector{Cluster: conformance.Cluster, Node: "warm-up"})
	require.NoError(t, err) // the IAM token, once
	r.m.reset()
	for range 6 {
		vms, err := r.p.List(context.Background(), sel)
		require.NoError(t, err)
		require.Len(t, vms, 30)
		for _, vm := range vms {
			require.Equal(t, provider.StateRunning, vm.State)
			require.Equal(t, sel.Node, vm.Owner().Node)
			require.NotEmpty(t, vm.IPs, "the index carries the address")
		}
		r.clock.Advance(10 * time.Minute)
	}
	calls, _, _ := r.m.read()
	t.Logf("one node, 30 VMs, six audits: %d calls (the target: at most 8)", calls)
	assert.LessOrEqual(t, calls, 8)
	assert.Zero(t, r.attaches(), "an idle listing writes nothing")
}

// TestIndexShowingDeadIsConfirmedByRead: the index says a running VM is
// stopped (it lags): List reads that one VM from VPC and reports what VPC
// says; a VM the index shows deleting that VPC no longer has is left
// out. The index alone never reports a VM dead.
func TestIndexShowingDeadIsConfirmedByRead(t *testing.T) {
	r := newIndexRig(t)
	sel := provider.Selector{Cluster: conformance.Cluster, Node: "node-a"}
	vms := r.create(t, 0, 3, sel.Node)
	r.clock.Advance(time.Minute)
	r.fake.PinIndexStatus(vms[0].ID, "stopped")
	r.fake.PinIndexStatus(vms[1].ID, "failed")
	r.m.reset()
	got, err := r.p.List(context.Background(), sel)
	require.NoError(t, err)
	require.Len(t, got, 3)
	for _, vm := range got {
		assert.Equal(t, provider.StateRunning, vm.State, "%s: VPC's word, not the index's", vm.ID)
		assert.Equal(t, sel.Node, vm.Owner().Node, "the index's tags")
	}
	calls, _, _ := r.m.read()
	assert.Equal(t, 1+2, calls, "one search and one read per VM the index shows dead")

	// Really stopped: VPC confirms it, and the listing says so.
	r.fake.PinIndexStatus(vms[0].ID, "")
	r.fake.PinIndexStatus(vms[1].ID, "")
	require.NoError(t, r.cloud.Stop(vms[2].ID))
	got, err = r.p.List(context.Background(), sel)
	require.NoError(t, err)
	require.Len(t, got, 3)
	for _, vm := range got {
		want := provider.StateRunning
		if vm.ID == vms[2].ID {
			want = provider.StateStopped
		}
		assert.Equal(t, want, vm.State, vm.ID)
	}
}

// TestAnInstanceLeftUntaggedIsFoundAndTagged: the tagging service does
// not know a new instance yet (the cloud does not show it), so Create's
// attach fails; Create still returns the VM (its caller needs the id),
// the next listing finds it by its boot volume, reads it and tags it,
// and the listing after that is one search.
func TestAnInstanceLeftUntaggedIsFoundAndTagged(t *testing.T) {
	r := newIndexRig(t)
	sel := provider.Selector{Cluster: conformance.Cluster, Node: "node-a"}
	r.cloud.SetFaults(cloud.Faults{InvisibleFor: time.Minute})
	vm, err := r.p.Create(context.Background(), conformance.Spec(1, sel.Node))
	require.NoError(t, err)
	require.NotEmpty(t, vm.ID)
	assert.Empty(t, r.fake.InstanceTags(vm.ID), "the attach was refused")
	r.cloud.SetFaults(cloud.Faults{})
	r.clock.Advance(2 * time.Minute)

	r.m.reset()
	got, err := r.p.List(context.Background(), sel)
	require.NoError(t, err)
	require.Len(t, got, 1)
	assert.Equal(t, vm.ID, got[0].ID)
	calls, _, _ := r.m.read()
	assert.Equal(t, 1+2, calls, "one search, then the volume and the instance")
	assert.Equal(t, 1, r.attaches(), "and the instance is tagged")
	assert.Contains(t, r.fake.InstanceTags(vm.ID), "caa-node:node-a")

	r.m.reset()
	got, err = r.p.List(context.Background(), sel)
	require.NoError(t, err)
	require.Len(t, got, 1)
	calls, _, _ = r.m.read()
	assert.Equal(t, 1, calls)
	assert.Zero(t, r.attaches())
}

// TestListClusterIsOneSearchByClusterTag: the cluster's listing finds
// every VM of the cluster, whatever its node, and none of another
// cluster, in one search per page, stopping at the first short page; it
// tags nothing, even an untagged instance it finds by its volume.
func TestListClusterIsOneSearchByClusterTag(t *testing.T) {
	r := newIndexRig(t)
	want := map[string]string{}
	for n, node := range []string{"node-a", "node-b", "node-c"} {
		for _, vm := range r.create(t, 10*n, n+2, node) {
			want[vm.ID] = node
		}
	}
	other := conformance.Spec(99, "node-a")
	other.Cluster = "another-cluster"
	_, err := r.p.Create(context.Background(), other)
	require.NoError(t, err)
	r.clock.Advance(time.Minute)
	_, err = r.p.List(context.Background(), provider.Selector{Cluster: conformance.Cluster, Node: "warm-up"})
	require.NoError(t, err)

	for _, limit := range []int{1000, 4, 3} {
		t.Run(fmt.Sprintf("pages of %d", limit), func(t *testing.T) {
			ibmcloud.SetSearchLimit(r.p, limit)
			r.m.reset()
			vms, err := r.p.ListCluster(context.Background(), conformance.Cluster)
			require.NoError(t, err)
			got := map[string]string{}
			for _, vm := range vms {
				got[vm.ID] = vm.Owner().Node
				assert.Equal(t, provider.StateRunning, vm.State)
			}
			assert.Equal(t, want, got)
			calls, _, queries := r.m.read()
			hits := 2 * len(want) // an instance and its boot volume each
			assert.Len(t, queries, hits/limit+1, "one search per page, the last one short")
			assert.Equal(t, len(queries), calls, "and no read")
			assert.NotContains(t, queries[0], "caa-node")
		})
	}

	_, err = r.p.ListCluster(context.Background(), "")
	require.ErrorIs(t, err, provider.ErrInvalidSpec, "an empty cluster is never every VM")
}

// TestListReportsTheTEEFromTheIndex: a listing answered from the search
// index reports each VM's confidential compute mode, as a read does: a
// confidential VM is never listed as an ordinary one (which would have
// every listing replace it as not confidential), at no extra call.
func TestListReportsTheTEEFromTheIndex(t *testing.T) {
	r := newIndexRigTypes(t, []string{"bx3dc-2x10"})
	sel := provider.Selector{Cluster: conformance.Cluster, Node: "node-tee"}
	spec := conformance.Spec(1, sel.Node)
	spec.InstanceType, spec.TEE = "bx3dc-2x10", provider.TEETDX
	made, err := r.p.Create(context.Background(), spec)
	require.NoError(t, err)
	require.Equal(t, provider.TEETDX, made.TEE)
	plain := conformance.Spec(2, sel.Node)
	_, err = r.p.Create(context.Background(), plain)
	require.NoError(t, err)
	r.clock.Advance(time.Minute) // booted
	_, err = r.p.List(context.Background(), provider.Selector{Cluster: conformance.Cluster, Node: "warm-up"})
	require.NoError(t, err)
	r.m.reset()
	vms, err := r.p.List(context.Background(), sel)
	require.NoError(t, err)
	require.Len(t, vms, 2)
	for _, vm := range vms {
		want := provider.TEENone
		if vm.ID == made.ID {
			want = provider.TEETDX
		}
		assert.Equal(t, want, vm.TEE, "VM %s", vm.ID)
	}
	calls, _, _ := r.m.read()
	assert.Equal(t, 1, calls, "one search, no read by id")
}
