package reconcile

import (
	"context"
	"errors"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/pkg/ledger"
	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/test/mocks/cloud"
	"github.com/caa-project/caa/test/mocks/memory"
)

type event struct {
	warning         bool
	reason, message string
}

type events struct {
	mu  sync.Mutex
	all []event
}

func (s *events) Event(_ *Pod, warning bool, reason, message string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.all = append(s.all, event{warning, reason, message})
}

func (s *events) reasons() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, e := range s.all {
		out = append(out, e.reason)
	}
	return out
}

type fixture struct {
	ex     *Executor
	cloud  *cloud.Cloud
	ledger *ledger.Ledger
	events *events
	ctx    context.Context
}

func newFixture(t *testing.T, p provider.Provider, c *cloud.Cloud) fixture {
	t.Helper()
	l, err := ledger.Open(ledger.Options{Path: filepath.Join(t.TempDir(), "ledger.db"), Node: "n", Cluster: "c", Timeout: time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	ev := &events{}
	return fixture{
		ex:    &Executor{Ledger: l, Provider: p, Events: ev, Cluster: "c", Node: "n", RetryBase: time.Second},
		cloud: c, ledger: l, events: ev, ctx: context.Background(),
	}
}

// memoryFixture's cloud shows terminated VMs for an hour, as EC2 does, so a
// kill is positive evidence at once.
func memoryFixture(t *testing.T) fixture {
	c := cloud.New(cloud.Options{Images: []string{"img"}, KeepTerminated: time.Hour})
	return newFixture(t, memory.New(c), c)
}

// step reads the pod's current state the way a pass would, decides and applies.
func (f fixture) step(t *testing.T, p *Pod, missingSince time.Time, now time.Time) (Action, Result) {
	t.Helper()
	in := Input{Pod: p, CacheSynced: true, Now: now, MissingSince: missingSince}
	if r, err := f.ledger.Get(p.UID); err == nil {
		in.Record = &r
		if r.VMID != "" {
			if vm, err := f.ex.Provider.Get(f.ctx, r.VMID); err == nil {
				in.VM = &vm
			}
		}
	}
	if in.VM == nil {
		vms, err := f.ex.Provider.List(f.ctx, provider.Selector{Cluster: "c", Node: "n"})
		require.NoError(t, err)
		for _, vm := range vms {
			if vm.Owner().PodUID == p.UID && !vm.State.Gone() {
				in.VM = &vm
			}
		}
	}
	a := Decide(in, cfg)
	res, err := f.ex.Apply(f.ctx, in, a)
	require.NoError(t, err)
	return a, res
}

// checkingProvider asserts, inside every Create, that the ledger already
// holds the durable intent for that key (invariant I2).
type checkingProvider struct {
	provider.Provider
	t      *testing.T
	ledger *ledger.Ledger
	calls  int
	sent   []bool // each create's Spec.MaybeSent
}

func (p *checkingProvider) Create(ctx context.Context, spec provider.Spec) (provider.VM, error) {
	p.calls++
	p.sent = append(p.sent, spec.MaybeSent)
	r, err := p.ledger.Get(spec.PodUID)
	require.NoError(p.t, err, "no record before the cloud create")
	assert.Equal(p.t, ledger.PhaseCreating, r.Phase)
	assert.Equal(p.t, spec.Key, r.Key, "the intent names the key the cloud gets")
	return p.Provider.Create(ctx, spec)
}

func TestCreateWritesTheIntentFirst(t *testing.T) {
	c := cloud.New(cloud.Options{Images: []string{"img"}})
	f := newFixture(t, nil, c)
	cp := &checkingProvider{Provider: memory.New(c), t: t, ledger: f.ledger}
	f.ex.Provider = cp

	a, res := f.step(t, pod, time.Time{}, t0)
	assert.Equal(t, KindCreate, a.Kind)
	assert.Equal(t, 1, cp.calls)
	assert.Equal(t, []bool{false}, cp.sent, "a key the intent just named cannot have been sent: no lookup first")
	require.NotNil(t, res.Record)
	assert.Equal(t, ledger.PhaseRunning, res.Record.Phase)
	assert.Equal(t, c.Live()[0].ID, res.Record.VMID)
	assert.Equal(t, []string{EventVMCreated}, f.events.reasons())

	// The next look adopts nothing new and writes nothing to the cloud.
	before := c.Counters()["created"]
	a, res = f.step(t, pod, time.Time{}, t0)
	assert.Equal(t, KindNone, a.Kind)
	assert.Zero(t, res.CloudWrites)
	assert.Equal(t, before, c.Counters()["created"])
}

// lostReply makes the VM in the cloud but loses the answer, like a crash
// between the cloud's create and the ledger's Running write.
type lostReply struct{ provider.Provider }

func (p lostReply) Create(ctx context.Context, spec provider.Spec) (provider.VM, error) {
	if _, err := p.Provider.Create(ctx, spec); err != nil {
		return provider.VM{}, err
	}
	return provider.VM{}, errors.New("connection reset")
}

// TestCreateResumedAfterALostReplyMakesOneVM: the create's reply is lost
// and the cloud's listing does not show the VM yet (it lags), so the only
// way to find the VM is the resume: a create with the same key, which the
// cloud answers with the VM the first call made.
func TestCreateResumedAfterALostReplyMakesOneVM(t *testing.T) {
	c := cloud.New(cloud.Options{Images: []string{"img"}})
	c.SetFaults(cloud.Faults{InvisibleFor: time.Hour})
	f := newFixture(t, lostReply{memory.New(c)}, c)
	first, res := f.step(t, pod, time.Time{}, t0)
	assert.Equal(t, time.Second, res.RequeueAfter.Truncate(time.Second), "retried after the base backoff")
	require.Equal(t, ledger.PhaseCreating, res.Record.Phase)
	require.Len(t, c.Live(), 1, "the VM landed; only its reply was lost")

	// Restarted: the intent is still Creating with the same key, and the
	// listing still shows nothing.
	cp := &checkingProvider{Provider: memory.New(c), t: t, ledger: f.ledger}
	f.ex.Provider = cp
	a, res := f.step(t, pod, time.Time{}, t0)
	require.Equal(t, KindCreate, a.Kind, "%s: %s", a.Reason, a.Message)
	assert.Equal(t, ReasonResumeCreate, a.Reason)
	assert.Equal(t, []bool{true}, cp.sent, "the resumed key may have reached the cloud: the provider looks first")
	assert.Equal(t, first.Key, a.Key, "the resume reuses the key")
	assert.Equal(t, ledger.PhaseRunning, res.Record.Phase)
	assert.Len(t, c.Instances(), 1, "one VM per pod (I1)")
	assert.Equal(t, c.Instances()[0].ID, res.Record.VMID)
	assert.Equal(t, int64(1), c.Counters()["created"])
}

// refusing answers every create with err, as a cloud refusing the node's
// configuration or the pod's spec does; it makes no VM.
type refusing struct {
	provider.Provider
	mu      sync.Mutex
	err     error
	creates int
}

func (p *refusing) Create(ctx context.Context, spec provider.Spec) (provider.VM, error) {
	p.mu.Lock()
	err := p.err
	p.creates++
	p.mu.Unlock()
	if err != nil {
		return provider.VM{}, err
	}
	return p.Provider.Create(ctx, spec)
}

type nodeEvents struct {
	events
	node []event
}

func (s *nodeEvents) NodeEvent(node string, warning bool, reason, message string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.node = append(s.node, event{warning, reason, node + ": " + message})
}

// TestANodeLevelRefusalIsNoPodsFailure (issue 17.2): the cloud refuses a
// create for the node's configuration (a subnet it does not know, or the
// node's default type not offered in its zone). The pod is not recorded
// Failed: it stays Creating, says why, backs off, and is created once the
// configuration is fixed; the Node gets one event for the refusal.
func TestANodeLevelRefusalIsNoPodsFailure(t *testing.T) {
	for name, refusal := range map[string]error{
		"subnet": &provider.Error{Kind: provider.ErrNodeConfig, Provider: "memory", Op: "create", Code: "InvalidSubnetID.NotFound"},
		"default type not offered": &provider.Error{Kind: provider.ErrInvalidSpec, Provider: "memory", Op: "create", Code: "Unsupported",
			Refused: provider.RefusedInstanceType},
	} {
		t.Run(name, func(t *testing.T) {
			f := memoryFixture(t)
			ev := &nodeEvents{}
			f.ex.Events = ev
			p := &refusing{Provider: f.ex.Provider, err: refusal}
			f.ex.Provider = p
			for i := range 3 {
				in := Input{Pod: pod, CacheSynced: true, Now: t0, Retries: i}
				if r, err := f.ledger.Get(pod.UID); err == nil {
					in.Record = &r
				}
				a := Decide(in, cfg)
				require.Equal(t, KindCreate, a.Kind, "%s: %s", a.Reason, a.Message)
				res, err := f.ex.Apply(f.ctx, in, a)
				require.NoError(t, err)
				assert.Equal(t, ledger.PhaseCreating, res.Record.Phase, "never the pod's terminal failure")
				assert.Equal(t, ReasonNodeRefused, res.Record.Reason)
				assert.True(t, res.NodeRefused)
				assert.GreaterOrEqual(t, res.RequeueAfter, 30*time.Second, "backs off")
			}
			assert.Len(t, ev.node, 1, "one Node event per distinct refusal")
			assert.Equal(t, EventNodeRefused, ev.node[0].reason)

			// The operator fixes the configuration: the next try creates.
			p.mu.Lock()
			p.err = nil
			p.mu.Unlock()
			r, err := f.ledger.Get(pod.UID)
			require.NoError(t, err)
			in := Input{Pod: pod, Record: &r, CacheSynced: true, Now: t0, Retries: 3}
			res, err := f.ex.Apply(f.ctx, in, Decide(in, cfg))
			require.NoError(t, err)
			assert.Equal(t, ledger.PhaseRunning, res.Record.Phase)
			assert.Len(t, f.cloud.Live(), 1)
		})
	}
}

// TestARefusalOfThePodsOwnChoiceFailsThePodUntilTheNodeChanges: the cloud
// refuses the type the pod asked for: that pod fails (terminal, reported),
// and stays failed while nothing changes; a change of the node's
// configuration (another subnet, so another zone) retries it once.
func TestARefusalOfThePodsOwnChoiceFailsThePodUntilTheNodeChanges(t *testing.T) {
	f := memoryFixture(t)
	p := &refusing{Provider: f.ex.Provider, err: &provider.Error{Kind: provider.ErrInvalidSpec, Provider: "memory", Op: "create",
		Code: "Unsupported", Refused: provider.RefusedInstanceType}}
	f.ex.Provider = p
	big := cfg
	big.Spec.Types = append(big.Spec.Types, provider.InstanceType{Name: "big", VCPUs: 8, MemoryMiB: 32768})
	big.NodeConfig = "subnet=a"
	asks := &Pod{UID: "uid-1", Namespace: "ns", Name: "web", Annotations: map[string]string{provider.AnnotationMachineType: "big"}}
	in := Input{Pod: asks, CacheSynced: true, Now: t0}
	res, err := f.ex.Apply(f.ctx, in, Decide(in, big))
	require.NoError(t, err)
	require.Equal(t, ledger.PhaseFailed, res.Record.Phase)
	assert.Equal(t, ReasonCloudRefused, res.Record.Reason)

	in = Input{Pod: asks, Record: res.Record, CacheSynced: true, Now: t0}
	assert.Equal(t, KindNone, Decide(in, big).Kind, "the same ask under the same node: not sent again")
	moved := big
	moved.NodeConfig = "subnet=b"
	a := Decide(in, moved)
	assert.Equal(t, KindCreate, a.Kind, "the node's configuration changed: retried")
	assert.Equal(t, ReasonSpecFixed, a.Reason)
}

// TestASpentKeyTakesTheNextAttempts (issue 18.4): the cloud says the key
// belongs to a VM it terminated (EC2's IdempotentInstanceTerminated). The
// record moves to the next attempt's key, durably before that create, and
// the VM is made with it.
func TestASpentKeyTakesTheNextAttempts(t *testing.T) {
	f := memoryFixture(t)
	spent := map[string]bool{Key("uid-1", 1): true, Key("uid-1", 2): true}
	f.ex.Provider = &spentKeys{Provider: f.ex.Provider, spent: spent, t: t, ledger: f.ledger}
	in := Input{Pod: pod, CacheSynced: true, Now: t0}
	res, err := f.ex.Apply(f.ctx, in, Decide(in, cfg))
	require.NoError(t, err)
	require.Equal(t, ledger.PhaseRunning, res.Record.Phase)
	assert.Equal(t, 3, res.Record.Attempt)
	assert.Equal(t, Key("uid-1", 3), res.Record.Key)
	live := f.cloud.Live()
	require.Len(t, live, 1)
	assert.Equal(t, Key("uid-1", 3), live[0].Tags[provider.TagKey])
	assert.Equal(t, 3, res.CloudWrites)
}

// spentKeys refuses the keys in spent with ErrKeySpent, and checks that
// every create's key is the record's durable intent (I2).
type spentKeys struct {
	provider.Provider
	spent  map[string]bool
	t      *testing.T
	ledger *ledger.Ledger
}

func (p *spentKeys) Create(ctx context.Context, spec provider.Spec) (provider.VM, error) {
	r, err := p.ledger.Get(spec.PodUID)
	require.NoError(p.t, err)
	assert.Equal(p.t, spec.Key, r.Key, "the intent names the key before the create")
	if p.spent[spec.Key] {
		return provider.VM{}, &provider.Error{Kind: provider.ErrKeySpent, Provider: "memory", Op: "create", Code: "IdempotentInstanceTerminated"}
	}
	return p.Provider.Create(ctx, spec)
}

func TestCloudRefusesTheSpecOnceUntilThePodAsksForSomethingElse(t *testing.T) {
	f := memoryFixture(t)
	bad := cfg
	bad.Spec.AllowedImages = []string{"img", "img-unknown"}
	missing := &Pod{UID: "uid-1", Namespace: "ns", Name: "web", Annotations: map[string]string{provider.AnnotationImage: "img-unknown"}}
	in := Input{Pod: missing, CacheSynced: true, Now: t0}
	res, err := f.ex.Apply(f.ctx, in, Decide(in, bad))
	require.NoError(t, err)
	assert.Equal(t, ledger.PhaseFailed, res.Record.Phase)
	assert.Equal(t, ReasonCloudRefused, res.Record.Reason)
	assert.Empty(t, f.cloud.Live())
	assert.Equal(t, []string{EventCreateFailed}, f.events.reasons())
	revision := res.Record.Revision

	// Pass after pass, the same ask is not sent again and the ledger is
	// left alone.
	for range 5 {
		in := Input{Pod: missing, Record: res.Record, CacheSynced: true, Now: t0}
		a := Decide(in, bad)
		require.Equal(t, KindNone, a.Kind, "%s: %s", a.Reason, a.Message)
		res, err = f.ex.Apply(f.ctx, in, a)
		require.NoError(t, err)
	}
	assert.Equal(t, int64(1), f.cloud.Counters()[cloud.OpCreate], "one create call in all")
	got, err := f.ledger.Get(pod.UID)
	require.NoError(t, err)
	assert.Equal(t, revision, got.Revision, "no ledger churn")

	// The pod's owner fixes the image: a new attempt, named as such.
	fixed := &Pod{UID: "uid-1", Namespace: "ns", Name: "web", Annotations: map[string]string{provider.AnnotationImage: "img"}}
	in = Input{Pod: fixed, Record: &got, CacheSynced: true, Now: t0}
	a := Decide(in, bad)
	require.Equal(t, KindCreate, a.Kind)
	assert.Equal(t, ReasonSpecFixed, a.Reason)
	res, err = f.ex.Apply(f.ctx, in, a)
	require.NoError(t, err)
	assert.Equal(t, ledger.PhaseRunning, res.Record.Phase)
	assert.Empty(t, res.Record.FailedSpec)
}

func TestThrottlingWaitsAndRaisesNoEvent(t *testing.T) {
	f := memoryFixture(t)
	f.cloud.SetFaults(cloud.Faults{ThrottleRate: 0.001, ThrottleWriteOnly: true, RetryAfter: 4 * time.Second})
	_, res := f.step(t, pod, time.Time{}, t0)
	assert.GreaterOrEqual(t, res.RequeueAfter, 4*time.Second)
	assert.Less(t, res.RequeueAfter, 5*time.Second)
	assert.Equal(t, ledger.PhaseCreating, res.Record.Phase, "the intent stays for the retry")
	assert.Empty(t, f.events.reasons(), "throttling is caa's to absorb, not the pod's to see")
}

func TestBadCredentialsStopTheDaemon(t *testing.T) {
	f := memoryFixture(t)
	f.cloud.SetFaults(cloud.Faults{DenyAuth: true})
	in := Input{Pod: pod, CacheSynced: true, Now: t0}
	_, err := f.ex.Apply(f.ctx, in, Decide(in, cfg))
	assert.ErrorIs(t, err, ErrDaemon)
	assert.ErrorIs(t, err, provider.ErrAuth)
}

func TestRecreateAfterAKillAndAfterAStop(t *testing.T) {
	f := memoryFixture(t)
	_, res := f.step(t, pod, time.Time{}, t0)
	first := res.Record.VMID
	require.NoError(t, f.cloud.Kill(first))

	a, res := f.step(t, pod, time.Time{}, t0)
	assert.Equal(t, KindCreate, a.Kind)
	assert.True(t, a.Recreate)
	assert.Equal(t, 2, res.Record.Attempt)
	assert.NotEqual(t, first, res.Record.VMID)
	second := res.Record.VMID

	require.NoError(t, f.cloud.Stop(second))
	a, res = f.step(t, pod, time.Time{}, t0)
	assert.Equal(t, second, a.OldVMID)
	assert.Equal(t, 3, res.Record.Attempt)
	assert.Len(t, f.cloud.Live(), 1, "the stopped VM was deleted, not leaked")
	assert.Equal(t, []string{EventVMCreated, EventVMRecreated, EventVMRecreated}, f.events.reasons())
}

func TestDeleteOfAGonePod(t *testing.T) {
	f := memoryFixture(t)
	_, res := f.step(t, pod, time.Time{}, t0)
	vmID := res.Record.VMID

	in := Input{Record: res.Record, CacheSynced: true, Now: t0}
	a := Decide(in, cfg)
	require.Equal(t, KindDelete, a.Kind)
	res, err := f.ex.Apply(f.ctx, in, a)
	require.NoError(t, err)
	assert.Nil(t, res.Record)
	assert.Equal(t, 1, res.CloudWrites)
	assert.Empty(t, f.cloud.Live())
	_, err = f.ledger.Get(pod.UID)
	assert.ErrorIs(t, err, ledger.ErrNotFound)
	hist, err := f.ledger.History(pod.UID)
	require.NoError(t, err)
	assert.Equal(t, ledger.PhaseDeleting, hist[len(hist)-2].Record.Phase, "Deleting was durable before the cloud delete")
	assert.Equal(t, ledger.ActionDeleted, hist[len(hist)-1].Action)
	assert.Equal(t, vmID, hist[len(hist)-1].Record.VMID)
}

func TestAdoptRebuildsALostRecord(t *testing.T) {
	f := memoryFixture(t)
	spec := provider.Spec{Key: Key(pod.UID, 4), Cluster: "c", Node: "n", PodUID: pod.UID, PodNamespace: "ns", PodName: "web",
		InstanceType: "small", Image: "img"}
	vm, err := f.ex.Provider.Create(f.ctx, spec)
	require.NoError(t, err)

	a, res := f.step(t, pod, time.Time{}, t0)
	assert.Equal(t, KindAdopt, a.Kind)
	assert.Equal(t, vm.ID, res.Record.VMID)
	assert.Equal(t, 4, res.Record.Attempt, "the attempt comes back from the key")
	assert.Equal(t, spec.Key, res.Record.Key)
	assert.Equal(t, []string{EventVMAdopted}, f.events.reasons())
}

func TestAttemptOf(t *testing.T) {
	assert.Equal(t, 7, AttemptOf(Key("5f1c-uid", 7)))
	assert.Equal(t, 1, AttemptOf("no-attempt-here"))
	assert.Equal(t, 1, AttemptOf("x-a0"))
}

// TestAPodAskingMoreThanTheDefaultTypeIsTold: with no --instance-types to
// fit it to, a pod whose limits exceed the default type gets that type and
// a warning event saying so, in the informer mode as in the kata mode.
func TestAPodAskingMoreThanTheDefaultTypeIsTold(t *testing.T) {
	f := memoryFixture(t)
	big := &Pod{UID: "uid-1", Namespace: "ns", Name: "web", RuntimeClass: "kata-remote",
		Annotations: map[string]string{provider.AnnotationVCPUs: "8", provider.AnnotationMemory: "16384"}}
	c := cfg
	c.Spec = provider.SpecConfig{DefaultType: "small", DefaultImage: "img",
		Known: []provider.InstanceType{{Name: "small", VCPUs: 2, MemoryMiB: 4096}}}
	in := Input{Pod: big, CacheSynced: true, Now: t0}
	a := Decide(in, c)
	require.Equal(t, KindCreate, a.Kind)
	_, err := f.ex.Apply(f.ctx, in, a)
	require.NoError(t, err)
	assert.Equal(t, []string{EventVMCreated, EventSmallerThanAsked}, f.events.reasons())
	f.events.mu.Lock()
	defer f.events.mu.Unlock()
	assert.True(t, f.events.all[1].warning)
	assert.Contains(t, f.events.all[1].message, "--instance-types")
}
