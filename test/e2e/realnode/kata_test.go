package realnode

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"

	"github.com/caa-project/caa/pkg/health"
	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/pkg/sandbox"
	"github.com/caa-project/caa/test/e2e/cluster"
	"github.com/caa-project/caa/test/e2e/katanode"
	"github.com/caa-project/caa/test/e2e/upstream"
	podvmfake "github.com/caa-project/caa/test/mocks/podvm"
)

// kataPod is one pod sandbox crictl ran with the kata-remote handler, and
// its one container.
type kataPod struct {
	name       string
	obj        *corev1.Pod
	podConfig  string
	id, ctrID  string
	instanceID string
	agent      *podvmfake.KataAgent
}

// sandboxFailure matches the lines kata 4.1.0's shim logs when it gives a
// sandbox up: its agent check failed (virtcontainers/monitor.go, "notify on
// errors"), the sandbox watcher saw it (containerd-shim-v2/wait.go), or a
// process wait broke.
var sandboxFailure = []string{"notify on errors", "watchSandbox gets an error", "sandbox stopped unexpectedly",
	"failed to stop sandbox", "failed to delete sandbox", "Wait for process failed"}

// TestKataRemoteOnContainerd is level 1 of the real node (issue 40):
// containerd's CRI with the kata-remote handler running kata 4.1.0's own
// shim with its generated configuration, pointed at caa's socket; caa in
// the kata mode (the real apiserver with the pod objects, a bbolt ledger,
// the fake EC2) with `caa relay`; each VM booted by the fake cloud runs
// upstream's process-user-data and agent-protocol-forwarder and the test
// kata agent (kata's real agent API, each container a real process). Two
// pods: one named as containerd names sandboxes, one carrying CRI-O's
// names, which the shim copies into the sandbox-name annotation. crictl
// runs each pod and a container, execs in it, then caa is SIGKILLed and
// restarted and handed over by surge while crictl samples the pods and
// containers every 200 ms; then the pods are stopped and removed.
func TestKataRemoteOnContainerd(t *testing.T) {
	RequireUpstream(t)
	requireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()

	podvmDir, err := upstream.Build(ctx, upstream.PodVM)
	require.NoError(t, err)
	agentDir, err := upstream.Build(ctx, upstream.KataAgent)
	require.NoError(t, err)
	require.NoError(t, podvmfake.CheckUpstream(podvmDir))
	caaBin := filepath.Join(t.TempDir(), "caa")
	require.NoError(t, cluster.BuildCaa(ctx, caaBin, "", "caa_aws"))

	c := cluster.Start(ctx, t)
	// A gate the test closes to hold a VM's boot (a slow VM), so that caa
	// can be killed while the shim waits in StartVM.
	var gateOn atomic.Bool
	release, gated := make(chan struct{}), make(chan struct{}, 1)
	kn, err := katanode.NewWith(ctx, c, caaBin, "worker-1", katanode.Options{
		Upstream: &podvmfake.Upstream{Dir: podvmDir, KataAgent: filepath.Join(agentDir, upstream.AgentBin)},
		BootGate: func(ctx context.Context) {
			if !gateOn.Load() {
				return
			}
			select {
			case gated <- struct{}{}:
			default:
			}
			select {
			case <-release:
			case <-ctx.Done():
			}
		}})
	require.NoError(t, err)
	t.Cleanup(kn.Close)

	var caaMu sync.Mutex
	var procs []*katanode.Process
	startCaa := func(name string) *katanode.Process {
		t.Helper()
		p, err := kn.StartCaa(name)
		require.NoError(t, err)
		caaMu.Lock()
		procs = append(procs, p)
		caaMu.Unlock()
		return p
	}
	t.Cleanup(func() {
		caaMu.Lock()
		defer caaMu.Unlock()
		for i, p := range procs {
			if t.Failed() {
				t.Logf("--- caa %d log (tail)\n%s", i, tail(p.Logs.String(), 40))
			}
			_ = p.Stop(30 * time.Second)
		}
	})
	ready := func(p *katanode.Process) {
		t.Helper()
		_, err := p.WaitReady(ctx, 2*time.Minute)
		require.NoError(t, err, "caa ready; its log:\n%s", tail(p.Logs.String(), 40))
	}
	caaA := startCaa("caa-a")
	ready(caaA)
	relay, err := kn.StartRelay(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = relay.Stop(30 * time.Second) })

	syslog := ServeSyslog(t)
	work := t.TempDir()
	hv := CountHypervisorCalls(t, filepath.Join(kn.Dir, "hv-count.sock"), kn.HypervisorSocket)
	shim, err := BuildKataShim(ctx, work, hv.Socket)
	require.NoError(t, err)
	n := Start(t, Options{NetNS: kn.Net.NodeNS, Runtimes: []Runtime{shim.Runtime()}})
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("--- kata shim syslog (tail)\n%s", tail(strings.Join(syslog.Lines(), "\n"), 60))
		}
	})

	pods := []*kataPod{{name: "web"}, {name: "db"}}
	t.Cleanup(func() {
		// kata's shim leaves copies of a sandbox's files for CopyFile
		// behind (the sandbox container's resolv.conf); they are named
		// after the sandbox and container ids.
		for _, p := range pods {
			for _, id := range []string{p.id, p.ctrID} {
				if id == "" {
					continue
				}
				left, _ := filepath.Glob(filepath.Join("/run/kata-containers/shared/containers", id+"-*"))
				for _, f := range left {
					_ = os.Remove(f)
				}
			}
		}
	})
	startContainer := func(p *kataPod) {
		t.Helper()
		ctr := WriteJSON(t, p.name+"-ctr.json", map[string]any{
			"metadata": map[string]any{"name": "app"},
			"image":    map[string]any{"image": PauseImage},
			"command":  []string{"sh", "-c", "echo " + p.name + " up; exec sleep 100000"},
			"log_path": "app.log",
			"linux":    map[string]any{},
		})
		out, err := n.Crictl(ctx, "create", p.id, ctr, p.podConfig)
		require.NoError(t, err, "crictl create in %s", p.name)
		p.ctrID = strings.TrimSpace(out)
		_, err = n.Crictl(ctx, "start", p.ctrID)
		require.NoError(t, err, "crictl start in %s", p.name)
	}
	// attach finds the pod's one VM and its agent, and checks the
	// container runs and execs.
	attach := func(p *kataPod) {
		t.Helper()
		live := kn.LiveSandboxVMs(p.id)
		require.Len(t, live, 1, "pod %s: one VM for sandbox %s", p.name, p.id)
		vm := live[0]
		p.instanceID = vm.ID
		assert.Equal(t, "default/"+p.name, vm.Tags[provider.TagPod], "pod %s: the VM's pod tag", p.name)
		assert.Equal(t, string(p.obj.UID), vm.Tags[provider.TagPodUID], "pod %s: the VM's pod UID tag", p.name)
		fvm := kn.Fleet.VM(vm.ID)
		require.NotNil(t, fvm, "pod %s: VM %s booted in the fake cloud", p.name, vm.ID)
		require.NotNil(t, fvm.VM.KataAgent, "pod %s: VM %s runs the test kata agent", p.name, vm.ID)
		p.agent = fvm.VM.KataAgent
		requireRunning(ctx, t, n, p)
		out, err := crictlExec(ctx, n, p.ctrID, "echo", "hello from "+p.name)
		require.NoError(t, err, "crictl exec in %s", p.name)
		assert.Equal(t, "hello from "+p.name, strings.TrimSpace(out), "pod %s: exec output through the shim, caa relay and the VM", p.name)
	}
	for _, p := range pods {
		p.obj, err = c.CreatePeerPod(ctx, "default", p.name, kn.Name, nil)
		require.NoError(t, err)
		meta := map[string]any{"name": p.name, "namespace": "default", "uid": string(p.obj.UID), "attempt": 0}
		cfg := map[string]any{"metadata": meta, "log_directory": t.TempDir(), "linux": map[string]any{}}
		if p.name == "web" {
			// Pod-level limits, which containerd passes as the
			// sandbox-cpu and sandbox-memory annotations and the shim
			// (static_sandbox_resource_mgmt) turns into the VM's size.
			cfg["linux"] = map[string]any{"resources": map[string]any{
				"cpu_period": 100000, "cpu_quota": 150000, "memory_limit_in_bytes": 512 << 20}}
		}
		if p.name == "db" {
			// CRI-O's names for the sandbox, as CRI-O sets them; kata's
			// shim copies them into io.kubernetes.cri.sandbox-name and
			// -namespace (virtcontainers/sandbox.go,
			// setHypervisorConfigAnnotations).
			cfg["annotations"] = map[string]string{
				"io.kubernetes.cri-o.SandboxName": fmt.Sprintf("k8s_%s_default_%s_0", p.name, p.obj.UID),
				"io.kubernetes.cri-o.Namespace":   "default",
			}
		}
		p.podConfig = WriteJSON(t, p.name+"-pod.json", cfg)
		out, err := n.Crictl(ctx, "runp", "--runtime", KataHandler, p.podConfig)
		require.NoError(t, err, "crictl runp %s", p.name)
		p.id = strings.TrimSpace(out)
		startContainer(p)
	}

	for _, p := range pods {
		attach(p)
		// What the shim sent: the sandbox's names as the runtime gave
		// them (CRI-O's k8s_ form copied into containerd's key for db).
		req := hv.CreateVM(p.id)
		require.NotNil(t, req, "pod %s: the shim's CreateVM", p.name)
		wantName := p.name
		if p.name == "db" {
			wantName = fmt.Sprintf("k8s_%s_default_%s_0", p.name, p.obj.UID)
		}
		assert.Equal(t, wantName, req.Annotations[sandbox.AnnotationSandboxName], "pod %s: CreateVM's sandbox name", p.name)
		assert.Equal(t, "default", req.Annotations[sandbox.AnnotationSandboxNamespace], "pod %s: CreateVM's sandbox namespace", p.name)
		if p.name == "web" {
			// 1.5 CPUs rounded up, 512 MiB: what the shim computed from
			// containerd's sandbox annotations.
			assert.Equal(t, "2", req.Annotations[provider.AnnotationVCPUs], "pod web: CreateVM's vCPUs")
			assert.Equal(t, "512", req.Annotations[provider.AnnotationMemory], "pod web: CreateVM's memory")
		}
		t.Logf("pod %s: CreateVM netns %s, annotations %v", p.name, req.NetworkNamespacePath, req.Annotations)
	}
	require.Len(t, kn.Core.Live(), len(pods), "one VM per pod in the fake cloud")

	// caa is SIGKILLed and restarted, then upgraded by the surge hand-over,
	// while crictl samples every 200 ms.
	sampler := startSampling(ctx, n, pods, 200*time.Millisecond)
	linesBefore := len(syslog.Lines())
	require.NoError(t, caaA.Kill())
	caaB := startCaa("caa-b")
	ready(caaB)
	caaC := startCaa("caa-c")
	ready(caaC)
	_, err = caaC.WaitHandover(ctx, health.HandoverDone, time.Minute)
	require.NoError(t, err, "the new caa took the node over")
	require.NoError(t, caaB.Stop(time.Minute), "the old caa stopped after the hand-over")
	// Two of the shim's 5-second agent checks after the hand-over.
	select {
	case <-ctx.Done():
	case <-time.After(12 * time.Second):
	}
	samples, bad := sampler.stop()
	// How many samples fit depends on how fast crictl answers on a loaded
	// machine (18 to 60 seen); what matters is that sampling went on across
	// both events and none was bad.
	assert.GreaterOrEqual(t, samples, 5, "crictl sampled the pods throughout")
	t.Logf("%d samples of both pods and containers (crictl inspectp, ps) every 200 ms across the SIGKILL restart and the hand-over, %d not Ready/Running", samples, len(bad))
	assert.Empty(t, bad, "every sample Ready/Running across caa's restart and hand-over")
	for _, l := range syslog.Lines()[linesBefore:] {
		for _, f := range sandboxFailure {
			assert.NotContains(t, l, f, "the shim gives no sandbox up across caa's restart and hand-over")
		}
	}
	for _, p := range pods {
		out, err := crictlExec(ctx, n, p.ctrID, "sh", "-c", "echo again from "+p.name+"; exit 3")
		assert.Error(t, err, "pod %s: the exec's exit status 3 comes back", p.name)
		assert.Equal(t, "again from "+p.name, strings.TrimSpace(out), "pod %s: exec after the hand-over", p.name)
	}

	// caa SIGKILLed while the shim waits in StartVM (its VM slow to boot):
	// the shim's StartVM fails ("ttrpc: closed") and so does the sandbox;
	// its StopVM finds nothing listening until the new caa starts, so the
	// record stays Creating with its VM. The retry the kubelet would make
	// (attempt 1 of the same pod) runs and supersedes it: that VM goes.
	late := &kataPod{name: "late"}
	late.obj, err = c.CreatePeerPod(ctx, "default", late.name, kn.Name, nil)
	require.NoError(t, err)
	lateConfig := func(attempt int) string {
		return WriteJSON(t, fmt.Sprintf("late-pod-%d.json", attempt), map[string]any{
			"metadata":      map[string]any{"name": late.name, "namespace": "default", "uid": string(late.obj.UID), "attempt": attempt},
			"log_directory": t.TempDir(), "linux": map[string]any{}})
	}
	cut := make(chan error, 1)
	gateOn.Store(true)
	go func() {
		_, err := n.Crictl(ctx, "runp", "--runtime", KataHandler, lateConfig(0))
		cut <- err
	}()
	select {
	case <-gated:
	case <-ctx.Done():
		t.Fatal("the late pod's VM never started booting")
	}
	require.NoError(t, caaC.Kill())
	caaD := startCaa("caa-d")
	ready(caaD)
	gateOn.Store(false)
	close(release)
	err = <-cut
	require.Error(t, err, "the sandbox whose StartVM caa's death cut fails")
	assert.Contains(t, err.Error(), "remote hypervisor call failed: ttrpc: closed")
	var cutID string
	for _, id := range hv.CreateVMs() {
		if req := hv.CreateVM(id); req.Annotations[sandbox.AnnotationSandboxName] == late.name {
			cutID = id
		}
	}
	require.NotEmpty(t, cutID, "the shim's CreateVM for the late pod")
	late.podConfig = lateConfig(1)
	out, err := n.Crictl(ctx, "runp", "--runtime", KataHandler, late.podConfig)
	require.NoError(t, err, "crictl runp late, attempt 1")
	late.id = strings.TrimSpace(out)
	startContainer(late)
	attach(late)
	require.Eventually(t, func() bool { return len(kn.LiveSandboxVMs(cutID)) == 0 }, time.Minute, 100*time.Millisecond,
		"the cut sandbox's VM goes once the pod's next sandbox runs")
	pods = append(pods, late)

	// The pods go: StopVM, the VMs terminated, the agent sockets gone, the
	// sandboxes out of the ledger.
	for _, p := range pods {
		for _, args := range [][]string{{"stop", p.ctrID}, {"rm", p.ctrID}, {"stopp", p.id}, {"rmp", p.id}} {
			_, err := n.Crictl(ctx, args...)
			require.NoError(t, err, "crictl %s (pod %s)", args[0], p.name)
		}
	}
	require.Eventually(t, func() bool { return len(kn.Core.Live()) == 0 }, time.Minute, 100*time.Millisecond, "every VM terminated")
	counts := hv.Counts()
	assert.Equal(t, len(pods), counts["hypervisor.Hypervisor/StopVM"], "one StopVM per pod (the cut sandbox's was refused: no caa listened)")
	for _, p := range pods {
		left, _ := filepath.Glob(filepath.Join(kn.AgentDir, p.id, "*"))
		assert.Empty(t, left, "pod %s: no agent socket left", p.name)
	}
	ledgerOut, err := exec.CommandContext(ctx, caaBin, "ledger", "sandboxes", "-o", "json", "--ledger", kn.Ledger).CombinedOutput()
	require.NoError(t, err, "caa ledger sandboxes: %s", ledgerOut)
	for _, p := range pods {
		assert.NotContains(t, string(ledgerOut), p.id, "pod %s: its sandbox is gone from the ledger", p.name)
	}
	assert.NotContains(t, string(ledgerOut), cutID, "the cut sandbox is gone from the ledger")

	// What the real shim called, on caa and on the agents.
	agentCalls := podvmfake.KataCalls{Served: map[string]int{}, Failed: map[string]int{}, Unimplemented: map[string]int{}}
	for _, p := range pods {
		c, err := p.agent.Calls()
		require.NoError(t, err)
		for m, k := range c.Served {
			agentCalls.Served[m] += k
		}
		for m, k := range c.Failed {
			agentCalls.Failed[m] += k
		}
		for m, k := range c.Unimplemented {
			agentCalls.Unimplemented[m] += k
		}
	}
	t.Logf("calls kata 4.1.0's shim made for %d pods (each one container and two execs but the last, started after caa was killed during its first sandbox's StartVM), across a SIGKILL restart and a surge hand-over of caa:\n%s",
		len(pods), callTable(counts, agentCalls))
	assert.Empty(t, agentCalls.Unimplemented, "the test kata agent serves every call the shim made")

	// What went wrong along the way, for the reader: the shim's warnings
	// and errors, caa's.
	var warned []string
	for _, l := range syslog.Lines() {
		if strings.Contains(l, "level=warning") || strings.Contains(l, "level=error") {
			warned = append(warned, l)
		}
	}
	caaMu.Lock()
	for i, p := range procs {
		for _, l := range strings.Split(p.Logs.String(), "\n") {
			if strings.Contains(l, `"level":"WARN"`) || strings.Contains(l, `"level":"ERROR"`) {
				warned = append(warned, fmt.Sprintf("caa %d: %s", i, l))
			}
		}
	}
	caaMu.Unlock()
	t.Logf("the shim's and caa's warnings and errors (%d):\n%s", len(warned), strings.Join(warned, "\n"))
}

