package cluster

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

const (
	// readyTimeout bounds the wait for etcd or the apiserver to serve; both
	// take seconds on an idle machine, much longer under a loaded -race run.
	readyTimeout = 3 * time.Minute
	// stopGrace is how long a server gets after SIGTERM before SIGKILL.
	stopGrace = 15 * time.Second
	// startAttempts covers a free port taken by someone else between our
	// probe and the server's bind.
	startAttempts = 3
	pollInterval  = 100 * time.Millisecond
)

// Options configure Launch.
type Options struct {
	// Dir holds keys, certificates, etcd's data and the servers' logs. Empty
	// means a new temporary directory that Stop removes.
	Dir string
	// Logf receives progress lines; nil drops them.
	Logf func(format string, args ...any)
	// RealKubelets readies the apiserver for real kubelets
	// (test/e2e/realnode): the ServiceAccount admission plugin on, so pods
	// get their projected token as in a real cluster; a client certificate
	// of the client CA for its calls to kubelets (logs, exec), which a
	// kubelet's x509 authentication admits; and kubelets reached at their
	// InternalIP.
	RealKubelets bool
	// APIServerArgs are added to the apiserver's flags (an egress selector
	// configuration, for one).
	APIServerArgs []string
}

// Cluster is a running etcd and kube-apiserver on 127.0.0.1.
type Cluster struct {
	dir     string
	ownDir  bool
	logf    func(string, ...any)
	bins    Binaries
	creds   credentials
	certDir string

	etcdURL  string
	apiPort  int
	apiArgs  []string
	url      string
	caPEM    []byte
	rest     *rest.Config
	client   kubernetes.Interface
	kubeconf string

	namespaces sync.Map // names known to exist, for CreatePeerPod

	realKubelets bool     // Options.RealKubelets
	extraArgs    []string // Options.APIServerArgs

	mu        sync.Mutex // guards the processes and stopped
	etcd      *process
	apiserver *process
	extras    []*process // controller-manager, scheduler, kwok: stopped first
	stopped   bool
}

// Start launches a cluster for t in t.TempDir and stops it in t.Cleanup,
// printing the tail of each server's log if t failed. It fails t if the
// cluster does not come up.
func Start(ctx context.Context, t testing.TB) *Cluster {
	t.Helper()
	return StartWith(ctx, t, Options{})
}

// StartWith is Start with opts; opts.Dir and opts.Logf default to
// t.TempDir() and t.Logf.
func StartWith(ctx context.Context, t testing.TB, opts Options) *Cluster {
	t.Helper()
	if opts.Dir == "" {
		opts.Dir = t.TempDir()
	}
	if opts.Logf == nil {
		opts.Logf = t.Logf
	}
	c, err := Launch(ctx, opts)
	if err != nil {
		t.Fatalf("start e2e cluster: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("e2e cluster logs:\n%s", c.LogTails(40))
		}
		if err := c.Stop(); err != nil {
			t.Errorf("stop e2e cluster: %v", err)
		}
	})
	return c
}

// Launch builds or finds the binaries, starts etcd and the apiserver, waits
// until the apiserver is ready, and creates the objects every test expects
// (the kube-system namespace and the kata-remote RuntimeClass). ctx bounds
// the start only: the servers run until Stop. On error nothing is left
// running.
func Launch(ctx context.Context, opts Options) (*Cluster, error) {
	bins, err := EnsureBinaries(ctx)
	if err != nil {
		return nil, err
	}
	c := &Cluster{dir: opts.Dir, logf: opts.Logf, bins: bins, realKubelets: opts.RealKubelets, extraArgs: opts.APIServerArgs}
	if c.logf == nil {
		c.logf = func(string, ...any) {}
	}
	if c.dir == "" {
		if c.dir, err = os.MkdirTemp("", "caa-e2e-"); err != nil {
			return nil, fmt.Errorf("e2e cluster dir: %w", err)
		}
		c.ownDir = true
	}
	if err := c.launch(ctx); err != nil {
		if stopErr := c.Stop(); stopErr != nil {
			err = errors.Join(err, stopErr)
		}
		return nil, err
	}
	return c, nil
}

