package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/kubernetes"

	"github.com/caa-project/caa/internal/cli"
	"github.com/caa-project/caa/internal/clouds"
	"github.com/caa-project/caa/pkg/cluster"
	"github.com/caa-project/caa/pkg/handover"
	"github.com/caa-project/caa/pkg/health"
	"github.com/caa-project/caa/pkg/holder"
	"github.com/caa-project/caa/pkg/ledger"
	"github.com/caa-project/caa/pkg/nodecap"
	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/pkg/reconcile"
)

// Options is the daemon's command line; every flag has an environment
// fallback so the DaemonSet can configure it from a ConfigMap.
type Options struct {
	// KlogTo, when set, is given the command's logger before its first
	// apiserver call. The binary sets it to cli.RouteKlog; tests that run
	// the command in-process leave it nil, since klog's logger is the
	// process's and is not safe to swap while client-go uses it.
	KlogTo func(*slog.Logger)

	version        string
	node           string
	providerName   string
	runtimeClasses []string
	ledgerPath     string
	healthAddr     string
	metricsAddr    string
	pprofAddr      string
	resync         time.Duration
	gcGrace        time.Duration
	bootTimeout    time.Duration
	confirmMissing time.Duration
	concurrency    int
	createRate     float64
	createBurst    int
	clusterID      string
	kubeconfig     string
	logFormat      string
	logLevel       string
	shutdownGrace  time.Duration
	userDataFile   string
	instanceTypes  string
	confidential   bool
	allowedTypes   []string
	allowedImages  []string
	retention      time.Duration
	cloudTimeout   time.Duration
	audit          time.Duration
	readRate       float64
	readBurst      int
	handover       bool
	handoverReady  time.Duration
	inertLook      time.Duration // --handover-inert-check
	podName        string
	clusterView    bool

	// The hand-over's own tuning (holder.go, addHandoverFlags).
	handoverCool         time.Duration
	handoverCheckProcess bool
	// handoverUnverified hands the ledger to askers that prove nothing
	// (caa outside a pod: tests, by-hand runs).
	handoverUnverified bool

	// clouds are the providers built into this binary, with their settings.
	clouds []*clouds.Cloud
	// client, when set, is the apiserver client instead of --kubeconfig's
	// (the package's tests run daemons on a fake clientset).
	client kubernetes.Interface
	// adaptorDirs are --adaptor-config-dir's directories (adaptorcfg.go).
	adaptorDirs []string
	// flags is the command's flag set, which the preflight's fingerprint
	// reads the cloud's settings from.
	flags *pflag.FlagSet
	// hv is the remote hypervisor mode (hypervisor.go).
	hv hypervisorFlags
	// av is the VMs the adaptor left (adaptorvms.go).
	av adaptorFlags
	// maxPodVMs is the node's kata.peerpods.io/vm capacity (nodecap);
	// maxPodVMsErr a CAA_MAX_POD_VMS that is not a number.
	maxPodVMs    int
	maxPodVMsErr error
}

// NewOptions returns one command's settings, with the clouds built into
// this binary (each command gets settings of its own); version is the
// build's, for logs, the hand-over and the apiserver's user agent.
func NewOptions(version string) *Options {
	return &Options{clouds: clouds.Compiled(), version: version}
}

// AddDaemonFlags registers the flags only `caa run` has, beside AddFlags':
// the remote hypervisor mode, the adaptor's VMs and settings, the
// hand-over and the node's capacity.
func (f *Options) AddDaemonFlags(fs *pflag.FlagSet) {
	f.hv.add(fs)
	f.av.add(fs)
	fs.BoolVar(&f.handover, "handover", cli.EnvOr("CAA_HANDOVER", "true") == "true",
		"ask a caa already running on this ledger to hand it over (a surge update); false: wait for its file lock instead (env CAA_HANDOVER)")
	f.addHandoverFlags(fs)
	maxVMs := nodecap.DefaultMax
	if v := os.Getenv("CAA_MAX_POD_VMS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			f.maxPodVMsErr = fmt.Errorf("CAA_MAX_POD_VMS=%q is not a whole number: set the node's %s capacity (default %d), or -1 to advertise none",
				v, nodecap.Resource, nodecap.DefaultMax)
		}
		maxVMs = n
	}
	fs.IntVar(&f.maxPodVMs, "max-pod-vms", maxVMs, "peer-pod VMs this node takes, advertised as the Node's "+string(nodecap.Resource)+
		" capacity (what upstream's peer-pods webhook asks each peer pod for); -1: advertise none (env CAA_MAX_POD_VMS)")
	hostname, _ := os.Hostname()
	fs.StringVar(&f.podName, "pod-name", cli.EnvOr("POD_NAME", hostname), "this pod's name, for hand-over logs and events (env POD_NAME, from the downward API)")
	f.addAdaptorConfigFlag(fs)
}

