package sandbox

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/pkg/ledger"
	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/test/mocks/cloud"
)

const sbA = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

func sbID(i int) string { return fmt.Sprintf("%064x", i+1) }

func TestLifecycleCreateStartStop(t *testing.T) {
	r := newRig(t)
	flags := &sentFlags{Provider: r.prov}
	r.crash()
	r.prov = flags
	r.start()
	ctx := context.Background()
	r.pod("uid-1", "web")

	sock, err := r.m.CreateVM(ctx, sbA, shimAnnotations("web"), "/var/run/netns/cni-1")
	require.NoError(t, err)
	assert.Equal(t, r.m.SocketPath(sbA), sock)
	assert.Zero(t, r.cloud.Counters()["total"], "CreateVM makes no cloud call")
	s := r.sandbox(sbA)
	assert.Equal(t, ledger.SandboxCreated, s.Phase)
	assert.Equal(t, "uid-1", s.PodUID)
	assert.Equal(t, "small", s.InstanceType, "the shim's empty machine_type and 1 vCPU / 2048 MiB pick the smallest fit")
	assert.GreaterOrEqual(t, s.Tunnel.VXLANID, VXLANIDBase)
	assert.LessOrEqual(t, s.Tunnel.VXLANID, VXLANIDMax)

	again, err := r.m.CreateVM(ctx, sbA, shimAnnotations("web"), "/var/run/netns/cni-1")
	require.NoError(t, err, "a repeated CreateVM answers the same")
	assert.Equal(t, sock, again)

	require.NoError(t, r.m.StartVM(ctx, sbA))
	assert.Equal(t, []bool{false}, flags.flags(), "the key this StartVM took cannot have been sent: no lookup first")
	s = r.sandbox(sbA)
	assert.Equal(t, ledger.SandboxRunning, s.Phase)
	require.Len(t, r.live(), 1)
	vm := r.live()[0]
	assert.Equal(t, vm.ID, s.VMID)
	assert.Equal(t, sbA, vm.Tags[TagSandbox])
	assert.Equal(t, "uid-1", vm.Tags[provider.TagPodUID])
	assert.Equal(t, Key(sbA, 1), vm.Tags[provider.TagKey])
	assert.Contains(t, string(vm.UserData()), VMName("web", sbA), "the VM boots with the user data the side built")
	assert.Equal(t, vm.IPs[0]+":15150", s.RelayAddr)
	assert.Equal(t, vm.IPs[0], s.Tunnel.RemoteIP)
	assert.Equal(t, "192.0.2.10", s.Tunnel.LocalIP)
	assert.Equal(t, []string{"serial-1"}, s.CertSerials)
	rel := r.side.relay(sock)
	require.NotNil(t, rel, "the agent socket is served")
	assert.Equal(t, s.VMName, rel.serverName, "the relay checks the forwarder's certificate against the VM's name")

	require.NoError(t, r.m.StartVM(ctx, sbA), "a repeated StartVM of a running sandbox is a no-op")
	assert.Len(t, r.live(), 1)

	require.NoError(t, r.m.StopVM(ctx, sbA))
	// StopVM answers once Deleting is durable; the delete after the answer
	// may already have removed the record, never its story.
	if now, err := r.led.GetSandbox(sbA); err == nil {
		assert.Equal(t, ledger.SandboxDeleting, now.Phase, "StopVM answers once Deleting is durable")
	}
	atStop, err := r.led.SandboxHistory(sbA)
	require.NoError(t, err)
	assert.True(t, slices.ContainsFunc(atStop, func(e ledger.SandboxEvent) bool { return e.Sandbox.Phase == ledger.SandboxDeleting }),
		"Deleting was durable when StopVM answered: %v", atStop)
	eventually(t, func() bool { return r.side.relay(sock) == nil }, "the agent socket is closed, after the answer")
	eventually(t, func() bool { return len(r.live()) == 0 }, "the VM is deleted")
	eventually(t, func() bool { _, err := r.led.GetSandbox(sbA); return err != nil }, "the record goes")
	hist, err := r.led.SandboxHistory(sbA)
	require.NoError(t, err)
	var phases []ledger.SandboxPhase
	for _, e := range hist {
		phases = append(phases, e.Sandbox.Phase)
	}
	assert.Equal(t, ledger.SandboxCreating, phases[1], "the intent was durable before the VM existed: %v", phases)
	assert.Empty(t, hist[1].Sandbox.VMID)
	assert.Equal(t, ledger.ActionDeleted, hist[len(hist)-1].Action, "the story stays in history")
}

