package rollout

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"

	"github.com/caa-project/caa/pkg/health"
	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/test/e2e/cluster"
	"github.com/caa-project/caa/test/e2e/nodeagent"
	ec2fake "github.com/caa-project/caa/test/mocks/aws"
	"github.com/caa-project/caa/test/mocks/cloud"
)

const (
	namespace = "caa-system"
	ec2Image  = "ami-0123456789abcdef0"
	// Fake credentials: the fake EC2 checks every request's signature
	// against them, so they provably reach caa through the Secret.
	accessKey = "AKIDROLLOUTTEST"
	secretKey = "rollout-secret-key"
	// poll is the interval of condition polls and of the VM sampler; it
	// never stands in for synchronisation.
	poll = 100 * time.Millisecond
)

// binaries maps an image tag to a caa build stamped with that version,
// built once by TestMain.
var binaries map[string]string

// The image tags of the broken releases (TestMain maps them).
const (
	tagExits = "v2-exits"
	tagHangs = "v2-hangs"
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "caa-rollout-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binaries = map[string]string{}
	for _, v := range []string{"v1", "v2"} {
		bin := filepath.Join(dir, "caa-"+v)
		if err := cluster.BuildCaa(context.Background(), bin, v); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		binaries[v] = bin
	}
	// A broken release that exits at start: caa v2 run with a provider it
	// does not know, as a build with a wrong default or a renamed flag
	// would. It fails validation after its health server and the API
	// reads, before it asks for the ledger.
	exits := filepath.Join(dir, "caa-"+tagExits)
	script := "#!/bin/sh\nexec " + binaries["v2"] + " \"$@\" --provider=no-such-cloud\n"
	if err := os.WriteFile(exits, []byte(script), 0o755); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binaries[tagExits] = exits
	// A broken release that never turns ready is caa v2 itself, deployed
	// with a cloud endpoint whose node listing hangs (env.hangEndpoint).
	binaries[tagHangs] = binaries["v2"]
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// firstReady is what a caa process said about itself when its readiness
// probe first passed.
type firstReady struct {
	At      time.Time
	Node    string
	Tag     string
	Status  health.Snapshot
	Metrics string
	Err     error
}

// recorder keeps the timeline: caa pods as a watch sees them, running VMs
// per node as sampled from the fake cloud, marks, and what each caa
// answered at its first readiness.
type recorder struct {
	nodes []string
	core  *cloud.Cloud

	// pollCtx ends the /status pollers of the caa processes.
	pollCtx context.Context
	pollWG  sync.WaitGroup

	mu      sync.Mutex
	tl      Timeline
	ready   map[string]firstReady // by pod UID
	trouble []nodeagent.Observation
	onPod   func(PodSample)               // called outside mu, on the informer's goroutine
	polls   map[string]context.CancelFunc // by pod UID
	// lastProc is each process's last recorded answer, by pod UID.
	lastProc map[string]ProcSample
}

// pollStatus asks one caa process's /status every poll interval until
// stopped, recording each change of what it answers (ready, reason,
// hand-over). It runs for each process the agent starts.
func (r *recorder) pollStatus(ctx context.Context, o nodeagent.Observation) {
	// A long timeout: an answer that comes late on a loaded machine is
	// recorded when it comes, while a timeout would record a false "not
	// ready".
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	tick := time.NewTicker(poll)
	defer tick.Stop()
	for {
		s := ProcSample{Sent: time.Now(), Pod: o.Pod.Name, UID: string(o.UID), Node: o.Node, Tag: o.Tag, PID: o.PID}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, o.HealthURL+"/status", nil)
		resp, err := client.Do(req)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			s.Reason = "unreachable"
		} else {
			var snap health.Snapshot
			err = json.NewDecoder(resp.Body).Decode(&snap)
			resp.Body.Close()
			if err != nil {
				s.Reason = "unreadable /status: " + err.Error()
			} else {
				s.Ready, s.Reason = snap.Ready, snap.Reason
				s.Reconciling = snap.Ready
				if h := snap.Handover; h != nil {
					s.Handover = &HandoverView{Role: h.Role, Peer: h.Peer, Outcome: h.Outcome, Reason: h.Reason,
						StartedAt: h.StartedAt, Took: time.Duration(h.Took), Gap: time.Duration(h.Gap)}
					if h.Role == health.RoleHandedOver && h.Outcome == health.HandoverUnderway {
						s.Reconciling = false
					}
				}
			}
		}
		s.At = time.Now()
		r.procSample(s)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// procSample records s if it differs from the process's last answer.
func (r *recorder) procSample(s ProcSample) {
	r.mu.Lock()
	defer r.mu.Unlock()
	last, seen := r.lastProc[s.UID]
	if seen && last.Ready == s.Ready && last.Reason == s.Reason && last.Gone == s.Gone && sameHandover(last.Handover, s.Handover) {
		return
	}
	r.lastProc[s.UID] = s
	r.tl.Procs = append(r.tl.Procs, s)
}

func sameHandover(a, b *HandoverView) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

// startPolling starts the /status poller of a process the agent started;
// stopPolling ends it when the process ended, recording it gone.
func (r *recorder) startPolling(o nodeagent.Observation) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if cancel := r.polls[string(o.UID)]; cancel != nil {
		cancel()
	}
	if r.pollCtx.Err() != nil {
		return
	}
	ctx, cancel := context.WithCancel(r.pollCtx)
	r.polls[string(o.UID)] = cancel
	r.pollWG.Go(func() { r.pollStatus(ctx, o) })
}