// AddFlags registers the daemon's flags on fs: its cloud, cluster, ledger
// and budgets (also `caa ledger rebuild`'s, which needs the same cloud and
// cluster).
func (f *Options) AddFlags(fs *pflag.FlagSet) {
	f.flags = fs
	fs.StringVar(&f.node, "node-name", os.Getenv("NODE_NAME"), "this node's name (env NODE_NAME, from the downward API)")
	fs.StringVar(&f.providerName, "provider", os.Getenv("CAA_PROVIDER"), "cloud provider: "+clouds.Names(f.clouds)+" (env CAA_PROVIDER)")
	fs.StringSliceVar(&f.runtimeClasses, "runtime-class", provider.SplitList(cli.EnvOr("CAA_RUNTIME_CLASSES", "kata-remote")),
		"runtime class of peer pods, repeatable (env CAA_RUNTIME_CLASSES, comma-separated)")
	fs.StringVar(&f.ledgerPath, "ledger", cli.EnvOr("CAA_LEDGER", ledger.DefaultPath), "ledger file (env CAA_LEDGER)")
	fs.StringVar(&f.healthAddr, "health-addr", cli.EnvOr("CAA_HEALTH_ADDR", ":8000"), "address of /healthz, /readyz, /metrics, /status: host:port, or unix:PATH for exec probes (`caa probe`) that need no port (env CAA_HEALTH_ADDR)")
	fs.StringVar(&f.metricsAddr, "metrics-addr", cli.EnvOr("CAA_METRICS_ADDR", ""), "a second address serving /metrics only (not /status, whose pod names and VM ids "+
		"stay on --health-addr), for scrapes when --health-addr is a unix socket: host:port, 127.0.0.1:PORT to keep it off the network; empty: none; "+
		"while another process holds its port (the old caa of a surge on the host network) it is served once free (env CAA_METRICS_ADDR)")
	fs.StringVar(&f.pprofAddr, "pprof-addr", os.Getenv("CAA_PPROF_ADDR"),
		"address of Go's runtime profiles (/debug/pprof/), a listener of their own; empty (the default): off. Use loopback, "+
			"such as 127.0.0.1:6060: goroutine dumps and the command line are served there (env CAA_PPROF_ADDR)")
	fs.DurationVar(&f.resync, "resync", cli.EnvDuration("CAA_RESYNC", time.Minute),
		"period of the check of the pod cache against the ledger; it makes no cloud call (env CAA_RESYNC)")
	fs.DurationVar(&f.audit, "audit-interval", cli.EnvDuration("CAA_AUDIT_INTERVAL", 10*time.Minute),
		"mean period of the full pass that lists this node's VMs, jittered by ±50%; 0: at startup only (env CAA_AUDIT_INTERVAL)")
	fs.Float64Var(&f.readRate, "read-rate", cli.EnvFloat("CAA_READ_RATE", 5), "cloud reads (listings, gets) per second (env CAA_READ_RATE)")
	fs.IntVar(&f.readBurst, "read-burst", cli.EnvInt("CAA_READ_BURST", 20), "burst of cloud reads (env CAA_READ_BURST)")
	fs.DurationVar(&f.gcGrace, "gc-grace", cli.EnvDuration("CAA_GC_GRACE", 5*time.Minute), "how long an orphan VM is known before it is deleted (env CAA_GC_GRACE)")
	fs.DurationVar(&f.bootTimeout, "boot-timeout", cli.EnvDuration("CAA_BOOT_TIMEOUT", 10*time.Minute),
		"how long a new VM may boot and still hold back readiness; past it, the pod is reported but no longer waited for (env CAA_BOOT_TIMEOUT)")
	fs.DurationVar(&f.confirmMissing, "confirm-missing", cli.EnvDuration("CAA_CONFIRM_MISSING", 30*time.Second),
		"how long a recorded VM must stay not found before it is recreated (env CAA_CONFIRM_MISSING)")
	fs.IntVar(&f.concurrency, "create-concurrency", cli.EnvInt("CAA_CREATE_CONCURRENCY", 8), "pods reconciled at once (env CAA_CREATE_CONCURRENCY)")
	fs.Float64Var(&f.createRate, "create-rate", float64(cli.EnvInt("CAA_CREATE_RATE", 5)), "cloud writes per second (env CAA_CREATE_RATE)")
	fs.IntVar(&f.createBurst, "create-burst", cli.EnvInt("CAA_CREATE_BURST", 10), "burst of cloud writes (env CAA_CREATE_BURST)")
	fs.StringVar(&f.clusterID, "cluster-id", os.Getenv("CAA_CLUSTER_ID"), "cluster id in VM tags (env CAA_CLUSTER_ID; default: the kube-system namespace UID)")
	fs.StringVar(&f.kubeconfig, "kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig file (env KUBECONFIG; default: in-cluster config)")
	fs.StringVar(&f.logFormat, "log-format", cli.EnvOr("CAA_LOG_FORMAT", "text"), "log format: text or json (env CAA_LOG_FORMAT)")
	fs.StringVar(&f.logLevel, "log-level", cli.EnvOr("CAA_LOG_LEVEL", "info"), "log level: debug, info, warn or error (env CAA_LOG_LEVEL)")
	fs.DurationVar(&f.shutdownGrace, "shutdown-grace", cli.EnvDuration("CAA_SHUTDOWN_GRACE", 20*time.Second),
		"on SIGTERM, how long cloud calls in flight may finish (env CAA_SHUTDOWN_GRACE)")
	fs.StringVar(&f.userDataFile, "user-data-file", os.Getenv("CAA_USER_DATA_FILE"), "file whose bytes every VM gets as user data; never logged (env CAA_USER_DATA_FILE)")
	fs.StringVar(&f.instanceTypes, "instance-types", os.Getenv("CAA_INSTANCE_TYPES"),
		"instance types that pods' vCPU, memory and GPU requests (kata's default_vcpus, default_memory, default_gpus and "+
			"default_gpu_model annotations) are fitted to, the smallest that fits: names of types caa knows for the cloud, or "+
			"name:vcpus:memoryMiB[:gpus:model] for others; with --confidential (the default) only types that can run a confidential VM. "+
			"Empty: every pod gets the cloud's default type, and a pod that asks for more gets an event saying so. "+
			"Suggested: aws m6a.large,m6a.xlarge,m6a.2xlarge,m6a.4xlarge; "+
			"azure Standard_DC2as_v5,Standard_DC4as_v5,Standard_DC8as_v5; "+
			"ibmcloud bx3dc-2x10,bx3dc-4x20,bx3dc-8x40 (env CAA_INSTANCE_TYPES)")
	fs.BoolVar(&f.confidential, "confidential", cli.EnvOr("CAA_CONFIDENTIAL", "true") != "false",
		"make every VM a confidential VM (AMD SEV-SNP on EC2 m6a/c6a/r6a; Azure DCas/ECas v5 (SEV-SNP) and DCes/ECes v5 (TDX); "+
			"Intel TDX on IBM Cloud bx3dc/cx3dc/mx3dc; SGX, which is no confidential VM, is refused), "+
			"and never serve a pod from a VM the cloud reports as not confidential. The default type and every listed type must "+
			"be able to; false: ordinary VMs, the explicit opt-out (env CAA_CONFIDENTIAL)")
	fs.StringSliceVar(&f.allowedTypes, "allowed-types", provider.SplitList(os.Getenv("CAA_ALLOWED_TYPES")),
		"instance types a pod may ask for (env CAA_ALLOWED_TYPES; default: the table and the default type)")
	fs.StringSliceVar(&f.allowedImages, "allowed-images", provider.SplitList(os.Getenv("CAA_ALLOWED_IMAGES")),
		"images a pod may ask for with the image annotation; the user data goes to every VM, so only trusted images "+
			"(env CAA_ALLOWED_IMAGES; default: the cloud's configured image only)")
	fs.DurationVar(&f.retention, "history-retention", cli.EnvDuration("CAA_HISTORY_RETENTION", 7*24*time.Hour),
		"how long the ledger keeps the history of deleted pods (env CAA_HISTORY_RETENTION)")
	fs.DurationVar(&f.cloudTimeout, "cloud-timeout", cli.EnvDuration("CAA_CLOUD_TIMEOUT", 5*time.Minute),
		"deadline of each cloud call, a create's whole long-running operation included (env CAA_CLOUD_TIMEOUT)")
	fs.BoolVar(&f.clusterView, "cluster-view", cli.EnvOr("CAA_CLUSTER_VIEW", "false") == "true",
		"audit against the cluster caa's view on this Node while it is fresh, listing the cloud without it and at least every "+
			cluster.DefaultListEvery.String()+" whatever it says; on only where the cluster scope is installed, whose component "+
			"and chart values set it (env CAA_CLUSTER_VIEW)")
	for _, c := range f.clouds {
		c.AddFlags(fs)
	}
}