// The intent (Creating with its key) is durable before the create: a
// create that fails leaves the record saying so, and the next StartVM
// uses the same key, so the cloud never holds two VMs for the sandbox.
func TestStartVMAfterACrashMidCreateMakesNoDuplicate(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	r.pod("uid-1", "web")
	_, err := r.m.CreateVM(ctx, sbA, shimAnnotations("web"), "/run/netns/ns")
	require.NoError(t, err)

	// The cloud makes the VM, but caa dies before it learns the answer:
	// play it by creating with the record's key behind caa's back, then
	// putting the record where a crash would leave it.
	s := r.sandbox(sbA)
	s.Phase, s.Attempt, s.Key, s.VMName = ledger.SandboxCreating, 1, Key(sbA, 1), VMName("web", sbA)
	_, err = r.led.PutSandbox(s)
	require.NoError(t, err)
	made, err := r.prov.Create(ctx, provider.Spec{Key: s.Key, Cluster: "c1", Node: "node-1", PodUID: "uid-1",
		PodNamespace: "team", PodName: "web", InstanceType: "small", Image: "podvm-image"})
	require.NoError(t, err)
	r.crash()
	flags := &sentFlags{Provider: r.prov}
	r.prov = flags
	r.start()

	require.NoError(t, r.m.StartVM(ctx, sbA), "the shim's StartVM after the restart")
	assert.Equal(t, []bool{true}, flags.flags(), "a Creating sandbox's key may have reached the cloud: the provider looks first")
	require.Len(t, r.live(), 1, "no duplicate VM")
	assert.Equal(t, made.ID, r.sandbox(sbA).VMID, "the VM the first create made is the sandbox's")
	assert.Equal(t, 1, r.sandbox(sbA).Attempt)
}

func TestStopVMDuringStartVMAnswersFastAndLeaksNothing(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	r.pod("uid-1", "web")
	r.cloud.SetFaults(cloud.Faults{BootDelay: time.Hour}) // never runs
	_, err := r.m.CreateVM(ctx, sbA, shimAnnotations("web"), "/run/netns/ns")
	require.NoError(t, err)
	started := make(chan error, 1)
	go func() { started <- r.m.StartVM(ctx, sbA) }()
	eventually(t, func() bool { return r.sandbox(sbA).VMID != "" }, "the VM is created")

	t0 := time.Now()
	require.NoError(t, r.m.StopVM(ctx, sbA))
	assert.Less(t, time.Since(t0), time.Second, "runtime-rs gives StopVM about a second")
	require.Error(t, <-started, "the StartVM gives up")
	eventually(t, func() bool { return len(r.live()) == 0 }, "the VM made for the stopped sandbox is deleted")
	eventually(t, func() bool { _, err := r.led.GetSandbox(sbA); return err != nil }, "the record goes")
}

// StopVM answers once the sandbox is Deleting durably, without waiting for
// its tunnel to go (100 teardowns at once queue in the kernel, past the
// second runtime-rs gives StopVM) nor its relay to close (a relay daemon's
// stops go one at a time): both run after the answer, then the VM's
// delete. A crash before they ran loses nothing: the next caa's sync does
// them.
func TestStopVMAnswersBeforeTheTunnelAndRelayGo(t *testing.T) {
	for _, stage := range []string{"teardown", "close"} {
		t.Run(stage, func(t *testing.T) {
			r := newRig(t)
			ctx := context.Background()
			r.pod("uid-1", "web")
			sock, err := r.m.CreateVM(ctx, sbA, shimAnnotations("web"), "/run/netns/ns")
			require.NoError(t, err)
			require.NoError(t, r.m.StartVM(ctx, sbA))
			reached, release := holdAt(r.side, stage)

			stopped := make(chan error, 1)
			go func() { stopped <- r.m.StopVM(ctx, sbA) }()
			select {
			case err := <-stopped:
				require.NoError(t, err)
			case <-time.After(10 * time.Second):
				close(release)
				t.Fatalf("StopVM did not answer while the %s was held: the answer waits for it", stage)
			}
			// Durable before the answer (PutSandbox returns once committed).
			assert.Equal(t, ledger.SandboxDeleting, r.sandbox(sbA).Phase)
			<-reached // runs after the answer
			assert.Len(t, r.live(), 1, "the VM waits for the release")
			close(release)
			eventually(t, func() bool { return r.side.relay(sock) == nil && !r.side.tunnelUp("/run/netns/ns") }, "relay and tunnel go")
			eventually(t, func() bool { return len(r.live()) == 0 }, "the VM is deleted")
			eventually(t, func() bool { _, err := r.led.GetSandbox(sbA); return err != nil }, "the record goes")
		})
	}
}

