package e2e

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"

	"github.com/caa-project/caa/pkg/ledger"
	"github.com/caa-project/caa/pkg/reconcile"
	"github.com/caa-project/caa/test/mocks/cloud"
	katafake "github.com/caa-project/caa/test/mocks/kata"
)

// TestHypervisorNeverServesAVMTheCloudReportsNotConfidential: in the kata
// remote-hypervisor mode, on the fake EC2 over the real SDK, a sandbox's
// VM is asked to be AMD SEV-SNP by default; when the cloud reports it as
// an ordinary VM (the fake's control endpoint), caa never serves it:
//   - during StartVM: StartVM fails (FailedPrecondition) naming why, the
//     pod gets a VMNotConfidential warning event, and the VM is deleted;
//   - after a restart: the running sandbox is not served again (its agent
//     socket stays closed), the event, the VM deleted, the record gone.
func TestHypervisorNeverServesAVMTheCloudReportsNotConfidential(t *testing.T) {
	t.Parallel()
	ctx, e := newHVEnv(t, 4*time.Minute)
	web := e.newPod(ctx, t, "shop", "web", nil)
	api := e.newPod(ctx, t, "shop", "api", nil)
	d := e.startReady(t)
	// downgrade has the fake EC2 report the VM as an ordinary one, through
	// its control endpoint.
	downgrade := func(id string) {
		t.Helper()
		rec := httptest.NewRecorder()
		q := url.Values{"id": {id}, "tee": {""}}
		e.ec2.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, cloud.ControlPrefix+"tee?"+q.Encode(), nil))
		require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	}

	// During StartVM: the VM boots slowly, and the cloud reports it as
	// ordinary before it runs.
	e.core.SetFaults(cloud.Faults{BootDelay: 20 * time.Second})
	first := sandboxID(31)
	_, err := e.shim.CreateVM(ctx, first, web.annotations(nil), web.net.NSPath)
	require.NoError(t, err)
	started := make(chan error, 1)
	go func() { started <- e.shim.StartVM(ctx, first) }()
	require.Eventually(t, func() bool { return len(e.sandboxVMs(first)) == 1 }, time.Minute, 20*time.Millisecond, "the VM is made")
	vm := e.sandboxVMs(first)[0]
	assert.Equal(t, "sev-snp", vm.TEE, "the sandbox's VM was asked to be AMD SEV-SNP")
	downgrade(vm.ID)
	select {
	case err = <-started:
	case <-ctx.Done():
		t.Fatal("StartVM never answered")
	}
	require.Error(t, err, "a VM the cloud reports as ordinary is never served")
	assert.Equal(t, codes.FailedPrecondition, status.Code(err), "%v", err)
	assert.Contains(t, err.Error(), "asked to be confidential (sev-snp) but the cloud reports it as none")
	e.core.SetFaults(cloud.Faults{})
	require.Eventually(t, func() bool { return len(e.liveSandboxVMs(first)) == 0 }, time.Minute, 20*time.Millisecond,
		"the ordinary VM is deleted on that evidence")
	require.Eventually(t, func() bool {
		return hasEventIn(ctx, t, e.c, "shop", "web", corev1.EventTypeWarning, reconcile.ReasonNotConfidential)
	}, 20*time.Second, 50*time.Millisecond, "the pod is told why")

	// After a restart: a served sandbox whose VM the cloud now reports as
	// ordinary is not served again.
	second := sandboxID(32)
	sock, err := e.shim.CreateVM(ctx, second, api.annotations(nil), api.net.NSPath)
	require.NoError(t, err)
	require.NoError(t, e.shim.StartVM(ctx, second), "failed boots: %v", e.fleet.Failed())
	require.NoError(t, katafake.CheckAgent(ctx, sock))
	vms := e.liveSandboxVMs(second)
	require.Len(t, vms, 1)
	assert.Equal(t, "sev-snp", vms[0].TEE)
	assert.Contains(t, d.logs.String(), `"confidential":"sev-snp"`, "the sandbox's VM is logged with its TEE")
	d.stop(t)
	downgrade(vms[0].ID)

	d = e.start(t)
	require.Eventually(t, func() bool { return len(e.liveSandboxVMs(second)) == 0 }, time.Minute, 20*time.Millisecond,
		"the ordinary VM is deleted after the restart, not adopted")
	require.Eventually(t, func() bool {
		return hasEventIn(ctx, t, e.c, "shop", "api", corev1.EventTypeWarning, reconcile.ReasonNotConfidential)
	}, 20*time.Second, 50*time.Millisecond)
	assert.Error(t, katafake.CheckAgent(ctx, sock), "the agent socket is not served again")
	d.waitReady(t, func() {})
	d.stop(t)
	_, hist, err := e.readLedger(t, second)
	assert.ErrorIs(t, err, ledger.ErrNotFound, "the record goes with the VM")
	require.NotEmpty(t, hist)
	var refused bool
	for _, h := range hist {
		refused = refused || h.Sandbox.Reason == reconcile.ReasonNotConfidential && h.Sandbox.VMID == vms[0].ID
	}
	assert.True(t, refused, "the history says why VM %s was deleted", vms[0].ID)
}
