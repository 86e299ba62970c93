package rollout

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
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

	mu      sync.Mutex
	tl      Timeline
	ready   map[string]firstReady // by pod UID
	trouble []nodeagent.Observation
	onPod   func(PodSample) // called outside mu, on the informer's goroutine
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
	case nodeagent.Ready:
	case nodeagent.Exited, nodeagent.Restarted, nodeagent.Failed:
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
	return tl
}

// env is one rollout test's world.
type env struct {
	t       *testing.T
	c       *cluster.Cluster
	core    *cloud.Cloud
	ec2URL  string
	agent   *nodeagent.Agent
	rec     *recorder
	kustDir string
	// agentDir holds the nodes' hostPaths and the caa pods' logs.
	agentDir string
	nodes    []string
	pods     map[string]*corev1.Pod // peer pods by UID
}

// start brings up the control plane with kwok, nodeCount kwok nodes with
// podsPerNode peer pods each, the fake EC2, the node agent and the
// recorders. Everything stops in t.Cleanup.
func start(ctx context.Context, t *testing.T, nodeCount, podsPerNode int) *env {
	t.Helper()
	c := cluster.Start(ctx, t)
	require.NoError(t, c.StartControlPlane(ctx))
	require.NoError(t, c.StartKwok(ctx))

	core := cloud.New(ec2fake.CloudOptions(cloud.Options{Images: []string{ec2Image}}))
	// Every call takes a little while and a new VM boots for a second, so
	// a new caa has real work before it may turn ready.
	core.SetFaults(cloud.Faults{Latency: 20 * time.Millisecond, BootDelay: time.Second})
	srv := httptest.NewServer(ec2fake.NewServer(core, ec2fake.WithCredentials(accessKey, secretKey)))
	t.Cleanup(srv.Close)
	e := &env{t: t, c: c, core: core, ec2URL: srv.URL, kustDir: t.TempDir(), agentDir: t.TempDir(), pods: map[string]*corev1.Pod{}}

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

	e.rec = &recorder{nodes: e.nodes, core: core, ready: map[string]firstReady{}}
	agentCtx, stopAgent := context.WithCancel(context.Background())
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
		stopAgent()
		factory.Shutdown()
		wg.Wait()
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
const kustomization = `apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - {{BASE}}
  - credentials.yaml
images:
  - name: caa
    newTag: {{TAG}}
configMapGenerator:
  - name: caa-config
    behavior: merge
    literals:
      - CAA_AWS_REGION=us-east-1
      - CAA_AWS_SUBNET_ID=subnet-0123456789abcdef0
      - CAA_AWS_IMAGE=` + ec2Image + `
      - CAA_AWS_INSTANCE_TYPE=t3.small
      # The fake EC2 of this test, in-process on the loopback.
      - CAA_AWS_ENDPOINT={{ENDPOINT}}
      # No instance metadata service here; credentials come from the Secret.
      - AWS_EC2_METADATA_DISABLED=true
      # A resync far beyond the test's length: a running caa never notices
      # the VMs killed behind its back, so the new caa's startup pass is
      # what recreates them, which is the behaviour under test.
      - CAA_RESYNC=10m
patches:
  # Probe periods of 1s instead of 10s and 5s: the controller moves on
  # when a pod turns Ready, and a 5s period would add up to 5s per node to
  # the test without testing anything more. Thresholds are unchanged.
  - patch: |-
      apiVersion: apps/v1
      kind: DaemonSet
      metadata:
        name: caa
        namespace: caa-system
      spec:
        template:
          spec:
            containers:
              - name: caa
                startupProbe:
                  periodSeconds: 1
                readinessProbe:
                  periodSeconds: 1
`

const credentials = `apiVersion: v1
kind: Secret
metadata:
  name: caa-cloud-credentials
  namespace: caa-system
type: Opaque
stringData:
  AWS_ACCESS_KEY_ID: ` + accessKey + `
  AWS_SECRET_ACCESS_KEY: ` + secretKey + `
`

// apply renders the overlay for tag and runs kubectl apply -k on it.
func (e *env) apply(ctx context.Context, tag string) {
	e.t.Helper()
	overlay, err := filepath.Abs(filepath.Join("..", "..", "..", "deploy", "overlays", "aws"))
	require.NoError(e.t, err)
	require.FileExists(e.t, filepath.Join(overlay, "kustomization.yaml"))
	base, err := filepath.Rel(e.kustDir, overlay)
	require.NoError(e.t, err)
	k := strings.NewReplacer("{{BASE}}", base, "{{TAG}}", tag, "{{ENDPOINT}}", e.ec2URL).Replace(kustomization)
	require.NoError(e.t, os.WriteFile(filepath.Join(e.kustDir, "kustomization.yaml"), []byte(k), 0o600))
	require.NoError(e.t, os.WriteFile(filepath.Join(e.kustDir, "credentials.yaml"), []byte(credentials), 0o600))
	bins, err := cluster.EnsureBinaries(ctx)
	require.NoError(e.t, err)
	cmd := exec.CommandContext(ctx, bins.Kubectl, "--kubeconfig", e.c.Kubeconfig(), "apply", "-k", e.kustDir)
	out, err := cmd.CombinedOutput()
	require.NoError(e.t, err, "kubectl apply -k (caa:%s):\n%s", tag, out)
	e.t.Logf("kubectl apply -k (caa:%s):\n%s", tag, strings.TrimSpace(string(out)))
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
