package reconcile

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/caa-project/caa/pkg/cluster"
	"github.com/caa-project/caa/pkg/ledger"
	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/test/mocks/cloud"
)

// viewFixture is a pass fixture in the steady state whose audits read the
// view on Node "n" through the real cluster.NodeAudit.
type viewFixture struct {
	passFixture
	kube *fake.Clientset
}

func newViewFixture(t *testing.T, pods []*Pod) viewFixture {
	t.Helper()
	f := viewFixture{passFixture: newPassFixture(t, time.Hour), kube: fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n"}})}
	require.True(t, f.rec.Pass(context.Background(), pods, true).Converged(), "the startup pass lists the cloud and creates")
	f.rec.SetAuditSource(&cluster.NodeAudit{Client: f.kube, Now: f.clock.Now})
	f.rec.audits.steady.Store(true)
	return f
}

// writeView puts v on Node "n" as anyone with patch on Nodes could.
func (f viewFixture) writeView(t *testing.T, vms ...cluster.ViewVM) {
	t.Helper()
	v := cluster.View{At: f.clock.Now(), Every: cluster.Duration(10 * time.Minute), VMs: vms}
	s, err := v.Encode()
	require.NoError(t, err)
	n, err := f.kube.CoreV1().Nodes().Get(context.Background(), "n", metav1.GetOptions{})
	require.NoError(t, err)
	n.Annotations = map[string]string{cluster.ViewAnnotation: s}
	_, err = f.kube.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{})
	require.NoError(t, err)
}

func (f viewFixture) record(t *testing.T, uid string) ledger.Record {
	t.Helper()
	rec, err := f.ledger.Get(uid)
	require.NoError(t, err)
	return rec
}

// TestAForgedViewDecidesNoCloudWrite (issue 30.1): a view written by
// someone else than the cluster caa shows pod B's running VM as pod A's,
// under the key A's record names, beside A's own VM under a new key. Taken
// at its word, pod A keeps its VM and deletes B's as A's duplicate. Every
// VM stays running, and no cloud write is sent.
func TestAForgedViewDecidesNoCloudWrite(t *testing.T) {
	ctx := context.Background()
	pods := peerPods(2)
	f := newViewFixture(t, pods)
	recA, recB := f.record(t, pods[0].UID), f.record(t, pods[1].UID)

	f.writeView(t,
		cluster.ViewVM{ID: recA.VMID, State: provider.StateRunning, PodUID: recA.PodUID, Key: recA.PodUID + "-a7"},
		cluster.ViewVM{ID: recB.VMID, State: provider.StateRunning, PodUID: recA.PodUID, Key: recA.Key},
	)
	f.cloud.ResetCounters()
	for range 3 {
		f.clock.Advance(time.Second)
		res := f.rec.Pass(ctx, pods, true)
		require.NoError(t, res.Err)
	}
	b, err := f.cloud.Get(recB.VMID)
	require.NoError(t, err)
	assert.Equal(t, provider.StateRunning, b.State, "pod B's VM")
	assert.Len(t, f.cloud.Live(), 2)
	assert.Zero(t, f.cloud.Counters()[cloud.OpDelete], "no delete sent")
	assert.Zero(t, f.cloud.Counters()[cloud.OpCreate], "no create sent")
	assert.Equal(t, recA, f.record(t, pods[0].UID), "pod A's record untouched")
	assert.Equal(t, recB, f.record(t, pods[1].UID), "pod B's record untouched")
}

// TestAViewDrivenAdoptionKeepsTheRecord (issue 30.9): a pod's duplicate
// (a VM of a key its record keeps open) shows in the view; the pass keeps
// the recorded VM, deletes the duplicate, and the record still holds the
// kept VM's name, addresses and zone, as the cloud says them.
func TestAViewDrivenAdoptionKeepsTheRecord(t *testing.T) {
	ctx := context.Background()
	pods := peerPods(1)
	f := newViewFixture(t, pods)
	rec := f.record(t, pods[0].UID)
	require.NotEmpty(t, rec.VMName)
	require.NotEmpty(t, rec.IPs)
	require.NotEmpty(t, rec.Zone)

	// A second attempt's VM, made while the record named that key open.
	open := Key(pods[0].UID, 2)
	rec.OpenKeys = []string{open}
	stored, err := f.ledger.Put(rec)
	require.NoError(t, err)
	dup, err := f.rec.Exec.Provider.Create(ctx, provider.Spec{Key: open, Cluster: "c", Node: "n", PodUID: pods[0].UID,
		PodNamespace: "ns", PodName: pods[0].Name, InstanceType: cfg.Spec.DefaultType, Image: cfg.Spec.DefaultImage})
	require.NoError(t, err)

	f.writeView(t,
		cluster.ViewVM{ID: rec.VMID, State: provider.StateRunning, PodUID: rec.PodUID, Key: rec.Key},
		cluster.ViewVM{ID: dup.ID, State: provider.StateRunning, PodUID: rec.PodUID, Key: open},
	)
	f.clock.Advance(time.Second)
	res := f.rec.Pass(ctx, pods, true)
	require.NoError(t, res.Err)
	gone, err := f.cloud.Get(dup.ID)
	require.NoError(t, err)
	assert.True(t, gone.State.Gone(), "the duplicate is deleted: %s", gone.State)
	after := f.record(t, pods[0].UID)
	assert.Equal(t, stored.VMID, after.VMID)
	assert.Equal(t, stored.VMName, after.VMName, "name")
	assert.Equal(t, stored.IPs, after.IPs, "addresses")
	assert.Equal(t, stored.Zone, after.Zone, "zone")
	assert.Empty(t, after.OpenKeys)
}

