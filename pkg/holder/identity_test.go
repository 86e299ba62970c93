package holder

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	authv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/caa-project/caa/pkg/handover"
)

const ns = "caa-system"

var (
	isController = true
	dsCaa        = &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: "caa", Namespace: ns, UID: "ds-uid"},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "caa"}},
			UpdateStrategy: appsv1.DaemonSetUpdateStrategy{Type: appsv1.RollingUpdateDaemonSetStrategyType,
				RollingUpdate: &appsv1.RollingUpdateDaemonSet{MaxSurge: ptr(intstr.FromInt32(1))}},
		},
	}
)

func ptr[T any](v T) *T { return &v }

func caaPod(name, uid, node, rev string, owner types.UID) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, UID: types.UID(uid),
			Labels:          map[string]string{"app": "caa", revisionLabel: rev},
			OwnerReferences: []metav1.OwnerReference{{Kind: "DaemonSet", Name: "caa", UID: owner, Controller: &isController}}},
		Spec: corev1.PodSpec{NodeName: node},
	}
}

func revision(hash string, n int64) *appsv1.ControllerRevision {
	return &appsv1.ControllerRevision{
		ObjectMeta: metav1.ObjectMeta{Name: "caa-" + hash, Namespace: ns, Labels: map[string]string{"app": "caa", revisionLabel: hash},
			OwnerReferences: []metav1.OwnerReference{{Kind: "DaemonSet", Name: "caa", UID: "ds-uid", Controller: &isController}}},
		Revision: n,
	}
}

