package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/caa-project/caa/test/e2e/cluster"
	ec2fake "github.com/caa-project/caa/test/mocks/aws"
	armfake "github.com/caa-project/caa/test/mocks/azure"
	"github.com/caa-project/caa/test/mocks/cloud"
)

// This file runs the real caa binary on Azure workload identity and under
// the least-privilege role of deploy/overlays/azure/role.json:
//
//   - a real ServiceAccount token from the test apiserver's TokenRequest
//     API (audience api://AzureADTokenExchange) in the file named by
//     AZURE_FEDERATED_TOKEN_FILE, with AZURE_CLIENT_ID, AZURE_TENANT_ID and
//     AZURE_AUTHORITY_HOST, the variables AKS's workload identity webhook
//     injects. caa's DefaultAzureCredential exchanges it at a fake Entra ID
//     (https, trusted through SSL_CERT_FILE) that verifies the JWT against
//     the apiserver's published JWKS, its issuer, audience, expiry and
//     subject, and issues access tokens that live 3 seconds, so they expire
//     and are renewed many times a run.
//   - the fake ARM accepts only those access tokens, until they expire, and
//     authorizes every call against the shipped role.
//
// The token file is rotated during the run, as the kubelet does. azidentity
// rereads the file at most every 10 minutes, and the kubelet rotates a
// token at 80% of a life of at least an hour, so the old token stays good
// (Entra accepts it until its exp): the test checks that caa keeps working
// across the rotation without a restart, not that the new file was read
// within the run.

const (
	azureTenantID = "72f988bf-0000-4000-8000-0000000caa01"
	azureClientID = "0c1d2e3f-0000-4000-8000-0000000caa02"
	azureNSG      = "/subscriptions/" + armfake.DefaultSubscription +
		"/resourceGroups/caa-net/providers/Microsoft.Network/networkSecurityGroups/peerpods-nsg"
)

// shippedAzureRole is deploy/overlays/azure/role.json.
func shippedAzureRole(t *testing.T) *armfake.Role {
	t.Helper()
	r, err := armfake.ReadRole(filepath.Join("..", "..", "deploy", "overlays", "azure", "role.json"))
	require.NoError(t, err)
	return r
}

// azureRoleCloud is a fake ARM under a role the test holds, knowing one
// subnet, and caa's flags for it (a security group set, so every action of
// the role is used).
type azureRoleCloud struct {
	core *cloud.Cloud
	role atomic.Pointer[armfake.Role]
	args []string
}

func newAzureRoleCloud(t *testing.T, auth armfake.Option) *azureRoleCloud {
	t.Helper()
	ac := &azureRoleCloud{core: cloud.New(cloud.Options{PageSize: 5, Images: []string{azureImage}, Types: []string{azureSize}})}
	ac.role.Store(shippedAzureRole(t))
	subnet := "/subscriptions/" + armfake.DefaultSubscription +
		"/resourceGroups/caa-net/providers/Microsoft.Network/virtualNetworks/caa-vnet/subnets/peerpods"
	arm := httptest.NewServer(armfake.NewServer(ac.core, auth, armfake.WithRole(ac.role.Load), armfake.WithSubnets(subnet)))
	t.Cleanup(arm.Close)
	ac.args = []string{"--provider", "azure", "--azure-endpoint", arm.URL,
		"--azure-subscription-id", armfake.DefaultSubscription, "--azure-resource-group", armfake.DefaultResourceGroup,
		"--azure-location", armfake.DefaultLocation, "--azure-subnet-id", subnet, "--azure-security-group-id", azureNSG,
		"--azure-ssh-public-key", "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGNhYS1lMmUta2V5 caa@e2e",
		"--azure-image", azureImage, "--azure-instance-type", azureSize,
		"--azure-poll-interval", "50ms", "--azure-retry-delay", "50ms", "--log-level", "debug"}
	return ac
}

