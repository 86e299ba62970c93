package e2e

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/test/e2e/cluster"
	armfake "github.com/caa-project/caa/test/mocks/azure"
	"github.com/caa-project/caa/test/mocks/cloud"
	vpcfake "github.com/caa-project/caa/test/mocks/ibmcloud"
)

// The cluster scope's end-to-end tests: `caa cluster` replicas and node
// caa processes against the real apiserver and one fake EC2, with short
// graces so each test takes seconds.

const (
	scopeNamespace = "caa-system"
	scopeLease     = "caa-cluster"
	scopeGrace     = 4 * time.Second
)

// launchClusterCaa starts one `caa cluster` replica against the EC2 at
// url; extra flags come last and override.
func launchClusterCaa(t *testing.T, c *cluster.Cluster, url, identity string, extra ...string) *daemon {
	t.Helper()
	return launchClusterCaaOn(t, c, identity, append(ec2Args(url), extra...), awsEnv())
}

// launchClusterCaaOn starts one `caa cluster` replica with the cloud's
// flags (and any others, last) in env.
func launchClusterCaaOn(t *testing.T, c *cluster.Cluster, identity string, cloudArgs, env []string) *daemon {
	t.Helper()
	health := freeHealthAddr(t)
	args := []string{"cluster", "--kubeconfig", c.Kubeconfig(), "--identity", identity, "--lease-namespace", scopeNamespace,
		"--health-addr", health, "--log-format", "json",
		"--interval", "1s", "--node-gone-grace", scopeGrace.String(),
		"--lease-duration", "3s", "--lease-renew-deadline", "2s", "--lease-retry", "500ms"}
	cmd := exec.Command(caaBin, append(args, cloudArgs...)...)
	cmd.Env = env
	return spawn(t, cmd, cmd.Start, "http://"+health, "caa cluster "+identity)
}

// startScopeCluster starts a cluster with the cluster caa's namespace.
func startScopeCluster(ctx context.Context, t *testing.T) *cluster.Cluster {
	t.Helper()
	c := cluster.Start(ctx, t)
	require.NoError(t, c.EnsureNamespace(ctx, scopeNamespace))
	return c
}

// seedVMs puts n live VMs tagged for node into the cloud, as a node's caa
// would have made them.
func seedVMs(t *testing.T, core *cloud.Cloud, clusterID, node string, n int) []string {
	t.Helper()
	return seedVMsOf(t, core, clusterID, node, n, ec2Type, ec2Image)
}

// seedVMsOf is seedVMs with the cloud's instance type and image.
func seedVMsOf(t *testing.T, core *cloud.Cloud, clusterID, node string, n int, instanceType, image string) []string {
	t.Helper()
	var ids []string
	for i := range n {
		spec := provider.Spec{Key: fmt.Sprintf("%s-%d-a1", node, i), Cluster: clusterID, Node: node,
			PodUID: fmt.Sprintf("%s-uid-%d", node, i), PodNamespace: "team", PodName: fmt.Sprintf("%s-%d", node, i)}
		in, err := core.Create(cloud.CreateRequest{Tags: spec.Tags(), InstanceType: instanceType, Image: image})
		require.NoError(t, err)
		ids = append(ids, in.ID)
	}
	return ids
}

// clusterUID is the cluster id caa derives: the kube-system namespace's UID.
func clusterUID(ctx context.Context, t *testing.T, c *cluster.Cluster) string {
	t.Helper()
	ns, err := c.Client().CoreV1().Namespaces().Get(ctx, "kube-system", metav1.GetOptions{})
	require.NoError(t, err)
	return string(ns.UID)
}

// states returns the cloud state of each id.
func states(core *cloud.Cloud, ids []string) map[string]provider.State {
	out := map[string]provider.State{}
	for _, id := range ids {
		in, err := core.Get(id)
		if err != nil {
			out[id] = "missing"
			continue
		}
		out[id] = in.State
	}
	return out
}

