package chart_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/cli/values"
	"helm.sh/helm/v3/pkg/getter"
	"helm.sh/helm/v3/pkg/release"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/caa-project/caa/test/e2e/cluster"
)

// chartDir is the chart, beside this module's directory.
const chartDir = "caa"

// kubeVersion is the Kubernetes release the chart is rendered for: that of
// the e2e harness's kube-apiserver (test/e2e/tools).
const kubeVersion = "v1.37.2"

// clouds are the clouds with a values file of their own, values-<cloud>.yaml.
var clouds = []string{"aws", "azure", "ibmcloud"}

// valuesFile is a values file of the chart by its short name ("aws",
// "kata", ...).
func valuesFile(name string) string {
	return filepath.Join(chartDir, "values-"+name+".yaml")
}

// releaseNamespace is the namespace the tests install the release into:
// the kustomize tree's.
const releaseNamespace = "caa-system"

// renderChart renders the chart as `helm template caa deploy/chart/caa -n
// caa-system -f files... --set sets...` does.
func renderChart(files []string, sets ...string) ([]byte, error) {
	return renderWith(releaseNamespace, values.Options{ValueFiles: files, Values: sets})
}

// renderChartStrings is renderChart with --set-string.
func renderChartStrings(files []string, sets ...string) ([]byte, error) {
	return renderWith(releaseNamespace, values.Options{ValueFiles: files, StringValues: sets})
}

// renderWith renders the chart with Helm's Go SDK as `helm template -n ns`
// does: client only, the chart's kubeVersion checked against Helm's
// default capabilities.
func renderWith(ns string, opts values.Options) ([]byte, error) {
	rel, err := renderRelease(ns, opts)
	if err != nil {
		return nil, err
	}
	return []byte(rel.Manifest), nil
}

// renderRelease is renderWith's release: its manifest and its hooks (the
// `helm test` objects).
func renderRelease(ns string, opts values.Options) (*release.Release, error) {
	ch, err := loader.Load(chartDir)
	if err != nil {
		return nil, fmt.Errorf("load the chart: %w", err)
	}
	vals, err := opts.MergeValues(getter.Providers{})
	if err != nil {
		return nil, fmt.Errorf("merge the values: %w", err)
	}
	install := action.NewInstall(&action.Configuration{Log: func(string, ...any) {}})
	install.DryRun, install.ClientOnly, install.Replace = true, true, true
	install.ReleaseName, install.Namespace = "caa", ns
	// As `helm template --kube-version`: the test apiserver's release (a
	// test binary has no Kubernetes version stamped into Helm's defaults).
	if install.KubeVersion, err = chartutil.ParseKubeVersion(kubeVersion); err != nil {
		return nil, err
	}
	return install.Run(ch, vals)
}

// mustRender renders the chart or fails t.
func mustRender(t *testing.T, files []string, sets ...string) []byte {
	t.Helper()
	out, err := renderChart(files, sets...)
	require.NoError(t, err, "render the chart with %v %v", files, sets)
	require.NotEmpty(t, out)
	return out
}

// decode splits a multi-document YAML stream into objects.
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

// find returns the object of kind and name, or nil.
func find(objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	return nil
}

// kubectl is the kubectl the e2e harness builds from the Kubernetes release
// of the test apiserver; it renders the kustomize tree and dry-runs.
func kubectl(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: this test builds or finds kubectl and the apiserver")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Minute)
	defer cancel()
	bins, err := cluster.EnsureBinaries(ctx)
	require.NoError(t, err, "build or find the harness binaries")
	require.NotEmpty(t, bins.Kubectl)
	return bins.Kubectl
}

func runKubectl(ctx context.Context, bin string, stdin []byte, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, bin, args...)
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

// kustomize renders deploy/<overlay> with the given deploy/components, as a
// user's kustomization listing both would.
func kustomize(t *testing.T, bin, overlay string, components ...string) []byte {
	t.Helper()
	deploy, err := filepath.Abs("..")
	require.NoError(t, err)
	dir := t.TempDir()
	rel := func(p string) string {
		r, err := filepath.Rel(dir, filepath.Join(deploy, p))
		require.NoError(t, err)
		return r
	}
	var b strings.Builder
	fmt.Fprintf(&b, "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - %s\n", rel(overlay))
	if len(components) > 0 {
		b.WriteString("components:\n")
		for _, c := range components {
			fmt.Fprintf(&b, "  - %s\n", rel(c))
		}
	}
	require.NoError(t, os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(b.String()), 0o644))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := runKubectl(ctx, bin, nil, "kustomize", dir)
	require.NoError(t, err, "render %s with %v", overlay, components)
	return out
}

// generatedName is kustomize's name of a generated ConfigMap: the name and
// a hash of its content.
var generatedName = regexp.MustCompile(`^(caa-config)-[a-z0-9]{10}$`)

// helmLabels are the recommended labels only Helm knows (the release, the
// chart, the version it deploys); kustomize's objects carry the others
// (name, part-of, component).
var helmLabels = []string{"app.kubernetes.io/instance", "app.kubernetes.io/version", "app.kubernetes.io/managed-by", "helm.sh/chart"}

// normalize makes the two renders comparable: kustomize's hashed ConfigMap
// name becomes the chart's plain one (the chart rolls the pods by a checksum
// annotation instead, which is dropped here), Helm's own labels and the
// kept Namespace's resource policy are dropped, and the objects are sorted.
// Everything else must be equal field for field.
func normalize(t *testing.T, objs []*unstructured.Unstructured) []string {
	t.Helper()
	var out []string
	for _, o := range objs {
		m := rewriteStrings(o.Object, func(s string) string { return generatedName.ReplaceAllString(s, "$1") }).(map[string]any)
		u := &unstructured.Unstructured{Object: m}
		for _, path := range [][]string{{"metadata", "labels"}, {"spec", "template", "metadata", "labels"}} {
			labels, found, _ := unstructured.NestedStringMap(m, path...)
			if !found {
				continue
			}
			for _, l := range helmLabels {
				delete(labels, l)
			}
			require.NoError(t, unstructured.SetNestedStringMap(m, labels, path...))
		}
		if u.GetKind() == "Namespace" {
			ann := u.GetAnnotations()
			delete(ann, "helm.sh/resource-policy")
			if len(ann) == 0 {
				ann = nil
			}
			u.SetAnnotations(ann)
		}
		ann, _, _ := unstructured.NestedStringMap(m, "spec", "template", "metadata", "annotations")
		if _, ok := ann["checksum/config"]; ok {
			delete(ann, "checksum/config")
			if len(ann) == 0 {
				unstructured.RemoveNestedField(m, "spec", "template", "metadata", "annotations")
			} else {
				require.NoError(t, unstructured.SetNestedStringMap(m, ann, "spec", "template", "metadata", "annotations"))
			}
		}
		b, err := yaml.Marshal(u.Object)
		require.NoError(t, err)
		out = append(out, fmt.Sprintf("# %s %s/%s\n%s", u.GetKind(), u.GetNamespace(), u.GetName(), b))
	}
	sort.Strings(out)
	return out
}

func rewriteStrings(v any, f func(string) string) any {
	switch x := v.(type) {
	case map[string]any:
		m := make(map[string]any, len(x))
		for k, e := range x {
			m[k] = rewriteStrings(e, f)
		}
		return m
	case []any:
		l := make([]any, len(x))
		for i, e := range x {
			l[i] = rewriteStrings(e, f)
		}
		return l
	case string:
		return f(x)
	default:
		return v
	}
}