// TestAzureIdentityWorkloadIdentity runs caa on AKS workload identity
// under the shipped role: caa starts and creates a VM per pod with access
// tokens from the fake Entra ID; the tokens expire many times and the
// federated token file is rotated while it runs; a new pod gets its VM and
// a deleted pod loses its VM, without a restart; no token appears in caa's
// output, events, /status or ledger.
func TestAzureIdentityWorkloadIdentity(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	c := cluster.Start(ctx, t)

	// The fake Entra ID trusts the apiserver's service-account issuer.
	rc := c.Client().CoreV1().RESTClient()
	disco, err := rc.Get().AbsPath("/.well-known/openid-configuration").DoRaw(ctx)
	require.NoError(t, err, "the apiserver's OIDC discovery document")
	var oidc struct {
		Issuer string `json:"issuer"`
	}
	require.NoError(t, json.Unmarshal(disco, &oidc))
	jwks, err := rc.Get().AbsPath("/openid/v1/jwks").DoRaw(ctx)
	require.NoError(t, err, "the apiserver's JWKS")
	verify, err := ec2fake.JWKSVerifier(jwks, oidc.Issuer, armfake.EntraAudience, nil)
	require.NoError(t, err)
	entra := &armfake.Entra{TenantID: azureTenantID, ClientID: azureClientID, Subject: "system:serviceaccount:" + saNamespace + ":" + saName,
		Lifetime: 3 * time.Second, Grace: 2 * time.Second,
		Verify:  func(tok string) (string, error) { return verify(tok) },
		Refusal: func(why string) { t.Logf("fake Entra ID refused a request: %s", why) }}
	idp := httptest.NewTLSServer(entra)
	t.Cleanup(idp.Close)
	certFile := filepath.Join(t.TempDir(), "entra-ca.pem")
	require.NoError(t, os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: idp.Certificate().Raw}), 0o600))

	ac := newAzureRoleCloud(t, armfake.WithAccessTokens(entra.Check))
	tokenFile := filepath.Join(t.TempDir(), "azure-identity-token")
	writeFile := func(tok string) {
		require.NoError(t, os.WriteFile(tokenFile+".new", []byte(tok), 0o600))
		require.NoError(t, os.Rename(tokenFile+".new", tokenFile))
	}
	secrets := map[string]string{}
	first := saToken(ctx, t, c, armfake.EntraAudience)
	secrets["federated token"] = first
	writeFile(first)
	env := append(hermeticEnv(), "AZURE_CLIENT_ID="+azureClientID, "AZURE_TENANT_ID="+azureTenantID,
		"AZURE_FEDERATED_TOKEN_FILE="+tokenFile, "AZURE_AUTHORITY_HOST="+idp.URL+"/",
		"CAA_AZURE_DISABLE_INSTANCE_DISCOVERY=true", "SSL_CERT_FILE="+certFile)

	const node = "worker-1"
	_, err = c.CreateNode(ctx, node)
	require.NoError(t, err)
	for i := range 3 {
		_, err := c.CreatePeerPod(ctx, "team", fmt.Sprintf("pod-%d", i), node, nil)
		require.NoError(t, err)
	}
	ledgerPath := filepath.Join(t.TempDir(), "caa", "ledger.db")
	d := launchCaa(t, c, node, ledgerPath, "azure workload identity", ac.args, env)
	d.waitReady(t, func() { assert.Len(t, liveVMs(ac.core), 3, "at the first 200 every pod has its VM") })
	require.Positive(t, entra.IssuedFor(first), "Entra ID issued tokens for the ServiceAccount token")
	atReady := entra.Issued.Load()

	// The access tokens expire (3s) and are renewed while caa runs: the
	// audit every 2s needs fresh ones.
	require.Eventually(t, func() bool { return entra.Issued.Load() >= atReady+3 }, time.Minute, 100*time.Millisecond,
		"caa renewed its expiring access tokens")

	// Rotation, as the kubelet does it: a new token in the file.
	rotated := saToken(ctx, t, c, armfake.EntraAudience)
	require.NotEqual(t, first, rotated)
	secrets["rotated federated token"] = rotated
	writeFile(rotated)
	atRotation := entra.Issued.Load()

	_, err = c.CreatePeerPod(ctx, "team", "pod-new", node, nil)
	require.NoError(t, err)
	require.NoError(t, c.DeletePod(ctx, "team", "pod-0"))
	require.Eventually(t, func() bool {
		live := liveVMs(ac.core)
		pods, err := c.Client().CoreV1().Pods("team").List(ctx, metav1.ListOptions{})
		if err != nil || len(live) != 3 {
			return false
		}
		for _, p := range pods.Items {
			if _, ok := live[string(p.UID)]; !ok {
				return false
			}
		}
		return true
	}, time.Minute, 100*time.Millisecond, "the new pod got a VM and the deleted pod's VM went, after the rotation, without a restart")
	require.Eventually(t, func() bool { return entra.Issued.Load() >= atRotation+3 }, time.Minute, 100*time.Millisecond,
		"tokens keep being renewed after the rotation")
	assert.Equal(t, http.StatusOK, d.readyz(), "still ready")
	status := httpGet(t, d.health+"/status")
	t.Logf("workload identity: %d access tokens issued (%d at ready, %d for the rotated file's token: azidentity rereads the file every 10 minutes), %d requests refused",
		entra.Issued.Load(), atReady, entra.IssuedFor(rotated), entra.Refused.Load())
	assert.ErrorIs(t, entra.Check(entra.Tokens()[0]), armfake.ErrAccessTokenExpired, "the first access token expired during the run")
	d.stop(t)
	assert.NotContains(t, d.logs.String(), "AuthorizationFailed", "no call was refused by the role")
	assert.Contains(t, d.logs.String(), "workload identity (client "+azureClientID, "caa logs its credential route")

	// Invariant I7: no federated or access token anywhere caa writes.
	for i, tok := range entra.Tokens() {
		secrets[fmt.Sprintf("access token %d", i)] = tok
	}
	events, err := c.Client().CoreV1().Events("").List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	var eventText strings.Builder
	for _, e := range events.Items {
		eventText.WriteString(e.Reason + " " + e.Message + "\n")
	}
	ledger, err := os.ReadFile(ledgerPath)
	require.NoError(t, err)
	places := map[string][]byte{"logs": []byte(d.logs.String()), "events": []byte(eventText.String()), "/status": status, "ledger": ledger}
	require.NotEmpty(t, places["logs"])
	for name, s := range secrets {
		for where, text := range places {
			assert.False(t, bytes.Contains(text, []byte(s)), "the %s is in caa's %s (I7)", name, where)
		}
	}
}

