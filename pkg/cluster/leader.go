package cluster

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// Election is the Lease that picks the one replica allowed to call the
// cloud. Durations default to client-go's usual 15s/10s/2s.
type Election struct {
	Client    kubernetes.Interface
	Namespace string
	Name      string
	Identity  string
	Lease     time.Duration
	Renew     time.Duration
	Retry     time.Duration
	Log       *slog.Logger
	Metrics   *Metrics
}

func (e *Election) durations() (lease, renew, retry time.Duration) {
	lease, renew, retry = e.Lease, e.Renew, e.Retry
	if lease <= 0 {
		lease = 15 * time.Second
	}
	if renew <= 0 {
		renew = 10 * time.Second
	}
	if retry <= 0 {
		retry = 2 * time.Second
	}
	return lease, renew, retry
}

// Run campaigns for the Lease until ctx is done, and runs lead while this
// replica holds it. lead's ctx ends when the Lease is lost; a new lead
// starts only once the last one returned, so two never overlap in this
// process. On a clean shutdown the Lease is released, so the other
// replica takes over at once rather than after the lease duration.
func (e *Election) Run(ctx context.Context, lead func(ctx context.Context)) error {
	lease, renew, retry := e.durations()
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: e.Namespace, Name: e.Name},
		Client:     e.Client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: e.Identity},
	}
	// leading serialises the leads: client-go starts OnStartedLeading in
	// a goroutine of its own and may return before it ends.
	var leading sync.Mutex
	for ctx.Err() == nil {
		le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock: lock, LeaseDuration: lease, RenewDeadline: renew, RetryPeriod: retry,
			ReleaseOnCancel: true, Name: e.Name,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: func(lctx context.Context) {
					leading.Lock()
					defer leading.Unlock()
					if lctx.Err() != nil {
						return
					}
					e.Metrics.Leader.Set(1)
					e.Log.Info("leading: this replica lists the cluster's VMs", "lease", e.Namespace+"/"+e.Name, "identity", e.Identity)
					lead(lctx)
				},
				OnStoppedLeading: func() {
					e.Metrics.Leader.Set(0)
					e.Log.Info("not leading", "lease", e.Namespace+"/"+e.Name, "identity", e.Identity)
				},
			},
		})
		if err != nil {
			return fmt.Errorf("leader election: %w", err)
		}
		le.Run(ctx)
	}
	return nil
}

// Fence returns nil while the Lease, read from the apiserver now, names
// this replica and has not expired by the local clock. The leader asks it
// before each delete: a replica paused past its lease (SIGSTOP, a long GC)
// must not act on a sweep it started as leader.
func (e *Election) Fence(ctx context.Context) error {
	lease, _, _ := e.durations()
	l, err := e.Client.CoordinationV1().Leases(e.Namespace).Get(ctx, e.Name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("read lease %s/%s: %w", e.Namespace, e.Name, err)
	}
	holder := ""
	if l.Spec.HolderIdentity != nil {
		holder = *l.Spec.HolderIdentity
	}
	if holder != e.Identity {
		return fmt.Errorf("lease %s/%s is held by %q, not this replica (%s)", e.Namespace, e.Name, holder, e.Identity)
	}
	if l.Spec.RenewTime == nil || time.Since(l.Spec.RenewTime.Time) > lease {
		return fmt.Errorf("lease %s/%s has not been renewed within %s", e.Namespace, e.Name, lease)
	}
	return nil
}
