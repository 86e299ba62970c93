package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"

	"github.com/caa-project/caa/pkg/health"
	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/pkg/reconcile"
	"github.com/caa-project/caa/test/e2e/cluster"
	"github.com/caa-project/caa/test/mocks/cloud"
)

// Confidential by default (issue 29), on each fake cloud over its real
// SDK: with no --confidential flag a peer pod's VM is a confidential VM as
// the cloud reports it; a caa configured with a type that cannot be one is
// refused at start with the fix named and makes no cloud call; a VM the
// cloud reports as not confidential is never served: the pod gets a
// warning event, the VM is deleted and a confidential one replaces it.

// confidentialCase is one cloud's part: the TEE its default type runs, and
// a type of the same cloud that cannot run a confidential VM.
type confidentialCase struct {
	fc       *fakeCloud
	tee      provider.TEE
	typeFlag string
	ordinary string
	fix      string // the capable type the refusal suggests
}

// newAWSFakeCloud is the fake EC2 as a fakeCloud.
func newAWSFakeCloud(t *testing.T) *fakeCloud {
	aws := newAWSCloud(t)
	return &fakeCloud{name: "aws", url: aws.url, core: aws.core, args: aws.awsArgs(),
		live: func() map[string]string { return liveVMs(aws.core) },
		env: []string{"AWS_ACCESS_KEY_ID=AKIDE2ETEST", "AWS_SECRET_ACCESS_KEY=e2e-secret-key", "AWS_EC2_METADATA_DISABLED=true",
			"AWS_CONFIG_FILE=/dev/null", "AWS_SHARED_CREDENTIALS_FILE=/dev/null"}}
}

func TestConfidentialByDefaultOnEveryCloud(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 10*time.Minute)
	c := cluster.Start(ctx, t)
	for _, tc := range []confidentialCase{
		{fc: newAWSFakeCloud(t), tee: provider.TEESEVSNP, typeFlag: "--aws-instance-type", ordinary: "t3.small", fix: "m6a.large"},
		{fc: newAzureFake(t), tee: provider.TEESEVSNP, typeFlag: "--azure-instance-type", ordinary: "Standard_D2as_v5", fix: "Standard_DC2as_v5"},
		{fc: newIBMCloudFake(t), tee: provider.TEETDX, typeFlag: "--ibmcloud-instance-type", ordinary: "bx2-2x8", fix: "bx3dc-2x10"},
	} {
		// Each cloud its own node, namespace, fake and caa: side by side.
		t.Run(tc.fc.name, func(t *testing.T) { t.Parallel(); runConfidentialByDefault(ctx, t, c, tc) })
	}
}