// TestAzurePreflightNamesTheMissingAction starts caa (on a managed
// identity) under the shipped role minus one action at a time: it touches
// no pod, its readiness reason and a Node event name the action, and once
// the role is whole again (no restart) it turns ready. Then a resource
// group and a subnet that do not exist: the reason names the setting.
func TestAzurePreflightNamesTheMissingAction(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	c := cluster.Start(ctx, t)
	full := shippedAzureRole(t)
	start := func(t *testing.T, node string, role *armfake.Role, extra ...string) (*azureRoleCloud, *daemon) {
		token := secret("e2e-arm-token-")
		ac := newAzureRoleCloud(t, armfake.WithBearerToken(token))
		ac.role.Store(role) // before caa starts
		mi, miURL := newManagedIdentity(t, token)
		_, err := c.CreateNode(ctx, node)
		require.NoError(t, err)
		_, err = c.CreatePeerPod(ctx, "team", node+"-pod", node, nil)
		require.NoError(t, err)
		args := append(slices.Clone(ac.args), extra...)
		d := launchCaa(t, c, node, filepath.Join(t.TempDir(), "caa", "ledger.db"), "azure preflight", args,
			append(hermeticEnv(), "IDENTITY_ENDPOINT="+miURL, "IDENTITY_HEADER="+mi.Header))
		return ac, d
	}
	for i, action := range full.Actions {
		t.Run(action, func(t *testing.T) {
			node := fmt.Sprintf("preflight-%d", i)
			ac, d := start(t, node, full.Without(action))
			var reason string
			require.Eventually(t, func() bool {
				code, body := readyzBody(d)
				reason = body
				return code == http.StatusServiceUnavailable && strings.Contains(body, "preflight failed") && strings.Contains(body, action)
			}, time.Minute, 100*time.Millisecond, "the readiness reason names %s", action)
			t.Logf("readiness without %s: %.300s...", action, reason)
			require.Eventually(t, func() bool {
				events, err := c.Client().CoreV1().Events("").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + node})
				require.NoError(t, err)
				for _, e := range events.Items {
					if e.Reason == "CaaPreflightFailed" && strings.Contains(e.Message, action) {
						return true
					}
				}
				return false
			}, time.Minute, 100*time.Millisecond, "a Node event names %s", action)
			assert.Empty(t, ac.core.Live(), "no pod was touched")

			ac.role.Store(full) // the operator fixes the role; caa retries
			d.waitReady(t, func() { assert.Len(t, ac.core.Live(), 1, "the pod got its VM") })
			d.stop(t)
		})
	}
	for name, tc := range map[string]struct{ flag, value, want string }{
		"wrong resource group": {"--azure-resource-group", "no-such-group", "--azure-resource-group (CAA_AZURE_RESOURCE_GROUP)"},
		"wrong subnet": {"--azure-subnet-id", "/subscriptions/" + armfake.DefaultSubscription +
			"/resourceGroups/caa-net/providers/Microsoft.Network/virtualNetworks/caa-vnet/subnets/elsewhere", "--azure-subnet-id (CAA_AZURE_SUBNET_ID)"},
	} {
		t.Run(name, func(t *testing.T) {
			ac, d := start(t, "preflight-"+strings.ReplaceAll(name, " ", "-"), full, tc.flag, tc.value)
			require.Eventually(t, func() bool {
				code, body := readyzBody(d)
				return code == http.StatusServiceUnavailable && strings.Contains(body, tc.want)
			}, time.Minute, 100*time.Millisecond, "the readiness reason names the setting")
			d.stop(t)
			assert.Empty(t, ac.core.Instances(), "nothing was created")
		})
	}
}

