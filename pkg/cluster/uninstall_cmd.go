package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/pflag"

	"github.com/caa-project/caa/internal/cli"
	"github.com/caa-project/caa/internal/clouds"
	"github.com/caa-project/caa/pkg/provider"
)

// UninstallOptions are `caa uninstall`'s settings: the cloud's and the
// cluster's, as `caa cluster` reads them (flags, CAA_* variables, or the
// adaptor's ConfigMap), and the uninstall's own.
type UninstallOptions struct {
	base           Options
	namespace      string
	runtimeClasses []string
	dryRun         bool
	departedNodes  bool
	wait           time.Duration
}

// NewUninstallOptions returns the uninstall's settings, with the clouds
// built into this binary.
func NewUninstallOptions(version string) *UninstallOptions {
	return &UninstallOptions{base: Options{clouds: clouds.Compiled(), version: version}}
}

// AddFlags registers the uninstall's flags on fs.
func (u *UninstallOptions) AddFlags(fs *pflag.FlagSet) {
	f := &u.base
	f.flags = fs
	fs.StringVar(&f.providerName, "provider", os.Getenv("CAA_PROVIDER"), "cloud provider: "+clouds.Names(f.clouds)+" (env CAA_PROVIDER)")
	fs.StringVar(&f.clusterID, "cluster-id", os.Getenv("CAA_CLUSTER_ID"), "cluster id in VM tags (env CAA_CLUSTER_ID; default: the kube-system namespace UID)")
	fs.StringVar(&f.kubeconfig, "kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig file (env KUBECONFIG; default: in-cluster config)")
	fs.StringVar(&f.logFormat, "log-format", cli.EnvOr("CAA_LOG_FORMAT", "text"), "log format of the cloud's messages: text or json (env CAA_LOG_FORMAT)")
	fs.StringVar(&f.logLevel, "log-level", cli.EnvOr("CAA_LOG_LEVEL", "warn"), "log level: debug, info, warn or error (env CAA_LOG_LEVEL)")
	fs.StringVar(&u.namespace, "namespace", cli.EnvOr("CAA_NAMESPACE", "caa-system"),
		"caa's namespace: no caa or caa-cluster pod may run there (env CAA_NAMESPACE)")
	fs.StringSliceVar(&u.runtimeClasses, "runtime-class", provider.SplitList(cli.EnvOr("CAA_RUNTIME_CLASSES", "kata-remote")),
		"runtime class of peer pods, repeatable: no such pod may exist (env CAA_RUNTIME_CLASSES, comma-separated)")
	fs.BoolVar(&u.dryRun, "dry-run", false, "print what would be deleted and cleaned, change nothing")
	fs.BoolVar(&u.departedNodes, "departed-nodes", false,
		"also delete the VMs tagged for Nodes this cluster no longer has (without it they are kept and listed: check --cluster-id first)")
	fs.DurationVar(&u.wait, "wait", cli.EnvDuration("CAA_UNINSTALL_WAIT", 10*time.Minute),
		"how long to wait for the cloud to show the deleted VMs terminated (env CAA_UNINSTALL_WAIT)")
	for _, c := range f.clouds {
		c.AddFlags(fs)
	}
	f.addAdaptorConfigFlag(fs)
}

func (u *UninstallOptions) check() error {
	var errs []error
	if _, err := clouds.Find(u.base.clouds, u.base.providerName); err != nil {
		errs = append(errs, err)
	}
	if u.namespace == "" {
		errs = append(errs, errors.New("--namespace is empty: pass caa's namespace (caa-system by default)"))
	}
	if len(u.runtimeClasses) == 0 {
		errs = append(errs, errors.New("--runtime-class is empty: pass the peer pods' runtime class (kata-remote by default)"))
	}
	if u.wait <= 0 {
		errs = append(errs, errors.New("--wait must be positive"))
	}
	if _, err := cli.NewLogger(io.Discard, u.base.logFormat, u.base.logLevel); err != nil {
		errs = append(errs, err)
	}
	return cli.JoinLine(errs)
}

// RunUninstall is `caa uninstall`: what it did goes to stdout, the cloud's
// log to stderr.
func RunUninstall(ctx context.Context, u *UninstallOptions, stdout, stderr io.Writer) error {
	if _, err := u.base.applyAdaptorConfig(); err != nil {
		return err
	}
	if err := u.check(); err != nil {
		return cli.UsageError{Err: err}
	}
	log, _ := cli.NewLogger(stderr, u.base.logFormat, u.base.logLevel)
	client, err := cli.KubeClient(u.base.kubeconfig, "caa-uninstall/"+u.base.version, 20)
	if err != nil {
		return err
	}
	c, err := clouds.Find(u.base.clouds, u.base.providerName)
	if err != nil {
		return err
	}
	p, _, err := c.Open(ctx, log)
	if err != nil {
		return fmt.Errorf("open the cloud %s: %w", u.base.providerName, err)
	}
	lister, ok := p.(provider.ClusterLister)
	if !ok {
		return fmt.Errorf("--provider %s cannot list a cluster's VMs: delete them in the cloud's console by their caa-cluster tag", u.base.providerName)
	}
	id := u.base.clusterID
	if id == "" {
		if id, err = ID(ctx, client); err != nil {
			return err
		}
	}
	un := &Uninstall{Client: client, Cloud: clusterCloud{lister, p}, Cluster: id, Namespace: u.namespace,
		RuntimeClasses: u.runtimeClasses, DryRun: u.dryRun, DepartedNodes: u.departedNodes, Wait: u.wait, Out: stdout}
	rep, err := un.Run(ctx)
	if err != nil {
		return err
	}
	verb := "deleted"
	if u.dryRun {
		verb = "would delete"
	}
	fmt.Fprintf(stdout, "cluster %s: %s %d VMs, kept %d, cleaned %d Nodes\n", id, verb, len(rep.VMsDeleted), len(rep.VMsKept)+len(rep.VMsOfUnknownNodes), len(rep.NodesCleaned))
	var errs []error
	if len(rep.VMsKept) > 0 {
		errs = append(errs, fmt.Errorf("%d VMs kept: their pods still exist (listed above); delete those pods and run this again", len(rep.VMsKept)))
	}
	if len(rep.VMsOfUnknownNodes) > 0 {
		errs = append(errs, fmt.Errorf("%d VMs kept: tagged for cluster %s but for Nodes this cluster does not have (listed above); "+
			"if %s is this cluster's id (caa's --cluster-id, else the kube-system namespace's UID) and those nodes left it, run this again with --departed-nodes",
			len(rep.VMsOfUnknownNodes), id, id))
	}
	return cli.JoinLine(errs)
}