// allIn reports whether every state of m is one of sts.
func allIn(m map[string]provider.State, sts ...provider.State) bool {
	for _, s := range m {
		if !slices.Contains(sts, s) {
			return false
		}
	}
	return true
}

// seedNodes creates each node and seeds n live VMs of the cluster on it;
// it returns each node's VMs.
func seedNodes(ctx context.Context, t *testing.T, c *cluster.Cluster, core *cloud.Cloud, clusterID string, nodes []string, n int, instanceType, image string) map[string][]string {
	t.Helper()
	vms := map[string][]string{}
	for _, node := range nodes {
		_, err := c.CreateNode(ctx, node)
		require.NoError(t, err)
		vms[node] = seedVMsOf(t, core, clusterID, node, n, instanceType, image)
	}
	return vms
}

// makeSick cordons the node and marks it NotReady: unhealthy, but there.
func makeSick(ctx context.Context, t *testing.T, c *cluster.Cluster, node string) {
	t.Helper()
	sick, err := c.Client().CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	require.NoError(t, err)
	sick.Spec.Unschedulable = true
	sick, err = c.Client().CoreV1().Nodes().Update(ctx, sick, metav1.UpdateOptions{})
	require.NoError(t, err)
	sick.Status.Conditions[0].Status = corev1.ConditionFalse
	_, err = c.Client().CoreV1().Nodes().UpdateStatus(ctx, sick, metav1.UpdateOptions{})
	require.NoError(t, err)
}

// waitViewPublished waits until the leader has put a cloud view on node.
func waitViewPublished(ctx context.Context, t *testing.T, c *cluster.Cluster, node string) {
	t.Helper()
	require.Eventually(t, func() bool {
		n, err := c.Client().CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		return err == nil && n.Annotations["caa.dev/cloud-view"] != ""
	}, 30*time.Second, condPoll, "views published")
}

// waitAuditsFromView waits until the node caa d audits against the
// cluster caa's view.
func waitAuditsFromView(t *testing.T, d *daemon, what string) {
	t.Helper()
	require.Eventually(t, func() bool { return strings.Contains(d.logs.String(), "auditing from the cluster caa's cloud view") },
		30*time.Second, condPoll, what)
}

// requireCollectedAfterGrace waits until every VM of the departed node is
// in one of the deleted states, and checks that none of the cluster's VMs
// on that node ended sooner than the grace after deletedAt.
func requireCollectedAfterGrace(t *testing.T, core *cloud.Cloud, clusterID, node string, vms []string, deletedAt time.Time, deleted ...provider.State) {
	t.Helper()
	require.Eventually(t, func() bool { return allIn(states(core, vms), deleted...) },
		30*time.Second, condPoll, "the departed node's VMs deleted")
	for _, in := range core.Instances() {
		if in.Tags[provider.TagNode] == node && in.Tags[provider.TagCluster] == clusterID {
			assert.GreaterOrEqual(t, in.EndedAt.Sub(deletedAt), scopeGrace, "VM %s deleted before the grace", in.ID)
		}
	}
}

// requireUntouchedFor checks, for the span, that the VMs of each of the
// nodes and the foreign ones all stay running.
func requireUntouchedFor(t *testing.T, span time.Duration, core *cloud.Cloud, vms map[string][]string, nodes, foreign []string) {
	t.Helper()
	deadline := time.Now().Add(span)
	for time.Now().Before(deadline) {
		for _, n := range nodes {
			require.True(t, allIn(states(core, vms[n]), provider.StateRunning), "node %s's VMs untouched: %v", n, states(core, vms[n]))
		}
		require.True(t, allIn(states(core, foreign), provider.StateRunning), "another cluster's VM untouched")
		time.Sleep(condPoll)
	}
}