// check validates the flags that need no cloud or cluster.
func (f *Options) check() error {
	var errs []error
	if f.node == "" {
		errs = append(errs, errors.New("--node-name is empty: set it, or NODE_NAME from the downward API (spec.nodeName)"))
	}
	if _, err := clouds.Find(f.clouds, f.providerName); err != nil {
		errs = append(errs, err)
	}
	if len(f.runtimeClasses) == 0 {
		errs = append(errs, errors.New("--runtime-class: at least one is needed (default kata-remote)"))
	}
	if f.resync <= 0 || f.gcGrace <= 0 || f.confirmMissing <= 0 || f.shutdownGrace <= 0 || f.bootTimeout <= 0 ||
		f.retention <= 0 || f.cloudTimeout <= 0 {
		errs = append(errs, errors.New("--resync, --gc-grace, --confirm-missing, --shutdown-grace, --boot-timeout, "+
			"--history-retention and --cloud-timeout must be positive"))
	}
	if f.concurrency <= 0 || f.createRate <= 0 || f.createBurst <= 0 || f.readRate <= 0 || f.readBurst <= 0 {
		errs = append(errs, errors.New("--create-concurrency, --create-rate, --create-burst, --read-rate and --read-burst must be positive"))
	}
	if _, err := health.CheckProfileAddr(f.pprofAddr); err != nil {
		errs = append(errs, err)
	}
	if f.audit < 0 {
		errs = append(errs, errors.New("--audit-interval must be 0 (startup only) or positive"))
	}
	if _, err := f.types(); err != nil {
		errs = append(errs, err)
	} else if err := f.checkConfidential(); err != nil {
		errs = append(errs, err)
	}
	if err := f.hv.check(); err != nil {
		errs = append(errs, err)
	}
	if err := f.av.check(); err != nil {
		errs = append(errs, err)
	}
	if f.maxPodVMsErr != nil {
		errs = append(errs, f.maxPodVMsErr)
	}
	if _, err := cli.NewLogger(io.Discard, f.logFormat, f.logLevel); err != nil {
		errs = append(errs, err)
	}
	return cli.JoinLine(errs)
}