func (c *Cluster) launch(ctx context.Context) error {
	var err error
	if c.creds, err = writeCredentials(c.dir); err != nil {
		return err
	}
	c.certDir = filepath.Join(c.dir, "apiserver-certs")
	for attempt := 1; ; attempt++ {
		err = c.startServers(ctx, attempt)
		if err == nil || !errors.Is(err, errPortTaken) || attempt == startAttempts {
			break
		}
		c.logf("e2e: start attempt %d lost a port to another process; retrying on other ports", attempt)
	}
	if err != nil {
		return err
	}
	c.rest = &rest.Config{
		Host:            c.url,
		BearerToken:     c.creds.adminTok,
		TLSClientConfig: rest.TLSClientConfig{CAData: c.caPEM},
		// Tests make bursts of calls; client-side throttling only slows them.
		QPS: -1,
	}
	if c.client, err = kubernetes.NewForConfig(c.rest); err != nil {
		return fmt.Errorf("e2e client: %w", err)
	}
	c.kubeconf = filepath.Join(c.dir, "kubeconfig")
	if err := writeKubeconfig(c.kubeconf, c.rest); err != nil {
		return err
	}
	return c.bootstrap(ctx)
}

// errPortTaken marks a start that failed because a port we probed as free
// was bound by someone else before the server bound it.
var errPortTaken = errors.New("port taken")

// startServers starts etcd and then the apiserver on fresh ports, each with
// a clean state, and waits until both serve.
func (c *Cluster) startServers(ctx context.Context, attempt int) error {
	ports, err := freePorts(3)
	if err != nil {
		return err
	}
	etcdClient, etcdPeer := ports[0], ports[1]
	c.apiPort = ports[2]
	c.url = "https://127.0.0.1:" + strconv.Itoa(c.apiPort)
	c.etcdURL = "http://127.0.0.1:" + strconv.Itoa(etcdClient)
	peerURL := "http://127.0.0.1:" + strconv.Itoa(etcdPeer)

	// A failed attempt may have left data or a half-written bundle behind.
	dataDir := filepath.Join(c.dir, "etcd-data")
	for _, d := range []string{dataDir, c.certDir} {
		if err := os.RemoveAll(d); err != nil {
			return fmt.Errorf("reset %s: %w", d, err)
		}
	}
	if err := os.MkdirAll(c.certDir, 0o700); err != nil {
		return fmt.Errorf("create cert dir: %w", err)
	}

	etcdArgs := []string{
		"--name=e2e",
		"--data-dir=" + dataDir,
		"--listen-client-urls=" + c.etcdURL,
		"--advertise-client-urls=" + c.etcdURL,
		"--listen-peer-urls=" + peerURL,
		"--initial-advertise-peer-urls=" + peerURL,
		"--initial-cluster=e2e=" + peerURL,
		"--initial-cluster-state=new",
		// Throw-away data: skipping fsync keeps a shared CI disk out of
		// the apiserver's latency.
		"--unsafe-no-fsync=true",
		"--log-level=warn",
	}
	etcd, err := startProcess("etcd", c.bins.Etcd, etcdArgs, filepath.Join(c.dir, "etcd.log"))
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.etcd = etcd
	c.mu.Unlock()
	c.logf("e2e: etcd (attempt %d) at %s", attempt, c.etcdURL)
	if err := waitReady(ctx, etcd, c.etcdHealthy); err != nil {
		c.stopProcesses()
		return err
	}

	c.apiArgs = []string{
		"--etcd-servers=" + c.etcdURL,
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(c.apiPort),
		"--cert-dir=" + c.certDir,
		"--token-auth-file=" + c.creds.tokens,
		// Kubelets' identities (NodeKubeconfig): client certificates of
		// this CA, which the Node authorizer and NodeRestriction confine to
		// their own node's objects, as in a real cluster.
		"--client-ca-file=" + c.creds.clientCA,
		"--authorization-mode=Node,RBAC",
		"--enable-admission-plugins=NodeRestriction",
		"--service-account-key-file=" + c.creds.saPub,
		"--service-account-signing-key-file=" + c.creds.saKey,
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		// No controller-manager runs: the endpoint reconciler would publish
		// this address for the kubernetes Service, and the ServiceAccount
		// plugin would wait for token controllers that never come.
		"--endpoint-reconciler-type=none",
		"--disable-admission-plugins=ServiceAccount",
		"--profiling=false",
	}
	if c.realKubelets {
		clientCert := filepath.Join(c.dir, "apiserver-kubelet-client.pem")
		// The apiserver's identity towards kubelets, as kubeadm issues it;
		// a kubelet's webhook authorizer asks the apiserver about it, and
		// system:masters may do anything.
		if err := c.WriteClientCertificate(clientCert, "kube-apiserver-kubelet-client", "system:masters"); err != nil {
			c.stopProcesses()
			return err
		}
		c.apiArgs = slices.DeleteFunc(c.apiArgs, func(a string) bool { return a == "--disable-admission-plugins=ServiceAccount" })
		c.apiArgs = append(c.apiArgs,
			"--kubelet-client-certificate="+clientCert,
			"--kubelet-client-key="+clientCert,
			"--kubelet-preferred-address-types=InternalIP")
	}
	c.apiArgs = append(c.apiArgs, c.extraArgs...)
	if err := c.startAPIServer(ctx); err != nil {
		c.stopProcesses()
		return err
	}
	return nil
}