// A new sandbox of the same pod may set up its tunnel in the same network
// namespace right after the old one's StopVM answered, while the old
// tunnel's teardown (which removes the namespace's caa tunnel by name) is
// still to run: the new setup waits for it, so the new tunnel stays.
func TestANewSandboxsTunnelSurvivesTheOldOnesStop(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	r.pod("uid-1", "web")
	_, err := r.m.CreateVM(ctx, sbA, shimAnnotations("web"), "/run/netns/ns")
	require.NoError(t, err)
	require.NoError(t, r.m.StartVM(ctx, sbA))
	reached, release := holdAt(r.side, "teardown") // the old teardown is late
	require.NoError(t, r.m.StopVM(ctx, sbA))
	<-reached
	_, err = r.m.CreateVM(ctx, sbID(7), shimAnnotations("web"), "/run/netns/ns")
	require.NoError(t, err)
	started := make(chan error, 1)
	go func() { started <- r.m.StartVM(ctx, sbID(7)) }()
	select {
	case err := <-started:
		close(release)
		t.Fatalf("the new sandbox's StartVM finished (%v) while the old tunnel's teardown was pending", err)
	case <-time.After(100 * time.Millisecond): // a negative check: nothing to poll for
	}
	close(release)
	require.NoError(t, <-started)
	eventually(t, func() bool { _, err := r.led.GetSandbox(sbA); return err != nil }, "the old sandbox is gone")
	assert.True(t, r.side.tunnelUp("/run/netns/ns"), "the new sandbox's tunnel is up")
	assert.Equal(t, ledger.SandboxRunning, r.sandbox(sbID(7)).Phase)
}

// A caa killed right after StopVM answered (relay, tunnel and VM still
// there) leaves a Deleting record: the next caa's first sync releases the
// sandbox and deletes its VM.
func TestStopVMAnsweredThenCrashIsFinishedByTheNextCaa(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	r.pod("uid-1", "web")
	_, err := r.m.CreateVM(ctx, sbA, shimAnnotations("web"), "/run/netns/ns")
	require.NoError(t, err)
	require.NoError(t, r.m.StartVM(ctx, sbA))
	reached, release := holdAt(r.side, "close")
	stopped := make(chan error, 1)
	go func() { stopped <- r.m.StopVM(ctx, sbA) }()
	select {
	case err := <-stopped:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		close(release)
		t.Fatal("StopVM did not answer while the relay's close was held")
	}
	<-reached
	r.stop() // the process is going: nothing more starts
	close(release)
	r.m.Wait()
	_ = r.led.Close()
	require.Len(t, r.live(), 1, "the VM outlived the crash")

	r.side.mu.Lock()
	r.side.gate = nil
	r.side.mu.Unlock()
	r.start()
	_, err = r.m.Sync(ctx, time.Second)
	require.NoError(t, err)
	eventually(t, func() bool { return len(r.live()) == 0 }, "the next caa deletes the VM")
	eventually(t, func() bool { _, err := r.led.GetSandbox(sbA); return err != nil }, "and removes the record")
	assert.False(t, r.side.tunnelUp("/run/netns/ns"), "the tunnel is gone")
}

