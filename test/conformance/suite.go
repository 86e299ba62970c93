// Package conformance is the one test suite every provider.Provider passes:
// the in-memory provider directly, and each cloud's provider through its real
// SDK against the fake cloud's HTTP front end. A provider's test calls Run
// (and its benchmarks Bench) with a factory that wires it to a fresh fake.
package conformance

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/test/mocks/cloud"
)

// The images and instance types the suite's cloud accepts. Providers pass
// spec.Image and spec.InstanceType to the wire unchanged.
const (
	ImageGood = "img-0a1b2c3d4e5f60718"
	ImageBad  = "img-0000000000000dead"
	TypeSmall = "bx2-2x8"
	TypeLarge = "bx2-8x32"
	TypeBad   = "zz9-plural-z-alpha"
	Cluster   = "cluster-7f3a"
	PageSize  = 4
	// UserDataSecret is the user data of every VM the suite creates; it
	// must never show in an error or a log line.
	UserDataSecret = "TOKEN=userdata-secret-4d1f"
)

// Harness is one provider wired to one fake cloud.
type Harness struct {
	Provider provider.Provider
	// Cloud is the fake behind the provider, for controls and counters.
	Cloud *cloud.Cloud
	// Logs returns what the provider and its SDK logged so far.
	Logs func() string
	// Secrets are the credentials the harness configured; they must never
	// show in an error or a log line.
	Secrets []string
	// NoRetryAfter says the cloud's throttling reply never says when to
	// come back (EC2's), whatever the fault asks for: the caller then
	// gets no Retry-After and paces itself.
	NoRetryAfter bool
}

// Factory builds a harness on a fresh cloud made with opts.
type Factory func(t testing.TB, opts cloud.Options) Harness

// Clock is the fake clock the suite gives the cloud.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// Options are the cloud options the suite runs with.
func Options(clock *Clock) cloud.Options {
	return cloud.Options{
		PageSize: PageSize,
		Images:   []string{ImageGood},
		Types:    []string{TypeSmall, TypeLarge},
		Now:      clock.Now,
		Seed:     7,
	}
}

// Spec is the suite's spec for pod n on node.
func Spec(n int, node string) provider.Spec {
	return provider.Spec{
		Key:          fmt.Sprintf("uid-%04d-a1", n),
		Cluster:      Cluster,
		Node:         node,
		PodUID:       fmt.Sprintf("uid-%04d", n),
		PodNamespace: "team",
		PodName:      fmt.Sprintf("pod-%d", n),
		InstanceType: TypeSmall,
		Image:        ImageGood,
		UserData:     []byte(UserDataSecret),
		ExtraTags:    map[string]string{"cost-center": "cc-42"},
	}
}

type env struct {
	Harness
	clock *Clock
	ctx   context.Context
}

func setup(t *testing.T, factory Factory) env {
	t.Helper()
	clock := &Clock{now: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	h := factory(t, Options(clock))
	require.NotNil(t, h.Provider)
	require.NotNil(t, h.Cloud)
	if h.Logs == nil {
		h.Logs = func() string { return "" }
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return env{Harness: h, clock: clock, ctx: ctx}
}

// Run runs every conformance test against the provider factory builds.
func Run(t *testing.T, factory Factory) {
	tests := []struct {
		name string
		fn   func(*testing.T, env)
	}{
		{"CreateIsIdempotent", testCreateIsIdempotent},
		{"ConcurrentCreatesMakeOneVM", testConcurrentCreates},
		{"CreatedVMIsTaggedAndBoots", testCreatedVMIsTaggedAndBoots},
		{"ListFollowsPagination", testListFollowsPagination},
		{"ListIsScopedByClusterAndNode", testListIsScoped},
		{"DeleteIsIdempotentAndComplete", testDeleteIsIdempotentAndComplete},
		{"DeadVMsStayVisibleUntilDeleted", testDeadVMsStayVisibleUntilDeleted},
		{"LongPodNamesGetDistinctVMsWithinLimits", testLongPodNames},
		{"ErrorKinds", testErrorKinds},
		{"ThrottlingCarriesRetryAfterAndIsNotRetriedForever", testThrottling},
		{"EventualConsistencyIsVisibleAsNotFound", testEventualConsistency},
		{"SecretsNeverLeak", testSecretsNeverLeak},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, setup(t, factory)) })
	}
}