// requireReplacedThroughView kills one of the node's live VMs behind its
// caa's back and waits for the replacement, then lets three more audits
// of a second each pass; live maps the node's pod UIDs to their VMs.
func requireReplacedThroughView(t *testing.T, core *cloud.Cloud, live func() map[string]string) {
	t.Helper()
	var killedUID, killedID string
	for uid, id := range live() {
		killedUID, killedID = uid, id
		break
	}
	killedAt := time.Now()
	require.NoError(t, core.Kill(killedID))
	require.Eventually(t, func() bool {
		id, ok := live()[killedUID]
		return ok && id != killedID
	}, 30*time.Second, condPoll, "the killed VM replaced")
	t.Logf("replaced %s after %s", killedID, time.Since(killedAt).Round(time.Millisecond))
	time.Sleep(3 * time.Second) // three more audits: the window measured, not a synchronisation
}

// retarget is args with the URL from replaced by to.
func retarget(args []string, from, to string) []string {
	out := slices.Clone(args)
	for i, a := range out {
		out[i] = strings.Replace(a, from, to, 1)
	}
	return out
}

func leaseHolder(ctx context.Context, c *cluster.Cluster) string {
	l, err := c.Client().CoordinationV1().Leases(scopeNamespace).Get(ctx, scopeLease, metav1.GetOptions{})
	if err != nil || l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

// TestClusterScopeCollectsDepartedNodes: a deleted node's VMs are deleted
// once the grace has passed (not before); the VMs of a node that exists,
// however unhealthy (NotReady, cordoned, its caa killed), and of a node
// deleted and re-created within the grace, are never touched.
func TestClusterScopeCollectsDepartedNodes(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 5*time.Minute)
	c := startScopeCluster(ctx, t)
	aws := newAWSCloud(t)
	id := clusterUID(ctx, t, c)

	vms := seedNodes(ctx, t, c, aws.core, id, []string{"gone", "sick", "flapping", "healthy"}, 3, ec2Type, ec2Image)
	// A VM of another cluster under the departed node's name: never ours.
	foreign := seedVMs(t, aws.core, "another-cluster", "gone", 1)

	// The node caa of "healthy" runs (and audits against the views); the
	// others' are gone or dead, which is the point.
	healthy := startDaemon(t, c, aws, "healthy", filepath.Join(t.TempDir(), "healthy", "ledger.db"))
	healthy.waitReady(t, func() {})

	// "sick": NotReady and cordoned, longer than the grace.
	makeSick(ctx, t, c, "sick")

	a := launchClusterCaa(t, c, aws.url, "replica-a")
	b := launchClusterCaa(t, c, aws.url, "replica-b")
	require.Eventually(t, func() bool { return leaseHolder(ctx, c) != "" }, 30*time.Second, condPoll, "a leader")

	// The leader has listed (the views are on the Nodes) before any node goes.
	waitViewPublished(ctx, t, c, "gone")

	require.NoError(t, c.Client().CoreV1().Nodes().Delete(ctx, "gone", metav1.DeleteOptions{}))
	deletedAt := time.Now()
	require.NoError(t, c.Client().CoreV1().Nodes().Delete(ctx, "flapping", metav1.DeleteOptions{}))
	time.Sleep(scopeGrace / 4) // the node stays away for a while: the scenario, not a synchronisation
	_, err := c.CreateNode(ctx, "flapping")
	require.NoError(t, err)

	requireCollectedAfterGrace(t, aws.core, id, "gone", vms["gone"], deletedAt, provider.StateTerminated)
	// Three more graces: nothing else goes.
	requireUntouchedFor(t, 3*scopeGrace, aws.core, vms, []string{"sick", "flapping", "healthy"}, foreign)
	assert.Equal(t, int64(3), aws.core.Counters()["deleted"], "exactly the departed node's three VMs")

	evs, err := c.Client().CoreV1().Events(scopeNamespace).List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	got := 0
	for _, e := range evs.Items {
		if e.Reason == "DepartedNodeVMDeleted" {
			got += int(max(e.Count, 1))
		}
	}
	assert.Equal(t, 3, got, "one event per deleted VM")
	leader := a
	if leaseHolder(ctx, c) == "replica-b" {
		leader = b
	}
	assert.Equal(t, 3, strings.Count(leader.logs.String(), `"msg":"deleted a VM of a departed node"`), "one log line per delete")
	assert.Contains(t, leader.logs.String(), `"caa-pod-uid":"gone-uid-0"`, "the log line carries the VM's tags")
}

