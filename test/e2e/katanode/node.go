// Package katanode is one worker node of caa's remote hypervisor mode, for
// programs (make demo-kata) as much as for tests: a "node" network
// namespace in which the caa binary and `caa relay` run, the fake EC2
// listening on the node's loopback, a cloud network on which a fake pod VM
// boots for every instance the fake EC2 runs (from the instance's user
// data, read through the fake IMDSv2), and pod network namespaces wired as
// a CNI would. Nothing here takes a *testing.T: every step returns an error,
// and Close undoes what New built.
package katanode

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/pkg/sandbox"
	"github.com/caa-project/caa/test/e2e/cluster"
	ec2fake "github.com/caa-project/caa/test/mocks/aws"
	"github.com/caa-project/caa/test/mocks/cloud"
	katafake "github.com/caa-project/caa/test/mocks/kata"
	podvmfake "github.com/caa-project/caa/test/mocks/podvm"
)

// The fake EC2's image and instance type: m6a.large runs AMD SEV-SNP, which
// caa's default (--confidential) needs.
const (
	EC2Image = "ami-0123456789abcdef0"
	EC2Type  = "m6a.large"
)

// Node is one worker node of the remote hypervisor mode.
type Node struct {
	Name    string
	Cluster *cluster.Cluster
	Net     *podvmfake.CloudNetwork
	// Core is the fake EC2's state; Calls counts the calls made to it.
	Core  *cloud.Cloud
	Calls *Calls
	Fleet *podvmfake.Fleet
	// Dir is short: agent socket paths (Dir/pods/<64 hex>/agent.ttrpc)
	// must fit a unix socket address.
	Dir, Ledger, HypervisorSocket, AgentDir, RelaySocket string
	// Shim is kata's shim on this node: it calls HypervisorSocket.
	Shim katafake.Shim

	caaBin    string
	ec2URL    string
	cloudEnv  []string
	mu        sync.Mutex
	pods      int
	closers   []func()
	closeOnce sync.Once
}

// Options change how New builds a node.
type Options struct {
	// Upstream, when set, boots every pod VM with upstream's own programs
	// (process-user-data, agent-protocol-forwarder) and, if it names one,
	// the test kata agent; its EC2IMDS is the node's fake EC2's.
	Upstream *podvmfake.Upstream
	// BootGate, when set, is called before each pod VM boots and delays
	// the boot until it returns (a slow VM).
	BootGate func(ctx context.Context)
}

// New builds node name of cluster c, whose caa binary is caaBin. It needs
// root (network namespaces). On error nothing it built is left behind.
func New(ctx context.Context, c *cluster.Cluster, caaBin, name string) (n *Node, err error) {
	return NewWith(ctx, c, caaBin, name, Options{})
}

