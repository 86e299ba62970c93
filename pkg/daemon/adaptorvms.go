package daemon

import (
	"context"
	"log/slog"

	"github.com/spf13/pflag"
	"golang.org/x/time/rate"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"

	"github.com/caa-project/caa/internal/cli"
	"github.com/caa-project/caa/pkg/adaptorvm"
	"github.com/caa-project/caa/pkg/health"
	"github.com/caa-project/caa/pkg/provider"
)

// adaptorFlags are `caa run`'s settings for the VMs upstream's
// cloud-api-adaptor left on this node (pkg/adaptorvm).
type adaptorFlags struct {
	mode, podsDir, kataDir string
}

func (a *adaptorFlags) add(fs *pflag.FlagSet) {
	fs.StringVar(&a.mode, "adaptor-vms", cli.EnvOr("CAA_ADAPTOR_VMS", adaptorvm.ModeReport),
		"the VMs upstream's cloud-api-adaptor left (named podvm-<pod>-<sandbox>): "+adaptorvm.ModeReport+" says in /status and the log "+
			"what caa would do with each and why, and deletes nothing; "+adaptorvm.ModeCollect+" also deletes those tied to this node "+
			"whose pod the apiserver shows gone, seen so twice --gc-grace apart; "+adaptorvm.ModeOff+" does not look (env CAA_ADAPTOR_VMS)")
	fs.StringVar(&a.podsDir, "adaptor-pods-dir", cli.EnvOr("CAA_ADAPTOR_PODS_DIR", adaptorvm.DefaultPodsDir),
		"the adaptor's pods directory on this node, whose sandbox records tie its VMs to this node (env CAA_ADAPTOR_PODS_DIR)")
	fs.StringVar(&a.kataDir, "adaptor-kata-dir", cli.EnvOr("CAA_ADAPTOR_KATA_DIR", adaptorvm.DefaultKataDir),
		"kata's sandbox directory on this node: a sandbox there keeps its adaptor VM (env CAA_ADAPTOR_KATA_DIR)")
}

// check validates --adaptor-vms; unset (a command without these flags)
// is off.
func (a *adaptorFlags) check() error {
	if a.mode == "" {
		return nil
	}
	_, err := adaptorvm.ParseMode(a.mode)
	return err
}

// adaptorCloud is what the collector needs of the cloud: the raw
// provider's listing, and deletes through the metered provider.
type adaptorCloud struct {
	provider.AdaptorLister
	prov provider.Provider
}

func (c adaptorCloud) Delete(ctx context.Context, id string) error { return c.prov.Delete(ctx, id) }

// adaptorCollector builds the collector for this start; nil when it is
// off, or when the provider cannot list the adaptor's VMs (said once).
func (f *Options) adaptorCollector(raw, prov provider.Provider, client kubernetes.Interface, log *slog.Logger) *adaptorvm.Collector {
	if f.av.mode == "" || f.av.mode == adaptorvm.ModeOff {
		return nil
	}
	lister, ok := raw.(provider.AdaptorLister)
	if !ok {
		log.Info("adaptor VMs: this provider cannot list the adaptor's VMs; not looking", "provider", raw.Name())
		return nil
	}
	return &adaptorvm.Collector{
		Mode: f.av.mode, Cloud: adaptorCloud{AdaptorLister: lister, prov: prov},
		Pod: podReader(client), PodsDir: f.av.podsDir, KataDir: f.av.kataDir, Grace: f.gcGrace,
		Log: log.With("component", "adaptor-vms"),
	}
}

// podReader reads one pod from the apiserver itself: a list of the
// namespace by name (caa may list pods, not get them), with no resource
// version, so etcd answers and no cache.
func podReader(client kubernetes.Interface) func(ctx context.Context, namespace, name string) adaptorvm.Pod {
	return func(ctx context.Context, namespace, name string) adaptorvm.Pod {
		list, err := client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{
			FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String(),
		})
		switch {
		case apierrors.IsNotFound(err):
			// The namespace itself is gone, and its pods with it.
			return adaptorvm.Pod{Kind: adaptorvm.PodGone}
		case err != nil:
			return adaptorvm.Pod{Kind: adaptorvm.PodError, Err: err.Error()}
		}
		for _, p := range list.Items {
			if p.Name == name && p.Namespace == namespace {
				return adaptorvm.Pod{Kind: adaptorvm.PodExists, Created: p.CreationTimestamp.Time, Phase: string(p.Status.Phase)}
			}
		}
		return adaptorvm.Pod{Kind: adaptorvm.PodGone}
	}
}

// runAdaptorVMs scans the adaptor's VMs while this caa holds the ledger
// (cloud writes are the holder's alone, I9), once the node is ready, and
// again every audit interval while a VM tied to this node is left.
func (n *nodeDaemon) runAdaptorVMs(ctx context.Context, writes *rate.Limiter) {
	c := n.adaptor
	if c == nil {
		return
	}
	select {
	case <-ctx.Done():
		return
	case <-n.status.Readied():
	}
	c.Wait = writes.Wait
	every := n.f.audit
	if every <= 0 {
		every = n.f.gcGrace
	}
	c.Run(ctx, every, func(rep adaptorvm.Report) { n.status.SetAdaptorVMs(toHealthAdaptor(rep)) })
}

func toHealthAdaptor(rep adaptorvm.Report) health.AdaptorVMs {
	out := health.AdaptorVMs{At: rep.At, Mode: rep.Mode, Sandboxes: rep.Sandboxes, Problems: rep.Problems, Error: rep.Error, Skipped: rep.Skipped,
		VMs: make([]health.AdaptorVM, 0, len(rep.Items))}
	for _, it := range rep.Items {
		out.VMs = append(out.VMs, health.AdaptorVM{ID: it.ID, Name: it.Name, State: string(it.State), Tie: string(it.Tie),
			Sandbox: it.Sandbox, Pod: it.Pod, Action: it.Action, Why: it.Why})
	}
	return out
}