// types reads --instance-types against the chosen cloud's table of sizes
// (none when the cloud is unknown: its error is reported on its own).
func (f *Options) types() ([]provider.InstanceType, error) {
	return provider.ParseInstanceTypes(f.instanceTypes, f.knownTypes())
}

// knownTypes is the chosen cloud's table of instance type sizes.
func (f *Options) knownTypes() []provider.InstanceType {
	if c, err := clouds.Find(f.clouds, f.providerName); err == nil && c.Types != nil {
		return c.Types()
	}
	return nil
}

// newProvider builds the chosen cloud's provider and the node's defaults
// for spec selection.
func (f *Options) newProvider(ctx context.Context, log *slog.Logger) (provider.Provider, provider.SpecConfig, error) {
	types, err := f.types()
	if err != nil {
		return nil, provider.SpecConfig{}, err
	}
	spec := provider.SpecConfig{Types: types, Known: f.knownTypes(), AllowedTypes: f.allowedTypes, AllowedImages: f.allowedImages,
		Confidential: f.confidential}
	c, err := clouds.Find(f.clouds, f.providerName)
	if err != nil {
		return nil, spec, err
	}
	spec.TEEs = c.TEEs
	if c.UseCluster != nil {
		client, err := f.kubeClient()
		if err != nil {
			return nil, spec, err
		}
		c.UseCluster(client, f.node)
	}
	p, defaults, err := c.Open(ctx, log)
	if err != nil {
		return nil, spec, err
	}
	spec.DefaultType, spec.DefaultImage = defaults.InstanceType, defaults.Image
	spec.UserDataLimit = provider.UserDataLimitOf(p)
	if len(spec.AllowedImages) > 0 && spec.DefaultImage != "" && !slices.Contains(spec.AllowedImages, spec.DefaultImage) {
		// The configured image is the operator's own choice: always allowed.
		spec.AllowedImages = append(spec.AllowedImages, spec.DefaultImage)
	}
	return p, spec, nil
}