// testCreateIsIdempotent: the same key makes one VM whether or not the
// caller knows it may have been sent before (Spec.MaybeSent: a retry after
// a crash; without it: a ledger rebuilt, or a caller that was wrong).
func testCreateIsIdempotent(t *testing.T, e env) {
	spec := Spec(1, "node-a")
	first, err := e.Provider.Create(e.ctx, spec)
	require.NoError(t, err)
	require.NotEmpty(t, first.ID)
	for _, maybeSent := range []bool{true, false} {
		spec.MaybeSent = maybeSent
		again, err := e.Provider.Create(e.ctx, spec)
		require.NoError(t, err, "MaybeSent %v", maybeSent)
		assert.Equal(t, first.ID, again.ID, "same key, same VM (MaybeSent %v)", maybeSent)
		assert.Len(t, e.Cloud.Live(), 1, "one VM in the cloud")
		assert.Equal(t, int64(1), e.Cloud.Counters()["created"])

		// Same key with another shape: never a second VM.
		other := spec
		other.InstanceType = TypeLarge
		third, err := e.Provider.Create(e.ctx, other)
		if err == nil {
			assert.Equal(t, first.ID, third.ID)
		} else {
			assert.ErrorIs(t, err, provider.ErrConflict)
		}
		assert.Len(t, e.Cloud.Live(), 1)
	}
}

func testConcurrentCreates(t *testing.T, e env) {
	spec := Spec(2, "node-a")
	var wg sync.WaitGroup
	ids := make([]string, 4)
	errs := make([]error, 4)
	for i := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			vm, err := e.Provider.Create(e.ctx, spec)
			ids[i], errs[i] = vm.ID, err
		}()
	}
	wg.Wait()
	// A racing create may lose with ErrConflict; a retry then finds the VM.
	for i, err := range errs {
		if err != nil {
			require.ErrorIs(t, err, provider.ErrConflict, "call %d", i)
			vm, err := e.Provider.Create(e.ctx, spec)
			require.NoError(t, err)
			ids[i] = vm.ID
		}
	}
	assert.Len(t, slices.Compact(slices.Sorted(slices.Values(ids))), 1, "every call saw the same VM: %v", ids)
	assert.Len(t, e.Cloud.Live(), 1)
}

func testCreatedVMIsTaggedAndBoots(t *testing.T, e env) {
	e.Cloud.SetFaults(cloud.Faults{BootDelay: time.Minute})
	spec := Spec(3, "node-a")
	vm, err := e.Provider.Create(e.ctx, spec)
	require.NoError(t, err)
	for k, v := range spec.Tags() {
		assert.Equal(t, v, vm.Tags[k], "tag %s on the created VM", k)
	}
	assert.Equal(t, TypeSmall, vm.InstanceType)
	assert.Equal(t, ImageGood, vm.Image)

	got, err := e.Provider.Get(e.ctx, vm.ID)
	require.NoError(t, err)
	assert.Equal(t, vm.ID, got.ID)
	assert.Equal(t, provider.StatePending, got.State)
	assert.Equal(t, provider.Owner{Cluster: Cluster, Node: "node-a", PodUID: spec.PodUID, Pod: "team/pod-3", Key: spec.Key, Managed: true}, got.Owner())
	assert.NotEmpty(t, got.IPs)
	assert.False(t, got.CreatedAt.IsZero())

	e.clock.Advance(2 * time.Minute)
	got, err = e.Provider.Get(e.ctx, vm.ID)
	require.NoError(t, err)
	assert.Equal(t, provider.StateRunning, got.State)
}

