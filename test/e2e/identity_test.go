package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/caa-project/caa/test/e2e/cluster"
	ec2fake "github.com/caa-project/caa/test/mocks/aws"
	"github.com/caa-project/caa/test/mocks/cloud"
)

// The steps the identity and least-privilege tests of every cloud share
// (identity_aws_test.go, identity_azure_test.go, identity_ibmcloud_test.go):
// each cloud's file sets up its fakes and credential route and says what
// differs; these run caa through them.

const (
	// saNamespace and saName are the deploy/ ServiceAccount, whose token
	// each cloud's identity trusts.
	saNamespace = "caa-system"
	saName      = "caa"
)

// saToken asks the apiserver for a token of caa's ServiceAccount with
// audience aud, through the TokenRequest API the kubelet uses for
// projected tokens.
func saToken(ctx context.Context, t *testing.T, c *cluster.Cluster, aud string) string {
	t.Helper()
	require.NoError(t, c.EnsureNamespace(ctx, saNamespace))
	// Subtests side by side on one cluster each ask for it: whoever
	// creates it first, the others find it there.
	_, err := c.Client().CoreV1().ServiceAccounts(saNamespace).Create(ctx,
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: saName}}, metav1.CreateOptions{})
	if !apierrors.IsAlreadyExists(err) {
		require.NoError(t, err)
	}
	expiry := int64(3600)
	tok, err := c.Client().CoreV1().ServiceAccounts(saNamespace).CreateToken(ctx, saName, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{Audiences: []string{aud}, ExpirationSeconds: &expiry},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	return tok.Status.Token
}

// apiserverVerifier verifies a ServiceAccount token for audience aud as a
// cloud's identity provider does: against the apiserver's published OIDC
// issuer and JWKS, its audience and expiry.
func apiserverVerifier(ctx context.Context, t *testing.T, c *cluster.Cluster, aud string) ec2fake.TokenVerifier {
	t.Helper()
	rc := c.Client().CoreV1().RESTClient()
	disco, err := rc.Get().AbsPath("/.well-known/openid-configuration").DoRaw(ctx)
	require.NoError(t, err, "the apiserver's OIDC discovery document")
	var oidc struct {
		Issuer string `json:"issuer"`
	}
	require.NoError(t, json.Unmarshal(disco, &oidc))
	jwks, err := rc.Get().AbsPath("/openid/v1/jwks").DoRaw(ctx)
	require.NoError(t, err, "the apiserver's JWKS")
	verify, err := ec2fake.JWKSVerifier(jwks, oidc.Issuer, aud, nil)
	require.NoError(t, err)
	return verify
}

// writeTokenFile replaces the token file at path atomically, as the
// kubelet does.
func writeTokenFile(t *testing.T, path, token string) {
	t.Helper()
	tmp := path + ".new"
	require.NoError(t, os.WriteFile(tmp, []byte(token), 0o600))
	require.NoError(t, os.Rename(tmp, path))
}

// secretSet is every token and key in play, by name, for the check that
// none appears where caa writes.
type secretSet struct {
	mu sync.Mutex
	m  map[string]string
}

func (s *secretSet) add(name, value string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[string]string{}
	}
	s.m[name] = value
}

func (s *secretSet) all() map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		return map[string]string{}
	}
	return maps.Clone(s.m)
}

