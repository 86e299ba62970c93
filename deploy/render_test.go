// Package deploy_test checks the manifests in deploy/ the way a cluster
// would see them: rendered by kubectl kustomize (kubectl built from the same
// Kubernetes release as the test apiserver), inspected object by object,
// dry-run against a real kube-apiserver, and exercised by the real caa
// binary under the ServiceAccount they define. It also builds the image's
// binary with `make static`, the build `make image` puts in the image.
package deploy_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/caa-project/caa/test/e2e/cluster"
)

// kustomizations are the directories a user may apply, relative to deploy/:
// the base (which every overlay builds on) and one overlay per cloud.
var kustomizations = []string{"base", "overlays/aws", "overlays/azure", "overlays/ibmcloud"}

// components are the kustomize components under deploy/ a user may add to
// an overlay; each is rendered on top of every overlay (withComponent).
var components = []string{"components/no-surge"}

// providerOf is the CAA_PROVIDER each overlay must set.
var providerOf = map[string]string{"overlays/aws": "aws", "overlays/azure": "azure", "overlays/ibmcloud": "ibmcloud"}

// binaryTimeout bounds finding (or, cold, building) the harness binaries
// and building caa.
const binaryTimeout = 50 * time.Minute

// needBinaries skips under -short: like the other built-binary tests of
// the project, these build kubectl, kube-apiserver and caa.
func needBinaries(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: the deploy tests build kubectl, the apiserver and caa")
	}
}

// kubectl returns the kubectl the e2e harness builds from its Kubernetes
// wrapper module, so rendering and dry-runs use the cluster's own release.
func kubectl(t *testing.T) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), binaryTimeout)
	defer cancel()
	bins, err := cluster.EnsureBinaries(ctx)
	require.NoError(t, err, "build or find the harness binaries")
	require.NotEmpty(t, bins.Kubectl, "the harness returned no kubectl")
	return bins.Kubectl
}

// deployDir is the absolute path of deploy/ (the test's working directory).
func deployDir(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	require.NoError(t, err)
	return dir
}

// repoRoot is the repository root, one level above deploy/.
func repoRoot(t *testing.T) string {
	t.Helper()
	return filepath.Dir(deployDir(t))
}

// runKubectl runs kubectl with args, stdin as its input, and returns its
// standard output; a failure carries its standard error.
func runKubectl(ctx context.Context, bin string, stdin []byte, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, bin, args...)
	// No user kubeconfig or cache may leak in: every call names its own.
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.TempDir(), "KUBECONFIG=" + os.DevNull}
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("kubectl %v: %w\n%s", args, err, stderr.Bytes())
	}
	return stdout.Bytes(), nil
}

// render runs `kubectl kustomize` on one kustomization under deploy/.
func render(t *testing.T, kubectlBin, kustomization string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := runKubectl(ctx, kubectlBin, nil, "kustomize", filepath.Join(deployDir(t), kustomization))
	require.NoError(t, err, "render %s", kustomization)
	require.NotEmpty(t, out, "%s rendered to nothing", kustomization)
	return out
}

// withComponent renders overlay (relative to deploy/) with component added,
// as a user's kustomization that lists both would: a kustomization in a
// temporary directory naming the overlay as its resource and the component
// in its components.
func withComponent(t *testing.T, kubectlBin, overlay, component string) []byte {
	t.Helper()
	dir := t.TempDir()
	rel := func(p string) string {
		r, err := filepath.Rel(dir, filepath.Join(deployDir(t), p))
		require.NoError(t, err)
		return r
	}
	k := fmt.Sprintf("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - %s\ncomponents:\n  - %s\n",
		rel(overlay), rel(component))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o644))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := runKubectl(ctx, kubectlBin, nil, "kustomize", dir)
	require.NoError(t, err, "render %s with %s", overlay, component)
	require.NotEmpty(t, out)
	return out
}

// decode splits a rendered multi-document YAML stream into objects.
func decode(t *testing.T, rendered []byte) []*unstructured.Unstructured {
	t.Helper()
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(rendered), 4096)
	var objs []*unstructured.Unstructured
	for {
		var m map[string]any
		err := dec.Decode(&m)
		if errors.Is(err, io.EOF) {
			return objs
		}
		require.NoError(t, err, "decode rendered manifests")
		if len(m) == 0 {
			continue
		}
		objs = append(objs, &unstructured.Unstructured{Object: m})
	}
}