// cluster returns the Kubernetes client and the cluster id (--cluster-id,
// else the kube-system namespace's UID).
func (f *Options) cluster(ctx context.Context) (kubernetes.Interface, string, error) {
	client, err := f.kubeClient()
	if err != nil {
		return nil, "", err
	}
	id, err := f.clusterOf(ctx, client)
	return client, id, err
}

// clusterOf is --cluster-id, else the kube-system namespace's UID.
func (f *Options) clusterOf(ctx context.Context, client kubernetes.Interface) (string, error) {
	if f.clusterID != "" {
		return f.clusterID, nil
	}
	return cluster.ID(ctx, client)
}

// kubeClient is the node's apiserver client. Its client-side limit is the
// kubelet's own (kubeAPIQPS 50, kubeAPIBurst 100) rather than client-go's
// 5 and 10: in the remote hypervisor mode each StartVM reads its pod and
// service account and writes an event, so a burst of sandboxes queued
// here for longer than for the cloud budget (bench S10).
func (f *Options) kubeClient() (kubernetes.Interface, error) {
	if f.client != nil {
		return f.client, nil
	}
	return cli.KubeClient(f.kubeconfig, "caa/"+f.version, 50)
}

// Run is `caa run`. It returns nil after a clean SIGTERM shutdown, which
// never deletes a VM (invariant I4); a cli.UsageError for settings that
// cannot work, and a cli.LoggedError for a failure it logged.
func Run(ctx context.Context, f *Options, stderr io.Writer) error {
	if err := f.applyAdaptorConfig(stderr); err != nil {
		return err
	}
	if err := f.check(); err != nil {
		return cli.UsageError{Err: err}
	}
	if err := f.limits().Check(); err != nil {
		return cli.UsageError{Err: err}
	}
	log, _ := cli.NewLogger(stderr, f.logFormat, f.logLevel)
	log = log.With("node", f.node)
	if f.KlogTo != nil {
		f.KlogTo(log)
	}
	if err := daemon(ctx, f, log); err != nil {
		log.Error("caa cannot run", "err", err)
		return cli.LoggedError{Err: err}
	}
	return nil
}