// TestAzureLeastPrivilegeLife runs caa's life through the binary under
// exactly the shipped role, on a managed identity: start and create,
// restart and adopt, a killed VM recreated, a deleted pod's VM deleted, an
// orphan collected, and `caa ledger rebuild`. No call is refused.
func TestAzureLeastPrivilegeLife(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	c := cluster.Start(ctx, t)
	token := secret("e2e-arm-token-")
	ac := newAzureRoleCloud(t, armfake.WithBearerToken(token))
	mi, miURL := newManagedIdentity(t, token)
	env := append(hermeticEnv(), "IDENTITY_ENDPOINT="+miURL, "IDENTITY_HEADER="+mi.Header)
	const node = "worker-1"
	_, err := c.CreateNode(ctx, node)
	require.NoError(t, err)
	for i := range 4 {
		_, err := c.CreatePeerPod(ctx, "team", fmt.Sprintf("pod-%d", i), node, nil)
		require.NoError(t, err)
	}
	ledgerPath := filepath.Join(t.TempDir(), "caa", "ledger.db")
	args := append(slices.Clone(ac.args), "--gc-grace", "1s")
	start := func() *daemon { return launchCaa(t, c, node, ledgerPath, "azure least privilege", args, env) }
	noRefusal := func(d *daemon) {
		t.Helper()
		assert.NotContains(t, d.logs.String(), "AuthorizationFailed", "no call was refused by the role")
	}

	d := start() // start, create
	d.waitReady(t, func() { assert.Len(t, liveVMs(ac.core), 4) })
	first := liveVMs(ac.core)
	d.stop(t)
	noRefusal(d)

	require.NoError(t, ac.core.Kill(first[firstUID(ctx, t, c, "pod-1")])) // recreate on restart
	before := ac.core.Counters()
	d = start() // adopt
	d.waitReady(t, func() { assert.Len(t, liveVMs(ac.core), 4) })
	after := ac.core.Counters()
	assert.Equal(t, int64(1), after[cloud.OpCreate]-before[cloud.OpCreate], "one VM recreated, the others adopted")
	require.NoError(t, c.DeletePod(ctx, "team", "pod-2")) // delete
	kube, err := c.Client().CoreV1().Namespaces().Get(ctx, "kube-system", metav1.GetOptions{})
	require.NoError(t, err)
	orphan, err := ac.core.Create(cloud.CreateRequest{Name: "caa-orphan-0123456789ab", UniqueName: true, Image: azureImage, InstanceType: azureSize,
		Tags: map[string]string{"caa-cluster": string(kube.UID), "caa-node": node, "caa-managed-by": "caa", "caa-pod-uid": "gone", "caa-key": "gone-1"}})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		live := liveVMs(ac.core)
		_, orphanLive := live["gone"]
		return len(live) == 3 && !orphanLive
	}, time.Minute, 100*time.Millisecond, "the deleted pod's VM and the orphan %s were deleted", orphan.ID)
	d.stop(t)
	noRefusal(d)

	// rebuild under the same role
	require.NoError(t, os.Remove(ledgerPath))
	out := runCaaEnv(t, env, append([]string{"ledger", "rebuild", "--node-name", node, "--kubeconfig", c.Kubeconfig(), "--ledger", ledgerPath}, ac.args...)...)
	assert.Contains(t, out, "recorded 3 VMs")
	d = start()
	d.waitReady(t, func() { assert.Len(t, liveVMs(ac.core), 3) })
	d.stop(t)
	noRefusal(d)
}

// runCaaEnv runs a caa command in env and returns its output.
func runCaaEnv(t *testing.T, env []string, args ...string) string {
	t.Helper()
	cmd := exec.Command(caaBin, args...)
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "caa %v:\n%s", args, out)
	return string(out)
}
