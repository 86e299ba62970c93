package e2e

import (
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/pkg/reconcile"
	"github.com/caa-project/caa/test/e2e/cluster"
	ec2fake "github.com/caa-project/caa/test/mocks/aws"
	"github.com/caa-project/caa/test/mocks/cloud"
)

// TestARebuiltLedgerNeverReusesASpentKey (issue 18.4), through the binary:
// a pod's VM of attempt 1 is terminated behind caa's back and EC2 no longer
// lists it (it lists terminated instances about an hour; the fake here
// forgets them at once), but it still remembers the client token. The
// ledger is lost and rebuilt: nothing of the pod is left to record, so
// the daemon creates again from attempt 1, whose token EC2 answers with
// IdempotentInstanceTerminated. caa must take the next attempt's key and
// converge, rather than retry the spent key for ever.
func TestARebuiltLedgerNeverReusesASpentKey(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 10*time.Minute)
	c := cluster.Start(ctx, t)
	core := cloud.New(ec2fake.CloudOptions(cloud.Options{Images: []string{"ami-0123456789abcdef0"}, KeepTerminated: time.Millisecond}))
	srv := httptest.NewServer(ec2fake.NewServer(core))
	t.Cleanup(srv.Close)
	aws := &awsCloud{core: core, url: srv.URL}
	const node = "worker-1"
	_, err := c.CreateNode(ctx, node)
	require.NoError(t, err)
	pod, err := c.CreatePeerPod(ctx, "team", "web", node, nil)
	require.NoError(t, err)
	uid := string(pod.UID)
	ledgerPath := filepath.Join(t.TempDir(), "caa", "ledger.db")

	d := startDaemon(t, c, aws, node, ledgerPath)
	d.waitReady(t, func() { require.Len(t, liveVMs(core), 1) })
	d.stop(t)
	first := liveVMs(core)[uid]
	require.NotEmpty(t, first)
	require.NoError(t, core.Kill(first))
	require.NoError(t, os.Remove(ledgerPath))

	out := runCaa(t, "ledger", "rebuild", "--provider", "aws", "--node-name", node, "--kubeconfig", c.Kubeconfig(),
		"--ledger", ledgerPath, "--aws-endpoint", aws.url, "--aws-region", "us-east-1",
		"--aws-security-group-ids", "sg-0123456789abcdef0", "--aws-subnet-id", "subnet-0123456789abcdef0")
	assert.Contains(t, out, "recorded 0 VMs")

	d = startDaemon(t, c, aws, node, ledgerPath)
	d.waitReady(t, func() {
		live := core.Live()
		require.Len(t, live, 1, "one VM for the pod")
		assert.Equal(t, reconcile.Key(uid, 2), live[0].Tags[provider.TagKey], "the spent key of attempt 1 was skipped")
	})
	d.stop(t)
	out = runCaa(t, "ledger", "get", "team/web", "--ledger", ledgerPath)
	assert.Contains(t, out, reconcile.Key(uid, 2))
	assert.Contains(t, d.logs.String(), "idempotency key already spent")
}