func runConfidentialByDefault(ctx context.Context, t *testing.T, c *cluster.Cluster, tc confidentialCase) {
	fc := tc.fc
	node := "worker-" + fc.name
	_, err := c.CreateNode(ctx, node)
	require.NoError(t, err)
	ledgerPath := filepath.Join(t.TempDir(), "caa", "ledger.db")

	// A type that cannot be confidential: refused before any cloud call or
	// ledger file, exit code 2, the flag, a capable type and the opt-out
	// named.
	fc.core.ResetCounters()
	refused := startCloudDaemon(t, c, fc, node, ledgerPath, tc.typeFlag, tc.ordinary)
	code := exitCode(t, refused)
	assert.Equal(t, 2, code, "a configuration error is a usage error")
	assert.Contains(t, refused.logs.String(), tc.typeFlag+" "+tc.ordinary+" cannot run a confidential VM (")
	assert.Contains(t, refused.logs.String(), "use "+tc.fix+" or set --confidential=false")
	assert.Zero(t, fc.core.Counters()["total"], "no cloud call before the refusal")
	_, err = os.Stat(ledgerPath)
	assert.ErrorIs(t, err, os.ErrNotExist, "no ledger file made")

	// The default: every VM confidential, as the cloud reports it.
	var pods []*corev1.Pod
	for _, name := range []string{"web", "api"} {
		p, err := c.CreatePeerPod(ctx, "conf-"+fc.name, name, node, nil)
		require.NoError(t, err)
		pods = append(pods, p)
	}
	d := startCloudDaemon(t, c, fc, node, ledgerPath)
	d.waitReady(t, func() {})
	live := fc.core.Live()
	require.Len(t, live, 2)
	for _, in := range live {
		assert.Equal(t, string(tc.tee), in.TEE, "VM %s is a %s VM as the cloud reports it", in.ID, tc.tee)
	}
	assert.Contains(t, d.logs.String(), `"confidential":"on"`, "the start names the setting")
	assert.Contains(t, d.logs.String(), `"confidential":"`+string(tc.tee)+`"`, "each VM created is logged with its TEE")
	snap := statusOf(t, d)
	assert.Equal(t, "on", snap.Confidential)
	require.Len(t, snap.VMs, 2)
	for _, vm := range snap.VMs {
		assert.Equal(t, string(tc.tee), vm.Confidential, "/status names VM %s's TEE", vm.ID)
	}
	// Kept through later passes (each audit lists the cloud): a
	// confidential VM is never read back as an ordinary one.
	kept := fc.live()
	for target := fc.core.Counters()[cloud.OpList] + 2; fc.core.Counters()[cloud.OpList] < target; {
		d.requireRunning(t)
		time.Sleep(condPoll)
	}
	assert.Equal(t, kept, fc.live(), "the confidential VMs are kept through the audits")
	ls := runCaa(t, "ledger", "ls", "--ledger", ledgerPath)
	assert.Regexp(t, `(?m)^POD\s+NAMESPACE\s+PHASE\s+VM\s+TYPE\s+TEE\s`, ls)
	assert.Equal(t, 2, strings.Count(ls, " "+string(tc.tee)+" "), "caa ledger ls names each VM's TEE:\n%s", ls)

	// The cloud reports web's VM as an ordinary VM (the fake's control
	// endpoint): it is never served; warning event, deleted, replaced by a
	// confidential VM.
	web := pods[0]
	old := vmOfPod(fc, string(web.UID))
	require.NotEmpty(t, old)
	q := url.Values{"id": {old}, "tee": {""}}
	resp, err := http.Post(fc.url+cloud.ControlPrefix+"tee?"+q.Encode(), "application/json", nil)
	require.NoError(t, err)
	_ = resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Empty(t, mustGet(t, fc.core, old).TEE)

	deadline := time.Now().Add(2 * time.Minute)
	for {
		in, err := fc.core.Get(old)
		gone := errors.Is(err, cloud.ErrNotFound) || err == nil && in.State == provider.StateTerminated
		now := vmOfPod(fc, string(web.UID))
		if gone && now != "" && now != old && hasEventIn(ctx, t, c, web.Namespace, web.Name, corev1.EventTypeWarning, reconcile.ReasonNotConfidential) {
			assert.Equal(t, string(tc.tee), mustGet(t, fc.core, now).TEE, "the replacement is confidential")
			break
		}
		d.requireRunning(t)
		require.True(t, time.Now().Before(deadline), "the downgraded VM %s was not refused, deleted and replaced (gone %v, now %q)", old, gone, now)
		time.Sleep(condPoll)
	}
	// The ledger never took the downgraded VM back: the pod's record is
	// the replacement, asked to be confidential.
	rec := runCaa(t, "ledger", "get", web.Namespace+"/"+web.Name, "--ledger", ledgerPath)
	assert.Regexp(t, `Confidential \(TEE\):\s+`+string(tc.tee), rec)
	assert.Contains(t, rec, reconcile.ReasonNotConfidential, "the history says why the VM was replaced")
	d.stop(t)
}

// exitCode waits for a caa that is to refuse its start and returns its
// exit code.
func exitCode(t *testing.T, d *daemon) int {
	t.Helper()
	select {
	case err := <-d.done:
		var exit *exec.ExitError
		require.ErrorAs(t, err, &exit, "caa refused its start")
		return exit.ExitCode()
	case <-time.After(time.Minute):
		t.Fatal("caa still running a minute after a start it should refuse")
	}
	return 0
}

func statusOf(t *testing.T, d *daemon) health.Snapshot {
	t.Helper()
	var snap health.Snapshot
	require.NoError(t, json.Unmarshal([]byte(d.get(t, "/status")), &snap))
	return snap
}

// vmOfPod is the live VM of a pod as the cloud's tags say ("" if none).
func vmOfPod(fc *fakeCloud, uid string) string { return fc.live()[uid] }

func mustGet(t *testing.T, core *cloud.Cloud, id string) cloud.Instance {
	t.Helper()
	in, err := core.Get(id)
	require.NoError(t, err)
	return in
}

// TestConfidentialOptOutIsNamed: --confidential=false is the explicit
// opt-out: an ordinary type starts, its VMs are ordinary, and the log
// lines and /status entries that report a VM name the flag.
func TestConfidentialOptOutIsNamed(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 5*time.Minute)
	const node = "worker-1"
	c := startWithNode(ctx, t, node)
	fc := newAWSFakeCloud(t)
	_, err := c.CreatePeerPod(ctx, "team", "plain", node, nil)
	require.NoError(t, err)
	d := startCloudDaemon(t, c, fc, node, filepath.Join(t.TempDir(), "caa", "ledger.db"),
		"--aws-instance-type", "t3.small", "--confidential=false")
	d.waitReady(t, func() {})
	live := fc.core.Live()
	require.Len(t, live, 1)
	assert.Empty(t, live[0].TEE, "an ordinary VM, as asked")
	assert.Contains(t, d.logs.String(), `"confidential":"off (--confidential=false)"`)
	snap := statusOf(t, d)
	assert.Equal(t, "off (--confidential=false)", snap.Confidential)
	require.Len(t, snap.VMs, 1)
	assert.Equal(t, "off (--confidential=false)", snap.VMs[0].Confidential)
	d.stop(t)
}