// NewWith is New with options.
func NewWith(ctx context.Context, c *cluster.Cluster, caaBin, name string, o Options) (n *Node, err error) {
	n = &Node{Name: name, Cluster: c, caaBin: caaBin, Calls: &Calls{}}
	// The node itself, for the undo: a failing return sets n to nil
	// before this runs.
	built := n
	defer func() {
		if err != nil {
			built.Close()
			n = nil
		}
	}()
	if _, err := c.CreateNode(ctx, name); err != nil {
		return nil, fmt.Errorf("node %s on the apiserver: %w", name, err)
	}
	if n.Net, err = podvmfake.BuildCloudNetwork(); err != nil {
		return nil, fmt.Errorf("the node's network namespaces: %w", err)
	}
	n.onClose(n.Net.Close)
	// The apiserver (127.0.0.1 of this process's namespace) at the same
	// address on the node's loopback, so its kubeconfig serves as it is.
	api := strings.TrimPrefix(c.URL(), "https://")
	_, stopAPI, err := Forward(n.Net.NodeNS, api, "", api)
	if err != nil {
		return nil, fmt.Errorf("the apiserver on the node's loopback: %w", err)
	}
	n.onClose(stopAPI)

	// The fake EC2 listens on the node's loopback, where caa dials it.
	n.Core = cloud.New(ec2fake.CloudOptions(cloud.Options{Images: []string{EC2Image}}))
	var ln net.Listener
	if err := podvmfake.InNetNS(n.Net.NodeNS, func() (err error) {
		ln, err = net.Listen("tcp", "127.0.0.1:0")
		return err
	}); err != nil {
		return nil, fmt.Errorf("the fake EC2's listener on the node: %w", err)
	}
	srv := httptest.NewUnstartedServer(n.Calls.wrap(ec2fake.NewServer(n.Core)))
	_ = srv.Listener.Close()
	srv.Listener = ln
	srv.Start()
	n.onClose(srv.Close)
	n.ec2URL = srv.URL
	n.cloudEnv = append(HermeticEnv(), "AWS_ACCESS_KEY_ID=AKIDKATANODE", "AWS_SECRET_ACCESS_KEY=katanode-secret",
		"AWS_EC2_METADATA_DISABLED=true", "AWS_CONFIG_FILE=/dev/null", "AWS_SHARED_CREDENTIALS_FILE=/dev/null")

	// The pod VMs read their user data through EC2's IMDSv2, as the stock
	// image does.
	core := n.Core
	imds := func(id string) http.Handler { return ec2fake.IMDS(core, id, nil) }
	n.Fleet = podvmfake.NewFleet(n.Net, n.Core, nil).ReadingFrom(podvmfake.EC2IMDS{IMDS: imds})
	if o.Upstream != nil || o.BootGate != nil {
		boot := podvmfake.Boot
		if o.Upstream != nil {
			u := *o.Upstream
			u.EC2IMDS = imds
			boot = u.Boot
		}
		if gate := o.BootGate; gate != nil {
			inner := boot
			boot = func(ctx context.Context, opts podvmfake.Options) (*podvmfake.VM, error) {
				gate(ctx)
				return inner(ctx, opts)
			}
		}
		n.Fleet.Booting(boot)
	}
	fctx, stopFleet := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); n.Fleet.Run(fctx, 20*time.Millisecond) }()
	n.onClose(func() { stopFleet(); <-done; n.Fleet.Close() })

	if n.Dir, err = os.MkdirTemp("", "kn"); err != nil {
		return nil, fmt.Errorf("the node's directory: %w", err)
	}
	dir := n.Dir
	n.onClose(func() { _ = os.RemoveAll(dir) })
	n.Ledger = filepath.Join(n.Dir, "caa", "ledger.db")
	n.HypervisorSocket = filepath.Join(n.Dir, "hypervisor.sock")
	n.AgentDir = filepath.Join(n.Dir, "pods")
	n.RelaySocket = filepath.Join(n.Dir, "relay.sock")
	n.Shim = katafake.Shim{Socket: n.HypervisorSocket}
	return n, nil
}

// onClose adds f to what Close undoes, last added first.
func (n *Node) onClose(f func()) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.closers = append(n.closers, f)
}

// Close stops the fleet, the fake EC2 and the forwarders, and removes the
// namespaces and the node's directory. Processes started on the node are
// their starters' to stop first.
func (n *Node) Close() {
	n.closeOnce.Do(func() {
		n.mu.Lock()
		fs := n.closers
		n.closers = nil
		n.mu.Unlock()
		for i := len(fs) - 1; i >= 0; i-- {
			fs[i]()
		}
	})
}

// CloudArgs are caa's flags for the node's fake EC2; CloudEnv the
// credentials it reads from the environment.
func (n *Node) CloudArgs() []string {
	return []string{"--provider", "aws", "--aws-endpoint", n.ec2URL, "--aws-region", "us-east-1",
		"--aws-security-group-ids", "sg-0123456789abcdef0", "--aws-subnet-id", "subnet-0123456789abcdef0", "--aws-image", EC2Image, "--aws-instance-type", EC2Type}
}

// EC2URL is the fake EC2's endpoint, on the node's loopback.
func (n *Node) EC2URL() string { return n.ec2URL }

// CloudEnv is the environment caa needs for the fake EC2.
func (n *Node) CloudEnv() []string { return append([]string(nil), n.cloudEnv...) }

// Pod is a pod on the apiserver and its network namespace on the node.
type Pod struct {
	Namespace, Name string
	Net             *podvmfake.Pod
}

// NewPod creates pod ns/name on the apiserver (bound to the node, runtime
// class kata-remote) and its network namespace with a /24 of its own.
func (n *Node) NewPod(ctx context.Context, ns, name string) (*Pod, error) {
	if _, err := n.Cluster.CreatePeerPod(ctx, ns, name, n.Name, nil); err != nil {
		return nil, fmt.Errorf("pod %s/%s on the apiserver: %w", ns, name, err)
	}
	n.mu.Lock()
	n.pods++
	k := n.pods
	n.mu.Unlock()
	ip := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, byte(k), 5}), 24)
	p, err := n.Net.AddPod(ip)
	if err != nil {
		return nil, fmt.Errorf("pod %s/%s's network namespace: %w", ns, name, err)
	}
	return &Pod{Namespace: ns, Name: name, Net: p}, nil
}