func (r *recorder) stopPolling(o nodeagent.Observation) {
	r.mu.Lock()
	cancel := r.polls[string(o.UID)]
	delete(r.polls, string(o.UID))
	r.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	now := time.Now()
	r.procSample(ProcSample{Sent: now, At: now, Pod: o.Pod.Name, UID: string(o.UID), Node: o.Node, Tag: o.Tag, PID: o.PID,
		Reason: "process ended (" + string(o.Kind) + ")", Gone: true})
}

func (r *recorder) podSample(obj any, gone bool) {
	if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
	}
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	s := PodSample{At: time.Now(), Pod: pod.Name, UID: string(pod.UID), Node: pod.Spec.NodeName,
		Tag: tagOf(pod), Ready: nodeagent.PodReady(pod), Deleting: pod.DeletionTimestamp != nil, Gone: gone}
	r.mu.Lock()
	r.tl.Pods = append(r.tl.Pods, s)
	hook := r.onPod
	r.mu.Unlock()
	if hook != nil {
		hook(s)
	}
}

func tagOf(pod *corev1.Pod) string {
	if len(pod.Spec.Containers) == 0 {
		return ""
	}
	image := pod.Spec.Containers[0].Image
	if i := strings.LastIndex(image, ":"); i > strings.LastIndex(image, "/") {
		return image[i+1:]
	}
	return "latest"
}

func (r *recorder) sampleVMs() {
	counts := map[string]int{}
	for _, in := range r.core.Live() {
		counts[in.Tags[provider.TagNode]]++
	}
	r.mu.Lock()
	r.tl.VMs = append(r.tl.VMs, VMSample{At: time.Now(), Running: counts})
	r.mu.Unlock()
}

func (r *recorder) mark(label string) time.Time {
	now := time.Now()
	r.mu.Lock()
	r.tl.Marks = append(r.tl.Marks, Mark{At: now, Label: label})
	r.mu.Unlock()
	return now
}

// observe hears the node agent: at a process's first readiness it asks
// caa's /status and /metrics what it had done by then.
func (r *recorder) observe(o nodeagent.Observation) {
	switch o.Kind {
	case nodeagent.Started:
		r.startPolling(o)
		return
	case nodeagent.Terminated:
		r.stopPolling(o)
		return
	case nodeagent.Ready:
	case nodeagent.Exited, nodeagent.Restarted, nodeagent.Failed:
		if o.Kind != nodeagent.Failed {
			r.stopPolling(o)
		}
		r.mu.Lock()
		r.trouble = append(r.trouble, o)
		r.mu.Unlock()
		return
	default:
		return
	}
	r.mu.Lock()
	_, seen := r.ready[string(o.UID)]
	r.mu.Unlock()
	if seen {
		return
	}
	fr := firstReady{At: o.At, Node: o.Node, Tag: o.Tag}
	var body string
	body, fr.Err = fetch(o.HealthURL + "/status")
	if fr.Err == nil {
		fr.Err = json.Unmarshal([]byte(body), &fr.Status)
	}
	if fr.Err == nil {
		fr.Metrics, fr.Err = fetch(o.HealthURL + "/metrics")
	}
	r.mu.Lock()
	r.ready[string(o.UID)] = fr
	r.mu.Unlock()
}