func TestHostileRequestsGetClearErrorsAndLoseNothing(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	r.pod("uid-1", "web")
	_, err := r.m.CreateVM(ctx, sbA, shimAnnotations("web"), "/run/netns/ns")
	require.NoError(t, err)
	require.NoError(t, r.m.StartVM(ctx, sbA))
	before := r.sandbox(sbA)

	cases := []struct {
		name string
		call func() error
		kind error
		says string
	}{
		{"image outside the allow-list", func() error {
			a := shimAnnotations("web")
			a[provider.AnnotationImage] = "evil-image"
			_, err := r.m.CreateVM(ctx, sbID(7), a, "/run/netns/ns")
			return err
		}, ErrInvalid, provider.AnnotationImage},
		{"oversized initdata", func() error {
			a := shimAnnotations("web")
			a[AnnotationInitData] = strings.Repeat("x", MaxInitData+1)
			_, err := r.m.CreateVM(ctx, sbID(8), a, "/run/netns/ns")
			return err
		}, ErrInvalid, AnnotationInitData},
		{"no pod name", func() error {
			a := shimAnnotations("web")
			delete(a, AnnotationSandboxName)
			_, err := r.m.CreateVM(ctx, sbID(9), a, "/run/netns/ns")
			return err
		}, ErrInvalid, AnnotationSandboxName},
		{"a pod not on this node", func() error {
			_, err := r.m.CreateVM(ctx, sbID(10), shimAnnotations("elsewhere"), "/run/netns/ns")
			return err
		}, ErrInvalid, "team/elsewhere"},
		{"a path in the sandbox id", func() error {
			_, err := r.m.CreateVM(ctx, "../../etc", shimAnnotations("web"), "/run/netns/ns")
			return err
		}, ErrInvalid, "sandbox id"},
		{"StartVM of an unknown sandbox", func() error { return r.m.StartVM(ctx, sbID(11)) }, ErrUnknownSandbox, sbID(11)},
		{"StopVM of an unknown sandbox", func() error { return r.m.StopVM(ctx, sbID(12)) }, ErrUnknownSandbox, sbID(12)},
		{"another pod's sandbox id", func() error {
			r.pod("uid-2", "other")
			_, err := r.m.CreateVM(ctx, sbA, shimAnnotations("other"), "/run/netns/ns")
			return err
		}, ErrInvalid, "recorded for pod team/web"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.call()
			require.ErrorIs(t, err, c.kind)
			assert.Contains(t, err.Error(), c.says)
		})
	}
	all, err := r.led.ListSandboxes()
	require.NoError(t, err)
	assert.Len(t, all, 1, "no hostile request recorded anything")
	after := r.sandbox(sbA)
	assert.Equal(t, before.Revision, after.Revision, "the running sandbox is untouched")
	assert.Len(t, r.live(), 1)
	assert.NotNil(t, r.side.relay(before.AgentSocket))
}

// Restart: every running sandbox is served again with no cloud write and
// one listing; a VM that died behind caa's back makes its sandbox Lost
// (socket closed, event) and is never recreated for it.
func TestRestartServesEverySandboxWithNoCloudWrite(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	const n = 20
	for i := range n {
		r.pod(fmt.Sprint("uid-", i), fmt.Sprint("web-", i))
		_, err := r.m.CreateVM(ctx, sbID(i), shimAnnotations(fmt.Sprint("web-", i)), fmt.Sprint("/run/netns/ns-", i))
		require.NoError(t, err)
		require.NoError(t, r.m.StartVM(ctx, sbID(i)))
	}
	require.Len(t, r.live(), n)
	victim := r.sandbox(sbID(3)).VMID
	r.crash()
	assert.Empty(t, r.side.relays, "the dead process served nothing")
	require.NoError(t, r.cloud.Kill(victim))
	r.cloud.ResetCounters()
	startedBefore := r.side.started

	r.start()
	rep, err := r.m.Sync(ctx, 5*time.Second)
	require.NoError(t, err)
	assert.True(t, rep.Ready(), "pending: %v", rep.Pending)
	assert.Len(t, rep.Served, n-1)
	assert.Equal(t, []string{sbID(3)}, rep.Lost)
	assert.Zero(t, r.writes(), "no cloud write at restart")
	assert.Equal(t, int64(1), r.cloud.Counters()[cloud.OpList], "one listing")
	assert.Zero(t, r.cloud.Counters()[cloud.OpGet], "the terminated VM shows in the listing: no get")
	assert.Equal(t, n-1, r.side.started-startedBefore)
	for i := range n {
		s := r.sandbox(sbID(i))
		if i == 3 {
			assert.Equal(t, ledger.SandboxLost, s.Phase)
			assert.Nil(t, r.side.relay(s.AgentSocket))
			continue
		}
		assert.NotNil(t, r.side.relay(s.AgentSocket), "sandbox %d served again", i)
	}
	assert.Contains(t, r.events.reasons(), EventVMLost)
	require.ErrorIs(t, r.m.StartVM(ctx, sbID(3)), ErrNotStartable, "a lost sandbox gets no new VM")

	// The kubelet starts the next sandbox of that pod: it gets a new VM,
	// and the lost one's record goes (its VM is already terminated).
	next := sbID(100)
	_, err = r.m.CreateVM(ctx, next, shimAnnotations("web-3"), "/run/netns/ns-3b")
	require.NoError(t, err)
	require.NoError(t, r.m.StartVM(ctx, next))
	assert.Len(t, r.live(), n)
	eventually(t, func() bool { _, err := r.led.GetSandbox(sbID(3)); return err != nil }, "the superseded sandbox's record goes")
}

