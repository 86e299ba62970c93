package sandbox

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/pkg/ledger"
	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/pkg/reconcile"
)

const podUUID = "6f1e2d3c-4b5a-4968-8776-a5b4c3d2e1f0"

func TestReadPodIdentity(t *testing.T) {
	ok := []struct {
		name, sandboxName, ns string
		want                  PodIdentity
	}{
		{"containerd or runtime-rs: the plain name", "web-0", "team", PodIdentity{Namespace: "team", Name: "web-0"}},
		{"the Go shim under CRI-O", "k8s_web-0.a_team_" + podUUID + "_0", "team",
			PodIdentity{Namespace: "team", Name: "web-0.a", UID: podUUID}},
		{"CRI-O's name alone carries the namespace", "k8s_web_team_" + podUUID + "_12", "",
			PodIdentity{Namespace: "team", Name: "web", UID: podUUID}},
		{"a static pod's hash as UID", "k8s_etcd-n1_kube-system_0123456789abcdef0123456789abcdef_1", "kube-system",
			PodIdentity{Namespace: "kube-system", Name: "etcd-n1", UID: "0123456789abcdef0123456789abcdef"}},
	}
	for _, c := range ok {
		t.Run(c.name, func(t *testing.T) {
			got, err := ReadPodIdentity(map[string]string{AnnotationSandboxName: c.sandboxName, AnnotationSandboxNamespace: c.ns})
			require.NoError(t, err)
			assert.Equal(t, c.want, got)
		})
	}
	bad := []struct {
		name, sandboxName, ns, says string
	}{
		{"no name", "", "team", AnnotationSandboxName + " is empty"},
		{"no namespace", "web", "", AnnotationSandboxNamespace + " is empty"},
		{"CRI-O name with a part missing", "k8s_web_team_" + podUUID, "team", "5 parts"},
		{"CRI-O name with an extra part", "k8s_web_x_team_" + podUUID + "_0", "team", "5 parts"},
		{"CRI-O name with a bad UID", "k8s_web_team_not-a-uid_0", "team", `UID "not-a-uid" is not a pod UID`},
		{"CRI-O name with a bad attempt", "k8s_web_team_" + podUUID + "_x", "team", `attempt "x"`},
		{"CRI-O name with an empty pod", "k8s__team_" + podUUID + "_0", "team", "empty pod"},
		{"CRI-O name of another namespace", "k8s_web_other_" + podUUID + "_0", "team", `names namespace "other" but`},
		{"an underscore outside CRI-O's form", "web_1", "team", "is not a pod name"},
		{"upper case", "Web", "team", "is not a pod name"},
		{"a bad namespace", "web", "Team_1", "is not a namespace name"},
	}
	for _, c := range bad {
		t.Run(c.name, func(t *testing.T) {
			_, err := ReadPodIdentity(map[string]string{AnnotationSandboxName: c.sandboxName, AnnotationSandboxNamespace: c.ns})
			require.ErrorIs(t, err, ErrInvalid)
			assert.Contains(t, err.Error(), c.says)
		})
	}
}

// criOAnnotations are what kata's Go shim sends under CRI-O: CRI-O's
// io.kubernetes.cri-o.SandboxName value under the CRI sandbox-name key.
func criOAnnotations(name, uid string) map[string]string {
	a := shimAnnotations(name)
	a[AnnotationSandboxName] = "k8s_" + name + "_team_" + uid + "_0"
	return a
}

func TestCRIONamedSandboxFindsItsPodByUID(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	r.pod(podUUID, "web")
	r.pod("7a7a7a7a-0000-4000-8000-000000000001", "api")

	_, err := r.m.CreateVM(ctx, sbA, criOAnnotations("web", podUUID), "/run/netns/ns")
	require.NoError(t, err)
	s := r.sandbox(sbA)
	assert.Equal(t, podUUID, s.PodUID)
	assert.Equal(t, "team/web", s.PodRef())
	require.NoError(t, r.m.StartVM(ctx, sbA))
	assert.Equal(t, ledger.SandboxRunning, r.sandbox(sbA).Phase)
	assert.Contains(t, string(r.live()[0].UserData()), VMName("web", sbA))

	_, err = r.m.CreateVM(ctx, sbA, criOAnnotations("web", podUUID), "/run/netns/ns")
	require.NoError(t, err, "a repeated CreateVM answers the same")

	// The UID decides: a UID of no pod is not matched by name, and a
	// UID whose pod has another name is refused.
	_, err = r.m.CreateVM(ctx, sbID(2), criOAnnotations("web", "00000000-0000-4000-8000-00000000dead"), "/run/netns/ns")
	require.ErrorIs(t, err, ErrInvalid)
	assert.Contains(t, err.Error(), "team/web (UID 00000000-0000-4000-8000-00000000dead) is not a live pod")
	a := criOAnnotations("web", podUUID)
	a[AnnotationSandboxName] = "k8s_api_team_" + podUUID + "_0"
	_, err = r.m.CreateVM(ctx, sbID(3), a, "/run/netns/ns")
	require.ErrorIs(t, err, ErrInvalid)
	assert.Contains(t, err.Error(), "the pod of that UID is team/web")
	_, err = r.m.CreateVM(ctx, sbA, criOAnnotations("api", "7a7a7a7a-0000-4000-8000-000000000001"), "/run/netns/ns")
	require.ErrorIs(t, err, ErrInvalid, "a recorded sandbox stays its pod's")
	all, err := r.led.ListSandboxes()
	require.NoError(t, err)
	assert.Len(t, all, 1)
}