func fetch(url string) (string, error) {
	client := &http.Client{Timeout: 10 * time.Second}
	resp, err := client.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return string(b), nil
}

func (r *recorder) timeline() Timeline {
	r.mu.Lock()
	defer r.mu.Unlock()
	tl := r.tl
	tl.Nodes = r.nodes
	tl.Pods = append([]PodSample(nil), r.tl.Pods...)
	tl.VMs = append([]VMSample(nil), r.tl.VMs...)
	tl.Marks = append([]Mark(nil), r.tl.Marks...)
	tl.Procs = append([]ProcSample(nil), r.tl.Procs...)
	return tl
}

// env is one rollout test's world.
type env struct {
	t    *testing.T
	c    *cluster.Cluster
	core *cloud.Cloud
	// ec2URL is the fake EC2; hangURL the same cloud behind a front that
	// never answers a listing of a node's VMs (the broken release's).
	ec2URL, hangURL string
	agent           *nodeagent.Agent
	rec             *recorder
	kustDir         string
	// agentDir holds the nodes' hostPaths and the caa pods' logs.
	agentDir string
	nodes    []string
	opts     options

	mu   sync.Mutex
	pods map[string]*corev1.Pod // peer pods by UID
	// added are the peer pods created during the rollout, by UID.
	added   map[string]bool
	addWG   sync.WaitGroup
	addErrs []error
}

// options shape a test's deployment.
type options struct {
	// noSurge deploys with deploy/components/no-surge.
	noSurge bool
	// settings are extra CAA_* settings for the ConfigMap, NAME=value.
	settings []string
}

// release is one apply of the deployment: an image tag, and optionally
// another cloud endpoint.
type release struct {
	tag      string
	endpoint string // "": the fake EC2
}

// start brings up the control plane with kwok, nodeCount kwok nodes with
// podsPerNode peer pods each, the fake EC2, the node agent and the
// recorders. Everything stops in t.Cleanup.
func start(ctx context.Context, t *testing.T, nodeCount, podsPerNode int, opts options) *env {
	t.Helper()
	c := cluster.Start(ctx, t)
	require.NoError(t, c.StartControlPlane(ctx))
	require.NoError(t, c.StartKwok(ctx))

	core := cloud.New(ec2fake.CloudOptions(cloud.Options{Images: []string{ec2Image}}))
	// Every call takes a little while and a new VM boots for a second, so
	// a new caa has real work before it may turn ready.
	core.SetFaults(cloud.Faults{Latency: 20 * time.Millisecond, BootDelay: time.Second})
	ec2 := ec2fake.NewServer(core, ec2fake.WithCredentials(accessKey, secretKey))
	srv := httptest.NewServer(ec2)
	t.Cleanup(srv.Close)
	hang := httptest.NewServer(hangListing(ec2))
	t.Cleanup(hang.Close)
	e := &env{t: t, c: c, core: core, ec2URL: srv.URL, hangURL: hang.URL, kustDir: t.TempDir(), agentDir: t.TempDir(),
		opts: opts, pods: map[string]*corev1.Pod{}, added: map[string]bool{}}

	for i := range nodeCount {
		name := fmt.Sprintf("node-%d", i+1)
		_, err := c.CreateKwokNode(ctx, name)
		require.NoError(t, err)
		e.nodes = append(e.nodes, name)
	}
	e.eventually(ctx, 2*time.Minute, "kwok marks every node Ready", func() (bool, error) {
		list, err := c.Client().CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		ready := 0
		for _, n := range list.Items {
			for _, cond := range n.Status.Conditions {
				if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue {
					ready++
				}
			}
		}
		return ready == nodeCount, nil
	})
	for _, node := range e.nodes {
		for i := range podsPerNode {
			pod, err := c.CreatePeerPod(ctx, "team", fmt.Sprintf("%s-pod-%02d", node, i), node, nil)
			require.NoError(t, err)
			e.pods[string(pod.UID)] = pod
		}
	}

	agentCtx, stopAgent := context.WithCancel(context.Background())
	e.rec = &recorder{nodes: e.nodes, core: core, ready: map[string]firstReady{}, pollCtx: agentCtx,
		polls: map[string]context.CancelFunc{}, lastProc: map[string]ProcSample{}}
	e.agent, _ = nodeagent.New(nodeagent.Config{Client: c.Client(), REST: c.RestConfig(), Dir: e.agentDir,
		Binaries: binaries, Observe: e.rec.observe, Logf: t.Logf})
	var wg sync.WaitGroup
	wg.Go(func() { _ = e.agent.Run(agentCtx) })
	wg.Go(func() {
		tick := time.NewTicker(poll)
		defer tick.Stop()
		for {
			e.rec.sampleVMs()
			select {
			case <-agentCtx.Done():
				return
			case <-tick.C:
			}
		}
	})
	factory := informers.NewSharedInformerFactoryWithOptions(c.Client(), 0, informers.WithNamespace(namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = nodeagent.Selector }))
	_, err := factory.Core().V1().Pods().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { e.rec.podSample(obj, false) },
		UpdateFunc: func(_, obj any) { e.rec.podSample(obj, false) },
		DeleteFunc: func(obj any) { e.rec.podSample(obj, true) },
	})
	require.NoError(t, err)
	factory.Start(agentCtx.Done())
	t.Cleanup(func() {
		e.addWG.Wait()
		stopAgent()
		factory.Shutdown()
		wg.Wait()
		e.rec.pollWG.Wait()
		if t.Failed() {
			e.logCaaTails()
		}
	})
	return e
}

