package reconcile

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"reflect"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
)

// PodSource is the node's view of pods: an informer on this node's pods
// only (field selector spec.nodeName, never a cluster-wide cache). The
// runtime classes pick the peer pods, which get VMs; every pod of the node
// is still reported, so that a record whose pod merely changed class (or
// whose class was dropped from the flag) is never taken for a gone pod.
// Every change that matters pokes Changes, so the loop reacts at once.
type PodSource struct {
	informer       cache.SharedIndexInformer
	runtimeClasses []string
	changes        chan struct{}
	synced         chan struct{} // closed once the first list is in

	mu     sync.Mutex
	notify func(uid string) // per-pod changes, once a controller listens
}

// byUID indexes the cache by pod UID, the key of caa's work.
const byUID = "uid"

// NewPodSource watches the pods bound to node whose runtime class is one
// of runtimeClasses.
func NewPodSource(client kubernetes.Interface, node string, runtimeClasses []string, resync time.Duration) (*PodSource, error) {
	if node == "" {
		return nil, errors.New("pod source: no node name (set --node-name or NODE_NAME)")
	}
	if len(runtimeClasses) == 0 {
		return nil, errors.New("pod source: no runtime class to watch (set --runtime-class)")
	}
	factory := informers.NewSharedInformerFactoryWithOptions(client, resync,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", node).String()
		}))
	s := &PodSource{
		informer:       factory.Core().V1().Pods().Informer(),
		runtimeClasses: runtimeClasses,
		changes:        make(chan struct{}, 1),
		synced:         make(chan struct{}),
	}
	// The cache keeps a pod without its managed fields: caa never reads
	// them and never writes a pod, and each field manager's entry (the
	// creator's, the kubelet's status) is about as large as the rest of a
	// small pod's metadata.
	if err := s.informer.SetTransform(stripManagedFields); err != nil {
		return nil, fmt.Errorf("pod source: %w", err)
	}
	// The field selector also brings the node's other pods (caa's own
	// among them); their changes start no pass, except a delete or a move
	// to a terminal phase, which may free a VM recorded before a
	// configuration change. A pass never starts new work after a stop.
	if err := s.informer.AddIndexers(cache.Indexers{byUID: func(obj any) ([]string, error) {
		if p, ok := obj.(*corev1.Pod); ok {
			return []string{string(p.UID)}, nil
		}
		return nil, nil
	}}); err != nil {
		return nil, fmt.Errorf("pod source: %w", err)
	}
	if _, err := s.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if isPeer(runtimeClasses, obj) {
				s.changed(obj)
			}
		},
		UpdateFunc: func(oldObj, newObj any) {
			if isPeer(runtimeClasses, newObj) && changed(oldObj, newObj) || becameTerminal(oldObj, newObj) {
				s.changed(newObj)
			}
		},
		DeleteFunc: func(obj any) { s.changed(obj) },
	}); err != nil {
		return nil, fmt.Errorf("pod source: %w", err)
	}
	return s, nil
}

// stripManagedFields drops a pod's managed fields before the cache keeps
// it; anything else passes unchanged.
func stripManagedFields(obj any) (any, error) {
	if p, ok := obj.(*corev1.Pod); ok {
		p.ManagedFields = nil
	}
	return obj, nil
}

// Run runs the informer until ctx is done. The moment the first list is
// in, it sends a change, so a loop that found the cache unsynced starts
// its pass then instead of at its next retry.
func (s *PodSource) Run(ctx context.Context) {
	go func() {
		err := wait.PollUntilContextCancel(ctx, 5*time.Millisecond, true, func(context.Context) (bool, error) {
			return s.informer.HasSynced(), nil
		})
		if err == nil {
			close(s.synced)
			s.poke()
		}
	}()
	s.informer.Run(ctx.Done())
}

// WaitSynced waits until the cache holds its first complete view (true)
// or ctx is done (false). Unlike client-go's WaitForCacheSync, which looks
// every 100ms, it returns within a few milliseconds of the list: it sits
// on a start's path to ready. Run must be running.
func (s *PodSource) WaitSynced(ctx context.Context) bool {
	select {
	case <-s.synced:
		return true
	case <-ctx.Done():
		return false
	}
}

// Synced reports whether the cache holds a complete view. It turns true
// once, after the first list; later watch breaks are re-listed by the
// reflector before the store changes, so the store never holds a partial
// view.
func (s *PodSource) Synced() bool { return s.informer.HasSynced() }

// Changes delivers a token after any pod change (coalesced).
func (s *PodSource) Changes() <-chan struct{} { return s.changes }

