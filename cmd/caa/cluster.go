package main

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
	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"

	"github.com/caa-project/caa/pkg/cluster"
	"github.com/caa-project/caa/pkg/health"
	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/pkg/reconcile"
)

// clusterFlags is `caa cluster`'s command line; like `caa run`, every flag
// has an environment fallback.
type clusterFlags struct {
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
	clouds       []*cloud
}

func newClusterCommand() *cobra.Command {
	f := &clusterFlags{clouds: compiledClouds()}
	cmd := &cobra.Command{
		Use:   "cluster",
		Short: "Run the cluster scope: collect the VMs of departed nodes, publish one audit for every node",
		Long: "Run the cluster-scope caa (a Deployment of two replicas). The replica holding the Lease lists\n" +
			"every VM tagged for this cluster once per --interval, deletes the VMs of nodes gone from the\n" +
			"cluster (absent in two listings --node-gone-grace apart, and confirmed absent by the apiserver),\n" +
			"and writes on each Node what the cloud showed for it, which that node's caa audits against.",
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runCluster(cmd.Context(), f, cmd.ErrOrStderr()) },
	}
	fs := cmd.Flags()
	hostname, _ := os.Hostname()
	fs.StringVar(&f.providerName, "provider", os.Getenv("CAA_PROVIDER"), "cloud provider: "+cloudNames(f.clouds)+" (env CAA_PROVIDER)")
	fs.StringVar(&f.clusterID, "cluster-id", os.Getenv("CAA_CLUSTER_ID"), "cluster id in VM tags (env CAA_CLUSTER_ID; default: the kube-system namespace UID)")
	fs.StringVar(&f.kubeconfig, "kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig file (env KUBECONFIG; default: in-cluster config)")
	fs.StringVar(&f.healthAddr, "health-addr", envOr("CAA_HEALTH_ADDR", ":8000"), "address of /healthz, /readyz, /metrics (env CAA_HEALTH_ADDR)")
	fs.StringVar(&f.logFormat, "log-format", envOr("CAA_LOG_FORMAT", "text"), "log format: text or json (env CAA_LOG_FORMAT)")
	fs.StringVar(&f.logLevel, "log-level", envOr("CAA_LOG_LEVEL", "info"), "log level: debug, info, warn or error (env CAA_LOG_LEVEL)")
	fs.DurationVar(&f.interval, "interval", envDuration("CAA_CLUSTER_INTERVAL", 10*time.Minute),
		"period of the leader's cluster-wide listing; nodes trust its view for two periods (env CAA_CLUSTER_INTERVAL)")
	fs.DurationVar(&f.grace, "node-gone-grace", envDuration("CAA_NODE_GONE_GRACE", 10*time.Minute),
		"how long a node must be absent, seen in two listings that far apart, before its VMs are deleted (env CAA_NODE_GONE_GRACE)")
	fs.StringVar(&f.namespace, "lease-namespace", envOr("POD_NAMESPACE", "caa-system"), "namespace of the Lease (env POD_NAMESPACE)")
	fs.StringVar(&f.leaseName, "lease-name", envOr("CAA_LEASE_NAME", "caa-cluster"), "name of the Lease (env CAA_LEASE_NAME)")
	fs.StringVar(&f.identity, "identity", envOr("POD_NAME", hostname), "this replica's name in the Lease (env POD_NAME)")
	fs.DurationVar(&f.leaseFor, "lease-duration", envDuration("CAA_LEASE_DURATION", 15*time.Second), "how long a Lease not renewed stays held (env CAA_LEASE_DURATION)")
	fs.DurationVar(&f.renew, "lease-renew-deadline", envDuration("CAA_LEASE_RENEW_DEADLINE", 10*time.Second), "how long the leader tries to renew before it stops leading (env CAA_LEASE_RENEW_DEADLINE)")
	fs.DurationVar(&f.retry, "lease-retry", envDuration("CAA_LEASE_RETRY", 2*time.Second), "period of the Lease's renewals and tries (env CAA_LEASE_RETRY)")
	fs.Float64Var(&f.kubeQPS, "kube-qps", envFloat("CAA_KUBE_QPS", 20), "apiserver requests per second, for the per-Node views (env CAA_KUBE_QPS)")
	for _, c := range f.clouds {
		c.addFlags(fs)
	}
	return cmd
}

