package e2e

import (
	"encoding/pem"
	"fmt"
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

	"github.com/caa-project/caa/test/e2e/cluster"
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
	t.Parallel()
	ctx := testContext(t, 10*time.Minute)
	c := cluster.Start(ctx, t)

	// The fake Entra ID trusts the apiserver's service-account issuer.
	verify := apiserverVerifier(ctx, t, c, armfake.EntraAudience)
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
	secrets := map[string]string{}
	first := saToken(ctx, t, c, armfake.EntraAudience)
	secrets["federated token"] = first
	writeTokenFile(t, tokenFile, first)
	env := append(hermeticEnv(), "AZURE_CLIENT_ID="+azureClientID, "AZURE_TENANT_ID="+azureTenantID,
		"AZURE_FEDERATED_TOKEN_FILE="+tokenFile, "AZURE_AUTHORITY_HOST="+idp.URL+"/",
		"CAA_AZURE_DISABLE_INSTANCE_DISCOVERY=true", "SSL_CERT_FILE="+certFile)

	run := startIdentityRun(ctx, t, c, "azure workload identity", ac.args, env, func() map[string]string { return liveVMs(ac.core) })
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
	writeTokenFile(t, tokenFile, rotated)
	atRotation := entra.Issued.Load()

	run.churn(ctx, t, "the new pod got a VM and the deleted pod's VM went, after the rotation, without a restart")
	require.Eventually(t, func() bool { return entra.Issued.Load() >= atRotation+3 }, time.Minute, 100*time.Millisecond,
		"tokens keep being renewed after the rotation")
	status := run.status(t)
	t.Logf("workload identity: %d access tokens issued (%d at ready, %d for the rotated file's token: azidentity rereads the file every 10 minutes), %d requests refused",
		entra.Issued.Load(), atReady, entra.IssuedFor(rotated), entra.Refused.Load())
	assert.ErrorIs(t, entra.Check(entra.Tokens()[0]), armfake.ErrAccessTokenExpired, "the first access token expired during the run")
	run.d.stop(t)
	assert.NotContains(t, run.d.logs.String(), "AuthorizationFailed", "no call was refused by the role")
	assert.Contains(t, run.d.logs.String(), "workload identity (client "+azureClientID, "caa logs its credential route")

	// Invariant I7: no federated or access token anywhere caa writes.
	for i, tok := range entra.Tokens() {
		secrets[fmt.Sprintf("access token %d", i)] = tok
	}
	run.assertNoSecrets(ctx, t, status, secrets)
}

// TestAzurePreflightNamesTheMissingAction starts caa (on a managed
// identity) under the shipped role minus one action at a time: it touches
// no pod, its readiness reason and a Node event name the action, and once
// the role is whole again (no restart) it turns ready. Then a resource
// group and a subnet that do not exist: the reason names the setting.
func TestAzurePreflightNamesTheMissingAction(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 10*time.Minute)
	c := cluster.Start(ctx, t)
	full := shippedAzureRole(t)
	start := func(t *testing.T, node string, role *armfake.Role, extra ...string) (*azureRoleCloud, *daemon) {
		token := secret("e2e-arm-token-")
		ac := newAzureRoleCloud(t, armfake.WithBearerToken(token))
		ac.role.Store(role) // before caa starts
		mi, miURL := newManagedIdentity(t, token)
		nodeWithPod(ctx, t, c, node)
		args := append(slices.Clone(ac.args), extra...)
		d := launchCaa(t, c, node, filepath.Join(t.TempDir(), "caa", "ledger.db"), "azure preflight", args,
			append(hermeticEnv(), "IDENTITY_ENDPOINT="+miURL, "IDENTITY_HEADER="+mi.Header))
		return ac, d
	}
	for i, action := range full.Actions {
		t.Run(action, func(t *testing.T) {
			t.Parallel() // each its own node, cloud and caa: the waits overlap
			node := fmt.Sprintf("preflight-%d", i)
			ac, d := start(t, node, full.Without(action))
			preflightNamesMissing(ctx, t, c, d, node, action, action, ac.core, 0, func() { ac.role.Store(full) })
		})
	}
	for name, tc := range map[string]struct{ flag, value, want string }{
		"wrong resource group": {"--azure-resource-group", "no-such-group", "--azure-resource-group (CAA_AZURE_RESOURCE_GROUP)"},
		"wrong subnet": {"--azure-subnet-id", "/subscriptions/" + armfake.DefaultSubscription +
			"/resourceGroups/caa-net/providers/Microsoft.Network/virtualNetworks/caa-vnet/subnets/elsewhere", "--azure-subnet-id (CAA_AZURE_SUBNET_ID)"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ac, d := start(t, "preflight-"+strings.ReplaceAll(name, " ", "-"), full, tc.flag, tc.value)
			settingNamed(t, d, ac.core, tc.want)
		})
	}
}

// TestAzureLeastPrivilegeLife runs caa's life through the binary under
// exactly the shipped role, on a managed identity: start and create,
// restart and adopt, a killed VM recreated, a deleted pod's VM deleted, an
// orphan collected, and `caa ledger rebuild`. No call is refused.
func TestAzureLeastPrivilegeLife(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 10*time.Minute)
	c := cluster.Start(ctx, t)
	token := secret("e2e-arm-token-")
	ac := newAzureRoleCloud(t, armfake.WithBearerToken(token))
	mi, miURL := newManagedIdentity(t, token)
	env := append(hermeticEnv(), "IDENTITY_ENDPOINT="+miURL, "IDENTITY_HEADER="+mi.Header)
	leastPrivilegeLife(ctx, t, c, leastPrivilege{label: "azure least privilege", args: ac.args, env: env,
		core: ac.core, live: func() map[string]string { return liveVMs(ac.core) },
		refusal: "AuthorizationFailed", refusalMsg: "no call was refused by the role",
		orphan: cloud.CreateRequest{Name: "caa-orphan-0123456789ab", UniqueName: true, Image: azureImage, InstanceType: azureSize}})
}