// Notify makes every later pod change also call fn with the pod's UID
// (a controller's queue). Handlers only enqueue; they never call out.
func (s *PodSource) Notify(fn func(uid string)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.notify = fn
}

// changed pokes the loop and notifies the pod's UID.
func (s *PodSource) changed(obj any) {
	s.poke()
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	s.mu.Lock()
	fn := s.notify
	s.mu.Unlock()
	if fn != nil {
		fn(string(p.UID))
	}
}

// Pod returns the cached pod of a UID (NotPeer set as in Pods), or nil.
func (s *PodSource) Pod(uid string) *Pod {
	objs, err := s.informer.GetIndexer().ByIndex(byUID, uid)
	if err != nil || len(objs) == 0 {
		return nil
	}
	p, ok := objs[0].(*corev1.Pod)
	if !ok {
		return nil
	}
	return s.pod(p)
}

func (s *PodSource) pod(p *corev1.Pod) *Pod {
	pod := PodFromKube(p)
	pod.NotPeer = p.Spec.RuntimeClassName == nil || !slices.Contains(s.runtimeClasses, *p.Spec.RuntimeClassName)
	return pod
}

func (s *PodSource) poke() {
	select {
	case s.changes <- struct{}{}:
	default:
	}
}

// isPeer reports whether obj is a peer pod (runtimeClassName is immutable,
// so the new object answers for an update). A delete whose final state was
// missed counts, to be safe.
func isPeer(runtimeClasses []string, obj any) bool {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return true
	}
	return p.Spec.RuntimeClassName != nil && slices.Contains(runtimeClasses, *p.Spec.RuntimeClassName)
}

// becameTerminal reports an update that moved a pod to Succeeded or Failed.
func becameTerminal(oldObj, newObj any) bool {
	o, ok1 := oldObj.(*corev1.Pod)
	n, ok2 := newObj.(*corev1.Pod)
	return ok1 && ok2 && o.Status.Phase != n.Status.Phase &&
		(n.Status.Phase == corev1.PodSucceeded || n.Status.Phase == corev1.PodFailed)
}

// changed reports whether an update matters to caa: the kubelet rewrites
// pod status often, and only a phase, the annotations, the runtime class
// or a deletion change what caa decides.
func changed(oldObj, newObj any) bool {
	o, ok1 := oldObj.(*corev1.Pod)
	n, ok2 := newObj.(*corev1.Pod)
	if !ok1 || !ok2 {
		return true
	}
	return o.Status.Phase != n.Status.Phase ||
		!maps.Equal(o.Annotations, n.Annotations) ||
		!reflect.DeepEqual(o.Spec.RuntimeClassName, n.Spec.RuntimeClassName) ||
		!o.DeletionTimestamp.Equal(n.DeletionTimestamp)
}

// Pods returns every pod of the node in the cache, terminal ones included;
// those whose runtime class is not watched are marked NotPeer.
func (s *PodSource) Pods() []*Pod {
	var out []*Pod
	for _, obj := range s.informer.GetStore().List() {
		if p, ok := obj.(*corev1.Pod); ok {
			out = append(out, s.pod(p))
		}
	}
	return out
}

// PodFromKube converts a pod. A pod being deleted keeps its VM until it is
// gone or terminal, so the deletion timestamp does not matter here.
func PodFromKube(p *corev1.Pod) *Pod {
	rc := ""
	if p.Spec.RuntimeClassName != nil {
		rc = *p.Spec.RuntimeClassName
	}
	return &Pod{
		UID: string(p.UID), Namespace: p.Namespace, Name: p.Name, RuntimeClass: rc,
		Annotations: p.Annotations,
		Terminal:    p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed,
	}
}

// KubeEvents raises Kubernetes Events on pods through client-go's
// recorder (which rate-limits and aggregates repeats).
type KubeEvents struct {
	recorder    record.EventRecorder
	broadcaster record.EventBroadcaster
}

// EventCacheSize bounds each of the recorder's three caches (the
// aggregation of similar events, the count of repeated ones and the
// per-object spam filter; client-go's default is 4,096 entries each).
// caa's events name a VM or sandbox id, so nearly every one is a new key:
// with the default, each StartVM/StopVM cycle kept about 1.5 KiB in those
// caches (and more heap pinned around it) until 4,096 entries were reached,
// which S11 saw as growth over 1,000 cycles. A node holds at most a few
// hundred pods, each with a few reasons, so 256 entries still aggregate and
// rate-limit a pod's repeats; an evicted entry only restarts them.
const EventCacheSize = 256