// check validates what needs no cloud or cluster.
func (f *clusterFlags) check() error {
	var errs []error
	if _, err := findCloud(f.clouds, f.providerName); err != nil {
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
	if _, err := newLogger(io.Discard, f.logFormat, f.logLevel); err != nil {
		errs = append(errs, err)
	}
	return joinLine(errs)
}

func runCluster(ctx context.Context, f *clusterFlags, stderr io.Writer) error {
	if err := f.check(); err != nil {
		return usageError{err}
	}
	log, _ := newLogger(stderr, f.logFormat, f.logLevel)
	log = log.With("scope", "cluster", "identity", f.identity)
	if err := clusterScope(ctx, f, log); err != nil {
		log.Error("caa cluster cannot run", "err", err)
		return loggedError{err}
	}
	return nil
}

// clusterScope runs until ctx is done. Both replicas keep the Node cache
// and serve health; only the Lease holder calls the cloud.
func clusterScope(ctx context.Context, f *clusterFlags, log *slog.Logger) error {
	client, err := clusterKubeClient(f.kubeconfig, f.kubeQPS)
	if err != nil {
		return err
	}
	c, err := findCloud(f.clouds, f.providerName)
	if err != nil {
		return err
	}
	p, _, err := c.open(ctx, log)
	if err != nil {
		return err
	}
	lister, ok := p.(provider.ClusterLister)
	if !ok {
		return fmt.Errorf("--provider %s cannot list a cluster's VMs yet: run no cluster caa on it (nodes audit alone)", f.providerName)
	}
	id := f.clusterID
	if id == "" {
		if id, err = reconcile.ClusterID(ctx, client); err != nil {
			return err
		}
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics := cluster.NewMetrics(reg)
	nodes, err := cluster.NewNodes(client, nil)
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

	election := &cluster.Election{
		Client: client, Namespace: f.namespace, Name: f.leaseName, Identity: f.identity,
		Lease: f.leaseFor, Renew: f.renew, Retry: f.retry, Log: log, Metrics: metrics,
	}
	departed := &cluster.Departed{Cluster: id, Grace: f.grace}
	log.Info("caa cluster starting", "version", version, "provider", p.Name(), "cluster", id,
		"interval", f.interval, "nodeGoneGrace", f.grace, "lease", f.namespace+"/"+f.leaseName)
	err = election.Run(ctx, func(lctx context.Context) {
		s := &cluster.Sweeper{
			Cloud: clusterCloud{lister, p}, Client: client, Cluster: id, Nodes: nodes,
			// Each lead starts with what it saw itself: a new leader waits a
			// whole grace before its first delete.
			Departed: &cluster.Departed{Cluster: departed.Cluster, Grace: departed.Grace},
			// The nodes this cluster has had, kept beside the Lease: only
			// their VMs are ever collected.
			Known:    &cluster.KnownNodes{Client: client, Namespace: f.namespace, Name: f.leaseName + "-nodes"},
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

// clusterKubeClient is kubeClient with a higher request rate: the leader
// writes one view per Node per interval.
func clusterKubeClient(kubeconfig string, qps float64) (kubernetes.Interface, error) {
	cfg, err := restConfig(kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client config (set --kubeconfig outside a cluster): %w", err)
	}
	cfg.UserAgent = "caa-cluster/" + version
	cfg.QPS, cfg.Burst = float32(qps), int(2*qps)
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	cfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	return kubernetes.NewForConfig(cfg)
}
