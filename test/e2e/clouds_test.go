package e2e

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/test/e2e/cluster"
	"github.com/caa-project/caa/test/e2e/katanode"
	armfake "github.com/caa-project/caa/test/mocks/azure"
	"github.com/caa-project/caa/test/mocks/cloud"
	vpcfake "github.com/caa-project/caa/test/mocks/ibmcloud"
)

// This file runs scenarios (a), (b) and (c) of TestStartRestartAndRecreate
// on Azure and IBM Cloud VPC: the real `caa run` binary against a real
// kube-apiserver and each cloud's fake wire protocol, with credentials that
// reach the daemon the way they do in production (no test-only code path in
// caa):
//
//   - Azure: caa always builds azidentity's DefaultAzureCredential, whose
//     ManagedIdentityCredential honours App Service's IDENTITY_ENDPOINT and
//     IDENTITY_HEADER. That endpoint is plain http on the loopback interface
//     on App Service too, so a fake of it (managedIdentity below) hands the
//     daemon the one bearer token the fake ARM accepts. The other routes
//     cannot reach a local fake: IMDS is a fixed link-local address, and
//     workload identity asks the cloud's authority host, which caa sets
//     (the public cloud's), so AZURE_AUTHORITY_HOST is ignored.
//   - IBM Cloud: IBMCLOUD_API_KEY, exchanged for a token at the fake's IAM
//     endpoint (--ibmcloud-iam-endpoint), which issues the one token the fake
//     VPC accepts.
//
// Both fakes share the core of test/mocks/cloud, so killing a VM, listing the
// live ones and reading call counters go through the core; what differs per
// cloud is in fakeCloud.

// fakeCloud is what the scenarios need of one cloud: its fake, the daemon's
// flags and environment for it, and the cloud-specific parts of the checks.
type fakeCloud struct {
	name string
	// url is the fake's own address (set where a test needs it).
	url  string
	core *cloud.Cloud
	// args select the provider and point it at the fake.
	args []string
	// env is added to the daemon's environment (see hermeticEnv).
	env []string
	// secrets are the credentials and tokens in play, by name; none may
	// show in caa's output or its ledger (invariant I7).
	secrets map[string]string
	// writes are the fake's counters of mutating calls, all of which must
	// stay at zero on a warm restart.
	writes []string
	// live maps the pod UID of each live VM to the VM's core id, as the
	// cloud's tags say.
	live func() map[string]string
	// authenticated reports how many tokens the credential route under
	// test handed out, and how many requests to it were refused.
	authenticated func() (issued, refused int64)
}

// TestAzureStartRestartAndRecreate is scenarios (a), (b) and (c) on Azure.
func TestAzureStartRestartAndRecreate(t *testing.T) {
	t.Parallel()
	runStartRestartAndRecreate(t, newAzureFake(t))
}

// TestIBMCloudStartRestartAndRecreate is scenarios (a), (b) and (c) on IBM
// Cloud VPC.
func TestIBMCloudStartRestartAndRecreate(t *testing.T) {
	t.Parallel()
	runStartRestartAndRecreate(t, newIBMCloudFake(t))
}