func TestCRIONamedStaticPodIsFoundByItsMirrorHash(t *testing.T) {
	r := newRig(t)
	hash := "0123456789abcdef0123456789abcdef"
	p := r.pod("5e5e5e5e-0000-4000-8000-000000000002", "etcd")
	p.Annotations[mirrorAnnotation] = hash
	_, err := r.m.CreateVM(context.Background(), sbA, criOAnnotations("etcd", hash), "/run/netns/ns")
	require.NoError(t, err)
	assert.Equal(t, "5e5e5e5e-0000-4000-8000-000000000002", r.sandbox(sbA).PodUID)
}

// withLimits is what kata's Go shim sends for a pod with limits under
// static_sandbox_resource_mgmt (kata's remote configuration): vCPUs and
// memory from the limits, every other setting empty or zero.
func withLimits(name, vcpus, mem string) map[string]string {
	a := shimAnnotations(name)
	a[provider.AnnotationVCPUs], a[provider.AnnotationMemory] = vcpus, mem
	return a
}

func TestPodWithLimitsAndNoInstanceTypesStartsOnTheDefaultType(t *testing.T) {
	r := newRig(t)
	r.m.cfg.Spec = provider.SpecConfig{DefaultType: "small", DefaultImage: "podvm-image",
		Known: []provider.InstanceType{{Name: "small", VCPUs: 1, MemoryMiB: 2048}}}
	ctx := context.Background()
	r.pod("uid-1", "web")

	_, err := r.m.CreateVM(ctx, sbA, withLimits("web", "1", "1024"), "/run/netns/ns")
	require.NoError(t, err)
	assert.Empty(t, r.events.reasons(), "within the default type: nothing to say")

	r.pod("uid-2", "big")
	_, err = r.m.CreateVM(ctx, sbID(2), withLimits("big", "4", "8192"), "/run/netns/ns")
	require.NoError(t, err)
	assert.Equal(t, "small", r.sandbox(sbID(2)).InstanceType)
	assert.Equal(t, []string{EventSmallerThanAsked}, r.events.reasons(), "the pod is told it got less than it asked")
	require.NoError(t, r.m.StartVM(ctx, sbID(2)))
	assert.Equal(t, ledger.SandboxRunning, r.sandbox(sbID(2)).Phase)
	assert.Equal(t, "small", r.live()[0].InstanceType)
}

func TestPodWithLimitsNothingFitsIsRefusedNamingTheFlag(t *testing.T) {
	r := newRig(t) // --instance-types small:1:2048,large:4:8192
	r.pod("uid-1", "web")
	_, err := r.m.CreateVM(context.Background(), sbA, withLimits("web", "16", "2048"), "/run/netns/ns")
	require.ErrorIs(t, err, ErrInvalid)
	assert.Contains(t, err.Error(), "16 vCPUs")
	assert.Contains(t, err.Error(), "--instance-types")
	_, err = r.led.GetSandbox(sbA)
	assert.ErrorIs(t, err, ledger.ErrNotFound)

	_, err = r.m.CreateVM(context.Background(), sbA, withLimits("web", "3", "4096"), "/run/netns/ns")
	require.NoError(t, err)
	assert.Equal(t, "large", r.sandbox(sbA).InstanceType, "the smallest of the list that fits")
}

func TestPodOfAnotherRuntimeClassIsRefused(t *testing.T) {
	r := newRig(t)
	r.m.cfg.RuntimeClasses = []string{"kata-remote", "kata-remote-gpu"}
	// The pod cache marks it NotPeer, as the informer mode sees it.
	r.pods.add(&reconcile.Pod{UID: "uid-q", Namespace: "team", Name: "local", RuntimeClass: "kata-qemu", NotPeer: true,
		Annotations: map[string]string{}})
	_, err := r.m.CreateVM(context.Background(), sbA, shimAnnotations("local"), "/run/netns/ns")
	require.ErrorIs(t, err, ErrInvalid)
	assert.Contains(t, err.Error(), `runtime class "kata-qemu"`)
	assert.Contains(t, err.Error(), "--runtime-class kata-remote,kata-remote-gpu")
	_, err = r.led.GetSandbox(sbA)
	assert.ErrorIs(t, err, ledger.ErrNotFound, "nothing recorded")
	assert.ErrorIs(t, r.m.StartVM(context.Background(), sbA), ErrUnknownSandbox, "so no VM can follow")
	assert.Empty(t, r.live())
}