func TestVerifier(t *testing.T) {
	const newUID = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
	self := caaPod("caa-old", "11111111-1111-1111-1111-111111111111", "worker-1", "rev1", "ds-uid")
	client := fake.NewSimpleClientset(dsCaa, self,
		caaPod("caa-new", newUID, "worker-1", "rev2", "ds-uid"),
		caaPod("caa-undo", "22222222-2222-2222-2222-222222222222", "worker-1", "rev1", "ds-uid"),
		caaPod("caa-elsewhere", "33333333-3333-3333-3333-333333333333", "worker-2", "rev2", "ds-uid"),
		caaPod("intruder", "44444444-4444-4444-4444-444444444444", "worker-1", "rev2", "other-ds"),
		revision("rev1", 1), revision("rev2", 2))
	ctx := context.Background()
	gotSelf, ds, err := SelfAndDaemonSet(ctx, client, ns, "caa-old")
	require.NoError(t, err)
	assert.Equal(t, "caa", ds.Name)
	assert.True(t, Surge(ds))

	procRoot := t.TempDir()
	proc := func(pid, uid, nspid string) {
		dir := filepath.Join(procRoot, pid)
		require.NoError(t, os.MkdirAll(dir, 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(dir, "cgroup"), []byte("0::/kubepods/besteffort/pod"+uid+"/c1\n"), 0o644))
		require.NoError(t, os.WriteFile(filepath.Join(dir, "status"), []byte("NSpid:\t"+pid+"\t"+nspid+"\n"), 0o644))
	}
	proc("100", newUID, "1")                                 // the new caa's main process
	proc("200", newUID, "9")                                 // a kubectl exec into the new pod
	proc("300", "44444444-4444-4444-4444-444444444444", "1") // another pod's process
	proc("400", "22222222-2222-2222-2222-222222222222", "1") // the older revision's caa
	v := &Verifier{Client: client, Node: "worker-1", Self: gotSelf, DaemonSet: ds, CheckProcess: true, ProcRoot: procRoot}

	for _, tc := range []struct {
		name string
		peer handover.Peer
		pid  int
		want string // "" admits
	}{
		{"the new revision's caa", handover.Peer{Pod: "caa-new", Namespace: ns, UID: newUID}, 100, ""},
		{"kubectl exec into the new pod", handover.Peer{Pod: "caa-new", Namespace: ns, UID: newUID}, 200, "not its container's main process"},
		{"another pod claiming the new pod's name", handover.Peer{Pod: "caa-new", Namespace: ns}, 300, "not in pod caa-system/caa-new"},
		{"a process outside this pid namespace", handover.Peer{Pod: "caa-new", Namespace: ns}, 0, "not visible"},
		{"kubectl exec into this caa's own pod", handover.Peer{Pod: "caa-old", Namespace: ns}, 100, "this caa's own pod"},
		{"an older revision (a rollout undo in flight)", handover.Peer{Pod: "caa-undo", Namespace: ns}, 400, `runs revision "rev1"`},
		{"a caa pod of another node", handover.Peer{Pod: "caa-elsewhere", Namespace: ns}, 100, "runs on node"},
		{"a pod of another controller", handover.Peer{Pod: "intruder", Namespace: ns}, 300, "is not a pod of DaemonSet"},
		{"a pod that does not exist", handover.Peer{Pod: "ghost", Namespace: ns}, 100, "not found"},
		{"no pod named", handover.Peer{}, 100, "only a pod of DaemonSet caa-system/caa"},
		{"a recreated pod's old UID", handover.Peer{Pod: "caa-new", Namespace: ns, UID: "55555555-5555-5555-5555-555555555555"}, 100, "says pod UID"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id, err := v.Verify(ctx, tc.peer, handover.Cred{PID: tc.pid})
			if tc.want == "" {
				require.NoError(t, err)
				assert.Equal(t, newUID, id, "the identity the kernel vouched for")
				return
			}
			assert.Empty(t, id)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}

	noSurge := dsCaa.DeepCopy()
	noSurge.Spec.UpdateStrategy.RollingUpdate = &appsv1.RollingUpdateDaemonSet{MaxUnavailable: ptr(intstr.FromInt32(1)), MaxSurge: ptr(intstr.FromInt32(0))}
	assert.False(t, Surge(noSurge))
}

// TestVerifierByToken: without the process check (no hostPID, the shipped
// DaemonSet) the asker proves its pod with its service account token,
// which the apiserver reviews. Before, an asker that named the new pod
// (and its UID, read off the apiserver) was taken at its word: a local
// process could take the ledger, or make the real pod's hand-over fail
// and get it refused for the cooldown.
func TestVerifierByToken(t *testing.T) {
	const newUID = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
	self := caaPod("caa-old", "11111111-1111-1111-1111-111111111111", "worker-1", "rev1", "ds-uid")
	self.Spec.ServiceAccountName = "caa"
	client := fake.NewSimpleClientset(dsCaa, self, caaPod("caa-new", newUID, "worker-1", "rev2", "ds-uid"),
		revision("rev1", 1), revision("rev2", 2))
	sa := "system:serviceaccount:" + ns + ":caa"
	users := map[string]authv1.UserInfo{
		"token-new":    {Username: sa, Extra: map[string]authv1.ExtraValue{tokenPodName: {"caa-new"}, tokenPodUID: {newUID}}},
		"token-old":    {Username: sa, Extra: map[string]authv1.ExtraValue{tokenPodName: {"caa-old"}, tokenPodUID: {string(self.UID)}}},
		"token-other":  {Username: "system:serviceaccount:team:web", Extra: map[string]authv1.ExtraValue{tokenPodName: {"caa-new"}, tokenPodUID: {newUID}}},
		"token-legacy": {Username: sa}, // a long-lived Secret token, bound to no pod
	}
	reviews := 0
	client.PrependReactor("create", "tokenreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		reviews++
		tr := a.(k8stesting.CreateAction).GetObject().(*authv1.TokenReview).DeepCopy()
		if u, ok := users[tr.Spec.Token]; ok {
			tr.Status = authv1.TokenReviewStatus{Authenticated: true, User: u}
		} else {
			tr.Status = authv1.TokenReviewStatus{Error: "invalid bearer token"}
		}
		return true, tr, nil
	})
	ctx := context.Background()
	gotSelf, ds, err := SelfAndDaemonSet(ctx, client, ns, "caa-old")
	require.NoError(t, err)
	v := &Verifier{Client: client, Node: "worker-1", Self: gotSelf, DaemonSet: ds}

	for _, tc := range []struct {
		name  string
		token string
		want  string // "" admits
	}{
		{"the new pod with its own token", "token-new", ""},
		{"a process naming the new pod, with no token", "", "sent no service account token"},
		{"a process naming the new pod, with a forged token", "forged", "does not accept the asker's token: invalid bearer token"},
		{"a process naming the new pod, with this caa's own token", "token-old", "bound to pod [caa-old]"},
		{"another service account's token bound to the new pod", "token-other", "system:serviceaccount:team:web's"},
		{"a token bound to no pod", "token-legacy", "bound to pod []"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id, err := v.Verify(ctx, handover.Peer{Pod: "caa-new", Namespace: ns, UID: newUID, Token: tc.token}, handover.Cred{})
			if tc.want == "" {
				require.NoError(t, err)
				assert.Equal(t, newUID, id, "the identity the apiserver vouched for")
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			assert.Empty(t, id)
		})
	}
	assert.Equal(t, 5, reviews, "every asker with a token is reviewed")
	assert.NotContains(t, handover.Peer{Pod: "caa-new", Token: "token-new"}.String(), "token-new", "a token never reaches a log")
}