// crictlExec runs `crictl exec` in the node's namespace, where containerd's
// streaming server listens (on its loopback), and returns its output.
func crictlExec(ctx context.Context, n *Node, ctrID string, cmd ...string) (string, error) {
	c := exec.CommandContext(ctx, n.Bins.Crictl, append([]string{"--config", filepath.Join(n.Dir, "crictl.yaml"), "exec", ctrID}, cmd...)...)
	var out, stderr strings.Builder
	c.Stdout, c.Stderr = &out, &stderr
	start := c.Start
	if n.NetNS != "" {
		start = func() error { return podvmfake.InNetNS(n.NetNS, c.Start) }
	}
	if err := start(); err != nil {
		return "", err
	}
	if err := c.Wait(); err != nil {
		return out.String(), fmt.Errorf("crictl exec %s %v: %w: %s", ctrID, cmd, err, strings.TrimSpace(stderr.String()))
	}
	return out.String(), nil
}

// requireRunning waits for the pod to be Ready and its container Running.
func requireRunning(ctx context.Context, t *testing.T, n *Node, p *kataPod) {
	t.Helper()
	var last string
	deadline := time.Now().Add(time.Minute)
	for {
		ok, why := podUp(ctx, n, p)
		if ok {
			return
		}
		last = why
		if time.Now().After(deadline) || ctx.Err() != nil {
			require.Failf(t, "pod not up", "pod %s not Ready with its container Running within a minute; the last check said: %s", p.name, last)
		}
		time.Sleep(200 * time.Millisecond) // the poll period of a condition checked with crictl
	}
}