func firstUID(ctx context.Context, t *testing.T, c *cluster.Cluster, name string) string {
	t.Helper()
	pod, err := c.Client().CoreV1().Pods("team").Get(ctx, name, metav1.GetOptions{})
	require.NoError(t, err)
	return string(pod.UID)
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

// nodeWithPods makes the Node node and n peer pods on it, team/pod-0 on.
func nodeWithPods(ctx context.Context, t *testing.T, c *cluster.Cluster, node string, n int) {
	t.Helper()
	_, err := c.CreateNode(ctx, node)
	require.NoError(t, err)
	for i := range n {
		_, err := c.CreatePeerPod(ctx, "team", fmt.Sprintf("pod-%d", i), node, nil)
		require.NoError(t, err)
	}
}

// identityRun is caa on one cloud's credential route, on node worker-1.
type identityRun struct {
	c          *cluster.Cluster
	d          *daemon
	ledgerPath string
	// live maps each pod UID to its live VM in the fake cloud.
	live func() map[string]string
}

const identityNode = "worker-1"

// startIdentityRun starts caa (label, args, env) with three pods on
// worker-1 and waits until it is ready, every pod with its VM.
func startIdentityRun(ctx context.Context, t *testing.T, c *cluster.Cluster, label string, args, env []string, live func() map[string]string) *identityRun {
	t.Helper()
	nodeWithPods(ctx, t, c, identityNode, 3)
	r := &identityRun{c: c, ledgerPath: filepath.Join(t.TempDir(), "caa", "ledger.db"), live: live}
	r.d = launchCaa(t, c, identityNode, r.ledgerPath, label, args, env)
	r.d.waitReady(t, func() { assert.Len(t, live(), 3, "at the first 200 every pod has its VM") })
	return r
}

// churn makes a new pod and deletes pod-0, without a restart, and waits
// until the new pod has its VM and pod-0's VM is gone (how: msg).
func (r *identityRun) churn(ctx context.Context, t *testing.T, msg string) {
	t.Helper()
	_, err := r.c.CreatePeerPod(ctx, "team", "pod-new", identityNode, nil)
	require.NoError(t, err)
	require.NoError(t, r.c.DeletePod(ctx, "team", "pod-0"))
	require.Eventually(t, func() bool {
		live := r.live()
		pods, err := r.c.Client().CoreV1().Pods("team").List(ctx, metav1.ListOptions{})
		if err != nil || len(live) != 3 {
			return false
		}
		for _, p := range pods.Items {
			if _, ok := live[string(p.UID)]; !ok {
				return false
			}
		}
		return true
	}, time.Minute, 100*time.Millisecond, msg)
}

// status checks caa is still ready and returns its /status.
func (r *identityRun) status(t *testing.T) []byte {
	t.Helper()
	assert.Equal(t, http.StatusOK, r.d.readyz(), "still ready")
	return []byte(r.d.get(t, "/status"))
}

// assertNoSecrets checks invariant I7 once caa stopped: none of secrets
// is in caa's logs, the cluster's events, its /status (as read before the
// stop) or its ledger.
func (r *identityRun) assertNoSecrets(ctx context.Context, t *testing.T, status []byte, secrets map[string]string) {
	t.Helper()
	events, err := r.c.Client().CoreV1().Events("").List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	var eventText strings.Builder
	for _, e := range events.Items {
		eventText.WriteString(e.Reason + " " + e.Message + "\n")
	}
	ledger, err := os.ReadFile(r.ledgerPath)
	require.NoError(t, err)
	places := map[string][]byte{"logs": []byte(r.d.logs.String()), "events": []byte(eventText.String()), "/status": status, "ledger": ledger}
	require.NotEmpty(t, places["logs"])
	for name, s := range secrets {
		for where, text := range places {
			assert.False(t, bytes.Contains(text, []byte(s)), "the %s is in caa's %s (I7)", name, where)
		}
	}
}

// preflightNamesMissing: caa d on node, started without the permission
// action, is not ready with a reason that names it, a CaaPreflightFailed
// Node event names it, and it touched no pod (core holds the existing
// instances alone); once restore gives the permission back, caa turns
// ready without a restart and the pod gets its VM. what is how the log
// names the permission.
func preflightNamesMissing(ctx context.Context, t *testing.T, c *cluster.Cluster, d *daemon, node, action, what string,
	core *cloud.Cloud, existing int, restore func()) {
	t.Helper()
	var reason string
	require.Eventually(t, func() bool {
		code, body := d.readyzBody()
		reason = body
		return code == http.StatusServiceUnavailable && strings.Contains(body, "preflight failed") && strings.Contains(body, action)
	}, time.Minute, 100*time.Millisecond, "the readiness reason names %s", action)
	t.Logf("readiness without %s: %.400s...", what, reason)
	require.Eventually(t, func() bool {
		events, err := c.Client().CoreV1().Events("").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + node})
		require.NoError(t, err)
		return slices.ContainsFunc(events.Items, func(e corev1.Event) bool {
			return e.Reason == "CaaPreflightFailed" && strings.Contains(e.Message, action)
		})
	}, time.Minute, 100*time.Millisecond, "a Node event names %s", action)
	assert.Len(t, core.Live(), existing, "no pod was touched")

	restore() // the operator fixes the permissions; caa retries
	d.waitReady(t, func() { assert.Len(t, core.Live(), existing+1, "the pod got its VM") })
	d.stop(t)
}

// nodeWithPod makes the Node node and one peer pod on it, node-pod.
func nodeWithPod(ctx context.Context, t *testing.T, c *cluster.Cluster, node string) {
	t.Helper()
	_, err := c.CreateNode(ctx, node)
	require.NoError(t, err)
	_, err = c.CreatePeerPod(ctx, "team", node+"-pod", node, nil)
	require.NoError(t, err)
}

