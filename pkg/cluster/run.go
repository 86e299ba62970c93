package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"

	"github.com/caa-project/caa/internal/cli"
	"github.com/caa-project/caa/internal/clouds"
	"github.com/caa-project/caa/pkg/health"
	"github.com/caa-project/caa/pkg/provider"
)

// Options are `caa cluster`'s settings (AddFlags); like `caa run`, every
// flag has an environment fallback.
type Options struct {
	// KlogTo, when set, is given the command's logger before its first
	// apiserver call. The binary sets it to cli.RouteKlog; tests that run
	// the command in-process leave it nil, since klog's logger is the
	// process's and is not safe to swap while client-go uses it.
	KlogTo       func(*slog.Logger)
	version      string
	providerName string
	clusterID    string
	kubeconfig   string
	healthAddr   string
	logFormat    string
	logLevel     string
	interval     time.Duration
	grace        time.Duration
	namespace    string
	leaseName    string
	identity     string
	leaseFor     time.Duration
	renew        time.Duration
	retry        time.Duration
	kubeQPS      float64
	clouds       []*clouds.Cloud
	// adaptorDirs are --adaptor-config-dir's directories (adaptorcfg.go);
	// flags is the flag set AddFlags registered on, which they set.
	adaptorDirs []string
	flags       *pflag.FlagSet
}

// NewOptions returns the cluster scope's settings, with the clouds built
// into this binary; version is the build's, for its log and user agent.
func NewOptions(version string) *Options {
	return &Options{clouds: clouds.Compiled(), version: version}
}

// AddFlags registers the cluster scope's flags on fs.
func (f *Options) AddFlags(fs *pflag.FlagSet) {
	f.flags = fs
	hostname, _ := os.Hostname()
	fs.StringVar(&f.providerName, "provider", os.Getenv("CAA_PROVIDER"), "cloud provider: "+clouds.Names(f.clouds)+" (env CAA_PROVIDER)")
	fs.StringVar(&f.clusterID, "cluster-id", os.Getenv("CAA_CLUSTER_ID"), "cluster id in VM tags (env CAA_CLUSTER_ID; default: the kube-system namespace UID)")
	fs.StringVar(&f.kubeconfig, "kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig file (env KUBECONFIG; default: in-cluster config)")
	fs.StringVar(&f.healthAddr, "health-addr", cli.EnvOr("CAA_HEALTH_ADDR", ":8000"), "address of /healthz, /readyz, /metrics (env CAA_HEALTH_ADDR)")
	fs.StringVar(&f.logFormat, "log-format", cli.EnvOr("CAA_LOG_FORMAT", "text"), "log format: text or json (env CAA_LOG_FORMAT)")
	fs.StringVar(&f.logLevel, "log-level", cli.EnvOr("CAA_LOG_LEVEL", "info"), "log level: debug, info, warn or error (env CAA_LOG_LEVEL)")
	fs.DurationVar(&f.interval, "interval", cli.EnvDuration("CAA_CLUSTER_INTERVAL", 10*time.Minute),
		"period of the leader's cluster-wide listing; nodes trust its view for two periods (env CAA_CLUSTER_INTERVAL)")
	fs.DurationVar(&f.grace, "node-gone-grace", cli.EnvDuration("CAA_NODE_GONE_GRACE", 10*time.Minute),
		"how long a node must be absent, seen in two listings that far apart, before its VMs are deleted (env CAA_NODE_GONE_GRACE)")
	fs.StringVar(&f.namespace, "lease-namespace", cli.EnvOr("POD_NAMESPACE", "caa-system"), "namespace of the Lease (env POD_NAMESPACE)")
	fs.StringVar(&f.leaseName, "lease-name", cli.EnvOr("CAA_LEASE_NAME", "caa-cluster"), "name of the Lease (env CAA_LEASE_NAME)")
	fs.StringVar(&f.identity, "identity", cli.EnvOr("POD_NAME", hostname), "this replica's name in the Lease (env POD_NAME)")
	fs.DurationVar(&f.leaseFor, "lease-duration", cli.EnvDuration("CAA_LEASE_DURATION", 15*time.Second), "how long a Lease not renewed stays held (env CAA_LEASE_DURATION)")
	fs.DurationVar(&f.renew, "lease-renew-deadline", cli.EnvDuration("CAA_LEASE_RENEW_DEADLINE", 10*time.Second), "how long the leader tries to renew before it stops leading (env CAA_LEASE_RENEW_DEADLINE)")
	fs.DurationVar(&f.retry, "lease-retry", cli.EnvDuration("CAA_LEASE_RETRY", 2*time.Second), "period of the Lease's renewals and tries (env CAA_LEASE_RETRY)")
	fs.Float64Var(&f.kubeQPS, "kube-qps", cli.EnvFloat("CAA_KUBE_QPS", 20), "apiserver requests per second, for the per-Node views (env CAA_KUBE_QPS)")
	for _, c := range f.clouds {
		c.AddFlags(fs)
	}
	f.addAdaptorConfigFlag(fs)
}