// daemon runs caa until ctx is done. Health is served from the first moment
// (503 with the reason while the apiserver, the ledger or the cloud is not
// there yet), and the apiserver is retried with a capped backoff rather
// than crash-looping; no cloud call is made before the Node guard passed
// and the pod cache synced.
func daemon(ctx context.Context, f *Options, log *slog.Logger) error {
	started := time.Now()
	reg := prometheus.NewRegistry()
	metrics, err := health.NewMetrics(reg)
	if err != nil {
		return err
	}
	status := health.NewStatus(health.Config{Stale: 3 * f.resync, Metrics: metrics, Confidential: f.confidentialMode()})
	status.SetBlocked("starting: connecting to the Kubernetes API")
	// Every wait up to the ledger's acquisition (the apiserver, the
	// preflight's retries, the pod cache) is a wait by design: liveness
	// stays true through it (acquire keeps it alive from there).
	alive := status.KeepAlive(ctx, time.Second)
	defer alive()
	if path := os.Getenv("CAA_CPU_PROFILE_TO_READY"); path != "" {
		defer profileToReady(path, status, log)()
	}

	var userData []byte
	if f.userDataFile != "" {
		data, err := os.ReadFile(f.userDataFile)
		if err != nil {
			return fmt.Errorf("--user-data-file: %w", err)
		}
		userData = data
	}
	client, err := f.kubeClient()
	if err != nil {
		return err
	}

	// Everything below stops on stop; cloud calls in flight get the grace.
	// On an early return the deferred stop runs before the wait for the
	// servers (defers run last first), so a refusal exits instead of hanging.
	var wg sync.WaitGroup
	defer wg.Wait()
	stopCtx, stop := context.WithCancel(ctx)
	defer stop()

	serve := func(name string, fn func() error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := fn(); err != nil && stopCtx.Err() == nil {
				log.Error(name+" stopped", "err", err)
			}
		}()
	}
	mux, metricsOnly := healthHandlers(status, reg)
	srv, err := health.Listen(stopCtx, f.healthAddr, mux, log)
	if err != nil {
		return fmt.Errorf("health endpoint: %w", err)
	}
	serve("health server", func() error { return srv.Serve(stopCtx) })
	if f.metricsAddr != "" {
		serve("metrics server", func() error {
			ms, err := health.ListenWhenFree(stopCtx, f.metricsAddr, metricsOnly, log, 2*time.Second)
			if err != nil {
				return err
			}
			return ms.Serve(stopCtx)
		})
	}
	if f.pprofAddr != "" {
		psrv, err := health.Listen(stopCtx, f.pprofAddr, health.ProfileHandler(), log)
		if err != nil {
			return fmt.Errorf("profile endpoint: %w", err)
		}
		if lo, _ := health.CheckProfileAddr(f.pprofAddr); !lo {
			log.Warn("--pprof-addr is not a loopback address: the runtime profiles are reachable from the network", "addr", psrv.Addr().String())
		}
		serve("profile server", func() error { return psrv.Serve(stopCtx) })
	}
	log.Info("caa starting", "version", f.version, "provider", f.providerName, "ledger", f.ledgerPath, "health", srv.Addr().String(),
		"confidential", f.confidentialMode())

	// The pod cache starts syncing at once: it needs nothing read below.
	pods, err := reconcile.NewPodSource(client, f.node, f.runtimeClasses, 0)
	if err != nil {
		return err
	}
	serve("pod informer", func() error { pods.Run(stopCtx); return nil })

	// The cloud's client is built, and the ledger's recorded meta read,
	// while the apiserver answers the reads below; on a warm restart the
	// startup listing goes out from there too (startEarly).
	var (
		// raw is the cloud's provider itself (its optional interfaces,
		// the preflight's among them, are seen on it); prov counts calls.
		raw, prov provider.Provider
		specCfg   provider.SpecConfig
		provErr   error
		recorded  recordedMeta
		early     *reconcile.Prefetch
	)
	// What the preflight checks, as it stands for this start: the warm
	// restart's guess and the preflight's gate compare it with the ledger's
	// record of the last pass.
	fp := preflightFingerprint(f.providerName, f.flags, os.Environ(), os.ReadFile)
	provDone := make(chan struct{})
	go func() {
		defer close(provDone)
		if raw, specCfg, provErr = f.newProvider(ctx, log); provErr != nil {
			return
		}
		prov = health.InstrumentProvider(raw, metrics)
		log.Debug("start: cloud client built", "since", time.Since(started))
		recorded = readRecordedMeta(stopCtx, f.ledgerPath, recordedPreflightTimeout)
		early = f.startEarly(stopCtx, prov, recorded, fp, "")
		log.Debug("start: ledger meta read", "since", time.Since(started), "earlyListing", early != nil)
	}()

	// The cluster id and the Node's ledger id, read before the ledger file
	// is opened (a refusal must not leave a new, empty file behind).
	var clusterID, nodeLedger string
	err = retryAPI(stopCtx, log, status, func(ctx context.Context) error {
		// Two independent reads, side by side: each is a round trip on
		// the path to ready.
		var nodeErr error
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			nodeLedger, nodeErr = reconcile.NodeLedgerID(ctx, client, f.node)
		}()
		var clusterErr error
		clusterID, clusterErr = f.clusterOf(ctx, client)
		wg.Wait()
		return errors.Join(clusterErr, nodeErr)
	})
	log.Debug("start: cluster and Node read", "since", time.Since(started))
	<-provDone
	if err != nil {
		return shutdownErr(ctx, err)
	}

	// Everything that can fail for this build or its settings (the cloud's
	// credentials and resource ids, the pod cache) is made ready before the
	// ledger is asked for: a broken new version fails here, while the caa
	// beside it still holds the ledger and keeps reconciling. The pod
	// cache syncs from the apiserver while the preflight asks the cloud:
	// each waits on a different server.
	if provErr != nil {
		return fmt.Errorf("provider %s: %w", f.providerName, provErr)
	}
	events := reconcile.NewKubeEvents(client, f.node)
	defer events.Shutdown()
	passed, err := preflightGate(stopCtx, f, log, status, raw, clusterID, nodeLedger, recorded, fp, func(reason string) {
		events.NodeEvent(f.node, true, "CaaPreflightFailed", reason)
	}, serve)
	if err != nil {
		return shutdownErr(ctx, err)
	}
	if early == nil {
		early = f.startEarly(stopCtx, prov, recorded, fp, clusterID)
	}
	status.SetBlocked("starting: reading this node's pods")
	if !pods.WaitSynced(stopCtx) {
		return shutdownErr(ctx, errors.New("the pod cache did not sync"))
	}
	log.Debug("start: pod cache synced", "since", time.Since(started))

	n := &nodeDaemon{
		f: f, log: log, status: status, client: client, events: events, pods: pods,
		prov: prov, specCfg: specCfg, userData: userData, clusterID: clusterID, nodeLedger: nodeLedger,
		me: handover.Peer{Pod: f.podName, Version: f.version, PID: os.Getpid()}, started: started,
		serve: serve, preflight: passed, gate: holder.Gate{Cooldown: f.handoverCool}, early: early,
		adaptor: f.adaptorCollector(raw, prov, client, log), metrics: metrics,
	}
	alive()
	err = n.run(ctx, stopCtx)
	log.Info("caa stopped")
	return err
}

