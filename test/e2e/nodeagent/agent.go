// Package nodeagent is a small test kubelet for caa's DaemonSet pods: for
// each caa pod bound to a node it runs the real caa binary of the pod's
// image tag, reports the pod's status from that process's real probes,
// and on deletion stops the process and completes the deletion.
//
// It stands in for the kubelet only for pods labelled
// app.kubernetes.io/name=caa; kwok plays kubelet for the peer pods. Every
// "pod" shares this machine's loopback, which stands in for the pod IP,
// and a hostPath maps onto <Dir>/<node>/<path>, so two caa versions on one
// node share one ledger directory as they do on a real node.
package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"time"

	authv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Selector picks the pods the agent runs.
const Selector = "app.kubernetes.io/name=caa"

// Config sets up an Agent.
type Config struct {
	// Client (with node-level rights: it reads ConfigMaps and Secrets,
	// requests ServiceAccount tokens and writes pod status) and REST (the
	// apiserver's address and CA, written into each pod's kubeconfig).
	Client kubernetes.Interface
	REST   *rest.Config
	// Dir holds the nodes' host directories and the pods' files and logs.
	Dir string
	// Binaries maps an image tag to the caa binary that stands for it.
	Binaries map[string]string
	// Observe, if set, hears every change of a pod's container, in order
	// per pod, on that pod's worker: keep it short.
	Observe func(Observation)
	// Logf receives progress lines; nil drops them.
	Logf func(format string, args ...any)
	// RestartBackoff is the first wait before restarting a process that
	// exited (doubled each time up to 30s); 0 means one second, shorter
	// than the kubelet's 10s, to keep tests brisk.
	RestartBackoff time.Duration
	// Start, if set, starts a container's process on node (in place of
	// cmd.Start): a test whose nodes are network namespaces starts it in
	// the node's, as a pod on the host network runs.
	Start func(node string, cmd *exec.Cmd) error
	// HostIP, if set, is a node's IP for the downward API's status.hostIP
	// (otherwise the loopback, as for every pod here).
	HostIP func(node string) string
}

// ObservationKind names what happened to a pod's container.
type ObservationKind string

// The observations, in the order a pod's life produces them.
const (
	Started    ObservationKind = "Started"    // a process was started
	Ready      ObservationKind = "Ready"      // the readiness probe turned true
	NotReady   ObservationKind = "NotReady"   // the readiness probe turned false
	Exited     ObservationKind = "Exited"     // the process ended without being asked
	Restarted  ObservationKind = "Restarted"  // a failed liveness or startup probe killed it
	Terminated ObservationKind = "Terminated" // stopped for the pod's deletion
	Deleted    ObservationKind = "Deleted"    // the deletion was completed
	Failed     ObservationKind = "Failed"     // the container could not start (see Err)
)

// Observation is one change of a pod's container.
type Observation struct {
	At   time.Time
	Kind ObservationKind
	Pod  types.NamespacedName
	UID  types.UID
	Node string
	Tag  string
	// HealthURL is the process's health address (http://127.0.0.1:port).
	HealthURL string
	PID       int
	Restarts  int32
	Err       error
}

// Agent plays kubelet for caa's pods on every node.
type Agent struct {
	cfg    Config
	probes *http.Client

	mu      sync.Mutex
	workers map[types.UID]*worker
	done    map[types.UID]bool // pods whose worker has finished
	errs    []error
	wg      sync.WaitGroup
}

// New returns an agent; Run starts it.
func New(cfg Config) (*Agent, error) {
	if cfg.Client == nil || cfg.REST == nil || cfg.Dir == "" {
		return nil, errors.New("nodeagent: Client, REST and Dir are required")
	}
	if cfg.Logf == nil {
		cfg.Logf = func(string, ...any) {}
	}
	if cfg.RestartBackoff <= 0 {
		cfg.RestartBackoff = time.Second
	}
	return &Agent{
		cfg:     cfg,
		probes:  &http.Client{Transport: &http.Transport{DisableKeepAlives: true}},
		workers: map[types.UID]*worker{},
		done:    map[types.UID]bool{},
	}, nil
}