// runStartRestartAndRecreate is the sequence of TestStartRestartAndRecreate
// for any cloud: first start, restart with every VM alive (zero cloud
// writes), restart after VMs were killed behind caa's back.
func runStartRestartAndRecreate(t *testing.T, fc *fakeCloud) {
	ctx := testContext(t, 10*time.Minute)
	const node, n = "worker-1", 12
	c := startWithNode(ctx, t, node)
	pods := map[string]bool{}
	for i := range n {
		pod, err := c.CreatePeerPod(ctx, "team", fmt.Sprintf("pod-%02d", i), node, nil)
		require.NoError(t, err)
		pods[string(pod.UID)] = true
	}
	// Another node's pod: never touched by this node's caa.
	_, err := c.CreateNode(ctx, "worker-2")
	require.NoError(t, err)
	_, err = c.CreatePeerPod(ctx, "team", "elsewhere", "worker-2", nil)
	require.NoError(t, err)

	ledgerPath := filepath.Join(t.TempDir(), "caa", "ledger.db")
	fc.core.SetFaults(cloud.Faults{Latency: 20 * time.Millisecond})
	// onePerPod checks I1 and that exactly this node's pods have VMs.
	onePerPod := func(msg string) {
		t.Helper()
		assert.ElementsMatch(t, slices.Collect(maps.Keys(pods)), slices.Collect(maps.Keys(fc.live())), msg)
		assert.Len(t, fc.core.Live(), n, "%s: one live VM per pod, no more (I1)", msg)
	}
	noSecrets := func(d *daemon) {
		t.Helper()
		out := d.logs.String()
		require.NotEmpty(t, out)
		for name, s := range fc.secrets {
			// Not assert.NotContains: its message would repeat the output.
			assert.False(t, strings.Contains(out, s), "the %s is in caa's output (I7)", name)
		}
	}

	// (a) first start: one VM per pod, ready only once all are recorded.
	d := startCloudDaemon(t, c, fc, node, ledgerPath)
	d.waitReady(t, func() { onePerPod("at the first 200 every pod has its VM") })
	first := fc.live()
	require.Len(t, first, n)
	d.stop(t)
	noSecrets(d)
	assert.Equal(t, first, fc.live(), "SIGTERM deleted nothing (I4)")
	issued, refused := fc.authenticated()
	assert.Positive(t, issued, "caa authenticated through the %s credential route under test", fc.name)
	assert.Zero(t, refused, "no request to the token endpoint was refused")

	// (b) restart with every VM alive: adopted, zero cloud writes.
	fc.core.ResetCounters()
	d = startCloudDaemon(t, c, fc, node, ledgerPath)
	d.waitReady(t, func() {})
	counters := fc.core.Counters()
	for _, op := range append([]string{"created", "deleted"}, fc.writes...) {
		assert.Zero(t, counters[op], "no %s on a warm restart", op)
	}
	assert.Positive(t, counters[cloud.OpList], "the startup pass listed the cloud")
	assert.Equal(t, first, fc.live())
	d.stop(t)
	noSecrets(d)

	// (c) restart after k VMs were killed behind caa's back.
	const k = 3
	killed := map[string]bool{}
	for uid, id := range first {
		if len(killed) == k {
			break
		}
		require.NoError(t, fc.core.Kill(id), "kill %s", uid)
		killed[uid] = true
	}
	d = startCloudDaemon(t, c, fc, node, ledgerPath)
	d.waitReady(t, func() { onePerPod("ready only after the killed VMs were recreated") })
	after := fc.live()
	for uid, id := range first {
		if killed[uid] {
			assert.NotEqual(t, id, after[uid], "pod %s got a new VM", uid)
		} else {
			assert.Equal(t, id, after[uid], "pod %s kept its VM", uid)
		}
	}
	d.stop(t)
	noSecrets(d)

	ledger, err := os.ReadFile(ledgerPath)
	require.NoError(t, err)
	for name, s := range fc.secrets {
		assert.False(t, bytes.Contains(ledger, []byte(s)), "the %s is in the ledger (I7)", name)
	}
}

// startCloudDaemon starts `caa run` for fc, at debug level so that the
// secrets check covers every line caa can write; extra flags come last,
// so they override.
func startCloudDaemon(t *testing.T, c *cluster.Cluster, fc *fakeCloud, node, ledgerPath string, extra ...string) *daemon {
	t.Helper()
	args := append(append([]string{"--log-level", "debug"}, fc.args...), extra...)
	return launchCaa(t, c, node, ledgerPath, fc.name, args, append(hermeticEnv(), fc.env...))
}

// hermeticEnv is this process's environment without anything that could
// hand the daemon other credentials or settings: cloud SDK variables and
// caa's own.
func hermeticEnv() []string { return katanode.HermeticEnv() }

// secret returns a fresh random credential, so that finding it anywhere
// can only mean it leaked.
func secret(prefix string) string { return prefix + strings.ToLower(rand.Text()) }

// Azure.

const (
	azureImage = "Canonical:ubuntu-24_04-lts:server:latest"
	azureSize  = "Standard_DC2as_v5" // AMD SEV-SNP: a confidential size
)

