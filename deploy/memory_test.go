package deploy_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// memoryFile holds the measured peak RSS of each build of caa and the
// rule that turns a peak into a memory request and limit. The numbers in
// it are measurements (deploy/README.md, The image, says how they were
// taken); the tests below hold the manifests and the README to them.
const memoryFile = "memory.json"

// Floors of the rule, so that the headroom cannot be edited away in
// memory.json itself: the issue asks for a request of about 1.5 times the
// measured peak and a limit of two to three times the request.
const (
	minRequestOverPeak  = 1.5
	minLimitOverRequest = 2.0
)

type memoryRecord struct {
	About    string `json:"about"`
	Measured string `json:"measured"`
	Machine  string `json:"machine"`
	Method   string `json:"method"`
	PeerPods int    `json:"peerPods"`
	// DensePeerPods is the crowded node the limit must also cover.
	DensePeerPods int `json:"densePeerPods"`
	Rule          struct {
		RequestOverPeak  float64 `json:"requestOverPeak"`
		LimitOverRequest float64 `json:"limitOverRequest"`
		Text             string  `json:"text"`
	} `json:"rule"`
	Builds []memoryBuild `json:"builds"`
}

// memoryBuild is one build's measurement.
type memoryBuild struct {
	// Clouds is the CLOUDS the build was made with ("" for every cloud),
	// which is also what `make image` puts in its tag.
	Clouds string `json:"clouds"`
	// DeployedBy are the kustomizations (relative to deploy/) whose
	// DaemonSet runs this build.
	DeployedBy []string `json:"deployedBy"`
	// RunsMiB are the peak RSS of each run with PeerPods on the node, in
	// MiB; the request is sized from them.
	RunsMiB []float64 `json:"runsMiB"`
	// DenseRunsMiB are the same with DensePeerPods on the node; the limit
	// must hold them.
	DenseRunsMiB []float64 `json:"denseRunsMiB"`
}

// peak is the highest run: the request is sized from the worst run seen,
// not the typical one.
func (b memoryBuild) peak() float64 { return slices.Max(b.RunsMiB) }

func (b memoryBuild) median() float64 {
	vs := slices.Clone(b.RunsMiB)
	slices.Sort(vs)
	n := len(vs)
	if n%2 == 1 {
		return vs[n/2]
	}
	return (vs[n/2-1] + vs[n/2]) / 2
}

// tagSuffix is what `make image CLOUDS=<clouds>` appends to the version.
func (b memoryBuild) tagSuffix() string {
	if b.Clouds == "" {
		return ""
	}
	return "-" + strings.ReplaceAll(b.Clouds, ",", "-")
}

func readMemory(t *testing.T) memoryRecord {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(deployDir(t), memoryFile))
	require.NoError(t, err)
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	var m memoryRecord
	require.NoError(t, dec.Decode(&m), "%s", memoryFile)
	return m
}

// build returns the build a kustomization deploys, failing t unless
// memory.json names exactly one.
func (m memoryRecord) build(t *testing.T, kustomization string) memoryBuild {
	t.Helper()
	var found []memoryBuild
	for _, b := range m.Builds {
		if slices.Contains(b.DeployedBy, kustomization) {
			found = append(found, b)
		}
	}
	require.Len(t, found, 1, "%s names exactly one measured build for %s", memoryFile, kustomization)
	return found[0]
}