// Run watches caa's pods in every namespace and runs them until ctx ends;
// then it stops every process it started (SIGTERM, then SIGKILL after the
// pod's grace) without touching the API, and returns.
func (a *Agent) Run(ctx context.Context) error {
	factory := informers.NewSharedInformerFactoryWithOptions(a.cfg.Client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = Selector }))
	inf := factory.Core().V1().Pods().Informer()
	_, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { a.changed(ctx, obj, inf.GetStore()) },
		UpdateFunc: func(_, obj any) { a.changed(ctx, obj, inf.GetStore()) },
		DeleteFunc: func(obj any) {
			if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = tomb.Obj
			}
			a.changed(ctx, obj, inf.GetStore())
		},
	})
	if err != nil {
		return fmt.Errorf("nodeagent: pod handler: %w", err)
	}
	factory.Start(ctx.Done())
	<-ctx.Done()
	factory.Shutdown()
	a.wg.Wait()
	return nil
}

// changed hands a pod's change to its worker, starting one for a pod
// bound to a node.
func (a *Agent) changed(ctx context.Context, obj any, store cache.Store) {
	pod, ok := obj.(*corev1.Pod)
	if !ok || pod.Spec.NodeName == "" {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	w, ok := a.workers[pod.UID]
	if !ok {
		// A late event of a finished pod (its delete) starts nothing.
		if ctx.Err() != nil || a.done[pod.UID] {
			return
		}
		w = &worker{agent: a, store: store, key: pod.Namespace + "/" + pod.Name, uid: pod.UID,
			name: types.NamespacedName{Namespace: pod.Namespace, Name: pod.Name}, node: pod.Spec.NodeName,
			notify: make(chan struct{}, 1)}
		a.workers[pod.UID] = w
		a.wg.Go(func() {
			w.run(ctx)
			a.mu.Lock()
			delete(a.workers, w.uid)
			a.done[w.uid] = true
			a.mu.Unlock()
		})
	}
	select {
	case w.notify <- struct{}{}:
	default:
	}
}

// Errors returns what went wrong so far (unknown image tags, unresolvable
// configuration, failed status writes), oldest first.
func (a *Agent) Errors() []error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]error(nil), a.errs...)
}

func (a *Agent) report(err error) {
	a.mu.Lock()
	a.errs = append(a.errs, err)
	a.mu.Unlock()
	a.cfg.Logf("nodeagent: %v", err)
}

// PodDir is where the agent keeps a pod's files: its kubeconfig, home
// directory and the process log (caa.log).
func (a *Agent) PodDir(node string, pod types.NamespacedName, uid types.UID) string {
	return filepath.Join(a.cfg.Dir, node, "pods", pod.Namespace+"_"+pod.Name+"_"+string(uid))
}

// LogPath is the file a pod's process output goes to, across restarts.
func (a *Agent) LogPath(node string, pod types.NamespacedName, uid types.UID) string {
	return filepath.Join(a.PodDir(node, pod, uid), "caa.log")
}

// HostDir is where a hostPath of node lives on this machine.
func (a *Agent) HostDir(node, path string) string {
	return filepath.Join(a.cfg.Dir, node, filepath.Clean("/"+path))
}

// writeKubeconfig gives the pod a kubeconfig holding a TokenRequest token
// for its ServiceAccount, bound to the pod, so caa runs with exactly the
// rights its RBAC grants (and loses them when the pod is gone).
func (a *Agent) writeKubeconfig(ctx context.Context, pod *corev1.Pod, path string) error {
	sa := pod.Spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	expiry := int64(time.Hour / time.Second)
	tr, err := a.cfg.Client.CoreV1().ServiceAccounts(pod.Namespace).CreateToken(ctx, sa, &authv1.TokenRequest{
		Spec: authv1.TokenRequestSpec{
			ExpirationSeconds: &expiry,
			BoundObjectRef:    &authv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("%w: token for serviceaccount %s/%s: %w", errConfig, pod.Namespace, sa, err)
	}
	const name = "in-pod"
	kc := clientcmdapi.NewConfig()
	kc.Clusters[name] = &clientcmdapi.Cluster{Server: a.cfg.REST.Host, CertificateAuthorityData: a.cfg.REST.CAData}
	kc.AuthInfos[name] = &clientcmdapi.AuthInfo{Token: tr.Status.Token}
	kc.Contexts[name] = &clientcmdapi.Context{Cluster: name, AuthInfo: name}
	kc.CurrentContext = name
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		return fmt.Errorf("write kubeconfig for %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	return os.Chmod(path, 0o600)
}
