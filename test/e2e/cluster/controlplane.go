package cluster

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// KwokNodeAnnotation marks the nodes kwok manages (CreateKwokNode sets it).
const KwokNodeAnnotation = "kwok.x-k8s.io/node"

// StartControlPlane starts kube-controller-manager, running only the
// DaemonSet controller, and kube-scheduler, which DaemonSet pods need to be
// bound to their nodes. Both run until Stop and use the admin credentials.
func (c *Cluster) StartControlPlane(ctx context.Context) error {
	caFile := filepath.Join(c.dir, "apiserver-ca.crt")
	// The controller-manager wants the CA certificate alone here; it is
	// what it would publish to pods as ca.crt.
	if err := os.WriteFile(caFile, c.caPEM, 0o600); err != nil {
		return fmt.Errorf("write apiserver CA: %w", err)
	}
	ports, err := freePorts(2)
	if err != nil {
		return err
	}
	kcm := []string{
		"--kubeconfig=" + c.kubeconf,
		"--leader-elect=false",
		"--bind-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(ports[0]),
		"--cert-dir=" + filepath.Join(c.dir, "kcm-certs"),
		"--use-service-account-credentials=false",
		"--service-account-private-key-file=" + c.creds.saKey,
		"--root-ca-file=" + caFile,
		// The DaemonSet controller is what the rollout tests are about. The
		// node lifecycle controller lifts the not-ready NoSchedule taint the
		// apiserver puts on every new Node once kwok reports it Ready;
		// without it no DaemonSet pod is ever placed. kwok heartbeats every
		// 20-45 s, so the grace period must be longer than that.
		"--controllers=daemonset-controller,node-lifecycle-controller",
		"--node-monitor-grace-period=2m",
	}
	if c.realKubelets {
		// Real kubelets run pods that read the apiserver with their
		// ServiceAccount's projected token: the default ServiceAccount of
		// each namespace and the CA ConfigMap (kube-root-ca.crt) the token
		// volume holds come from these two controllers.
		for i, a := range kcm {
			if strings.HasPrefix(a, "--controllers=") {
				kcm[i] += ",serviceaccount-controller,root-ca-certificate-publisher-controller"
			}
		}
	}
	sched := []string{
		"--kubeconfig=" + c.kubeconf,
		"--leader-elect=false",
		"--bind-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(ports[1]),
		"--cert-dir=" + filepath.Join(c.dir, "scheduler-certs"),
	}
	for _, s := range []struct {
		name, bin string
		args      []string
		port      int
	}{
		{"kube-controller-manager", c.bins.ControllerManager, kcm, ports[0]},
		{"kube-scheduler", c.bins.Scheduler, sched, ports[1]},
	} {
		p, err := c.startExtra(s.name, s.bin, s.args)
		if err != nil {
			return err
		}
		if err := waitReady(ctx, p, healthzCheck(s.port)); err != nil {
			return fmt.Errorf("start %s: %w", s.name, err)
		}
		c.logf("e2e: %s serving", s.name)
	}
	return nil
}

// healthzCheck probes a component's own /healthz on 127.0.0.1:port. The
// component serves a self-signed certificate that only this probe sees.
func healthzCheck(port int) func(context.Context) error {
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true,
		TLSClientConfig:   &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // local probe of a self-signed test server
	}}
	url := "https://127.0.0.1:" + strconv.Itoa(port) + "/healthz"
	return func(ctx context.Context) error {
		_, err := get(ctx, client, url, "")
		return err
	}
}

// kwokPodStages are the only pod stages kwok gets: it plays kubelet for peer
// pods (runtime class kata-remote) and for nothing else, so caa's own
// DaemonSet pods are left to the test's node agent. A peer pod goes from
// Pending straight to Running and Ready; a deleted one is removed at once.
const kwokPodStages = `apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: peer-pod-running
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: .spec.runtimeClassName
      operator: In
      values: ["` + RuntimeClassName + `"]
    - key: .metadata.deletionTimestamp
      operator: DoesNotExist
    - key: .status.phase
      operator: In
      values: ["Pending"]
  next:
    statusTemplate: |
      {{ $now := Now }}
      phase: Running
      startTime: {{ $now | Quote }}
      conditions:
      - type: Initialized
        status: "True"
        lastTransitionTime: {{ $now | Quote }}
      - type: ContainersReady
        status: "True"
        lastTransitionTime: {{ $now | Quote }}
      - type: Ready
        status: "True"
        lastTransitionTime: {{ $now | Quote }}
      containerStatuses:
      {{ range .spec.containers }}
      - name: {{ .name | Quote }}
        image: {{ .image | Quote }}
        ready: true
        started: true
        restartCount: 0
        state:
          running:
            startedAt: {{ $now | Quote }}
      {{ end }}
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: peer-pod-deleted
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: .spec.runtimeClassName
      operator: In
      values: ["` + RuntimeClassName + `"]
    - key: .metadata.deletionTimestamp
      operator: Exists
  next:
    delete: true
`

