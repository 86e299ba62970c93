package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/caa-project/caa/pkg/ledger"
	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/pkg/sandbox"
	"github.com/caa-project/caa/test/e2e/cluster"
	"github.com/caa-project/caa/test/e2e/katanode"
	ec2fake "github.com/caa-project/caa/test/mocks/aws"
	armfake "github.com/caa-project/caa/test/mocks/azure"
	"github.com/caa-project/caa/test/mocks/cloud"
	vpcfake "github.com/caa-project/caa/test/mocks/ibmcloud"
	katafake "github.com/caa-project/caa/test/mocks/kata"
	podvmfake "github.com/caa-project/caa/test/mocks/podvm"
)

// hvEnv is a node for the remote hypervisor mode: the real apiserver, a
// "node" network namespace in which the caa binary runs (started from a
// thread inside it, so the process is born there) with the fake EC2 and the
// apiserver reachable on its loopback, a cloud network (a bridge) on which
// the fake pod VM fleet boots every instance the fake EC2 runs, from the
// instance's user data, and pod network namespaces wired as a CNI would.
type hvEnv struct {
	c         *cluster.Cluster
	cn        *podvmfake.CloudNetwork
	core      *cloud.Cloud
	cloudName string
	// cloudArgs and cloudEnv point caa at the fake cloud.
	cloudArgs, cloudEnv []string
	door                *arrivals
	hold                *createHold
	fleet               *podvmfake.Fleet
	ec2                 http.Handler // the fake EC2's server over aws.core, for other doors to it
	node                string
	// dir is short: agent socket paths (dir/pods/<64 hex>/agent.ttrpc)
	// must fit a unix socket address.
	dir, ledger, socket, agents string
	shim                        katafake.Shim
	pods                        atomic.Int32
}

// newHVEnv is a hypervisor test's start: its context, ending at the
// timeout, and node worker-1 on a cluster of its own.
func newHVEnv(t *testing.T, timeout time.Duration) (context.Context, *hvEnv) {
	t.Helper()
	ctx := testContext(t, timeout)
	cn := podvmfake.NewCloudNetwork(t) // skips only where the kernel lacks netns or VXLAN
	return ctx, newHVEnvOn(ctx, t, cluster.Start(ctx, t), cn, "worker-1")
}

// newHVEnvOn is node on cluster c (several nodes may share one apiserver),
// in its own cloud network cn with its own fake EC2 and pod VM fleet.
func newHVEnvOn(ctx context.Context, t *testing.T, c *cluster.Cluster, cn *podvmfake.CloudNetwork, node string) *hvEnv {
	return newHVEnvIn(ctx, t, c, cn, node, "aws")
}