// TestClusterScopeLeaderKilledMidSweep: the leader is SIGKILLed while it
// deletes a departed node's VMs; the other replica takes the Lease over
// and deletes the rest after its own grace; no VM is deleted twice.
func TestClusterScopeLeaderKilledMidSweep(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 5*time.Minute)
	c := startScopeCluster(ctx, t)
	aws := newAWSCloud(t)
	id := clusterUID(ctx, t, c)
	const n = 30
	// A node the cluster has had (the leader sees it, and keeps its name),
	// deleted once the leader has seen it.
	_, err := c.CreateNode(ctx, "ghost")
	require.NoError(t, err)
	ghost := seedVMs(t, aws.core, id, "ghost", n)

	replicas := map[string]*daemon{
		"replica-a": launchClusterCaa(t, c, aws.url, "replica-a"),
		"replica-b": launchClusterCaa(t, c, aws.url, "replica-b"),
	}
	var first string
	require.Eventually(t, func() bool { first = leaseHolder(ctx, c); return first != "" }, 30*time.Second, condPoll)
	require.Eventually(t, func() bool {
		cm, err := c.Client().CoreV1().ConfigMaps(scopeNamespace).Get(ctx, "caa-cluster-nodes", metav1.GetOptions{})
		return err == nil && strings.Contains(cm.Data["nodes"], "ghost")
	}, 30*time.Second, condPoll, "the leader keeps the node's name")
	require.NoError(t, c.Client().CoreV1().Nodes().Delete(ctx, "ghost", metav1.DeleteOptions{}))
	// Slow calls, so the sweep of 30 deletes takes seconds.
	aws.core.SetFaults(cloud.Faults{Latency: 150 * time.Millisecond})
	require.Eventually(t, func() bool {
		terminated := 0
		for _, s := range states(aws.core, ghost) {
			if s == provider.StateTerminated {
				terminated++
			}
		}
		return terminated >= 3
	}, 60*time.Second, 10*time.Millisecond, "the first leader started deleting")
	replicas[first].kill(t)
	before := 0
	for _, s := range states(aws.core, ghost) {
		if s == provider.StateTerminated {
			before++
		}
	}
	require.Less(t, before, n, "killed mid-sweep")

	require.Eventually(t, func() bool { h := leaseHolder(ctx, c); return h != "" && h != first }, 30*time.Second, condPoll, "the other replica leads")
	require.Eventually(t, func() bool { return allIn(states(aws.core, ghost), provider.StateTerminated) }, 60*time.Second, condPoll,
		"no delete missed")
	assert.Equal(t, int64(n), aws.core.Counters()["deleted"])
	assert.LessOrEqual(t, aws.core.Counters()[cloud.OpDelete], int64(n+1),
		"no VM deleted twice (one call may have been cut by the kill)")
}

