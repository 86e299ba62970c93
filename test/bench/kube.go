package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/caa-project/caa/pkg/reconcile"
	"github.com/caa-project/caa/test/e2e/cluster"
)

// env is one apiserver for a scenario, with a counting proxy in front of
// it for caa and a kubeconfig that points at the proxy.
type env struct {
	c          *cluster.Cluster
	client     kubernetes.Interface
	proxy      *Proxy
	kubeconfig string
	dir        string
}

// newEnv launches etcd and kube-apiserver (binaries from the e2e cache)
// under dir, and a proxy for caa.
func newEnv(ctx context.Context, dir string, logf func(string, ...any)) (*env, error) {
	if err := mkdir(filepath.Join(dir, "cluster")); err != nil {
		return nil, err
	}
	c, err := cluster.Launch(ctx, cluster.Options{Dir: filepath.Join(dir, "cluster"), Logf: logf})
	if err != nil {
		return nil, err
	}
	cfg := c.RestConfig()
	p, err := StartProxy(c.URL(), cfg.CAData)
	if err != nil {
		_ = c.Stop()
		return nil, err
	}
	e := &env{c: c, client: c.Client(), proxy: p, dir: dir, kubeconfig: filepath.Join(dir, "caa.kubeconfig")}
	if err := writeKubeconfig(e.kubeconfig, p, cfg.BearerToken); err != nil {
		e.close()
		return nil, err
	}
	return e, nil
}

func (e *env) close() {
	_ = e.proxy.Close()
	_ = e.c.Stop()
}

// writeKubeconfig writes a kubeconfig for a client of the proxy.
func writeKubeconfig(path string, p *Proxy, token string) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["bench"] = &clientcmdapi.Cluster{Server: p.URL, CertificateAuthorityData: p.CAPEM}
	cfg.AuthInfos["bench"] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["bench"] = &clientcmdapi.Context{Cluster: "bench", AuthInfo: "bench"}
	cfg.CurrentContext = "bench"
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return fmt.Errorf("write kubeconfig: %w", err)
	}
	return nil
}

// proxyClient is a client like caa's: through a proxy, default content
// type and client-side limits off (the bench measures, it does not pace).
func proxyClient(p *Proxy, token string) (kubernetes.Interface, error) {
	return kubernetes.NewForConfig(&rest.Config{Host: p.URL, BearerToken: token, QPS: -1,
		TLSClientConfig: rest.TLSClientConfig{CAData: p.CAPEM}})
}

// createPods makes pods prefix-<i> for i in [from, to) on node in
// namespace ns, workers at a time. Peer pods carry the kata-remote
// runtime class; others are plain pods.
func createPods(ctx context.Context, e *env, ns, prefix, node string, from, to int, peer bool) error {
	if from >= to {
		return nil
	}
	if err := e.c.EnsureNamespace(ctx, ns); err != nil {
		return err
	}
	const workers = 24
	idx := make(chan int)
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for i := range idx {
				if err := createPod(ctx, e.client, ns, fmt.Sprintf("%s-%05d", prefix, i), node, peer); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	var err error
feed:
	for i := from; i < to; i++ {
		select {
		case idx <- i:
		case err = <-errs:
			break feed
		case <-ctx.Done():
			err = ctx.Err()
			break feed
		}
	}
	close(idx)
	wg.Wait()
	close(errs)
	if err == nil {
		err = <-errs
	}
	return err
}

func createPod(ctx context.Context, client kubernetes.Interface, ns, name, node string, peer bool) error {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{"app": "bench"}},
		Spec: corev1.PodSpec{
			NodeName:   node,
			Containers: []corev1.Container{{Name: "pause", Image: cluster.PauseImage}},
		},
	}
	if peer {
		rc := cluster.RuntimeClassName
		pod.Spec.RuntimeClassName = &rc
	}
	_, err := client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create pod %s/%s: %w", ns, name, err)
	}
	return nil
}

// forgetLedger removes the Node's ledger annotation, so that a caa with
// another cloud's ledger may start on the node (the bench runs the three
// clouds on one node in turn, which a real node never does).
func forgetLedger(ctx context.Context, client kubernetes.Interface, node string) error {
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{reconcile.LedgerAnnotation: nil}}})
	if err != nil {
		return err
	}
	if _, err := client.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("clear the ledger annotation of node %s: %w", node, err)
	}
	return nil
}

// podListTime is the median of runs LISTs of node's pods, the list caa's
// informer makes (field selector spec.nodeName, from the watch cache).
// The watch cache may trail the pods just created: it is first waited for
// (up to 30 s), then timed.
func podListTime(ctx context.Context, client kubernetes.Interface, node string, want, runs int) (time.Duration, error) {
	list := func() (int, error) {
		l, err := client.CoreV1().Pods("").List(ctx, metav1.ListOptions{
			FieldSelector:   fields.OneTermEqualSelector("spec.nodeName", node).String(),
			ResourceVersion: "0",
		})
		if err != nil {
			return 0, fmt.Errorf("list pods of node %s: %w", node, err)
		}
		return len(l.Items), nil
	}
	for deadline := time.Now().Add(30 * time.Second); ; {
		n, err := list()
		if err != nil {
			return 0, err
		}
		if n == want {
			break
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("node %s has %d pods in the apiserver's watch cache, want %d", node, n, want)
		}
		time.Sleep(50 * time.Millisecond) // polling the cache: the apiserver has no event for "caught up"
	}
	var ds []float64
	for range runs {
		start := time.Now()
		n, err := list()
		if err != nil {
			return 0, err
		}
		ds = append(ds, float64(time.Since(start)))
		if n != want {
			return 0, fmt.Errorf("node %s has %d pods, want %d", node, n, want)
		}
	}
	return time.Duration(Median(ds)), nil
}

// mkdir makes a directory for a ledger (0700, as caa wants it).
func mkdir(path string) error {
	if err := os.MkdirAll(path, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	return nil
}