// A stopped VM (still in the cloud) under a live sandbox is lost too; the
// old VM is deleted once a newer sandbox of the pod runs.
func TestVMStoppedBehindCaasBackIsReplacedBySuccessorAndDeleted(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	r.pod("uid-1", "web")
	_, err := r.m.CreateVM(ctx, sbA, shimAnnotations("web"), "/run/netns/ns")
	require.NoError(t, err)
	require.NoError(t, r.m.StartVM(ctx, sbA))
	old := r.sandbox(sbA)
	require.NoError(t, r.cloud.Stop(old.VMID))

	rep, err := r.m.Sync(ctx, time.Second)
	require.NoError(t, err)
	assert.Equal(t, []string{sbA}, rep.Lost)
	assert.Nil(t, r.side.relay(old.AgentSocket), "the lost sandbox's socket closes")
	assert.Len(t, r.cloud.Instances(), 1, "nothing is deleted on loss alone")

	_, err = r.m.CreateVM(ctx, sbID(5), shimAnnotations("web"), "/run/netns/ns2")
	require.NoError(t, err)
	require.NoError(t, r.m.StartVM(ctx, sbID(5)))
	eventually(t, func() bool {
		_, err := r.cloud.Get(old.VMID)
		in, _ := r.cloud.Get(old.VMID)
		return err != nil || in.State == provider.StateTerminated
	}, "the old VM is deleted")
	assert.Len(t, r.live(), 1)
}

// A VM a listing misses is confirmed before its sandbox is lost: one
// not-found read never kills a sandbox (invariant I3).
func TestMissingVMIsConfirmedBeforeTheSandboxIsLost(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	r.pod("uid-1", "web")
	_, err := r.m.CreateVM(ctx, sbA, shimAnnotations("web"), "/run/netns/ns")
	require.NoError(t, err)
	require.NoError(t, r.m.StartVM(ctx, sbA))
	r.m.cfg.ConfirmMissing = time.Hour
	now := time.Now()
	r.m.cfg.Now = func() time.Time { return now }
	// Gone without a trace: not found at once (KeepTerminated 0).
	r.cloud = cloud.New(cloud.Options{})
	r.m.cfg.Provider = newMemory(r.cloud)

	rep, err := r.m.Sync(ctx, time.Second)
	require.NoError(t, err)
	assert.Empty(t, rep.Lost)
	assert.Contains(t, rep.Pending[sbA], "confirming")
	assert.Equal(t, ledger.SandboxRunning, r.sandbox(sbA).Phase)

	now = now.Add(time.Hour)
	rep, err = r.m.Sync(ctx, time.Second)
	require.NoError(t, err)
	assert.Equal(t, []string{sbA}, rep.Lost)
}

func TestPodGoneRetiresItsSandboxes(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	r.pod("uid-1", "web")
	_, err := r.m.CreateVM(ctx, sbA, shimAnnotations("web"), "/run/netns/ns")
	require.NoError(t, err)
	require.NoError(t, r.m.StartVM(ctx, sbA))
	r.pods.remove("uid-1")
	rep, err := r.m.Sync(ctx, time.Second)
	require.NoError(t, err)
	assert.Equal(t, 1, rep.Retired)
	eventually(t, func() bool { return len(r.live()) == 0 }, "the VM of the gone pod is deleted")
}