// manifests are one kustomization's rendered objects, by kind.
type manifests struct {
	name string
	all  []*unstructured.Unstructured
}

func (m manifests) ofKind(kind string) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, o := range m.all {
		if o.GetKind() == kind {
			out = append(out, o)
		}
	}
	return out
}

// one returns the only object of kind, failing t if there is not exactly one.
func (m manifests) one(t *testing.T, kind string) *unstructured.Unstructured {
	t.Helper()
	objs := m.ofKind(kind)
	require.Len(t, objs, 1, "%s renders exactly one %s", m.name, kind)
	return objs[0]
}

func (m manifests) daemonSet(t *testing.T) *appsv1.DaemonSet {
	t.Helper()
	var ds appsv1.DaemonSet
	require.NoError(t, k8sruntime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(m.one(t, "DaemonSet").Object, &ds, true),
		"%s: the DaemonSet has fields apps/v1 does not know", m.name)
	return &ds
}

func (m manifests) configMap(t *testing.T) *corev1.ConfigMap {
	t.Helper()
	var cm corev1.ConfigMap
	require.NoError(t, k8sruntime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(m.one(t, "ConfigMap").Object, &cm, true))
	return &cm
}

// renderAll renders every kustomization once.
func renderAll(t *testing.T) map[string]manifests {
	t.Helper()
	bin := kubectl(t)
	out := map[string]manifests{}
	for _, k := range kustomizations {
		out[k] = manifests{name: k, all: decode(t, render(t, bin, k))}
	}
	return out
}

// buildCaa builds caa with `make static CLOUDS=clouds` into dir and
// returns its path. srcDir is the directory make runs in (the
// repository); clouds is "" for every cloud, or
// the one cloud an overlay's image holds.
func buildCaa(t *testing.T, srcDir, dir, version, clouds string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), binaryTimeout)
	defer cancel()
	bin := filepath.Join(dir, "caa")
	// The link is shared with other runs through the e2e binary cache: make
	// static's go build -o relinks the cached copy only when it is stale.
	key := []string{"make static", srcDir, version, clouds}
	require.NoError(t, cluster.CachedBuild(ctx, key, bin, func(cached string) error {
		cmd := exec.CommandContext(ctx, "make", "--no-print-directory", "-C", srcDir, "static",
			"VERSION="+version, "STATIC_OUT="+cached, "CLOUDS="+clouds)
		// GOWORK=off: build the module as the image does, whatever go.work a
		// developer has above it; -mod=readonly: go.mod and go.sum must already
		// be complete, as in a clean build context.
		cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=readonly", "GOOS="+runtime.GOOS, "GOARCH="+runtime.GOARCH)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("make static CLOUDS=%s in %s: %w\n%s", clouds, srcDir, err, out)
		}
		return nil
	}))
	return bin
}

// builtCaa holds the repository's builds of caa by CLOUDS, made once for
// all the tests of the package (a link of caa takes a while on a shared
// machine); TestMain removes them.
var builtCaa struct {
	sync.Mutex
	dir  string
	bins map[string]string
}

// repoCaa returns caa built from the repository with `make static
// CLOUDS=clouds`, as the image for those clouds holds it.
func repoCaa(t *testing.T, clouds string) string {
	t.Helper()
	builtCaa.Lock()
	defer builtCaa.Unlock()
	if bin, ok := builtCaa.bins[clouds]; ok {
		return bin
	}
	if builtCaa.dir == "" {
		dir, err := os.MkdirTemp("", "caa-deploy-test-")
		require.NoError(t, err)
		builtCaa.dir, builtCaa.bins = dir, map[string]string{}
	}
	dir := filepath.Join(builtCaa.dir, "clouds-"+clouds)
	require.NoError(t, os.MkdirAll(dir, 0o755))
	bin := buildCaa(t, repoRoot(t), dir, testVersion, clouds)
	builtCaa.bins[clouds] = bin
	return bin
}

// testVersion is the version stamped into the binaries the tests build.
const testVersion = "v0.0.0-deploy-test"

func TestMain(m *testing.M) {
	code := m.Run()
	if builtCaa.dir != "" {
		_ = os.RemoveAll(builtCaa.dir)
	}
	os.Exit(code)
}