func testListFollowsPagination(t *testing.T, e env) {
	want := map[string]bool{}
	n := 3*PageSize - 1
	for i := range n {
		vm, err := e.Provider.Create(e.ctx, Spec(100+i, "node-a"))
		require.NoError(t, err)
		want[vm.ID] = true
	}
	e.Cloud.ResetCounters()
	vms, err := e.Provider.List(e.ctx, provider.Selector{Cluster: Cluster, Node: "node-a"})
	require.NoError(t, err)
	got := map[string]bool{}
	for _, vm := range vms {
		got[vm.ID] = true
	}
	assert.Equal(t, want, got, "every VM, each once")
	assert.Len(t, vms, n)
	assert.GreaterOrEqual(t, e.Cloud.Counters()[cloud.OpList], int64(3), "at least three pages of %d", PageSize)
}

func testListIsScoped(t *testing.T, e env) {
	mine, err := e.Provider.Create(e.ctx, Spec(10, "node-a"))
	require.NoError(t, err)
	_, err = e.Provider.Create(e.ctx, Spec(11, "node-b"))
	require.NoError(t, err)
	otherCluster := Spec(12, "node-a")
	otherCluster.Cluster = "cluster-other"
	_, err = e.Provider.Create(e.ctx, otherCluster)
	require.NoError(t, err)
	// Someone else's VM with no caa tags at all.
	_, err = e.Cloud.Create(cloud.CreateRequest{Name: "not-caa", InstanceType: TypeSmall, Image: ImageGood})
	require.NoError(t, err)

	vms, err := e.Provider.List(e.ctx, provider.Selector{Cluster: Cluster, Node: "node-a"})
	require.NoError(t, err)
	require.Len(t, vms, 1)
	assert.Equal(t, mine.ID, vms[0].ID)

	none, err := e.Provider.List(e.ctx, provider.Selector{Cluster: Cluster, Node: "node-z"})
	require.NoError(t, err)
	assert.Empty(t, none)
}

func testDeleteIsIdempotentAndComplete(t *testing.T, e env) {
	vm, err := e.Provider.Create(e.ctx, Spec(20, "node-a"))
	require.NoError(t, err)
	require.NoError(t, e.Provider.Delete(e.ctx, vm.ID))

	got, err := e.Provider.Get(e.ctx, vm.ID)
	if err == nil {
		assert.True(t, got.State.Gone() || got.State == provider.StateStopping, "after delete the VM is going or gone, got %s", got.State)
	} else {
		assert.ErrorIs(t, err, provider.ErrNotFound)
	}
	assert.Empty(t, e.Cloud.Live(), "no live VM left")
	assert.Empty(t, e.Cloud.Resources(""), "no NIC, disk or volume left")

	require.NoError(t, e.Provider.Delete(e.ctx, vm.ID), "second delete is a no-op")
	require.NoError(t, e.Provider.Delete(e.ctx, missingID(t, e)), "deleting a VM that never existed is a no-op")

	vms, err := e.Provider.List(e.ctx, provider.Selector{Cluster: Cluster, Node: "node-a"})
	require.NoError(t, err)
	for _, v := range vms {
		assert.True(t, v.State.Gone(), "a listed deleted VM shows as gone")
	}
}

