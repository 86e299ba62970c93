package sandbox

import (
	"context"

	"net"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/pkg/ledger"
	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/pkg/reconcile"
	"github.com/caa-project/caa/test/mocks/cloud"
	"github.com/caa-project/caa/test/mocks/memory"
)

// fakePods is a pod cache.
type fakePods struct {
	mu       sync.Mutex
	pods     map[string]*reconcile.Pod
	unsynced bool
}

func (f *fakePods) setSynced(ok bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.unsynced = !ok
}

func (f *fakePods) add(p *reconcile.Pod) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pods[p.UID] = p
}

func (f *fakePods) remove(uid string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.pods, uid)
}

func (f *fakePods) Pods() []*reconcile.Pod {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []*reconcile.Pod
	for _, p := range f.pods {
		out = append(out, p)
	}
	return out
}

func (f *fakePods) Pod(uid string) *reconcile.Pod {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.pods[uid]
}

func (f *fakePods) Synced() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return !f.unsynced
}

// fakeSide records what the lifecycle asked of the pod VM side.
type fakeSide struct {
	mu        sync.Mutex
	userData  []UserDataInput
	tunnels   map[string]ledger.Tunnel // netns -> set up
	teardowns int
	guarded   [][]ledger.Tunnel     // each GuardTunnels's recorded tunnels
	relays    map[string]*fakeRelay // socket -> live relay
	started   int
	// unreachable makes WaitReachable wait for ctx (a forwarder that never answers).
	unreachable bool
	serial      int
	// gate, when set, runs first in UserData ("userdata"), SetupTunnel
	// ("tunnel"), StartRelay ("relay"), TeardownTunnel ("teardown") and a
	// relay's Close ("close"), outside the side's lock: a test holds a call
	// there.
	gate func(stage string)
}

func (f *fakeSide) pass(stage string) {
	f.mu.Lock()
	g := f.gate
	f.mu.Unlock()
	if g != nil {
		g(stage)
	}
}

// liveRelays counts the relays started and not closed.
func (f *fakeSide) liveRelays() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.relays)
}

func (f *fakeSide) tunnelUp(netns string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, ok := f.tunnels[netns]
	return ok
}

func newFakeSide() *fakeSide {
	return &fakeSide{tunnels: map[string]ledger.Tunnel{}, relays: map[string]*fakeRelay{}}
}

func (f *fakeSide) UserData(_ context.Context, in UserDataInput) ([]byte, string, error) {
	f.pass("userdata")
	f.mu.Lock()
	defer f.mu.Unlock()
	in.AuthJSON = slices.Clone(in.AuthJSON) // the caller wipes its copy after the call
	f.userData = append(f.userData, in)
	f.serial++
	// As the real user data, it carries the initdata and the credentials
	// (so that their sizes count).
	data := "#cloud-config\n# for " + in.Sandbox.VMName + "\n" + in.InitData + string(in.AuthJSON)
	return []byte(data), "serial-" + string(rune('0'+f.serial)), nil
}

func (f *fakeSide) SetupTunnel(netns string, t ledger.Tunnel) error {
	f.pass("tunnel")
	f.mu.Lock()
	defer f.mu.Unlock()
	f.tunnels[netns] = t
	return nil
}

func (f *fakeSide) TeardownTunnel(netns string, _ ledger.Tunnel) error {
	f.pass("teardown")
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.tunnels, netns)
	f.teardowns++
	return nil
}

func (f *fakeSide) GuardTunnels(recorded func() ([]ledger.Tunnel, error)) error {
	ts, err := recorded()
	if err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.guarded = append(f.guarded, ts)
	return nil
}

func (f *fakeSide) StartRelay(_ context.Context, socket, addr, serverName string) (Relay, error) {
	f.pass("relay")
	f.mu.Lock()
	defer f.mu.Unlock()
	r := &fakeRelay{side: f, socket: socket, addr: addr, serverName: serverName, unreachable: f.unreachable}
	f.relays[socket] = r
	f.started++
	return r, nil
}

func (f *fakeSide) relay(socket string) *fakeRelay {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.relays[socket]
}

type fakeRelay struct {
	side                     *fakeSide
	socket, addr, serverName string
	unreachable              bool
}

func (r *fakeRelay) WaitReachable(ctx context.Context) error {
	if err := ctx.Err(); err != nil { // as a real relay: a cancelled wait fails
		return err
	}
	if r.unreachable {
		<-ctx.Done()
		return ctx.Err()
	}
	return nil
}

func (r *fakeRelay) Close() error {
	r.side.pass("close")
	r.side.mu.Lock()
	defer r.side.mu.Unlock()
	if r.side.relays[r.socket] == r {
		delete(r.side.relays, r.socket)
	}
	return nil
}