// podUp says whether crictl sees the pod Ready and its container Running,
// and if not, why.
func podUp(ctx context.Context, n *Node, p *kataPod) (bool, string) {
	out, err := n.Crictl(ctx, "inspectp", "-o", "json", p.id)
	if err != nil {
		return false, err.Error()
	}
	var st struct {
		Status struct {
			State string `json:"state"`
		} `json:"status"`
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		return false, err.Error()
	}
	if st.Status.State != "SANDBOX_READY" {
		return false, "pod " + st.Status.State
	}
	out, err = n.Crictl(ctx, "ps", "-o", "json", "--id", p.ctrID)
	if err != nil {
		return false, err.Error()
	}
	if !strings.Contains(out, `"CONTAINER_RUNNING"`) {
		return false, "container not running: " + out
	}
	return true, ""
}

type sampling struct {
	cancel  context.CancelFunc
	done    chan struct{}
	samples int
	bad     []string
}

// startSampling checks every pod and container with crictl every period
// until stopped.
func startSampling(ctx context.Context, n *Node, pods []*kataPod, period time.Duration) *sampling {
	ctx, cancel := context.WithCancel(ctx)
	s := &sampling{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		tick := time.NewTicker(period)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			for _, p := range pods {
				if ok, why := podUp(ctx, n, p); !ok && ctx.Err() == nil {
					s.bad = append(s.bad, fmt.Sprintf("%s %s: %s", time.Now().Format("15:04:05.000"), p.name, why))
				}
			}
			s.samples++
		}
	}()
	return s
}

