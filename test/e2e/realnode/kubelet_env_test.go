package realnode

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/caa-project/caa/test/e2e/cluster"
	"github.com/caa-project/caa/test/e2e/katanode"
	"github.com/caa-project/caa/test/e2e/rollout"
	podvmfake "github.com/caa-project/caa/test/mocks/podvm"
)

// repoRoot is the repository's root, from this package's directory.
func repoRoot(t testing.TB) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", "..", ".."))
	require.NoError(t, err)
	return root
}

// caaImageTag is the tag `make image` gives the image built here.
const (
	caaImageRepo    = "localhost/caa"
	caaImageVersion = "realnode"
	caaImageTag     = caaImageRepo + ":" + caaImageVersion + "-aws"
)

// buildCAAImage runs `make image CLOUDS=aws` into a temporary directory and
// returns the archive: the image as a user builds it, not a test build.
func buildCAAImage(ctx context.Context, t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	cmd := exec.CommandContext(ctx, "make", "--no-print-directory", "image", "CLOUDS=aws",
		"IMAGE_DIR="+dir, "IMAGE_REPO="+caaImageRepo, "VERSION="+caaImageVersion)
	cmd.Dir = repoRoot(t)
	start := time.Now()
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "make image CLOUDS=aws:\n%s", out)
	archive := filepath.Join(dir, "caa-"+caaImageVersion+"-aws.tar")
	require.FileExists(t, archive)
	t.Logf("make image CLOUDS=aws: %s in %s", archive, time.Since(start).Round(time.Second))
	return archive
}

// serveKubernetesService makes the kubernetes Service's ClusterIP answer in
// the node's namespace: what kube-proxy does on a real node, so that caa's
// in-cluster configuration (KUBERNETES_SERVICE_HOST, from the kubelet)
// reaches the apiserver. The address goes on the namespace's loopback and
// a forwarder pipes it to the apiserver on this process's loopback.
func serveKubernetesService(ctx context.Context, t testing.TB, c *cluster.Cluster, netns string) {
	t.Helper()
	svc, err := c.Client().CoreV1().Services(metav1.NamespaceDefault).Get(ctx, "kubernetes", metav1.GetOptions{})
	require.NoError(t, err, "the kubernetes Service")
	ip, err := netip.ParseAddr(svc.Spec.ClusterIP)
	require.NoError(t, err)
	require.NoError(t, podvmfake.InNetNS(netns, func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		return netlink.AddrAdd(lo, &netlink.Addr{IPNet: &net.IPNet{IP: ip.AsSlice(), Mask: net.CIDRMask(32, 32)}})
	}), "the Service's address on the node's loopback")
	port := svc.Spec.Ports[0].Port
	_, stop, err := katanode.Forward(netns, net.JoinHostPort(ip.String(), fmt.Sprint(port)), "", strings.TrimPrefix(c.URL(), "https://"))
	require.NoError(t, err)
	t.Cleanup(stop)
}

// kataManifests is the test's kustomization: deploy/overlays/aws with the
// kata components (the remote hypervisor and the relay) as deploy/README.md
// says to deploy the kata mode, the image built here, and the node's fake
// EC2.
const kataManifests = `apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - {{OVERLAY}}
  - credentials.yaml
components:
  - {{KATA}}
  - {{RELAY}}
images:
  - name: caa
    newName: ` + caaImageRepo + `
    newTag: {{TAG}}
configMapGenerator:
  - name: caa-config
    behavior: merge
    literals:
{{LITERALS}}
patches:
` + rollout.FastProbesPatch