// TestClusterAuditReplacesTheNodeListing: with a cluster caa leading, the
// node's caa audits against the view on its Node with no listing of its
// own, and a VM killed behind its back is still replaced; once the leader
// is gone for two intervals, the node lists the cloud again.
func TestClusterAuditReplacesTheNodeListing(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 5*time.Minute)
	c := startScopeCluster(ctx, t)
	aws := newAWSCloud(t)
	nodeFront := newFront(t, sharedEC2(aws.core))
	const node = "worker-1"
	_, err := c.CreateNode(ctx, node)
	require.NoError(t, err)
	createPods(ctx, t, c, "team", "pod", node, 3)
	d := launchCaa(t, c, node, filepath.Join(t.TempDir(), "caa", "ledger.db"), "node", append(nodeFront.args(), "--audit-interval", "1s", "--cluster-view"), awsEnv())
	d.waitReady(t, func() {})

	clusterSrv := httptest.NewServer(sharedEC2(aws.core))
	t.Cleanup(clusterSrv.Close)
	leader := launchClusterCaa(t, c, clusterSrv.URL, "replica-a")
	waitAuditsFromView(t, d, "the node audits against the view")
	listings := nodeFront.nodeListings()

	require.Len(t, liveVMs(aws.core), 3)
	requireReplacedThroughView(t, aws.core, func() map[string]string { return liveVMs(aws.core) })
	assert.Equal(t, listings, nodeFront.nodeListings(), "no listing of the node's VMs while the view is fresh")
	assert.Len(t, liveVMs(aws.core), 3)

	leader.stop(t)
	require.Eventually(t, func() bool { return nodeFront.nodeListings() > listings }, 30*time.Second, condPoll,
		"the view goes stale: the node lists the cloud again")
	assert.Contains(t, d.logs.String(), "auditing alone")
	d.stop(t)
}

// nodeListings counts the listings that went through f: a node caa's
// front sees no other kind.
func (f *front) nodeListings() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, c := range f.calls {
		if c.kind == "list" {
			n++
		}
	}
	return n
}

// TestClusterScopeWithoutANodeListDeletesNothing: a leader whose Node list
// fails (its identity may not list Nodes) holds the Lease but never has a
// synced Node cache, so it lists no VM and deletes nothing, however long
// the VMs of a node that was never there wait.
func TestClusterScopeWithoutANodeListDeletesNothing(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 5*time.Minute)
	c := startScopeCluster(ctx, t)
	aws := newAWSCloud(t)
	id := clusterUID(ctx, t, c)
	ghost := seedVMs(t, aws.core, id, "ghost", 3)

	// An identity with everything the cluster caa needs but the Node list.
	const user = "e2e-cluster-caa-without-nodes"
	_, err := c.Client().RbacV1().Roles(scopeNamespace).Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: user},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"create", "get", "update"}},
			{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
		},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = c.Client().RbacV1().RoleBindings(scopeNamespace).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: user},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: user},
		Subjects:   []rbacv1.Subject{{Kind: "User", APIGroup: "rbac.authorization.k8s.io", Name: user}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	kc, err := clientcmd.LoadFromFile(c.Kubeconfig())
	require.NoError(t, err)
	for _, ai := range kc.AuthInfos {
		ai.Impersonate = user
	}
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	require.NoError(t, clientcmd.WriteToFile(*kc, kubeconfig))

	front := newFront(t, sharedEC2(aws.core))
	d := launchClusterCaa(t, c, front.url, "replica-a", "--kubeconfig", kubeconfig, "--cluster-id", id)
	require.Eventually(t, func() bool { return leaseHolder(ctx, c) == "replica-a" }, 30*time.Second, condPoll, "it leads")
	requireUntouchedFor(t, 3*scopeGrace, aws.core, map[string][]string{"ghost": ghost}, []string{"ghost"}, nil)
	assert.Zero(t, front.count(), "no cloud call at all without a synced Node cache")
	assert.Equal(t, 503, d.readyz(), "not ready: the Node cache never synced")
	d.stop(t)
}