// TestMemoryRecord checks memory.json on its own: every kustomization has
// one measured build, every overlay runs its own cloud's build, the rule
// keeps at least the headroom the issue asks for, and deploy/README.md
// shows the same numbers.
func TestMemoryRecord(t *testing.T) {
	m := readMemory(t)
	assert.GreaterOrEqual(t, m.Rule.RequestOverPeak, minRequestOverPeak, "rule: request over peak")
	assert.GreaterOrEqual(t, m.Rule.LimitOverRequest, minLimitOverRequest, "rule: limit over request")
	assert.NotEmpty(t, m.Rule.Text)
	assert.Equal(t, 1000, m.PeerPods, "the peaks are for 1,000 peer pods on the node")
	assert.Greater(t, m.DensePeerPods, m.PeerPods, "the dense node has more peer pods")
	assert.NotEmpty(t, m.Measured)
	assert.NotEmpty(t, m.Method)
	for _, b := range m.Builds {
		assert.GreaterOrEqual(t, len(b.RunsMiB), 3, "build %q: a peak is several runs, not one", b.Clouds)
		assert.NotEmpty(t, b.DenseRunsMiB, "build %q: measured on a dense node too", b.Clouds)
		for _, v := range append(slices.Clone(b.RunsMiB), b.DenseRunsMiB...) {
			assert.Greater(t, v, 0.0, "build %q", b.Clouds)
		}
		if b.Clouds != "" {
			for _, c := range strings.Split(b.Clouds, ",") {
				assert.Contains(t, slices.Collect(maps.Values(providerOf)), c, "build %q names no known cloud", b.Clouds)
			}
		}
	}
	for _, k := range kustomizations {
		b := m.build(t, k)
		if provider, ok := providerOf[k]; ok {
			assert.Equal(t, provider, b.Clouds, "%s deploys its own cloud's one-cloud build, not %q", k, b.Clouds)
		} else {
			assert.Empty(t, b.Clouds, "%s holds the every-cloud image", k)
		}
	}

	readme, err := os.ReadFile(filepath.Join(deployDir(t), "README.md"))
	require.NoError(t, err)
	for _, b := range m.Builds {
		row := readmeRow(t, string(readme), "`caa:<version>"+b.tagSuffix()+"`")
		for _, v := range []float64{b.median(), b.peak(), slices.Max(b.DenseRunsMiB)} {
			assert.Contains(t, strings.Join(row, "|"), fmt.Sprintf("%.1f MiB", v), "README.md's row for build %q shows its measurement", b.Clouds)
		}
	}
	// Each overlay's README repeats its own build's numbers.
	for name := range providerOf {
		b := m.build(t, name)
		raw, err := os.ReadFile(filepath.Join(deployDir(t), name, "README.md"))
		require.NoError(t, err)
		for _, v := range []float64{b.median(), b.peak(), slices.Max(b.DenseRunsMiB)} {
			assert.Contains(t, string(raw), fmt.Sprintf("%.1f", v), "%s/README.md shows its build's measurement", name)
		}
	}
}

// readmeRow returns the cells of the one table row of readme whose image
// cell is image.
func readmeRow(t *testing.T, readme, image string) []string {
	t.Helper()
	var rows [][]string
	for _, line := range strings.Split(readme, "\n") {
		if !strings.HasPrefix(line, "|") {
			continue
		}
		var cells []string
		for _, c := range strings.Split(strings.Trim(line, "|"), "|") {
			cells = append(cells, strings.TrimSpace(c))
		}
		if slices.Contains(cells, image) {
			rows = append(rows, cells)
		}
	}
	require.Len(t, rows, 1, "deploy/README.md has one table row for %s", image)
	return rows[0]
}