// testDeadVMsStayVisibleUntilDeleted: a VM that failed, or was stopped or
// deallocated behind caa's back, is still in the cloud. Get and List show it
// as Failed or Stopped (Dead, never Gone), so the caller replaces it and
// deletes it; Delete then removes it with its disk and network interface.
func testDeadVMsStayVisibleUntilDeleted(t *testing.T, e env) {
	cases := []struct {
		name  string
		kill  func(id string) error
		state provider.State
	}{
		{"failed", e.Cloud.Fail, provider.StateFailed},
		{"stopped", e.Cloud.Stop, provider.StateStopped},
		{"deallocated", e.Cloud.Deallocate, provider.StateStopped},
	}
	want := map[string]provider.State{}
	for i, c := range cases {
		vm, err := e.Provider.Create(e.ctx, Spec(70+i, "node-a"))
		require.NoError(t, err)
		require.NoError(t, c.kill(coreID(t, e, vm.Name)), c.name)
		want[vm.ID] = c.state
	}
	e.clock.Advance(2 * time.Hour) // past any boot delay or retention

	for id, state := range want {
		got, err := e.Provider.Get(e.ctx, id)
		require.NoError(t, err, "a dead VM is still there")
		assert.Equal(t, state, got.State, "get %s", id)
		assert.True(t, got.State.Dead() && !got.State.Gone() && !got.State.Alive(), "get %s: %s is dead, not gone", id, got.State)
	}
	vms, err := e.Provider.List(e.ctx, provider.Selector{Cluster: Cluster, Node: "node-a"})
	require.NoError(t, err)
	listed := map[string]provider.State{}
	for _, vm := range vms {
		listed[vm.ID] = vm.State
	}
	assert.Equal(t, want, listed, "List shows each dead VM with its state")

	for id := range want {
		require.NoError(t, e.Provider.Delete(e.ctx, id))
		got, err := e.Provider.Get(e.ctx, id)
		if err == nil {
			assert.True(t, got.State.Gone() || got.State == provider.StateStopping, "after delete %s is going or gone, got %s", id, got.State)
		} else {
			assert.ErrorIs(t, err, provider.ErrNotFound)
		}
	}
	assert.Empty(t, e.Cloud.Live(), "no dead VM left")
	assert.Empty(t, e.Cloud.Resources(""), "no disk, NIC or volume of a dead VM left")
}

// testLongPodNames: the longest names Kubernetes allows (a 63-character
// namespace, 253-character pod names) that differ only after their first
// 240 characters. Each pod gets its VM (the fakes refuse, as the clouds do,
// any tag or name over the cloud's limits), the two VMs' names and pod tags
// differ, every tag value fits the strictest cloud, and List finds each VM
// by its pod UID.
func testLongPodNames(t *testing.T, e env) {
	ns := "n" + strings.Repeat("s", 61) + "1"
	prefix := strings.Repeat("web-frontend.", 18) + strings.Repeat("x", 6)
	require.Len(t, ns, 63)
	require.Len(t, prefix, 240)
	var specs []provider.Spec
	byUID := map[string]provider.VM{}
	for i, suffix := range []string{"-aaaaaaaaaaa1", "-bbbbbbbbbbb2"} {
		spec := Spec(80+i, "node-a")
		spec.PodNamespace, spec.PodName = ns, prefix+suffix
		require.Len(t, spec.PodName, 253)
		vm, err := e.Provider.Create(e.ctx, spec)
		require.NoError(t, err, "a pod with a long name gets its VM")
		specs = append(specs, spec)
		byUID[spec.PodUID] = vm
	}
	a, b := byUID[specs[0].PodUID], byUID[specs[1].PodUID]
	assert.NotEqual(t, a.ID, b.ID)
	assert.NotEqual(t, a.Name, b.Name, "the VMs' names differ")
	assert.NotEqual(t, a.Tags[provider.TagPod], b.Tags[provider.TagPod], "so do their pod tags")
	for i, vm := range []provider.VM{a, b} {
		for k, v := range vm.Tags {
			assert.LessOrEqual(t, utf8.RuneCountInString(v), provider.MaxTagValue, "VM %s: tag %s", vm.ID, k)
		}
		assert.Equal(t, specs[i].Tags()[provider.TagPod], vm.Tags[provider.TagPod])
		assert.True(t, strings.HasPrefix(vm.Tags[provider.TagPod], ns+"/web-frontend."), "readable: %s", vm.Tags[provider.TagPod])
		assert.LessOrEqual(t, len(vm.Tags[provider.TagPod]), provider.MaxPodTag)
	}

	vms, err := e.Provider.List(e.ctx, provider.Selector{Cluster: Cluster, Node: "node-a"})
	require.NoError(t, err)
	listed := map[string]string{}
	for _, vm := range vms {
		listed[vm.Owner().PodUID] = vm.ID
	}
	assert.Equal(t, map[string]string{specs[0].PodUID: a.ID, specs[1].PodUID: b.ID}, listed, "List finds each VM by its pod UID")
	for _, spec := range specs {
		again, err := e.Provider.Create(e.ctx, spec)
		require.NoError(t, err)
		assert.Equal(t, byUID[spec.PodUID].ID, again.ID, "and Create by its key")
	}
	assert.Len(t, e.Cloud.Live(), 2)
}