// settingNamed: caa d, started with a wrong setting, is not ready with a
// reason that contains each of want, and, once stopped, created nothing
// in core.
func settingNamed(t *testing.T, d *daemon, core *cloud.Cloud, want ...string) {
	t.Helper()
	require.Eventually(t, func() bool {
		code, body := d.readyzBody()
		if code != http.StatusServiceUnavailable {
			return false
		}
		for _, w := range want {
			if !strings.Contains(body, w) {
				return false
			}
		}
		return true
	}, time.Minute, 100*time.Millisecond, "the readiness reason names the setting")
	d.stop(t)
	assert.Empty(t, core.Instances(), "nothing was created")
}

// leastPrivilege is caa on one cloud under exactly the shipped
// permissions, for leastPrivilegeLife.
type leastPrivilege struct {
	label      string
	args, env  []string
	core       *cloud.Cloud
	live       func() map[string]string // each pod UID to its live VM
	refusal    string                   // what caa logs when a call is refused
	refusalMsg string
	// orphan is the cloud's request for a VM; the test adds the tags of
	// this cluster and node, for a pod that is gone.
	orphan cloud.CreateRequest
	// secrets (nil: none) must not be in the rebuild's output.
	secrets func() map[string]string
}

// leastPrivilegeLife runs caa's life through the binary: start and create
// four pods' VMs, restart and adopt them with a killed VM recreated (one
// create), a deleted pod's VM deleted, an orphan collected, and `caa
// ledger rebuild` then a start on the rebuilt ledger. No call is refused.
func leastPrivilegeLife(ctx context.Context, t *testing.T, c *cluster.Cluster, lp leastPrivilege) {
	const node = "worker-1"
	nodeWithPods(ctx, t, c, node, 4)
	ledgerPath := filepath.Join(t.TempDir(), "caa", "ledger.db")
	args := append(slices.Clone(lp.args), "--gc-grace", "1s")
	start := func() *daemon { return launchCaa(t, c, node, ledgerPath, lp.label, args, lp.env) }
	noRefusal := func(d *daemon) {
		t.Helper()
		assert.NotContains(t, d.logs.String(), lp.refusal, lp.refusalMsg)
	}

	d := start() // start, create
	d.waitReady(t, func() { assert.Len(t, lp.live(), 4) })
	first := lp.live()
	d.stop(t)
	noRefusal(d)

	pod1 := firstUID(ctx, t, c, "pod-1")
	require.NoError(t, lp.core.Kill(first[pod1])) // recreate on restart
	before := lp.core.Counters()
	d = start() // adopt
	d.waitReady(t, func() { assert.Len(t, lp.live(), 4) })
	after := lp.core.Counters()
	assert.Equal(t, int64(1), after[cloud.OpCreate]-before[cloud.OpCreate], "one VM recreated, the others adopted")
	assert.NotEqual(t, first[pod1], lp.live()[pod1])
	require.NoError(t, c.DeletePod(ctx, "team", "pod-2")) // delete
	require.Eventually(t, func() bool { return len(lp.live()) == 3 }, time.Minute, 100*time.Millisecond,
		"the deleted pod's VM was deleted")
	// orphan: a VM tagged for this cluster and node that no pod owns
	kube, err := c.Client().CoreV1().Namespaces().Get(ctx, "kube-system", metav1.GetOptions{})
	require.NoError(t, err)
	req := lp.orphan
	req.Tags = map[string]string{"caa-cluster": string(kube.UID), "caa-node": node, "caa-managed-by": "caa", "caa-pod-uid": "gone", "caa-key": "gone-1"}
	orphan, err := lp.core.Create(req)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		in, err := lp.core.Get(orphan.ID)
		return err != nil || !in.State.Alive()
	}, time.Minute, 100*time.Millisecond, "the orphan %s was deleted", orphan.ID)
	live := lp.live()
	assert.Len(t, live, 3)
	assert.NotContains(t, live, "gone")
	d.stop(t)
	noRefusal(d)

	// rebuild under the same identity and permissions
	require.NoError(t, os.Remove(ledgerPath))
	out := runCaaEnv(t, lp.env, append([]string{"ledger", "rebuild", "--node-name", node, "--kubeconfig", c.Kubeconfig(), "--ledger", ledgerPath}, lp.args...)...)
	assert.Contains(t, out, "recorded 3 VMs")
	assert.NotContains(t, out, lp.refusal)
	d = start()
	d.waitReady(t, func() { assert.Len(t, lp.live(), 3) })
	d.stop(t)
	noRefusal(d)
	if lp.secrets != nil {
		for name, s := range lp.secrets() {
			assert.NotContains(t, out, s, "the %s is in the rebuild's output", name)
		}
	}
}