// TestClusterScopeOnIBMCloud is TestClusterScopeCollectsDepartedNodes's
// shape on IBM Cloud, kept short: the leader lists the cluster with one
// Global Search by the cluster tag (the instances' own tags, read from
// the index), deletes a deleted node's VMs after the grace and only
// those, never a cordoned NotReady node's nor another cluster's; and the
// node caa of a live node audits against the view it publishes.
func TestClusterScopeOnIBMCloud(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 5*time.Minute)
	c := startScopeCluster(ctx, t)
	ibm := newIBMCloudFake(t)
	id := clusterUID(ctx, t, c)
	env := append(hermeticEnv(), ibm.env...)

	vms := seedNodes(ctx, t, c, ibm.core, id, []string{"gone", "sick", "healthy"}, 2, ibmProfile, ibmImage)
	foreign := seedVMsOf(t, ibm.core, "another-cluster", "gone", 1, ibmProfile, ibmImage)

	healthy := launchCaa(t, c, "healthy", filepath.Join(t.TempDir(), "healthy", "ledger.db"), "ibmcloud", append(slices.Clip(ibm.args), "--cluster-view"), env)
	healthy.waitReady(t, func() {})

	makeSick(ctx, t, c, "sick")

	// The leader has a front of its own on the same cloud, to count its
	// calls apart from the node caa's.
	apiKey := strings.TrimPrefix(ibm.env[0], "IBMCLOUD_API_KEY=")
	var leaderCalls sync.Map // path -> *atomic.Int64
	leaderFake := vpcfake.NewServer(ibm.core, vpcfake.WithAPIKey(apiKey))
	leaderSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		kind := r.Method + " " + r.URL.Path
		if strings.HasPrefix(r.URL.Path, "/v1/") {
			kind = r.Method + " " + strings.Join(strings.Split(r.URL.Path, "/")[:3], "/")
		}
		n, _ := leaderCalls.LoadOrStore(kind, new(atomic.Int64))
		n.(*atomic.Int64).Add(1)
		leaderFake.ServeHTTP(w, r)
	}))
	t.Cleanup(leaderSrv.Close)
	launchClusterCaaOn(t, c, "replica-a", retarget(ibm.args, ibm.url, leaderSrv.URL), env)
	waitViewPublished(ctx, t, c, "gone")
	waitAuditsFromView(t, healthy, "the live node audits against the view")

	require.NoError(t, c.Client().CoreV1().Nodes().Delete(ctx, "gone", metav1.DeleteOptions{}))
	deletedAt := time.Now()
	// VPC shows no deleted instance: it may be missing rather than terminated.
	requireCollectedAfterGrace(t, ibm.core, id, "gone", vms["gone"], deletedAt, provider.StateTerminated, "missing")
	requireUntouchedFor(t, 2*scopeGrace, ibm.core, vms, []string{"sick", "healthy"}, foreign)
	assert.Equal(t, int64(2), ibm.core.Counters()["deleted"], "exactly the departed node's two VMs")
	// The leader's listings are searches and nothing else: every VM is
	// alive in the index, with its tags on the instance; its only other
	// calls are the IAM token and the two deletes.
	leaderCalls.Range(func(k, v any) bool {
		switch k.(string) {
		case "POST /v3/resources/search", "POST /identity/token":
		case "DELETE /v1/instances":
			assert.EqualValues(t, 2, v.(*atomic.Int64).Load(), "the leader's deletes")
		default:
			t.Errorf("the leader called %s %d times: its listing should need no read", k, v.(*atomic.Int64).Load())
		}
		return true
	})
}