// StartKwok starts kwok for the nodes made by CreateKwokNode: it gives them
// kwok's own node stages (initialise, then heartbeat), read from the kwok
// module the binary was built from, and the peer-pod stages above.
func (c *Cluster) StartKwok(ctx context.Context) error {
	modDir, err := kwokModuleDir(ctx)
	if err != nil {
		return err
	}
	podStages := filepath.Join(c.dir, "kwok-pod-stages.yaml")
	if err := os.WriteFile(podStages, []byte(kwokPodStages), 0o600); err != nil {
		return fmt.Errorf("write kwok stages: %w", err)
	}
	ports, err := freePorts(1)
	if err != nil {
		return err
	}
	args := []string{
		"--kubeconfig=" + c.kubeconf,
		"--manage-nodes-with-annotation-selector=" + KwokNodeAnnotation + "=fake",
		"--node-ip=127.0.0.1",
		"--server-address=127.0.0.1:" + strconv.Itoa(ports[0]),
		"--config=" + filepath.Join(modDir, "kustomize", "stage", "node", "fast", "node-initialize.yaml"),
		"--config=" + filepath.Join(modDir, "kustomize", "stage", "node", "heartbeat", "node-heartbeat.yaml"),
		"--config=" + podStages,
	}
	p, err := c.startExtra("kwok", c.bins.Kwok, args)
	if err != nil {
		return err
	}
	url := "http://127.0.0.1:" + strconv.Itoa(ports[0]) + "/healthz"
	probe := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	if err := waitReady(ctx, p, func(ctx context.Context) error {
		_, err := get(ctx, probe, url, "")
		return err
	}); err != nil {
		return fmt.Errorf("start kwok: %w", err)
	}
	c.logf("e2e: kwok serving at %s", url)
	return nil
}

// kwokModuleDir finds the kwok module the wrapper pins in the module cache;
// its stage files are not embedded in the binary.
func kwokModuleDir(ctx context.Context) (string, error) {
	tools, err := toolsDir()
	if err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Dir}}", kwokComponent.pin)
	cmd.Dir = filepath.Join(tools, kwokComponent.module)
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
	out, err := cmd.CombinedOutput()
	dir := strings.TrimSpace(string(out))
	if err != nil || dir == "" {
		return "", fmt.Errorf("locate the kwok module (go list -m %s in %s): %w: %s", kwokComponent.pin, cmd.Dir, err, LastLines(out, 5))
	}
	return dir, nil
}

// CreateKwokNode registers a Node for kwok to manage: kwok fills its status
// (Ready, addresses, capacity) and keeps it heartbeating. StartKwok must run
// for the node to turn Ready.
func (c *Cluster) CreateKwokNode(ctx context.Context, name string) (*corev1.Node, error) {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{
		Name:        name,
		Labels:      map[string]string{corev1.LabelHostname: name, corev1.LabelOSStable: "linux"},
		Annotations: map[string]string{KwokNodeAnnotation: "fake"},
	}}
	created, err := c.client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("create node %s: %w", name, err)
	}
	return created, nil
}

// startExtra starts a component beside the apiserver; Stop ends it first.
func (c *Cluster) startExtra(name, bin string, args []string) (*process, error) {
	if bin == "" {
		return nil, errors.New("start " + name + ": no binary (EnsureBinaries did not build it)")
	}
	c.mu.Lock()
	stopped := c.stopped
	c.mu.Unlock()
	if stopped {
		return nil, errors.New("start " + name + ": cluster stopped")
	}
	p, err := startProcess(name, bin, args, filepath.Join(c.dir, name+".log"))
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.extras = append(c.extras, p)
	c.mu.Unlock()
	return p, nil
}
