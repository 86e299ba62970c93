package sandbox

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/pkg/ledger"
	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/pkg/reconcile"
	"github.com/caa-project/caa/test/mocks/cloud"
)

// confidentialRig is a rig whose manager runs with --confidential on:
// "small" and "large" run AMD SEV-SNP.
func confidentialRig(t *testing.T) *rig {
	r := &rig{t: t, cloud: cloud.New(cloud.Options{IDPrefix: "vm-", KeepTerminated: 0}),
		pods: &fakePods{pods: map[string]*reconcile.Pod{}}, side: newFakeSide(), events: &eventLog{},
		path: t.TempDir() + "/ledger.db"}
	r.prov = newMemory(r.cloud)
	r.tweak = func(c *Config) {
		c.Spec.Confidential = true
		c.Spec.TEEs = func(string) []provider.TEE { return []provider.TEE{provider.TEESEVSNP} }
	}
	r.start()
	return r
}

// ordinaryCloud makes every VM ordinary whatever it is asked: a cloud
// that drops the confidential setting.
type ordinaryCloud struct{ provider.Provider }

func (o ordinaryCloud) Create(ctx context.Context, spec provider.Spec) (provider.VM, error) {
	spec.TEE = provider.TEENone
	return o.Provider.Create(ctx, spec)
}

func TestStartVMAsksForTheTEEAndServesTheConfidentialVM(t *testing.T) {
	r := confidentialRig(t)
	ctx := context.Background()
	r.pod("uid-1", "web")
	_, err := r.m.CreateVM(ctx, sbA, shimAnnotations("web"), "/run/netns/ns")
	require.NoError(t, err)
	assert.Equal(t, "sev-snp", r.sandbox(sbA).Confidential, "the TEE asked for is recorded with the sandbox")
	require.NoError(t, r.m.StartVM(ctx, sbA))
	require.Len(t, r.live(), 1)
	assert.Equal(t, "sev-snp", r.live()[0].TEE, "the cloud was asked for an SEV-SNP VM")
	assert.Equal(t, ledger.SandboxRunning, r.sandbox(sbA).Phase)
}

// TestStartVMNeverServesAVMTheCloudReportsNotConfidential: the cloud made
// an ordinary VM for a sandbox that asked for SEV-SNP; StartVM fails with
// the reason, the agent socket is never served, the pod gets a warning
// event, and the VM is deleted on that evidence.
func TestStartVMNeverServesAVMTheCloudReportsNotConfidential(t *testing.T) {
	r := confidentialRig(t)
	r.prov = ordinaryCloud{r.prov}
	r.crash()
	r.start()
	ctx := context.Background()
	r.pod("uid-1", "web")
	sock, err := r.m.CreateVM(ctx, sbA, shimAnnotations("web"), "/run/netns/ns")
	require.NoError(t, err)

	err = r.m.StartVM(ctx, sbA)
	require.ErrorIs(t, err, ErrNotStartable)
	assert.Contains(t, err.Error(), "asked to be confidential (sev-snp) but the cloud reports it as none")
	assert.Nil(t, r.side.relay(sock), "the agent socket is never served")
	assert.False(t, r.side.tunnelUp("/run/netns/ns"))
	assert.Contains(t, r.events.reasons(), reconcile.ReasonNotConfidential)
	eventually(t, func() bool { return len(r.live()) == 0 }, "the ordinary VM is deleted")
	eventually(t, func() bool { _, err := r.led.GetSandbox(sbA); return err != nil }, "the sandbox's record goes")
	hist, err := r.led.SandboxHistory(sbA)
	require.NoError(t, err)
	var refused bool
	for _, e := range hist {
		refused = refused || e.Sandbox.Reason == reconcile.ReasonNotConfidential
	}
	assert.True(t, refused, "the history says why")
}

// TestRestartNeverAdoptsAVMTheCloudReportsNotConfidential: after a
// restart, a running sandbox whose VM the cloud now reports as ordinary
// is not served again; its VM is deleted. The one beside it is served.
func TestRestartNeverAdoptsAVMTheCloudReportsNotConfidential(t *testing.T) {
	r := confidentialRig(t)
	ctx := context.Background()
	r.pod("uid-1", "web")
	r.pod("uid-2", "api")
	other := sbID(7)
	for id, name := range map[string]string{sbA: "web", other: "api"} {
		_, err := r.m.CreateVM(ctx, id, shimAnnotations(name), "/run/netns/ns-"+name)
		require.NoError(t, err)
		require.NoError(t, r.m.StartVM(ctx, id))
	}
	victim := r.sandbox(sbA)
	r.crash()
	require.NoError(t, r.cloud.SetTEE(victim.VMID, ""))

	r.start()
	rep, err := r.m.Sync(ctx, 5*time.Second)
	require.NoError(t, err)
	assert.Equal(t, []string{sbA}, rep.NotConfidential)
	assert.Equal(t, []string{other}, rep.Served)
	assert.Nil(t, r.side.relay(victim.AgentSocket), "not served after the restart")
	assert.NotNil(t, r.side.relay(r.sandbox(other).AgentSocket))
	assert.Contains(t, r.events.reasons(), reconcile.ReasonNotConfidential)
	eventually(t, func() bool { _, err := r.cloud.Get(victim.VMID); return err != nil }, "the ordinary VM is deleted")
	assert.Len(t, r.live(), 1)
}

// TestCreateVMTakesThePodsTEEAnnotation: the pod's caa.dev/tee annotation
// (read from the pod: the shims do not forward it) names the type's TEE or
// is refused naming what the type offers; sgx is refused as not a
// confidential VM, even where a table would offer it.
func TestCreateVMTakesThePodsTEEAnnotation(t *testing.T) {
	r := confidentialRig(t)
	r.tweak = func(c *Config) {
		c.Spec.Confidential = true
		c.Spec.TEEs = func(string) []provider.TEE { return []provider.TEE{provider.TEETDX, provider.TEESGX} }
	}
	r.crash()
	r.start()
	ctx := context.Background()
	r.pod("uid-1", "web").Annotations[provider.AnnotationTEE] = "tdx"
	r.pod("uid-2", "api")
	r.pod("uid-3", "bad").Annotations[provider.AnnotationTEE] = "sev-snp"
	r.pod("uid-4", "sgx").Annotations[provider.AnnotationTEE] = "sgx"
	_, err := r.m.CreateVM(ctx, sbA, shimAnnotations("web"), "/run/netns/ns-1")
	require.NoError(t, err)
	assert.Equal(t, "tdx", r.sandbox(sbA).Confidential)
	_, err = r.m.CreateVM(ctx, sbID(2), shimAnnotations("api"), "/run/netns/ns-2")
	require.NoError(t, err)
	assert.Equal(t, "tdx", r.sandbox(sbID(2)).Confidential, "the type's default TEE")
	_, err = r.m.CreateVM(ctx, sbID(3), shimAnnotations("bad"), "/run/netns/ns-3")
	require.ErrorIs(t, err, ErrInvalid)
	assert.Contains(t, err.Error(), `caa.dev/tee="sev-snp"`)
	assert.Contains(t, err.Error(), "offers tdx, sgx")
	_, err = r.m.CreateVM(ctx, sbID(4), shimAnnotations("sgx"), "/run/netns/ns-4")
	require.ErrorIs(t, err, ErrInvalid)
	assert.Contains(t, err.Error(), "not a confidential VM")
}