// coreID is the fake cloud's id of the instance the provider calls name.
func coreID(t *testing.T, e env, name string) string {
	t.Helper()
	for _, in := range e.Cloud.Live() {
		if in.Name == name {
			return in.ID
		}
	}
	t.Fatalf("no instance named %q in the fake cloud", name)
	return ""
}

// missingID is the id of a VM the provider made and deleted, past any
// retention of terminated VMs: an id of the right shape that names nothing.
func missingID(t *testing.T, e env) string {
	t.Helper()
	vm, err := e.Provider.Create(e.ctx, Spec(9999, "node-gone"))
	require.NoError(t, err)
	require.NoError(t, e.Provider.Delete(e.ctx, vm.ID))
	e.clock.Advance(24 * time.Hour)
	return vm.ID
}

func testErrorKinds(t *testing.T, e env) {
	live, err := e.Provider.Create(e.ctx, Spec(30, "node-a"))
	require.NoError(t, err)
	badImage := Spec(31, "node-a")
	badImage.Image = ImageBad
	badType := Spec(32, "node-a")
	badType.InstanceType = TypeBad

	tests := []struct {
		name   string
		faults cloud.Faults
		call   func() error
		kind   error // nil: transient, none of the kinds
	}{
		{"get of a missing VM", cloud.Faults{}, func() error { _, err := e.Provider.Get(e.ctx, missingID(t, e)); return err }, provider.ErrNotFound},
		{"unknown image", cloud.Faults{}, func() error { _, err := e.Provider.Create(e.ctx, badImage); return err }, provider.ErrInvalidSpec},
		{"unknown instance type", cloud.Faults{}, func() error { _, err := e.Provider.Create(e.ctx, badType); return err }, provider.ErrInvalidSpec},
		{"quota", cloud.Faults{QuotaLimit: 1}, func() error { _, err := e.Provider.Create(e.ctx, Spec(33, "node-a")); return err }, provider.ErrQuota},
		{"capacity", cloud.Faults{CapacityFailures: 1}, func() error { _, err := e.Provider.Create(e.ctx, Spec(34, "node-a")); return err }, provider.ErrCapacity},
		{"auth on create", cloud.Faults{DenyAuth: true}, func() error { _, err := e.Provider.Create(e.ctx, Spec(35, "node-a")); return err }, provider.ErrAuth},
		{"auth on list", cloud.Faults{DenyAuth: true}, func() error {
			_, err := e.Provider.List(e.ctx, provider.Selector{Cluster: Cluster, Node: "node-a"})
			return err
		}, provider.ErrAuth},
		{"auth on delete", cloud.Faults{DenyAuth: true}, func() error { return e.Provider.Delete(e.ctx, live.ID) }, provider.ErrAuth},
		{"server error is transient", cloud.Faults{ServerErrorRate: 1}, func() error { _, err := e.Provider.Get(e.ctx, live.ID); return err }, nil},
	}
	kinds := []error{provider.ErrNotFound, provider.ErrThrottled, provider.ErrQuota, provider.ErrCapacity,
		provider.ErrInvalidSpec, provider.ErrAuth, provider.ErrConflict, provider.ErrNodeConfig, provider.ErrKeySpent}
	// What of the spec the error says was refused: the reconciler tells the
	// pod's choice from the node's default by it.
	refused := map[string]string{"unknown image": provider.RefusedImage, "unknown instance type": provider.RefusedInstanceType}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e.Cloud.SetFaults(tc.faults)
			defer e.Cloud.SetFaults(cloud.Faults{})
			err := tc.call()
			require.Error(t, err)
			for _, k := range kinds {
				if k == tc.kind {
					assert.ErrorIs(t, err, k)
				} else {
					assert.NotErrorIs(t, err, k, "only %v", tc.kind)
				}
			}
			var pe *provider.Error
			assert.True(t, errors.As(err, &pe), "a *provider.Error in the chain: %v", err)
			if want, ok := refused[tc.name]; ok {
				assert.Equal(t, want, provider.RefusedPart(err), "what was refused: %v", err)
			}
		})
	}
	assert.Len(t, e.Cloud.Live(), 1, "no failed create left a VM")
}