// startEarly starts the startup pass's one listing ahead of the pass, while
// the pod cache syncs and the ledger opens, when no caa holds the ledger:
// it serves the first pass only if this start then opens the ledger from a
// free lock (reconcile.Prefetch says why that is safe). A hand-over's
// ledger is listed after the release instead, and hypervisor mode lists
// nothing at the start. With cluster "" it is a warm restart's guess, made
// before the apiserver has named the cluster: the cluster and node the
// ledger recorded, when the cloud settings are those of its last passed
// preflight; a guess the apiserver then contradicts is for another
// selector, and the pass lists as usual. fp is this start's preflight
// fingerprint. nil: no listing started.
func (f *Options) startEarly(ctx context.Context, p provider.Provider, recorded recordedMeta, fp, cluster string) *reconcile.Prefetch {
	if f.hv.socket != "" {
		return nil
	}
	if cluster == "" {
		if !recorded.ok || recorded.m.Node != f.node || recorded.m.Cluster == "" ||
			recorded.m.Preflight != fp {
			return nil
		}
		cluster = recorded.m.Cluster
	}
	if !ledger.Free(f.ledgerPath) {
		return nil
	}
	return reconcile.StartPrefetch(ctx, p, provider.Selector{Cluster: cluster, Node: f.node}, f.cloudTimeout)
}