// A shutdown deletes nothing and starts nothing (invariant I4).
func TestShutdownDeletesNothingAndRefusesNewWork(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	r.pod("uid-1", "web")
	_, err := r.m.CreateVM(ctx, sbA, shimAnnotations("web"), "/run/netns/ns")
	require.NoError(t, err)
	require.NoError(t, r.m.StartVM(ctx, sbA))
	r.stop()
	writes := r.writes()
	_, err = r.m.CreateVM(ctx, sbID(2), shimAnnotations("web"), "/run/netns/ns")
	require.ErrorIs(t, err, ErrStopping)
	require.ErrorIs(t, r.m.StartVM(ctx, sbA), ErrStopping)
	r.m.Close()
	r.m.Wait()
	assert.Equal(t, writes, r.writes())
	assert.Len(t, r.live(), 1)
	assert.Equal(t, ledger.SandboxRunning, r.sandbox(sbA).Phase)
}

func TestConcurrentSandboxesGetDistinctVXLANIDs(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	var wg sync.WaitGroup
	for i := range 8 {
		r.pod(fmt.Sprint("uid-", i), fmt.Sprint("p", i))
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := r.m.CreateVM(ctx, sbID(i), shimAnnotations(fmt.Sprint("p", i)), "/run/netns/ns")
			assert.NoError(t, err)
		}()
	}
	wg.Wait()
	all, err := r.led.ListSandboxes()
	require.NoError(t, err)
	ids := map[int]bool{}
	for _, s := range all {
		ids[s.Tunnel.VXLANID] = true
	}
	assert.Len(t, ids, 8)
}

// TestVXLANIDsAreDrawnAtRandom: a sandbox's VXLAN id is drawn from the
// whole range, not counted up, so one pod VM's id tells nothing of its
// neighbours'. A draw that hits a recorded id is drawn again, and the
// record keeps its id.
func TestVXLANIDsAreDrawnAtRandom(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	var ids []int
	for i := range 8 {
		r.pod(fmt.Sprint("uid-", i), fmt.Sprint("p", i))
		_, err := r.m.CreateVM(ctx, sbID(i), shimAnnotations(fmt.Sprint("p", i)), "/run/netns/ns")
		require.NoError(t, err)
		id := r.sandbox(sbID(i)).Tunnel.VXLANID
		require.GreaterOrEqual(t, id, VXLANIDBase)
		require.LessOrEqual(t, id, VXLANIDMax)
		ids = append(ids, id)
	}
	slices.Sort(ids)
	ids = slices.Compact(ids)
	require.Len(t, ids, 8, "distinct ids")
	// Eight draws from 16.2 million land within 10,000 of each other with
	// chance below 10^-20; counted ids always do.
	assert.Greater(t, ids[7]-ids[0], 10000, "the ids %v are counted, not drawn", ids)

	old := r.sandbox(sbID(0))
	draws := []int{old.Tunnel.VXLANID, ids[3], 7777777}
	r.m.drawVXLAN = func() (int, error) {
		d := draws[0]
		draws = draws[1:]
		return d, nil
	}
	r.pod("uid-new", "new")
	_, err := r.m.CreateVM(ctx, sbID(100), shimAnnotations("new"), "/run/netns/ns")
	require.NoError(t, err)
	assert.Equal(t, 7777777, r.sandbox(sbID(100)).Tunnel.VXLANID, "draws of recorded ids are drawn again")
	assert.Equal(t, old.Tunnel.VXLANID, r.sandbox(sbID(0)).Tunnel.VXLANID, "a record keeps its id")
	assert.Empty(t, draws)
}

// holdAt makes the side stop a StartVM at stage until release is closed;
// reached is closed when it gets there.
func holdAt(side *fakeSide, stage string) (reached, release chan struct{}) {
	reached, release = make(chan struct{}), make(chan struct{})
	var once sync.Once
	side.mu.Lock()
	side.gate = func(s string) {
		if s == stage {
			once.Do(func() { close(reached); <-release })
		}
	}
	side.mu.Unlock()
	return reached, release
}