// newAzureFake is the fake ARM for the scenarios, made with opts beyond
// the bearer token (e.g. the fidelity behaviours of
// test/e2e/azure_fidelity_test.go).
func newAzureFake(t *testing.T, opts ...armfake.Option) *fakeCloud {
	t.Helper()
	token := secret("e2e-arm-token-")
	core := cloud.New(cloud.Options{PageSize: 5, Images: []string{azureImage}, Types: []string{azureSize}})
	arm := httptest.NewServer(armfake.NewServer(core, append([]armfake.Option{armfake.WithBearerToken(token)}, opts...)...))
	t.Cleanup(arm.Close)
	mi, miURL := newManagedIdentity(t, token)
	subnet := "/subscriptions/" + armfake.DefaultSubscription +
		"/resourceGroups/caa-net/providers/Microsoft.Network/virtualNetworks/caa-vnet/subnets/peerpods"
	return &fakeCloud{
		name: "azure",
		url:  arm.URL,
		core: core,
		args: []string{"--provider", "azure",
			"--azure-endpoint", arm.URL, // plain http: allowed to loopback only
			"--azure-subscription-id", armfake.DefaultSubscription, "--azure-resource-group", armfake.DefaultResourceGroup,
			"--azure-location", armfake.DefaultLocation, "--azure-subnet-id", subnet,
			"--azure-ssh-public-key", "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGNhYS1lMmUta2V5 caa@e2e",
			"--azure-image", azureImage, "--azure-instance-type", azureSize,
			"--azure-poll-interval", "50ms", "--azure-retry-delay", "50ms"},
		env:           []string{"IDENTITY_ENDPOINT=" + miURL, "IDENTITY_HEADER=" + mi.Header},
		secrets:       map[string]string{"ARM bearer token": token, "managed identity header": mi.Header},
		writes:        []string{cloud.OpCreate, cloud.OpDelete, armfake.OpNICCreate, armfake.OpNICDelete},
		live:          func() map[string]string { return liveVMs(core) }, // ARM tags are the core's tags
		authenticated: func() (int64, int64) { return mi.Issued.Load(), mi.Refused.Load() },
	}
}

func newManagedIdentity(t *testing.T, token string) (*armfake.ManagedIdentity, string) {
	t.Helper()
	mi := &armfake.ManagedIdentity{Token: token, Header: secret("e2e-identity-header-"),
		Refusal: func(why string) { t.Logf("fake managed identity refused a request: %s", why) }}
	srv := httptest.NewServer(mi)
	t.Cleanup(srv.Close)
	return mi, srv.URL + armfake.ManagedIdentityPath
}

// IBM Cloud.

const (
	ibmImage   = "r006-e2e-image"
	ibmProfile = "bx3dc-2x10" // Intel TDX
	ibmZone    = "us-south-1"
)

func newIBMCloudFake(t *testing.T) *fakeCloud {
	t.Helper()
	apiKey, token := secret("e2e-apikey-"), secret("e2e-iam-token-")
	core := cloud.New(cloud.Options{IDPrefix: "0717_", PageSize: 5, Images: []string{ibmImage}, Types: []string{ibmProfile}, Zone: ibmZone})
	vpc := vpcfake.NewServer(core, vpcfake.WithAPIKey(apiKey), vpcfake.WithAccessToken(token))
	var issued, refused atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/identity/token" {
			vpc.ServeHTTP(w, r)
			return
		}
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		vpc.ServeHTTP(sw, r)
		if sw.status == http.StatusOK {
			issued.Add(1)
		} else {
			refused.Add(1)
		}
	}))
	t.Cleanup(srv.Close)
	return &fakeCloud{
		name: "ibmcloud",
		url:  srv.URL,
		core: core,
		args: []string{"--provider", "ibmcloud",
			"--ibmcloud-endpoint", srv.URL + "/v1", "--ibmcloud-iam-endpoint", srv.URL, "--ibmcloud-search-endpoint", srv.URL,
			"--ibmcloud-zone", ibmZone, "--ibmcloud-vpc-id", vpcfake.DefaultVPC, "--ibmcloud-subnet-id", vpcfake.DefaultSubnet,
			"--ibmcloud-resource-group-id", vpcfake.DefaultResourceGroup,
			"--ibmcloud-image", ibmImage, "--ibmcloud-instance-type", ibmProfile},
		env:           []string{"IBMCLOUD_API_KEY=" + apiKey},
		secrets:       map[string]string{"API key": apiKey, "IAM access token": token},
		writes:        []string{cloud.OpCreate, cloud.OpDelete, vpcfake.OpVolumeDelete},
		live:          func() map[string]string { return ibmLiveVMs(t, core) },
		authenticated: func() (int64, int64) { return issued.Load(), refused.Load() },
	}
}

// statusWriter remembers the status of a reply.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(status int) {
	w.status = status
	w.ResponseWriter.WriteHeader(status)
}

// ibmLiveVMs reads the pod UID of each live instance from its boot volume's
// user tags, where VPC keeps an instance's tags. caa escapes user tags, but
// its tag keys and a pod UID are already in the user-tag alphabet, so the
// fake shows them as written.
func ibmLiveVMs(t *testing.T, core *cloud.Cloud) map[string]string {
	out := map[string]string{}
	for _, in := range core.Live() {
		uid := ""
		for _, id := range in.Resources {
			if r, err := core.GetResource(id); err == nil && r.Kind == vpcfake.KindVolume {
				uid = r.Tags[provider.TagPodUID]
			}
		}
		if uid == "" {
			t.Errorf("instance %s has no boot volume with a %s tag", in.ID, provider.TagPodUID)
			continue
		}
		out[uid] = in.ID
	}
	return out
}