// NewKubeEvents records events as component "caa" on host node.
func NewKubeEvents(client kubernetes.Interface, node string) *KubeEvents {
	b := record.NewBroadcaster(record.WithCorrelatorOptions(record.CorrelatorOptions{LRUCacheSize: EventCacheSize}))
	b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")})
	return &KubeEvents{
		broadcaster: b,
		recorder:    b.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "caa", Host: node}),
	}
}

// Event implements EventSink.
func (k *KubeEvents) Event(pod *Pod, warning bool, reason, message string) {
	ref := &corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: pod.Namespace, Name: pod.Name, UID: types.UID(pod.UID)}
	typ := corev1.EventTypeNormal
	if warning {
		typ = corev1.EventTypeWarning
	}
	k.recorder.Event(ref, typ, reason, message)
}

// NodeEvent raises an event on the Node itself, for what concerns the
// whole node rather than one pod (credentials refused, a broken ledger).
func (k *KubeEvents) NodeEvent(node string, warning bool, reason, message string) {
	// The kubelet names its Node events the same way: the UID is the name.
	ref := &corev1.ObjectReference{Kind: "Node", APIVersion: "v1", Name: node, UID: types.UID(node)}
	typ := corev1.EventTypeNormal
	if warning {
		typ = corev1.EventTypeWarning
	}
	k.recorder.Event(ref, typ, reason, message)
}

// Shutdown flushes and stops the broadcaster.
func (k *KubeEvents) Shutdown() { k.broadcaster.Shutdown() }

// LedgerAnnotation on the Node records which ledger the node's caa uses, so
// a restart that finds no ledger (or another one) knows the hostPath is
// not what it was, instead of silently starting from nothing.
const LedgerAnnotation = "caa.dev/ledger-id"

// ErrLedgerReplaced: the Node says a ledger existed, the file says otherwise.
var ErrLedgerReplaced = errors.New("the ledger on this node is not the one the Node object names")

// CheckNodeLedger compares the Node's annotation with the ledger about to
// be used. existed says whether the file was there before this start;
// ledgerID is the id of the file as opened (empty if none).
func CheckNodeLedger(ctx context.Context, client kubernetes.Interface, node, ledgerPath string, existed bool, ledgerID string) error {
	want, err := NodeLedgerID(ctx, client, node)
	if err != nil {
		return err
	}
	return CompareNodeLedger(node, want, ledgerPath, existed, ledgerID)
}

// NodeLedgerID reads the ledger id the Node names ("" for none).
func NodeLedgerID(ctx context.Context, client kubernetes.Interface, node string) (string, error) {
	n, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("read node %s: %w", node, err)
	}
	return n.Annotations[LedgerAnnotation], nil
}

// CompareNodeLedger is CheckNodeLedger's decision: want is the Node's
// annotation. Called before the file is created (ledgerID ""), it refuses
// a missing file the Node says existed, so a failed start never leaves an
// empty ledger behind to confuse the next one.
func CompareNodeLedger(node, want, ledgerPath string, existed bool, ledgerID string) error {
	switch {
	case want == "" || want == ledgerID || (existed && ledgerID == ""):
		return nil
	case !existed:
		return fmt.Errorf("%w: node %s says ledger %s existed, but %s is missing; the likely cause is the ledger "+
			"hostPath not being mounted (check the DaemonSet's volume for /var/lib/caa). If the ledger is really lost, "+
			"run `caa ledger rebuild` or remove the %s annotation from the node to start afresh",
			ErrLedgerReplaced, node, want, ledgerPath, LedgerAnnotation)
	}
	return fmt.Errorf("%w: node %s names ledger %s but %s is ledger %s; check the hostPath, or remove the %s annotation "+
		"from the node if the file was replaced on purpose", ErrLedgerReplaced, node, want, ledgerPath, ledgerID, LedgerAnnotation)
}

// RecordNodeLedger writes the ledger id on the Node (a merge patch).
func RecordNodeLedger(ctx context.Context, client kubernetes.Interface, node, ledgerID string) error {
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{LedgerAnnotation: ledgerID}}})
	if err != nil {
		return err
	}
	if _, err := client.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		if apierrors.IsForbidden(err) {
			return fmt.Errorf("annotate node %s: %w (the ServiceAccount needs patch on nodes)", node, err)
		}
		return fmt.Errorf("annotate node %s: %w", node, err)
	}
	return nil
}