// check validates what needs no cloud or
func (f *Options) check() error {
	var errs []error
	if _, err := clouds.Find(f.clouds, f.providerName); err != nil {
		errs = append(errs, err)
	}
	if f.interval <= 0 || f.grace <= 0 {
		errs = append(errs, errors.New("--interval and --node-gone-grace must be positive"))
	}
	if f.grace < f.interval {
		errs = append(errs, fmt.Errorf("--node-gone-grace %s is shorter than --interval %s: two listings cannot be that close; raise the grace", f.grace, f.interval))
	}
	if f.leaseFor <= f.renew || f.renew <= f.retry || f.retry <= 0 {
		errs = append(errs, errors.New("want --lease-duration > --lease-renew-deadline > --lease-retry > 0"))
	}
	if f.identity == "" || f.namespace == "" || f.leaseName == "" {
		errs = append(errs, errors.New("--identity, --lease-namespace and --lease-name must be set (POD_NAME and POD_NAMESPACE from the downward API)"))
	}
	if f.kubeQPS <= 0 {
		errs = append(errs, errors.New("--kube-qps must be positive"))
	}
	if _, err := cli.NewLogger(io.Discard, f.logFormat, f.logLevel); err != nil {
		errs = append(errs, err)
	}
	return cli.JoinLine(errs)
}

// Run is `caa cluster`: it runs until ctx is done. It returns a
// cli.UsageError for settings that cannot work and a cli.LoggedError for a
// failure it logged.
func Run(ctx context.Context, f *Options, stderr io.Writer) error {
	applied, err := f.applyAdaptorConfig()
	if err != nil {
		return err
	}
	if err := f.check(); err != nil {
		return cli.UsageError{Err: err}
	}
	log, _ := cli.NewLogger(stderr, f.logFormat, f.logLevel)
	log = log.With("scope", "cluster", "identity", f.identity)
	for _, a := range applied {
		log.Info("adaptor setting", "key", a.Key, "setting", a.String())
	}
	if f.KlogTo != nil {
		f.KlogTo(log)
	}
	if err := clusterScope(ctx, f, log); err != nil {
		log.Error("caa cluster cannot run", "err", err)
		return cli.LoggedError{Err: err}
	}
	return nil
}

// clusterScope runs until ctx is done. Both replicas keep the Node cache
// and serve health; only the Lease holder calls the cloud.
func clusterScope(ctx context.Context, f *Options, log *slog.Logger) error {
	// A higher request rate than a node's: the leader writes one view
	// per Node per interval.
	client, err := cli.KubeClient(f.kubeconfig, "caa-cluster/"+f.version, f.kubeQPS)
	if err != nil {
		return err
	}
	c, err := clouds.Find(f.clouds, f.providerName)
	if err != nil {
		return err
	}
	p, _, err := c.Open(ctx, log)
	if err != nil {
		return err
	}
	lister, ok := p.(provider.ClusterLister)
	if !ok {
		return fmt.Errorf("--provider %s cannot list a cluster's VMs yet: run no cluster caa on it (nodes audit alone)", f.providerName)
	}
	id := f.clusterID
	if id == "" {
		if id, err = ID(ctx, client); err != nil {
			return err
		}
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics := NewMetrics(reg)
	nodes, err := NewNodes(client, nil)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !nodes.Synced() {
			http.Error(w, "the Node cache has not synced", http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "ok\n")
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	serveErr := make(chan error, 1)
	go func() { serveErr <- health.Serve(ctx, f.healthAddr, mux, log) }()
	go nodes.Run(ctx)

	broadcaster := record.NewBroadcaster()
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events(f.namespace)})
	defer broadcaster.Shutdown()
	recorder := broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "caa-cluster", Host: f.identity})
	leaseRef := &corev1.ObjectReference{Kind: "Lease", APIVersion: "coordination.k8s.io/v1", Namespace: f.namespace, Name: f.leaseName}

	election := &Election{
		Client: client, Namespace: f.namespace, Name: f.leaseName, Identity: f.identity,
		Lease: f.leaseFor, Renew: f.renew, Retry: f.retry, Log: log, Metrics: metrics,
	}
	departed := &Departed{Cluster: id, Grace: f.grace}
	log.Info("caa cluster starting", "version", f.version, "provider", p.Name(), "cluster", id,
		"interval", f.interval, "nodeGoneGrace", f.grace, "lease", f.namespace+"/"+f.leaseName)
	err = election.Run(ctx, func(lctx context.Context) {
		s := &Sweeper{
			Cloud: clusterCloud{lister, p}, Client: client, Cluster: id, Nodes: nodes,
			// Each lead starts with what it saw itself: a new leader waits a
			// whole grace before its first delete.
			Departed: &Departed{Cluster: departed.Cluster, Grace: departed.Grace},
			// The nodes this cluster has had, kept beside the Lease: only
			// their VMs are ever collected.
			Known:    &KnownNodes{Client: client, Namespace: f.namespace, Name: f.leaseName + "-nodes"},
			Interval: f.interval, Fence: election.Fence, Log: log, Metrics: metrics,
			Event: func(warning bool, reason, msg string) {
				typ := corev1.EventTypeNormal
				if warning {
					typ = corev1.EventTypeWarning
				}
				recorder.Event(leaseRef, typ, reason, msg)
			},
		}
		s.Run(lctx)
	})
	if err != nil {
		return err
	}
	if err := <-serveErr; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	log.Info("caa cluster stopped")
	return nil
}

// clusterCloud joins a provider's listing and delete.
type clusterCloud struct {
	provider.ClusterLister
	p provider.Provider
}

func (c clusterCloud) Delete(ctx context.Context, id string) error { return c.p.Delete(ctx, id) }

// ID is the default cluster identity: the kube-system namespace's UID,
// stable for the life of the cluster (what --cluster-id overrides).
func ID(ctx context.Context, client kubernetes.Interface) (string, error) {
	ns, err := client.CoreV1().Namespaces().Get(ctx, metav1.NamespaceSystem, metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("read the kube-system namespace for the cluster id (or set --cluster-id): %w", err)
	}
	return string(ns.UID), nil
}