// eventually polls cond until it holds, failing t at the deadline or on
// an error from cond.
func (e *env) eventually(ctx context.Context, within time.Duration, what string, cond func() (bool, error)) {
	e.t.Helper()
	deadline := time.Now().Add(within)
	for {
		ok, err := cond()
		require.NoError(e.t, err, what)
		if ok {
			return
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			e.t.Fatalf("timed out after %s waiting until %s", within, what)
		}
		time.Sleep(poll) // a poll interval, not a synchronisation
	}
}

// kustomization is the test's overlay on deploy/overlays/aws: only what
// this environment needs, the manifests themselves are not forked.
var kustomization = `apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - {{BASE}}
  - credentials.yaml
{{COMPONENTS}}images:
  - name: caa
    newTag: {{TAG}}
configMapGenerator:
  - name: caa-config
    behavior: merge
    literals:
` + FakeEC2Literals(ec2Image, "m6a.large") + `
      # A resync far beyond the test's length: a running caa never notices
      # the VMs killed behind its back, so the new caa's startup pass is
      # what recreates them, which is the behaviour under test.
      - CAA_RESYNC=10m
{{SETTINGS}}patches:
` + FastProbesPatch

// apply renders the overlay for tag and runs kubectl apply -k on it.
func (e *env) apply(ctx context.Context, tag string) { e.applyRelease(ctx, release{tag: tag}) }

// applyRelease renders the overlay for r, with the test's options, and
// runs kubectl apply -k on it.
func (e *env) applyRelease(ctx context.Context, r release) {
	e.t.Helper()
	deploy, err := filepath.Abs(filepath.Join("..", "..", "..", "deploy"))
	require.NoError(e.t, err)
	rel := func(p string) string {
		require.FileExists(e.t, filepath.Join(deploy, p, "kustomization.yaml"))
		r, err := filepath.Rel(e.kustDir, filepath.Join(deploy, p))
		require.NoError(e.t, err)
		return r
	}
	components := ""
	if e.opts.noSurge {
		components = "components:\n  - " + rel("components/no-surge") + "\n"
	}
	settings := ""
	for _, kv := range e.opts.settings {
		settings += "      - " + kv + "\n"
	}
	endpoint := r.endpoint
	if endpoint == "" {
		endpoint = e.ec2URL
	}
	k := strings.NewReplacer("{{BASE}}", rel("overlays/aws"), "{{TAG}}", r.tag, "{{ENDPOINT}}", endpoint,
		"{{COMPONENTS}}", components, "{{SETTINGS}}", settings).Replace(kustomization)
	require.NoError(e.t, os.WriteFile(filepath.Join(e.kustDir, "kustomization.yaml"), []byte(k), 0o600))
	require.NoError(e.t, os.WriteFile(filepath.Join(e.kustDir, "credentials.yaml"), []byte(CredentialsSecret(accessKey, secretKey)), 0o600))
	out := e.kubectl(ctx, "apply", "-k", e.kustDir)
	e.t.Logf("kubectl apply -k (caa:%s):\n%s", r.tag, out)
}