// newHVEnvIn is newHVEnvOn on the fake of cloudName (aws, azure or
// ibmcloud). Each VM reads its user data as the stock image does on that
// cloud: EC2's IMDSv2, Azure's IMDS compute/userData, IBM Cloud's cidata
// volume. With CAA_UPSTREAM_PODVM_BIN set, the VMs run upstream's real
// process-user-data and agent-protocol-forwarder (make test-upstream-podvm).
func newHVEnvIn(ctx context.Context, t *testing.T, c *cluster.Cluster, cn *podvmfake.CloudNetwork, node, cloudName string) *hvEnv {
	t.Helper()
	e := &hvEnv{c: c, cn: cn, node: node, cloudName: cloudName, door: &arrivals{}, hold: &createHold{}}
	// A node made already (a kwok node, for the DaemonSet controller's
	// tests) is kept.
	_, err := c.Client().CoreV1().Nodes().Get(ctx, e.node, metav1.GetOptions{})
	if err != nil {
		_, err = c.CreateNode(ctx, e.node)
		require.NoError(t, err)
	}
	// The apiserver (127.0.0.1 of the test's namespace) at the same address
	// on the node's loopback, so the kubeconfig serves as it is.
	api := strings.TrimPrefix(c.URL(), "https://")
	forward(t, cn.NodeNS, api, "", api)

	var src podvmfake.UserDataSource
	switch cloudName {
	case "aws":
		// The fake EC2 listens on the node's loopback, where caa dials it.
		core := cloud.New(ec2fake.CloudOptions(cloud.Options{Images: []string{ec2Image}}))
		var ln net.Listener
		require.NoError(t, podvmfake.InNetNS(cn.NodeNS, func() error {
			ln, err = net.Listen("tcp", "127.0.0.1:0")
			return err
		}))
		e.ec2 = ec2fake.NewServer(core)
		srv := httptest.NewUnstartedServer(e.door.wrap(e.hold.wrap(e.ec2)))
		_ = srv.Listener.Close()
		srv.Listener = ln
		srv.Start()
		t.Cleanup(srv.Close)
		e.core = core
		e.cloudArgs, e.cloudEnv = (&awsCloud{core: core, url: srv.URL}).awsArgs(), awsEnv()
		src = podvmfake.EC2IMDS{IMDS: func(id string) http.Handler { return ec2fake.IMDS(core, id, nil) }}
	case "azure", "ibmcloud":
		var fc *fakeCloud
		if cloudName == "azure" {
			fc = newAzureFake(t)
			src = podvmfake.AzureIMDS{IMDS: func(id string) http.Handler { return armfake.IMDS(fc.core, id) }}
		} else {
			fc = newIBMCloudFake(t)
			src = podvmfake.CIDataVolume{Files: func(id string) (map[string][]byte, error) { return vpcfake.CIData(fc.core, id) }}
		}
		// The fake and its identity endpoints listen on the test's
		// loopback: each address caa is given is served on the node's too.
		seen := map[string]bool{}
		for _, m := range loopbackAddr.FindAllString(strings.Join(append(fc.args, fc.env...), " "), -1) {
			if !seen[m] {
				seen[m] = true
				forward(t, cn.NodeNS, m, "", m)
			}
		}
		e.core, e.cloudArgs, e.cloudEnv = fc.core, fc.args, append(hermeticEnv(), fc.env...)
	default:
		t.Fatalf("no fake cloud %q", cloudName)
	}

	e.fleet = podvmfake.NewFleet(cn, e.core, nil).ReadingFrom(src)
	if dir := os.Getenv(podvmfake.UpstreamBinEnv); dir != "" {
		require.NoError(t, podvmfake.CheckUpstream(dir))
		t.Logf("the pod VMs run upstream's process-user-data and agent-protocol-forwarder from %s", dir)
		up := podvmfake.Upstream{Dir: dir}
		if cloudName == "aws" {
			// On EC2 the real process-user-data fetches the user data itself.
			core := e.core
			up.EC2IMDS = func(id string) http.Handler { return ec2fake.IMDS(core, id, nil) }
		}
		e.fleet.Booting(up.Boot)
	}
	fctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); e.fleet.Run(fctx, 20*time.Millisecond) }()
	t.Cleanup(func() { stop(); <-done; e.fleet.Close() })

	e.dir, err = os.MkdirTemp("", "hve")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(e.dir) })
	e.ledger = filepath.Join(e.dir, "caa", "ledger.db")
	e.socket = filepath.Join(e.dir, "hypervisor.sock")
	e.agents = filepath.Join(e.dir, "pods")
	e.shim = katafake.Shim{Socket: e.socket}
	return e
}

// start runs `caa run` in the remote hypervisor mode on the node; extra
// flags come last. Its health port is forwarded to the test's loopback, so
// the daemon helpers (readyz, waitReady, stop) work as for other tests.
func (e *hvEnv) start(t *testing.T, extra ...string) *daemon {
	t.Helper()
	// A port free in the node's namespace (the fake EC2 listens there too).
	var inner string
	require.NoError(t, podvmfake.InNetNS(e.cn.NodeNS, func() error {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		inner = l.Addr().String()
		return l.Close()
	}))
	outer := forward(t, "", "127.0.0.1:0", e.cn.NodeNS, inner)
	args := katanode.RunArgs(e.node, e.c.Kubeconfig(), e.ledger, inner, e.socket, e.agents, e.cn.NodeIP.Addr().String())
	args = append(args, e.cloudArgs...)
	cmd := exec.Command(caaBin, append(args, extra...)...)
	// Outside a pod nothing can verify a hand-over asker: these runs take
	// askers at their word, as launchCaaBin's do.
	cmd.Env = append(slices.Clone(e.cloudEnv), "CAA_HANDOVER_ALLOW_UNVERIFIED=true")
	// A child forked from a thread inside the node's namespace is born there.
	return spawn(t, cmd, func() error { return podvmfake.InNetNS(e.cn.NodeNS, cmd.Start) }, "http://"+outer, "caa (hypervisor mode)")
}

// startReady is start, then waits until the daemon is ready.
func (e *hvEnv) startReady(t *testing.T, extra ...string) *daemon {
	t.Helper()
	d := e.start(t, extra...)
	d.waitReady(t, func() {})
	return d
}

// loopbackAddr finds the test's loopback servers in a daemon's flags.
var loopbackAddr = regexp.MustCompile(`127\.0\.0\.1:[0-9]+`)

// forward serves listenAddr in namespace from ("" for the test's own) and
// pipes every connection to dialAddr opened in namespace to. It returns the
// address it listens on.
func forward(t *testing.T, from, listenAddr, to, dialAddr string) string {
	t.Helper()
	addr, stop, err := katanode.Forward(from, listenAddr, to, dialAddr)
	require.NoError(t, err)
	t.Cleanup(stop)
	return addr
}

// createHold, when on, lets a RunInstances make its instance and then holds
// the answer until the caller goes away: a create that landed in the cloud
// whose answer caa never reads.
type createHold struct {
	on     atomic.Bool
	landed chan struct{}
	mu     sync.Mutex
}