func testThrottling(t *testing.T, e env) {
	vm, err := e.Provider.Create(e.ctx, Spec(40, "node-a"))
	require.NoError(t, err)
	e.Cloud.SetFaults(cloud.Faults{ThrottleEvery: 1, RetryAfter: 7 * time.Second})
	e.Cloud.ResetCounters()

	_, err = e.Provider.Get(e.ctx, vm.ID)
	require.ErrorIs(t, err, provider.ErrThrottled)
	d, ok := provider.RetryAfter(err)
	if e.NoRetryAfter {
		assert.False(t, ok, "the cloud said nothing of when to retry, nor may the provider: %v", err)
	} else {
		assert.True(t, ok, "the cloud's Retry-After reaches the caller: %v", err)
		assert.Equal(t, 7*time.Second, d)
	}
	assert.Equal(t, int64(1), e.Cloud.Counters()[cloud.OpGet], "throttling is surfaced at once, not retried inside the SDK")

	_, err = e.Provider.Create(e.ctx, Spec(41, "node-a"))
	require.ErrorIs(t, err, provider.ErrThrottled)
	e.Cloud.SetFaults(cloud.Faults{})
	assert.Len(t, e.Cloud.Live(), 1, "a throttled create made no VM")
}

func testEventualConsistency(t *testing.T, e env) {
	e.Cloud.SetFaults(cloud.Faults{InvisibleFor: time.Hour})
	spec := Spec(50, "node-a")
	// Create returns what it made even while the cloud cannot show it yet:
	// the caller needs the id to record it.
	vm, err := e.Provider.Create(e.ctx, spec)
	require.NoError(t, err)
	id := vm.ID
	require.NotEmpty(t, id)
	_, err = e.Provider.Get(e.ctx, id)
	assert.ErrorIs(t, err, provider.ErrNotFound, "the provider reports what the cloud shows")
	vms, err := e.Provider.List(e.ctx, provider.Selector{Cluster: Cluster, Node: "node-a"})
	require.NoError(t, err)
	assert.Empty(t, vms)

	e.clock.Advance(2 * time.Hour)
	again, err := e.Provider.Create(e.ctx, spec)
	require.NoError(t, err)
	assert.Equal(t, id, again.ID, "once visible, the same key finds the same VM")
	assert.Len(t, e.Cloud.Live(), 1)
}

func testSecretsNeverLeak(t *testing.T, e env) {
	var msgs []string
	note := func(err error) {
		if err != nil {
			msgs = append(msgs, err.Error(), fmt.Sprintf("%+v", err))
		}
	}
	spec := Spec(60, "node-a")
	vm, err := e.Provider.Create(e.ctx, spec)
	require.NoError(t, err)
	msgs = append(msgs, fmt.Sprintf("%+v", vm), fmt.Sprint(spec), fmt.Sprintf("%#v", spec))
	_, err = e.Provider.Get(e.ctx, vm.ID)
	note(err)
	bad := Spec(61, "node-a")
	bad.Image = ImageBad
	_, err = e.Provider.Create(e.ctx, bad)
	note(err)
	for _, f := range []cloud.Faults{{DenyAuth: true}, {ServerErrorRate: 1}, {ThrottleEvery: 1}} {
		e.Cloud.SetFaults(f)
		_, err = e.Provider.Create(e.ctx, Spec(62, "node-a"))
		note(err)
		_, err = e.Provider.List(e.ctx, provider.Selector{Cluster: Cluster, Node: "node-a"})
		note(err)
	}
	e.Cloud.SetFaults(cloud.Faults{})
	note(e.Provider.Delete(e.ctx, vm.ID))
	msgs = append(msgs, e.Logs())

	secrets := append([]string{UserDataSecret, base64.StdEncoding.EncodeToString([]byte(UserDataSecret))}, e.Secrets...)
	all := strings.Join(msgs, "\n")
	for _, s := range secrets {
		if s != "" {
			assert.NotContains(t, all, s, "a secret leaked into an error or a log line")
		}
	}
}