func (s *sampling) stop() (int, []string) {
	s.cancel()
	<-s.done
	return s.samples, s.bad
}

// callTable formats the hypervisor and agent calls, one per line: the
// shim's hypervisor requests as sent (whatever caa answered), the agent's
// calls by outcome.
func callTable(hv map[string]int, agent podvmfake.KataCalls) string {
	var b strings.Builder
	fmt.Fprintf(&b, "  %-55s %8s %8s %8s\n", "call", "sent/ok", "failed", "unimpl.")
	for _, m := range slices.Sorted(maps.Keys(hv)) {
		fmt.Fprintf(&b, "  %-55s %8d %8s %8s\n", "hypervisor "+m, hv[m], "-", "-")
	}
	names := map[string]bool{}
	for _, m := range []map[string]int{agent.Served, agent.Failed, agent.Unimplemented} {
		for k := range m {
			names[k] = true
		}
	}
	for _, m := range slices.Sorted(maps.Keys(names)) {
		fmt.Fprintf(&b, "  %-55s %8d %8d %8d\n", "agent "+m, agent.Served[m], agent.Failed[m], agent.Unimplemented[m])
	}
	return b.String()
}

// tail is the last n lines of s.
func tail(s string, n int) string { return cluster.LastLines([]byte(s), n) }