// kubectl runs the harness's kubectl against the test cluster and returns
// its output.
func (e *env) kubectl(ctx context.Context, args ...string) string {
	e.t.Helper()
	bins, err := cluster.EnsureBinaries(ctx)
	require.NoError(e.t, err)
	cmd := exec.CommandContext(ctx, bins.Kubectl, append([]string{"--kubeconfig", e.c.Kubeconfig()}, args...)...)
	out, err := cmd.CombinedOutput()
	require.NoError(e.t, err, "kubectl %s:\n%s", strings.Join(args, " "), out)
	return strings.TrimSpace(string(out))
}

// hangListing passes every request to the fake EC2 except a listing of a
// node's VMs (DescribeInstances filtered by the node tag), which it holds
// until the caller gives up: a cloud whose API answers caa's preflight
// but never its node listing, so a caa on it never finishes a pass.
func hangListing(next http.Handler) http.Handler {
	nodeFilter := "tag:" + provider.TagNode
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		if form, err := url.ParseQuery(string(body)); err == nil && form.Get("Action") == "DescribeInstances" {
			for k, v := range form {
				if strings.HasPrefix(k, "Filter.") && strings.HasSuffix(k, ".Name") && slices.Contains(v, nodeFilter) {
					<-r.Context().Done()
					return
				}
			}
		}
		next.ServeHTTP(w, r)
	})
}

// addPeerPod creates a peer pod on node while the test runs (from an
// informer's callback: it does not wait), and remembers it as added.
func (e *env) addPeerPod(ctx context.Context, node, name string) {
	e.addWG.Go(func() {
		pod, err := e.c.CreatePeerPod(ctx, "team", name, node, nil)
		e.mu.Lock()
		defer e.mu.Unlock()
		if err != nil {
			e.addErrs = append(e.addErrs, err)
			return
		}
		e.pods[string(pod.UID)] = pod
		e.added[string(pod.UID)] = true
	})
}

// peerPods returns the peer pods so far, by UID, and which were added
// during the rollout.
func (e *env) peerPods() (map[string]*corev1.Pod, map[string]bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return maps.Clone(e.pods), maps.Clone(e.added)
}

// liveVMs maps each peer pod's UID to its live VM's id.
func (e *env) liveVMs() map[string]string {
	out := map[string]string{}
	for _, in := range e.core.Live() {
		out[in.Tags[provider.TagPodUID]] = in.ID
	}
	return out
}

// logCaaTails logs the end of every caa process's output.
func (e *env) logCaaTails() {
	matches, _ := filepath.Glob(filepath.Join(e.agentDir, "*", "pods", "*", "caa.log"))
	for _, m := range matches {
		b, err := os.ReadFile(m)
		if err != nil {
			continue
		}
		lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
		lines = lines[max(0, len(lines)-25):]
		e.t.Logf("--- %s (last %d lines)\n%s", m, len(lines), strings.Join(lines, "\n"))
	}
	for _, err := range e.agent.Errors() {
		e.t.Logf("node agent: %v", err)
	}
}

// metric returns the value of one sample line of a Prometheus text page
// ("name{labels}"), 0 when absent.
func metric(page, series string) float64 {
	for line := range strings.SplitSeq(page, "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err == nil {
				return f
			}
		}
	}
	return 0
}

// waitNodeEvents waits until node has an event of each reason from caa,
// and returns their messages by reason.
func (e *env) waitNodeEvents(ctx context.Context, node string, reasons ...string) map[string]string {
	e.t.Helper()
	out := map[string]string{}
	e.eventually(ctx, 30*time.Second, fmt.Sprintf("events %v on %s", reasons, node), func() (bool, error) {
		list, err := e.c.Client().CoreV1().Events("").List(ctx, metav1.ListOptions{
			FieldSelector: "involvedObject.kind=Node,involvedObject.name=" + node})
		if err != nil {
			return false, err
		}
		for _, ev := range list.Items {
			if ev.Source.Component == "caa" {
				out[ev.Reason] = ev.Message
			}
		}
		for _, r := range reasons {
			if _, ok := out[r]; !ok {
				return false, nil
			}
		}
		return true, nil
	})
	return out
}