// renderCAA renders the kata manifests with kubectl kustomize, and points
// the node's state hostPaths at dirs (prefix -> directory): the ledger's
// /var/lib/caa and the kubelet's /var/lib/kubelet live in the test's
// directories rather than on the machine. kata's own paths (/run/peerpod,
// /run/netns, /run/vc/sbs) stay as shipped: the shim dials them there.
func renderCAA(ctx context.Context, t testing.TB, endpoint, tag string, hostPaths map[string]string) []*unstructured.Unstructured {
	t.Helper()
	kust := t.TempDir()
	deploy := filepath.Join(repoRoot(t), "deploy")
	rel := func(p string) string {
		r, err := filepath.Rel(kust, filepath.Join(deploy, p))
		require.NoError(t, err)
		return r
	}
	literals := strings.ReplaceAll(rollout.FakeEC2Literals(katanode.EC2Image, katanode.EC2Type), "{{ENDPOINT}}", endpoint)
	k := strings.NewReplacer("{{OVERLAY}}", rel("overlays/aws"), "{{KATA}}", rel("components/kata-remote-hypervisor"),
		"{{RELAY}}", rel("components/relay"), "{{TAG}}", tag, "{{LITERALS}}", literals).Replace(kataManifests)
	require.NoError(t, os.WriteFile(filepath.Join(kust, "kustomization.yaml"), []byte(k), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(kust, "credentials.yaml"), []byte(rollout.CredentialsSecret("AKIDREALNODE", "realnode-secret")), 0o600))
	bins, err := cluster.EnsureBinaries(ctx)
	require.NoError(t, err)
	out, err := exec.CommandContext(ctx, bins.Kubectl, "kustomize", kust).Output()
	require.NoError(t, err, "kubectl kustomize")
	var objs []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(out), 4096)
	for {
		var u unstructured.Unstructured
		if err := dec.Decode(&u.Object); err == io.EOF {
			break
		} else {
			require.NoError(t, err)
		}
		if len(u.Object) == 0 {
			continue
		}
		if u.GetKind() == "DaemonSet" {
			volumes, _, err := unstructured.NestedSlice(u.Object, "spec", "template", "spec", "volumes")
			require.NoError(t, err)
			for _, v := range volumes {
				path, ok, _ := unstructured.NestedString(v.(map[string]any), "hostPath", "path")
				if !ok {
					continue
				}
				for from, to := range hostPaths {
					if path == from || strings.HasPrefix(path, from+"/") {
						require.NoError(t, unstructured.SetNestedField(v.(map[string]any), to+strings.TrimPrefix(path, from), "hostPath", "path"))
					}
				}
			}
			require.NoError(t, unstructured.SetNestedSlice(u.Object, volumes, "spec", "template", "spec", "volumes"))
		}
		objs = append(objs, &u)
	}
	return objs
}

// applyObjects applies objs with kubectl apply (server-side), as a user
// would apply the rendered manifests.
func applyObjects(ctx context.Context, t testing.TB, c *cluster.Cluster, objs []*unstructured.Unstructured) {
	t.Helper()
	var b bytes.Buffer
	for _, o := range objs {
		y, err := yaml.Marshal(o.Object)
		require.NoError(t, err)
		b.WriteString("---\n")
		b.Write(y)
	}
	bins, err := cluster.EnsureBinaries(ctx)
	require.NoError(t, err)
	cmd := exec.CommandContext(ctx, bins.Kubectl, "--kubeconfig", c.Kubeconfig(), "apply", "--server-side", "-f", "-")
	cmd.Stdin = &b
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "kubectl apply:\n%s", out)
}

// kubectl runs the cluster's kubectl with the admin kubeconfig.
func kubectl(ctx context.Context, c *cluster.Cluster, args ...string) (string, error) {
	bins, err := cluster.EnsureBinaries(ctx)
	if err != nil {
		return "", err
	}
	return run(ctx, bins.Kubectl, append([]string{"--kubeconfig", c.Kubeconfig()}, args...)...)
}

// podReady says whether pod's Ready condition is True.
func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// restarts sums the restart counts of pod's containers.
func restarts(p *corev1.Pod) int32 {
	var n int32
	for _, s := range p.Status.ContainerStatuses {
		n += s.RestartCount
	}
	return n
}