// TestOverlayImageAndMemory renders every kustomization and checks that
// it runs the build memory.json measured for it, tagged as `make image`
// tags that build, and that its memory request and limit keep the
// measured headroom. An overlay that deploys the every-cloud image, or a
// request that falls below the recorded peak times the rule, fails here.
func TestOverlayImageAndMemory(t *testing.T) {
	needBinaries(t)
	m := readMemory(t)
	readme, err := os.ReadFile(filepath.Join(deployDir(t), "README.md"))
	require.NoError(t, err)
	for name, r := range renderAll(t) {
		t.Run(name, func(t *testing.T) {
			b := m.build(t, name)
			c := container(t, r.daemonSet(t))

			// The image: what `make image CLOUDS=<the build's clouds>`
			// tags at the placeholder version, and nothing else; the base
			// (every cloud's build) names the placeholder each overlay
			// replaces.
			if b.Clouds == "" {
				assert.Equal(t, basePlaceholder, c.Image, "%s names the placeholder image the overlays replace", name)
			} else {
				assert.Equal(t, makeImageTags(t, b.Clouds, "dev"), []string{c.Image}, "%s deploys the image `make image CLOUDS=%s` builds", name, b.Clouds)
			}
			tag := c.Image[strings.LastIndex(c.Image, ":")+1:]
			if cloud, ok := providerOf[name]; ok {
				assert.True(t, strings.HasSuffix(tag, "-"+cloud), "%s deploys %s, not its one-cloud image (tag ending -%s)", name, c.Image, cloud)
			}

			req, lim := c.Resources.Requests[corev1.ResourceMemory], c.Resources.Limits[corev1.ResourceMemory]
			require.False(t, req.IsZero(), "%s requests memory", name)
			require.False(t, lim.IsZero(), "%s limits memory", name)
			peak := mib(b.peak())
			assert.GreaterOrEqual(t, req.Cmp(peak), 0,
				"%s requests %s, below the measured peak RSS of its build (%.1f MiB)", name, req.String(), b.peak())
			want := mib(b.peak() * m.Rule.RequestOverPeak)
			assert.GreaterOrEqual(t, req.Cmp(want), 0,
				"%s requests %s, less than %.1f x the measured peak %.1f MiB (%s)", name, req.String(), m.Rule.RequestOverPeak, b.peak(), m.Rule.Text)
			wantLim := mib(float64(req.Value()) / (1 << 20) * m.Rule.LimitOverRequest)
			assert.GreaterOrEqual(t, lim.Cmp(wantLim), 0,
				"%s limits memory to %s, less than %.1f x its request %s (%s)", name, lim.String(), m.Rule.LimitOverRequest, req.String(), m.Rule.Text)
			dense := slices.Max(b.DenseRunsMiB)
			assert.GreaterOrEqual(t, lim.Cmp(mib(dense)), 0,
				"%s limits memory to %s, below its build's peak with %d peer pods (%.1f MiB)", name, lim.String(), m.DensePeerPods, dense)

			// The README's row shows what the manifests hold.
			row := readmeRow(t, string(readme), "`caa:<version>"+b.tagSuffix()+"`")
			assert.Contains(t, row, req.String(), "README.md's row for %s shows its request", name)
			assert.Contains(t, row, lim.String(), "README.md's row for %s shows its limit", name)
			if _, ok := providerOf[name]; ok {
				raw, err := os.ReadFile(filepath.Join(deployDir(t), name, "README.md"))
				require.NoError(t, err)
				assert.Contains(t, string(raw), "| "+req.String()+" | "+lim.String()+" |", "%s/README.md shows its request and limit", name)
			}
		})
	}
}

// mib is v MiB as a quantity, rounded up to a whole MiB.
func mib(v float64) resource.Quantity {
	return *resource.NewQuantity(int64(math.Ceil(v))<<20, resource.BinarySI)
}

// makeImageTags returns the tags `make image` gives the images built with
// clouds at version, one per cloud, read off `make -n` (which builds
// nothing): internal/imagebuild tags each <repo>:<version>-<cloud>.
func makeImageTags(t *testing.T, clouds, version string) []string {
	t.Helper()
	out, err := makeDryRun(t, "image", "CLOUDS="+clouds, "VERSION="+version)
	require.NoError(t, err, "make -n image CLOUDS=%s:\n%s", clouds, out)
	return imageTags(t, out)
}