func (h *createHold) arm() <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.landed = make(chan struct{}, 1)
	h.on.Store(true)
	return h.landed
}

func (h *createHold) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !h.on.Load() {
			next.ServeHTTP(w, r)
			return
		}
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(strings.NewReader(string(body)))
		if ec2CallKind(string(body)) != "RunInstances" {
			next.ServeHTTP(w, r)
			return
		}
		rec := httptest.NewRecorder()
		next.ServeHTTP(rec, r)
		h.mu.Lock()
		select {
		case h.landed <- struct{}{}:
		default:
		}
		h.mu.Unlock()
		<-r.Context().Done() // the answer is lost with its caller
	})
}

// nodeDefaultRoute gives the node's namespace a default route on the cloud
// network, as a real node has one.
func (e *hvEnv) nodeDefaultRoute(t *testing.T) {
	t.Helper()
	ns, err := netns.GetFromPath(e.cn.NodeNS)
	require.NoError(t, err)
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	require.NoError(t, err)
	defer h.Close()
	br, err := h.LinkByName("cloud0")
	require.NoError(t, err)
	gw := e.cn.NodeIP.Masked().Addr().As4()
	gw[2], gw[3] = 255, 254
	require.NoError(t, h.RouteAdd(&netlink.Route{LinkIndex: br.Attrs().Index, Gw: net.IP(gw[:])}))
}

// peerPod is one pod on the apiserver and its network namespace on the node.
type peerPod struct {
	ns, name string
	net      *podvmfake.Pod
}

// newPod creates pod ns/name on the apiserver (bound to the node, kata-remote)
// and its network namespace with its own /24.
func (e *hvEnv) newPod(ctx context.Context, t *testing.T, ns, name string, annotations map[string]string) *peerPod {
	t.Helper()
	_, err := e.c.CreatePeerPod(ctx, ns, name, e.node, annotations)
	require.NoError(t, err)
	return e.podNetFor(t, ns, name)
}

// podNetFor gives pod ns/name, made on the apiserver by the caller, its
// network namespace with its own /24.
func (e *hvEnv) podNetFor(t *testing.T, ns, name string) *peerPod {
	t.Helper()
	k := e.pods.Add(1)
	ip := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, byte(k), 5}), 24)
	return &peerPod{ns: ns, name: name, net: e.cn.NewPod(t, ip)}
}

// annotations are the CRI annotations kata's shim sends for the pod's sandbox.
func (p *peerPod) annotations(extra map[string]string) map[string]string {
	a := map[string]string{sandbox.AnnotationSandboxName: p.name, sandbox.AnnotationSandboxNamespace: p.ns}
	for k, v := range extra {
		a[k] = v
	}
	return a
}

// sandboxID is a sandbox id as kata makes them: 64 hex digits.
func sandboxID(n int) string { return fmt.Sprintf("%064x", 0xca0000+n) }

// sandboxVMs are the fake EC2's instances made for sandbox id (any state).
func (e *hvEnv) sandboxVMs(id string) []cloud.Instance {
	var out []cloud.Instance
	for _, in := range e.core.Instances() {
		if vmTag(e.core, in, sandbox.TagSandbox) == id {
			out = append(out, in)
		}
	}
	return out
}

// instanceIDs are the instances' ids (what a failed assertion prints: an
// instance also holds its user data, keys included).
func instanceIDs(ins []cloud.Instance) []string {
	out := []string{}
	for _, in := range ins {
		out = append(out, in.ID)
	}
	return out
}

// liveSandboxVMs are those not terminated.
// vmTag is the VM's tag key: on the instance, or on a resource of it
// (IBM Cloud tags the boot volume: VPC instances take no user tags).
func vmTag(core *cloud.Cloud, in cloud.Instance, key string) string {
	if v, ok := in.Tags[key]; ok {
		return v
	}
	for _, id := range in.Resources {
		if r, err := core.GetResource(id); err == nil {
			if v, ok := r.Tags[key]; ok {
				return v
			}
		}
	}
	return ""
}

func (e *hvEnv) liveSandboxVMs(id string) []cloud.Instance {
	var out []cloud.Instance
	for _, in := range e.sandboxVMs(id) {
		if in.State != provider.StateTerminated {
			out = append(out, in)
		}
	}
	return out
}

// readLedger opens the ledger file read-only (no daemon holds it) and
// returns the sandbox's record (ErrNotFound if none) and history.
func (e *hvEnv) readLedger(t *testing.T, id string) (ledger.Sandbox, []ledger.SandboxEvent, error) {
	t.Helper()
	l, err := ledger.Open(ledger.Options{Path: e.ledger, ReadOnly: true, Timeout: 5 * time.Second})
	require.NoError(t, err)
	defer l.Close()
	hist, herr := l.SandboxHistory(id)
	if !errors.Is(herr, ledger.ErrNotFound) {
		require.NoError(t, herr)
	}
	s, err := l.GetSandbox(id)
	return s, hist, err
}