// TestUnknownVMsInAViewCostBoundedReads: a view naming thousands of VMs the
// ledger does not know costs no more than one listing, not a Get each.
func TestUnknownVMsInAViewCostBoundedReads(t *testing.T) {
	ctx := context.Background()
	pods := peerPods(1)
	f := newViewFixture(t, pods)
	rec := f.record(t, pods[0].UID)
	vms := []cluster.ViewVM{{ID: rec.VMID, State: provider.StateRunning, PodUID: rec.PodUID, Key: rec.Key}}
	for i := range 2000 {
		vms = append(vms, cluster.ViewVM{ID: fmt.Sprintf("i-%08x", i), State: provider.StateRunning})
	}
	f.writeView(t, vms...)
	f.cloud.ResetCounters()
	f.clock.Advance(time.Second)
	require.NoError(t, f.rec.Pass(ctx, pods, true).Err)
	c := f.cloud.Counters()
	assert.Zero(t, c[cloud.OpGet], "no Get per unknown id")
	assert.Equal(t, int64(1), c[cloud.OpList], "one listing instead")

	// A few unknown ids are read by id, each through the read budget.
	f.writeView(t, vms[:MaxViewReads+1]...)
	f.cloud.ResetCounters()
	f.clock.Advance(time.Second)
	budget := rate.NewLimiter(rate.Every(time.Hour), 100)
	f.rec.Exec.Reads = budget
	require.NoError(t, f.rec.Pass(ctx, pods, true).Err)
	c = f.cloud.Counters()
	assert.Equal(t, int64(MaxViewReads), c[cloud.OpGet])
	assert.Zero(t, c[cloud.OpList])
	assert.InDelta(t, 100-MaxViewReads, budget.Tokens(), 0.1, "each read took a token of the read budget")
}

// TestAViewsWordOnAVMIsReadBeforeAWrite: a view that agrees with the
// ledger on who owns a VM can still be wrong about its state (stale, or
// forged). Here it shows pod A's VM running while the cloud has it
// stopped, beside a running duplicate of pod A. Taken at its word, pod A
// keeps the stopped VM and deletes the running one; read first, the
// running VM stays.
func TestAViewsWordOnAVMIsReadBeforeAWrite(t *testing.T) {
	ctx := context.Background()
	pods := peerPods(1)
	f := newViewFixture(t, pods)
	rec := f.record(t, pods[0].UID)
	open := Key(pods[0].UID, 2)
	rec.OpenKeys = []string{open}
	_, err := f.ledger.Put(rec)
	require.NoError(t, err)
	dup, err := f.rec.Exec.Provider.Create(ctx, provider.Spec{Key: open, Cluster: "c", Node: "n", PodUID: pods[0].UID,
		PodNamespace: "ns", PodName: pods[0].Name, InstanceType: cfg.Spec.DefaultType, Image: cfg.Spec.DefaultImage})
	require.NoError(t, err)
	require.NoError(t, f.cloud.Stop(rec.VMID))

	f.writeView(t,
		cluster.ViewVM{ID: rec.VMID, State: provider.StateRunning, PodUID: rec.PodUID, Key: rec.Key},
		cluster.ViewVM{ID: dup.ID, State: provider.StateRunning, PodUID: rec.PodUID, Key: open},
	)
	f.clock.Advance(time.Second)
	require.NoError(t, f.rec.Pass(ctx, pods, true).Err)
	d, err := f.cloud.Get(dup.ID)
	require.NoError(t, err)
	assert.Equal(t, provider.StateRunning, d.State, "the running VM of the pod is kept")
}

// TestAFaithfulViewOfConfidentialVMsCostsNoRead: with confidential VMs
// (caa's default), a view that vouches for every VM spares every read.
// The view carries no TEE, so the VM a vouched record stands for must carry
// the TEE its record asked for: taken as "none", every vouched VM looked
// downgraded and was read by id at every audit (S6's idle fleet with the
// cluster caa made one read per VM per audit, 250% of EC2's
// DescribeInstances refill at 1,000 nodes x 30 pods instead of 0.25%).
func TestAFaithfulViewOfConfidentialVMsCostsNoRead(t *testing.T) {
	ctx := context.Background()
	pods := peerPods(3)
	f := viewFixture{passFixture: newPassFixture(t, time.Hour), kube: fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n"}})}
	f.rec.Config = confidentialCfg()
	require.True(t, f.rec.Pass(ctx, pods, true).Converged(), "the startup pass lists the cloud and creates")
	f.rec.SetAuditSource(&cluster.NodeAudit{Client: f.kube, Now: f.clock.Now})
	f.rec.audits.steady.Store(true)
	var shown []cluster.ViewVM
	for _, p := range pods {
		r := f.record(t, p.UID)
		require.Equal(t, string(provider.TEESEVSNP), r.Confidential)
		shown = append(shown, cluster.ViewVM{ID: r.VMID, State: provider.StateRunning, PodUID: r.PodUID, Key: r.Key})
	}
	f.writeView(t, shown...)
	f.cloud.ResetCounters()
	f.clock.Advance(time.Second)
	res := f.rec.Pass(ctx, pods, true)
	require.NoError(t, res.Err)
	c := f.cloud.Counters()
	assert.Zero(t, c[cloud.OpGet]+c[cloud.OpList], "no read: the view vouches for every VM (counters %v)", c)
	assert.Zero(t, c[cloud.OpCreate]+c[cloud.OpDelete])
}