// startAPIServer starts the apiserver with c.apiArgs and waits for /readyz.
func (c *Cluster) startAPIServer(ctx context.Context) error {
	api, err := startProcess("kube-apiserver", c.bins.APIServer, c.apiArgs, filepath.Join(c.dir, "kube-apiserver.log"))
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.apiserver = api
	c.mu.Unlock()
	c.logf("e2e: kube-apiserver at %s", c.url)
	start := time.Now()
	if err := waitReady(ctx, api, c.apiserverReady); err != nil {
		api.stop(stopGrace)
		return err
	}
	c.logf("e2e: kube-apiserver ready after %s", time.Since(start).Round(time.Millisecond))
	ca, err := servingCA(c.certDir)
	if err != nil {
		return err
	}
	if c.caPEM != nil && !bytes.Equal(ca, c.caPEM) {
		// Clients hold the first CA; a new one would break them all.
		return errors.New("kube-apiserver generated a new serving CA on restart")
	}
	c.caPEM = ca
	return nil
}

// waitReady polls check until it passes, the process exits, or the wait
// times out. An exit caused by a bind failure wraps errPortTaken.
func waitReady(ctx context.Context, p *process, check func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	for {
		if exit := p.exitErr(); exit != nil {
			tail := p.tail(30)
			if strings.Contains(tail, "address already in use") {
				exit = fmt.Errorf("%w: %w", errPortTaken, exit)
			}
			return fmt.Errorf("%w before it was ready; last lines of %s:\n%s", exit, p.logPath, tail)
		}
		lastErr := check(ctx)
		if lastErr == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not ready: %w (last check: %w); last lines of %s:\n%s", p.name, ctx.Err(), lastErr, p.logPath, p.tail(30))
		case <-time.After(pollInterval):
		}
	}
}

var etcdProbe = &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

func (c *Cluster) etcdHealthy(ctx context.Context) error {
	body, err := get(ctx, etcdProbe, c.etcdURL+"/health", "")
	if err != nil {
		return err
	}
	if !strings.Contains(body, `"health":"true"`) {
		return fmt.Errorf("etcd /health: %s", body)
	}
	return nil
}

// apiserverReady checks /readyz over TLS verified against the serving CA,
// which the apiserver writes into --cert-dir shortly after it starts.
func (c *Cluster) apiserverReady(ctx context.Context) error {
	ca, err := servingCA(c.certDir)
	if err != nil {
		return err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return errors.New("serving CA: no certificate in PEM")
	}
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true,
		TLSClientConfig:   &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12},
	}}
	_, err = get(ctx, client, c.url+"/readyz", c.creds.adminTok)
	return err
}