// imageTags reads the tags off `make -n image`'s imagebuild lines.
func imageTags(t *testing.T, out string) []string {
	t.Helper()
	builds := regexp.MustCompile(`(?m)go run ./internal/imagebuild .*-cloud (\S+) -version (\S+) -repo (\S+) `).FindAllStringSubmatch(out, -1)
	require.NotEmpty(t, builds, "make -n image prints its imagebuild runs:\n%s", out)
	var tags []string
	for _, m := range builds {
		tags = append(tags, m[3]+":"+m[2]+"-"+m[1])
	}
	return tags
}

// basePlaceholder is the base's image: no build makes it; each overlay
// replaces it with its one-cloud image (`make image` builds one per cloud).
const basePlaceholder = "caa:dev"

// makeDryRun runs `make -n` on a target of the repository's Makefile.
func makeDryRun(t *testing.T, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// IMAGE and IMAGE_REPO from the caller's environment would change the
	// answer; the test asks about the defaults.
	cmd := exec.CommandContext(ctx, "make", append([]string{"--no-print-directory", "-n", "-C", repoRoot(t)}, args...)...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "IMAGE=") && !strings.HasPrefix(kv, "IMAGE_REPO=") && !strings.HasPrefix(kv, "CLOUDS=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestImageTagRules: `make image` builds one image per cloud, each tagged
// with its cloud, and refuses a cloud name that would silently build
// another set.
func TestImageTagRules(t *testing.T) {
	for _, c := range []struct {
		args []string
		want []string // the tags, or nil when make must refuse
	}{
		{[]string{"CLOUDS=aws", "VERSION=v1.2.3"}, []string{"caa:v1.2.3-aws"}},
		{[]string{"CLOUDS=azure", "VERSION=v1.2.3", "IMAGE_REPO=registry.example.com/caa"}, []string{"registry.example.com/caa:v1.2.3-azure"}},
		{[]string{"CLOUDS=aws,ibmcloud", "VERSION=v1.2.3"}, []string{"caa:v1.2.3-aws", "caa:v1.2.3-ibmcloud"}},
		{[]string{"VERSION=v1.2.3"}, []string{"caa:v1.2.3-aws", "caa:v1.2.3-azure", "caa:v1.2.3-ibmcloud"}},
		{[]string{"CLOUDS=ec2", "VERSION=v1.2.3"}, nil},
	} {
		out, err := makeDryRun(t, append([]string{"image"}, c.args...)...)
		if c.want == nil {
			assert.Error(t, err, "make image %v is refused:\n%s", c.args, out)
			continue
		}
		require.NoError(t, err, "make image %v:\n%s", c.args, out)
		assert.Equal(t, c.want, imageTags(t, out), "make image %v", c.args)
	}
	out, err := makeDryRun(t, "static", "CLOUDS=aws,ec2")
	assert.Error(t, err, "make static refuses an unknown cloud:\n%s", out)
}

// TestDocumentedImages: the commands the overlays' READMEs give build and
// deploy that overlay's one-cloud image.
func TestDocumentedImages(t *testing.T) {
	setImage := regexp.MustCompile(`kustomize edit set image caa=(\S+)`)
	makeImage := regexp.MustCompile(`make image\b[^\n]*`)
	for name, cloud := range providerOf {
		raw, err := os.ReadFile(filepath.Join(deployDir(t), name, "README.md"))
		require.NoError(t, err)
		text := string(raw)
		sets := setImage.FindAllStringSubmatch(text, -1)
		require.NotEmpty(t, sets, "%s/README.md says how to set the image", name)
		for _, s := range sets {
			assert.True(t, strings.HasSuffix(s[1], "-"+cloud), "%s/README.md sets the image %s, not the %s one-cloud image", name, s[1], cloud)
		}
		builds := makeImage.FindAllString(text, -1)
		require.NotEmpty(t, builds, "%s/README.md says how to build the image", name)
		for _, b := range builds {
			assert.Contains(t, b, "CLOUDS="+cloud, "%s/README.md builds the %s image: %s", name, cloud, b)
		}
	}
}