// TestClusterAuditReplacesTheNodeListingOnIBMCloud is
// TestClusterAuditReplacesTheNodeListing on IBM Cloud: with the cluster
// caa leading, the node's caa makes no Global Search of its own, and an
// instance deleted behind its back is replaced within an audit interval
// through the view (the node reads only that instance, by id); once the
// leader is gone for two intervals, the node searches again.
func TestClusterAuditReplacesTheNodeListingOnIBMCloud(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 5*time.Minute)
	c := startScopeCluster(ctx, t)
	ibm := newIBMCloudFake(t)
	env := append(hermeticEnv(), ibm.env...)

	// The node's caa goes through a front of its own that counts its
	// searches; the same fake serves both caa, so the tags one attaches
	// the other sees.
	target, err := url.Parse(ibm.url)
	require.NoError(t, err)
	proxy := httputil.NewSingleHostReverseProxy(target)
	var searches atomic.Int64
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v3/resources/search" {
			searches.Add(1)
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(front.Close)
	nodeArgs := retarget(ibm.args, ibm.url, front.URL)

	const node = "worker-1"
	_, err = c.CreateNode(ctx, node)
	require.NoError(t, err)
	createPods(ctx, t, c, "team", "pod", node, 3)
	d := launchCaa(t, c, node, filepath.Join(t.TempDir(), "caa", "ledger.db"), "node", append(nodeArgs, "--audit-interval", "1s", "--cluster-view"), env)
	d.waitReady(t, func() {})
	require.Eventually(t, func() bool { return len(ibm.live()) == 3 }, 30*time.Second, condPoll, "three VMs")

	leader := launchClusterCaaOn(t, c, "replica-a", ibm.args, env)
	waitAuditsFromView(t, d, "the node audits against the view")
	before := searches.Load()

	requireReplacedThroughView(t, ibm.core, ibm.live)
	assert.Equal(t, before, searches.Load(), "no search of the node's own while the view is fresh")
	assert.Len(t, ibm.live(), 3)

	leader.stop(t)
	require.Eventually(t, func() bool { return searches.Load() > before }, 30*time.Second, condPoll,
		"the view goes stale: the node searches again")
	assert.Contains(t, d.logs.String(), "auditing alone")
	d.stop(t)
}

// TestClusterScopeOnAzure is TestClusterScopeCollectsDepartedNodes's shape
// on Azure, kept short: the leader lists the cluster with Resource Graph
// queries grouped by node (here answers of two rows, so the nodes do not
// fit one and the listing splits them), deletes a deleted node's VMs
// after the grace and only those, never another node's nor another
// cluster's; and the node caa of a live node audits against the view.
func TestClusterScopeOnAzure(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 5*time.Minute)
	c := startScopeCluster(ctx, t)
	az := newAzureFake(t, armfake.WithGraphPageSize(2))
	id := clusterUID(ctx, t, c)
	env := append(hermeticEnv(), az.env...)

	vms := seedNodes(ctx, t, c, az.core, id, []string{"gone", "other-1", "other-2", "healthy"}, 2, azureSize, azureImage)
	foreign := seedVMsOf(t, az.core, "another-cluster", "gone", 1, azureSize, azureImage)

	healthy := launchCaa(t, c, "healthy", filepath.Join(t.TempDir(), "healthy", "ledger.db"), "azure", append(slices.Clip(az.args), "--cluster-view"), env)
	healthy.waitReady(t, func() {})
	launchClusterCaaOn(t, c, "replica-a", az.args, env)
	require.Eventually(t, func() bool {
		for _, n := range []string{"gone", "other-1", "other-2", "healthy"} {
			node, err := c.Client().CoreV1().Nodes().Get(ctx, n, metav1.GetOptions{})
			if err != nil || !strings.Contains(node.Annotations["caa.dev/cloud-view"], vms[n][0]) {
				return false
			}
		}
		return true
	}, 30*time.Second, condPoll, "every node's view published, its VMs in it")
	waitAuditsFromView(t, healthy, "the live node audits against the view")

	require.NoError(t, c.Client().CoreV1().Nodes().Delete(ctx, "gone", metav1.DeleteOptions{}))
	deletedAt := time.Now()
	requireCollectedAfterGrace(t, az.core, id, "gone", vms["gone"], deletedAt, provider.StateTerminated, "missing")
	requireUntouchedFor(t, 2*scopeGrace, az.core, vms, []string{"other-1", "other-2", "healthy"}, foreign)
	assert.Equal(t, int64(2), az.core.Counters()["deleted"], "exactly the departed node's two VMs")
}