// Loop runs the reconciler in two stages. Startup: full passes (the cloud
// listing, every pod and record) until one converges, which is what
// readiness waits for (I5). Steady state, the way Kubernetes controllers
// work: every pod change puts the pod's UID on a rate-limited, deduplicated
// work queue, and workers reconcile one pod at a time with that pod's VM
// only (ReconcilePod: no listing per pod change); a full pass, the audit,
// runs only every Audit (jittered by ±50% so a fleet does not synchronise),
// and a cheap resync every Resync reads only the pod cache and the ledger
// to re-enqueue what still needs work. It returns when ctx is done.
type Loop struct {
	Reconciler *Reconciler
	Pods       *PodSource
	// Resync is the period of the cache-and-ledger check (default 1 min);
	// it makes no cloud call.
	Resync time.Duration
	// Audit is the mean period of the full pass after startup (0: startup
	// only). The audit lists the node's VMs: it finds VMs killed behind
	// caa's back, orphans and lost records.
	Audit  time.Duration
	Report func(PassResult, bool) // (result, startup pass converged)
	// PodDone, when set, hears where one pod stands after the worker
	// reconciled it between full passes, so /status does not wait for the
	// next audit to show a new pod pending or a created one done.
	PodDone func(PodStatus, PodStanding)
	// Calls, when set, is the context of the cloud and ledger calls, so a
	// shutdown can stop new work (Run's ctx) while the calls in flight get
	// a bounded time to finish (Calls cancelled later).
	Calls context.Context
	// MinGap is the least time between two startup passes started by pod
	// changes (default 1s), so a burst of changes costs one listing.
	MinGap time.Duration
	// BootPoll is how soon the startup pass is repeated while it waits
	// only for VMs to boot (default 1s).
	BootPoll time.Duration
	// Beat, when set, is the liveness heartbeat. The loop beats on every
	// turn, and every second while a pass runs, for at most MaxPass of
	// that pass: a slow cloud call is not a dead loop, but a pass stuck
	// past every call's deadline is.
	Beat    func()
	MaxPass time.Duration
	// Workers reconcile pods at once in the steady state (default the
	// reconciler's Concurrency): a slow create never holds up a delete.
	Workers int
}

// Run blocks until ctx is done.
func (l *Loop) Run(ctx context.Context) {
	queue := workqueue.NewTypedRateLimitingQueueWithConfig(
		workqueue.NewTypedItemExponentialFailureRateLimiter[string](time.Second, 5*time.Minute),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: "caa-pods"})
	defer queue.ShutDown()
	last, ok := l.startup(ctx)
	if !ok {
		return
	}
	// From here on every change goes on the queue. What changed while the
	// startup pass ran is found by comparing the cache with the ledger (no
	// cloud call); re-reading every pod the pass just handled would cost a
	// read per pod at every restart.
	l.Reconciler.audits.steady.Store(true)
	l.Pods.Notify(func(uid string) { queue.Add(uid) })
	defer l.Pods.Notify(nil)
	l.resync(queue)
	l.requeue(queue, last)
	l.steady(ctx, queue)
}

func (l *Loop) calls(ctx context.Context) context.Context {
	if l.Calls != nil {
		return l.Calls
	}
	return ctx
}

// startup runs full passes until one converges; false when ctx ended first.
func (l *Loop) startup(ctx context.Context) (PassResult, bool) {
	gap := l.MinGap
	if gap <= 0 {
		gap = time.Second
	}
	bootPoll := l.BootPoll
	if bootPoll <= 0 {
		bootPoll = time.Second
	}
	timer := time.NewTimer(0)
	defer timer.Stop()
	var earliest time.Time
	for {
		select {
		case <-ctx.Done():
			return PassResult{}, false
		case <-timer.C:
		case <-l.Pods.Changes():
			if wait := time.Until(earliest); wait > 0 {
				// Too soon after the last pass: fold this change into a
				// pass at the end of the gap.
				resetTimer(timer, wait)
				continue
			}
		}
		// select picks at random among ready cases: a change or a timer
		// ready together with the stop must not start a pass after it.
		if ctx.Err() != nil {
			return PassResult{}, false
		}
		l.beat()
		if !l.Pods.Synced() {
			resetTimer(timer, time.Second)
			continue
		}
		res := l.pass(ctx)
		if ctx.Err() != nil {
			return PassResult{}, false
		}
		if l.Report != nil {
			l.Report(res, res.Converged())
		}
		if res.Converged() {
			return res, true
		}
		next := 5 * time.Second
		if res.RequeueAfter > 0 && res.RequeueAfter < next {
			next = res.RequeueAfter
		}
		if res.Booting > 0 && next > bootPoll {
			next = bootPoll
		}
		earliest = time.Now().Add(gap)
		resetTimer(timer, next)
	}
}