// get returns the body of a 200 answer, and an error for anything else.
func get(ctx context.Context, client *http.Client, url, token string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return "", fmt.Errorf("GET %s: %w", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s: %s: %s", url, resp.Status, LastLines(body, 5))
	}
	return string(body), nil
}

// freePorts returns n distinct ports on 127.0.0.1 that were free a moment
// ago (the listeners are held until all n are chosen). They are drawn
// below the kernel's ephemeral range: a port the kernel handed out for
// ":0" can be taken, between the check and the server's bind, as the local
// port of any outgoing connection on the machine (a fleet of caa makes
// many), while a port below the range is only ever taken by a bind.
func freePorts(n int) ([]int, error) {
	low := ephemeralLow()
	var ports []int
	for range n {
		var l net.Listener
		var err error
		for try := 0; try < 64 && l == nil; try++ {
			addr := "127.0.0.1:0"
			if low >= 2048 {
				addr = "127.0.0.1:" + strconv.Itoa(low/2+rand.IntN(low/2))
			}
			l, err = net.Listen("tcp", addr)
		}
		if l == nil {
			return nil, fmt.Errorf("find a free port: %w", err)
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// ephemeralLow is the first port of the kernel's ephemeral range, 0 when
// it cannot be read.
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	low, _ := strconv.Atoi(f[0])
	return low
}

// RestartAPIServer stops the apiserver and starts it again on the same port
// with the same etcd, certificates and credentials, returning once it is
// ready again. Clients made before keep working.
func (c *Cluster) RestartAPIServer(ctx context.Context) error {
	c.mu.Lock()
	api, stopped := c.apiserver, c.stopped
	c.mu.Unlock()
	if stopped {
		return errors.New("restart kube-apiserver: cluster stopped")
	}
	if api != nil {
		if api.stop(stopGrace) {
			c.logf("e2e: kube-apiserver ignored SIGTERM for %s and was killed", stopGrace)
		}
	}
	if err := c.startAPIServer(ctx); err != nil {
		return fmt.Errorf("restart kube-apiserver: %w", err)
	}
	return nil
}

// Stop ends the apiserver, then etcd (SIGTERM, SIGKILL after a bound), and
// removes the directory if Launch made it. It is safe to call twice.
func (c *Cluster) Stop() error {
	c.mu.Lock()
	already := c.stopped
	c.stopped = true
	c.mu.Unlock()
	if already {
		return nil
	}
	c.stopProcesses()
	if c.ownDir {
		if err := os.RemoveAll(c.dir); err != nil {
			return fmt.Errorf("remove e2e cluster dir: %w", err)
		}
	}
	return nil
}

func (c *Cluster) stopProcesses() {
	c.mu.Lock()
	// The apiserver's clients first, then the apiserver, which needs etcd
	// to shut down cleanly.
	procs := append(slices.Clone(c.extras), c.apiserver, c.etcd)
	c.mu.Unlock()
	for _, p := range procs {
		if p != nil && p.stop(stopGrace) {
			c.logf("e2e: %s ignored SIGTERM for %s and was killed", p.name, stopGrace)
		}
	}
}

// LogTails returns the last n lines of each server's log, for a failure
// report.
func (c *Cluster) LogTails(n int) string {
	var b strings.Builder
	names := []string{"etcd", "kube-apiserver"}
	c.mu.Lock()
	for _, p := range c.extras {
		names = append(names, p.name)
	}
	c.mu.Unlock()
	for _, name := range names {
		path := filepath.Join(c.dir, name+".log")
		fmt.Fprintf(&b, "--- %s (%s)\n%s\n", name, path, fileTail(path, 0, n))
	}
	return b.String()
}

// Client returns an admin clientset for the cluster.
func (c *Cluster) Client() kubernetes.Interface { return c.client }

// RestConfig returns a copy of the admin client configuration.
func (c *Cluster) RestConfig() *rest.Config { return rest.CopyConfig(c.rest) }

// Kubeconfig returns the path of an admin kubeconfig file, with the CA and
// token inline, for clients in other processes.
func (c *Cluster) Kubeconfig() string { return c.kubeconf }

// URL returns the apiserver's base URL, https://127.0.0.1:<port>.
func (c *Cluster) URL() string { return c.url }