// shutdownErr is nil when err only says that the daemon was told to stop.
func shutdownErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// retryAPI runs fn until it succeeds or ctx is done, backing off from 1s
// to 30s, keeping /readyz at 503 with the reason and /healthz alive: the
// apiserver being away is not a reason to crash-loop (which would delay
// recovery by the kubelet's own back-off once it returns).
func retryAPI(ctx context.Context, log *slog.Logger, status *health.Status, fn func(context.Context) error) error {
	defer status.KeepAlive(ctx, time.Second)()
	backoff := time.Second
	for attempt := 1; ; attempt++ {
		status.Beat(time.Now())
		callCtx, cancel := context.WithTimeout(ctx, 15*time.Second)
		err := fn(callCtx)
		cancel()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		reason := "waiting for the Kubernetes API: " + err.Error()
		status.SetBlocked(reason)
		level := slog.LevelWarn
		if apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err) {
			level = slog.LevelError
		}
		log.Log(ctx, level, "Kubernetes API not usable yet; retrying", "attempt", attempt, "retryIn", backoff, "err", err)
		if err := sleepCtx(ctx, backoff); err != nil {
			return err
		}
		backoff = min(2*backoff, 30*time.Second)
	}
}

// pruneHistory drops the history of pods deleted longer than retention
// ago, at start and then every hour, so a churning node's ledger stays
// bounded.
func pruneHistory(ctx context.Context, led *ledger.Ledger, retention time.Duration, log *slog.Logger) {
	tick := time.NewTicker(time.Hour)
	defer tick.Stop()
	for {
		n, err := led.PruneDeleted(ctx, time.Now().Add(-retention), 0)
		switch {
		case err != nil && ctx.Err() == nil:
			log.Warn("history pruning failed", "err", err)
		case n.Pods > 0:
			log.Info("history of deleted pods pruned", "pods", n.Pods, "entries", n.Entries, "retention", retention)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// toHealthPass adapts a pass result for the health status.
func toHealthPass(res reconcile.PassResult, confidential bool) health.Pass {
	p := health.Pass{
		At: res.At, Duration: res.Duration, Err: res.Err, CloudWrites: res.CloudWrites,
		OrphansDeleted: res.OrphansDeleted, Records: res.Records, Actions: map[string]int{},
	}
	for k, n := range res.Actions {
		p.Actions[string(k)] = n
	}
	for _, ps := range res.Pending {
		p.Pending = append(p.Pending, health.PodNote(ps))
	}
	for _, ps := range res.Failed {
		p.Failed = append(p.Failed, health.PodNote(ps))
	}
	for _, ps := range res.NotWatched {
		p.NotWatched = append(p.NotWatched, health.PodNote(ps))
	}
	for _, o := range res.Orphans {
		p.Orphans = append(p.Orphans, health.Orphan{ID: o.ID, Pod: o.Pod, FirstSeen: o.FirstSeen})
	}
	for _, ps := range res.Degraded {
		p.Degraded = append(p.Degraded, health.PodNote(ps))
	}
	if res.VMs != nil {
		p.VMs = []health.VMNote{}
		for _, vm := range res.VMs {
			p.VMs = append(p.VMs, health.VMNote{Pod: vm.Pod, ID: vm.ID, Confidential: provider.Mode(confidential, vm.TEE)})
		}
	}
	if errors.Is(res.Err, reconcile.ErrStopping) {
		p.Blocked = "stopping: no new work"
	}
	if errors.Is(res.Err, reconcile.ErrDaemon) {
		p.Blocked = res.Err.Error()
	}
	return p
}

// healthHandlers are the handlers of --health-addr (all: /healthz, /readyz,
// /metrics, /status) and of --metrics-addr (/metrics only). In the remote
// hypervisor mode caa runs on the host network and --metrics-addr is a port
// of the node, which anyone who reaches the node can read: /status names
// pods and VMs, and /readyz says which hold readiness, so they are served
// only on --health-addr (there, a unix socket in the pod's own emptyDir,
// read by `caa probe` and `caa status` through kubectl exec).
func healthHandlers(status *health.Status, reg *prometheus.Registry) (all, metricsOnly http.Handler) {
	mux := http.NewServeMux()
	mux.Handle("/", health.Handler(status, reg))
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(status.Snapshot())
	})
	return mux, health.MetricsHandler(reg)
}