// Annotations are the CRI annotations kata's shim sends for the pod's
// sandbox.
func (p *Pod) Annotations() map[string]string {
	return map[string]string{sandbox.AnnotationSandboxName: p.Name, sandbox.AnnotationSandboxNamespace: p.Namespace}
}

// SandboxID is a sandbox id as kata makes them: 64 hex digits.
func SandboxID(n int) string { return fmt.Sprintf("%064x", 0xca0000+n) }

// SandboxVMs are the fake EC2's instances tagged for sandbox id, in any
// state.
func (n *Node) SandboxVMs(id string) []cloud.Instance {
	var out []cloud.Instance
	for _, in := range n.Core.Instances() {
		if in.Tags[sandbox.TagSandbox] == id {
			out = append(out, in)
		}
	}
	return out
}

// LiveSandboxVMs are SandboxVMs not terminated.
func (n *Node) LiveSandboxVMs(id string) []cloud.Instance {
	var out []cloud.Instance
	for _, in := range n.SandboxVMs(id) {
		if in.State != provider.StateTerminated {
			out = append(out, in)
		}
	}
	return out
}

// Calls counts the calls made to the fake EC2, by Action (a dry run, a
// permission check that changes nothing, counts as "<Action> (dry run)").
type Calls struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *Calls) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.Body = io.NopCloser(strings.NewReader(string(body)))
		q, _ := url.ParseQuery(string(body))
		action := q.Get("Action")
		if q.Get("DryRun") == "true" {
			action += " (dry run)"
		}
		c.mu.Lock()
		if c.n == nil {
			c.n = map[string]int{}
		}
		c.n[action]++
		c.mu.Unlock()
		next.ServeHTTP(w, r)
	})
}

// Count is how many calls of action arrived so far.
func (c *Calls) Count(action string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[action]
}

// Writes are the calls so far that create or delete a VM: RunInstances
// and TerminateInstances (dry runs excluded).
func (c *Calls) Writes() (runs, terminates int) {
	return c.Count("RunInstances"), c.Count("TerminateInstances")
}

// Forward serves listenAddr in namespace from ("" for this process's own)
// and pipes every connection to dialAddr opened in namespace to ("" for
// this process's). It returns the address it listens on and a stop
// function that closes the listener and waits for the pipes to end.
func Forward(from, listenAddr, to, dialAddr string) (addr string, stop func(), err error) {
	var ln net.Listener
	listen := func() (err error) { ln, err = net.Listen("tcp", listenAddr); return err }
	if from != "" {
		err = podvmfake.InNetNS(from, listen)
	} else {
		err = listen()
	}
	if err != nil {
		return "", nil, fmt.Errorf("forward %s: listen: %w", listenAddr, err)
	}
	dial := (&net.Dialer{Timeout: 5 * time.Second}).DialContext
	if to != "" {
		dial = podvmfake.DialIn(to)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	open := map[net.Conn]struct{}{}
	track := func(c net.Conn, add bool) {
		mu.Lock()
		defer mu.Unlock()
		if add {
			open[c] = struct{}{}
		} else {
			delete(open, c)
		}
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			track(in, true)
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer track(in, false)
				defer in.Close()
				out, err := dial(context.Background(), "tcp", dialAddr)
				if err != nil {
					return
				}
				defer out.Close()
				done := make(chan struct{}, 2)
				go func() { _, _ = io.Copy(out, in); done <- struct{}{} }()
				go func() { _, _ = io.Copy(in, out); done <- struct{}{} }()
				<-done
			}()
		}
	}()
	stop = func() {
		_ = ln.Close()
		mu.Lock()
		for c := range open {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	}
	return ln.Addr().String(), stop, nil
}

// hermeticEnv is this process's environment without what would point caa
// elsewhere than the node's fakes (cloud credentials, caa's own settings).
func HermeticEnv() []string {
	drop := []string{"AZURE_", "IDENTITY_", "MSI_", "IMDS_ENDPOINT=", "IBMCLOUD_", "VPC_", "IBM_CREDENTIALS_FILE=",
		"AWS_", "CAA_", "KUBECONFIG=", "NODE_NAME="}
	return slices.DeleteFunc(os.Environ(), func(kv string) bool {
		return slices.ContainsFunc(drop, func(p string) bool { return strings.HasPrefix(kv, p) })
	})
}

// errExited says a process ended before it did what was awaited.
var errExited = errors.New("exited")