func (l *Loop) pass(ctx context.Context) PassResult {
	stopBeats := l.beatDuring()
	defer stopBeats()
	return l.Reconciler.Pass(l.calls(ctx), l.Pods.Pods(), l.Pods.Synced())
}

// steady runs the workers, the audit and the resync until ctx is done.
func (l *Loop) steady(ctx context.Context, queue workqueue.TypedRateLimitingInterface[string]) {
	workers := l.Workers
	if workers <= 0 {
		workers = max(l.Reconciler.Concurrency, 8)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	defer queue.ShutDown() // before the wait: it ends the workers
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for l.work(ctx, queue) {
			}
		}()
	}
	resync := l.Resync
	if resync <= 0 {
		resync = time.Minute
	}
	tick := time.NewTicker(resync)
	defer tick.Stop()
	// A nil channel never fires: with no audit, startup was the only pass.
	var audit <-chan time.Time
	var auditTimer *time.Timer
	if l.Audit > 0 {
		auditTimer = time.NewTimer(AuditJitter(l.Audit, rand.Float64()))
		defer auditTimer.Stop()
		audit = auditTimer.C
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			l.resync(queue)
		case <-audit:
			if ctx.Err() != nil {
				return
			}
			res := l.pass(ctx)
			if ctx.Err() != nil {
				return
			}
			if l.Report != nil {
				l.Report(res, true)
			}
			l.requeue(queue, res)
			auditTimer.Reset(AuditJitter(l.Audit, rand.Float64()))
		}
	}
}

// work reconciles one pod from the queue; false once the queue shut down.
func (l *Loop) work(ctx context.Context, queue workqueue.TypedRateLimitingInterface[string]) bool {
	uid, quit := queue.Get()
	if quit {
		return false
	}
	defer queue.Done(uid)
	if ctx.Err() != nil {
		return false
	}
	pod := l.Pods.Pod(uid)
	res := l.Reconciler.ReconcilePod(l.calls(ctx), uid, pod, l.Pods.Synced())
	l.beat()
	if l.PodDone != nil && !errors.Is(res.Err, ErrStopping) {
		l.PodDone(l.Reconciler.Standing(uid, pod))
	}
	// The reconciler's own backoff (by error kind, Retry-After) sets the
	// delay; the queue only dedups and delays.
	queue.Forget(uid)
	if res.RequeueAfter > 0 && ctx.Err() == nil {
		queue.AddAfter(uid, res.RequeueAfter)
	}
	return true
}

// resync enqueues what the cache and the ledger say still needs work.
func (l *Loop) resync(queue workqueue.TypedRateLimitingInterface[string]) {
	l.beat()
	if !l.Pods.Synced() {
		return
	}
	uids, err := l.Reconciler.Stale(l.Pods.Pods())
	if err != nil {
		l.Reconciler.Exec.log().Warn("resync: cannot read the ledger", "err", err)
		return
	}
	for _, uid := range uids {
		queue.Add(uid)
	}
}

// requeue puts the pods a pass wants to see again on the queue.
func (l *Loop) requeue(queue workqueue.TypedRateLimitingInterface[string], res PassResult) {
	for uid, after := range res.Requeue {
		queue.AddAfter(uid, after)
	}
}

// AuditJitter spreads an audit period over [0.5, 1.5) of itself, from a
// uniform u in [0, 1), so the caa pods of a fleet do not list in step.
func AuditJitter(period time.Duration, u float64) time.Duration {
	return time.Duration(float64(period) * (0.5 + u))
}

func (l *Loop) beat() {
	if l.Beat != nil {
		l.Beat()
	}
}

// beatDuring beats every second until the returned stop is called, or
// until MaxPass (default 15 min) has passed.
func (l *Loop) beatDuring() (stop func()) {
	if l.Beat == nil {
		return func() {}
	}
	limit := l.MaxPass
	if limit <= 0 {
		limit = 15 * time.Minute
	}
	done := make(chan struct{})
	go func() {
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		deadline := time.NewTimer(limit)
		defer deadline.Stop()
		for {
			select {
			case <-done:
				return
			case <-deadline.C:
				return
			case <-tick.C:
				l.Beat()
			}
		}
	}()
	return func() { close(done) }
}

// resetTimer moves t to fire after d, draining a pending fire.
func resetTimer(t *time.Timer, d time.Duration) {
	if !t.Stop() {
		select {
		case <-t.C:
		default:
		}
	}
	t.Reset(d)
}