// A StopVM that lands while StartVM sets up the tunnel or starts the relay
// (StopVM takes no turn: it cannot wait for them) leaves neither behind:
// the relay StartVM made after StopVM's close is closed, the tunnel it set
// up after StopVM's teardown is torn down, and the VM and record go.
func TestStopVMDuringTunnelOrRelaySetupLeaksNoRelay(t *testing.T) {
	for _, stage := range []string{"tunnel", "relay"} {
		t.Run(stage, func(t *testing.T) {
			r := newRig(t)
			ctx := context.Background()
			r.pod("uid-1", "web")
			sock, err := r.m.CreateVM(ctx, sbA, shimAnnotations("web"), "/run/netns/ns")
			require.NoError(t, err)
			reached, release := holdAt(r.side, stage)
			started := make(chan error, 1)
			go func() { started <- r.m.StartVM(ctx, sbA) }()
			<-reached

			require.NoError(t, r.m.StopVM(ctx, sbA))
			close(release)
			require.Error(t, <-started, "the StartVM of a stopped sandbox fails")
			assert.Zero(t, r.side.liveRelays(), "no relay left serving %s", sock)
			assert.False(t, r.side.tunnelUp("/run/netns/ns"), "no tunnel left")
			eventually(t, func() bool { return len(r.live()) == 0 }, "the VM is deleted")
			eventually(t, func() bool { _, err := r.led.GetSandbox(sbA); return err != nil }, "the record goes")
			assert.Zero(t, r.side.liveRelays())
		})
	}
}

func (m *Manager) liveCount() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.live)
}

// StartVM and StopVM calls for ids the ledger never had (a confused or
// hostile shim) leave nothing in memory, and a finished sandbox's entry
// goes too.
func TestCallsForUnknownSandboxesLeaveNoEntry(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	for i := range 200 {
		require.ErrorIs(t, r.m.StartVM(ctx, sbID(1000+i)), ErrUnknownSandbox)
		require.ErrorIs(t, r.m.StopVM(ctx, sbID(1000+i)), ErrUnknownSandbox)
	}
	assert.Zero(t, r.m.liveCount(), "no entry per unknown id")

	r.pod("uid-1", "web")
	_, err := r.m.CreateVM(ctx, sbA, shimAnnotations("web"), "/run/netns/ns")
	require.NoError(t, err)
	require.NoError(t, r.m.StartVM(ctx, sbA))
	assert.Equal(t, 1, r.m.liveCount(), "a running sandbox holds its relay")
	require.NoError(t, r.m.StopVM(ctx, sbA))
	eventually(t, func() bool { _, err := r.led.GetSandbox(sbA); return err != nil }, "the record goes")
	eventually(t, func() bool { return r.m.liveCount() == 0 }, "and its entry")
}

// TestSyncGuardsTheRecordedTunnels: each Sync, the startup one of a
// restarted caa first, brings the node's VXLAN guard in line with the
// ledger: every recorded tunnel that has its VM's address, and only those.
func TestSyncGuardsTheRecordedTunnels(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	for i, name := range []string{"web", "db", "idle"} {
		r.pod(fmt.Sprint("uid-", i), name)
		_, err := r.m.CreateVM(ctx, sbID(i), shimAnnotations(name), fmt.Sprint("/run/netns/ns", i))
		require.NoError(t, err)
		if name != "idle" { // idle never starts: no VM, no tunnel
			require.NoError(t, r.m.StartVM(ctx, sbID(i)))
		}
	}
	want := []ledger.Tunnel{r.sandbox(sbID(0)).Tunnel, r.sandbox(sbID(1)).Tunnel}
	r.crash()
	r.start()
	_, err := r.m.Sync(ctx, time.Second)
	require.NoError(t, err)
	r.side.mu.Lock()
	guarded := slices.Clone(r.side.guarded)
	r.side.mu.Unlock()
	require.NotEmpty(t, guarded, "the restarted caa's first Sync rebuilds the guard")
	assert.ElementsMatch(t, want, guarded[0])
	for _, tun := range guarded[0] {
		assert.NotEmpty(t, tun.RemoteIP)
	}
}