// Bench measures List over 1,000 VMs and a create+delete round trip, at the
// given injected latency per call; it reports cloud calls per operation.
func Bench(b *testing.B, factory Factory, latency time.Duration) {
	clock := &Clock{now: time.Now()}
	opts := Options(clock)
	opts.PageSize = 100
	b.Run("List1000", func(b *testing.B) {
		h := factory(b, opts)
		sel := provider.Selector{Cluster: Cluster, Node: "node-bench"}
		for i := range 1000 {
			s := Spec(i, sel.Node)
			_, err := h.Cloud.Create(cloud.CreateRequest{Name: s.Key, Token: s.Key, Tags: s.Tags(), InstanceType: s.InstanceType, Image: s.Image})
			require.NoError(b, err)
		}
		h.Cloud.SetFaults(cloud.Faults{Latency: latency})
		h.Cloud.ResetCounters()
		ctx := context.Background()
		b.ResetTimer()
		for b.Loop() {
			vms, err := h.Provider.List(ctx, sel)
			if err != nil || len(vms) != 1000 {
				b.Fatalf("list: %d VMs, %v", len(vms), err)
			}
		}
		b.ReportMetric(float64(h.Cloud.Counters()["total"])/float64(b.N), "calls/op")
	})
	b.Run("CreateDelete", func(b *testing.B) {
		h := factory(b, opts)
		h.Cloud.SetFaults(cloud.Faults{Latency: latency})
		ctx := context.Background()
		n := 0
		b.ResetTimer()
		for b.Loop() {
			n++
			vm, err := h.Provider.Create(ctx, Spec(n, "node-bench"))
			if err != nil {
				b.Fatal(err)
			}
			if err := h.Provider.Delete(ctx, vm.ID); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(h.Cloud.Counters()["total"])/float64(b.N), "calls/op")
	})
}

// Deadlines checks that every call of a provider configured with short
// per-call timeouts (read and write both well under bound) ends on its own
// deadline when the cloud stops answering, even though the caller's context
// has none: each returns context.DeadlineExceeded in its chain within bound,
// and not as one of the kinds (it is not the cloud's answer).
func Deadlines(t *testing.T, h Harness, bound time.Duration) {
	t.Helper()
	ctx := context.Background()
	vm, err := h.Provider.Create(ctx, Spec(90, "node-a"))
	require.NoError(t, err)
	h.Cloud.SetFaults(cloud.Faults{Latency: time.Hour})
	defer h.Cloud.SetFaults(cloud.Faults{})

	calls := []struct {
		name string
		call func() error
	}{
		{"get", func() error { _, err := h.Provider.Get(ctx, vm.ID); return err }},
		{"list", func() error {
			_, err := h.Provider.List(ctx, provider.Selector{Cluster: Cluster, Node: "node-a"})
			return err
		}},
		{"create", func() error { _, err := h.Provider.Create(ctx, Spec(91, "node-a")); return err }},
		{"delete", func() error { return h.Provider.Delete(ctx, vm.ID) }},
	}
	for _, c := range calls {
		start := time.Now()
		err := c.call()
		took := time.Since(start)
		require.Error(t, err, c.name)
		assert.ErrorIs(t, err, context.DeadlineExceeded, "%s ends on its own deadline: %v", c.name, err)
		assert.Less(t, took, bound, "%s took %s", c.name, took)
		assert.False(t, provider.Terminal(err), "%s: a timeout is transient", c.name)
	}
}