// rig is a manager over a real ledger file, the memory cloud and fakes.
type rig struct {
	t      *testing.T
	led    *ledger.Ledger
	cloud  *cloud.Cloud
	prov   provider.Provider
	pods   *fakePods
	side   *fakeSide
	m      *Manager
	events *eventLog
	stop   context.CancelFunc
	path   string
	// tweak, when set, adjusts each manager's configuration at start.
	tweak func(*Config)
}

type eventLog struct {
	mu   sync.Mutex
	got  []string
	msgs []string
}

func (e *eventLog) Event(_ *reconcile.Pod, _ bool, reason, msg string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.got = append(e.got, reason)
	e.msgs = append(e.msgs, msg)
}

// messages is every event's message, one a line.
func (e *eventLog) messages() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return strings.Join(e.msgs, "\n")
}

func (e *eventLog) reasons() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.got...)
}

// sentFlags records each create's Spec.MaybeSent.
type sentFlags struct {
	provider.Provider
	mu  sync.Mutex
	got []bool
}

func (p *sentFlags) Create(ctx context.Context, spec provider.Spec) (provider.VM, error) {
	p.mu.Lock()
	p.got = append(p.got, spec.MaybeSent)
	p.mu.Unlock()
	return p.Provider.Create(ctx, spec)
}

func (p *sentFlags) flags() []bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.got)
}

func newRig(t *testing.T) *rig {
	t.Helper()
	r := &rig{t: t, cloud: cloud.New(cloud.Options{IDPrefix: "vm-", KeepTerminated: time.Hour}),
		pods: &fakePods{pods: map[string]*reconcile.Pod{}}, side: newFakeSide(), events: &eventLog{},
		path: filepath.Join(t.TempDir(), "ledger.db")}
	r.prov = memory.New(r.cloud)
	r.start()
	return r
}

// start opens the ledger and makes a manager: a caa process.
func (r *rig) start() {
	r.t.Helper()
	led, err := ledger.Open(ledger.Options{Path: r.path, Node: "node-1", Cluster: "c1", Timeout: time.Second})
	require.NoError(r.t, err)
	ctx, stop := context.WithCancel(context.Background())
	r.led, r.stop = led, stop
	cfg := Config{
		Ledger: led, Provider: r.prov, Pods: r.pods, Side: r.side, Events: r.events,
		Spec:    provider.SpecConfig{DefaultType: "small", DefaultImage: "podvm-image", Types: []provider.InstanceType{{Name: "small", VCPUs: 1, MemoryMiB: 2048}, {Name: "large", VCPUs: 4, MemoryMiB: 8192}}},
		Cluster: "c1", Node: "node-1", NodeIP: net.ParseIP("192.0.2.10"), SocketDir: filepath.Join(r.t.TempDir(), "pods"),
		Poll: 5 * time.Millisecond, StartTimeout: 5 * time.Second, PodWait: 200 * time.Millisecond,
		ConfirmMissing: time.Hour, Stop: ctx,
	}
	if r.tweak != nil {
		r.tweak(&cfg)
	}
	r.m = New(cfg)
	r.t.Cleanup(r.crash)
}

// crash ends the process without any cleanup of sandboxes (as SIGKILL).
func (r *rig) crash() {
	r.stop()
	r.m.Wait()
	r.m.Close()
	_ = r.led.Close()
}

func (r *rig) pod(uid, name string) *reconcile.Pod {
	p := &reconcile.Pod{UID: uid, Namespace: "team", Name: name, RuntimeClass: "kata-remote", Annotations: map[string]string{}}
	r.pods.add(p)
	return p
}

// shimAnnotations are what kata's Go shim sends: every setting, empty or
// zero where the sandbox has none.
func shimAnnotations(name string) map[string]string {
	return map[string]string{
		AnnotationSandboxName: name, AnnotationSandboxNamespace: "team",
		provider.AnnotationMachineType: "", provider.AnnotationImage: "",
		provider.AnnotationVCPUs: "1", provider.AnnotationMemory: "2048",
		AnnotationInitData: "", "io.katacontainers.config.hypervisor.default_gpus": "0",
	}
}

func (r *rig) sandbox(id string) ledger.Sandbox {
	r.t.Helper()
	s, err := r.led.GetSandbox(id)
	require.NoError(r.t, err)
	return s
}

func (r *rig) live() []cloud.Instance { return r.cloud.Live() }

func (r *rig) writes() int64 {
	c := r.cloud.Counters()
	return c[cloud.OpCreate] + c[cloud.OpDelete]
}

// eventually polls cond (a condition, never a sleep as synchronisation).
func eventually(t *testing.T, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func newMemory(c *cloud.Cloud) provider.Provider { return memory.New(c) }
