package e2e

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/caa-project/caa/pkg/provider"
)

// writeAdaptorDir writes a ConfigMap's or Secret's keys as its mounted
// volume shows them: one file per key.
func writeAdaptorDir(t *testing.T, keys map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for k, v := range keys {
		require.NoError(t, os.WriteFile(filepath.Join(dir, k), []byte(v), 0o600))
	}
	return dir
}

// TestClusterScopeFromTheAdaptorsSettings: `caa cluster` given only
// upstream's peer-pods-cm and peer-pods-secret (no --provider, no region,
// no credentials in its environment: what the chart's caa-cluster has
// with values-adaptor.yaml) takes the Lease, lists the cloud with the
// Secret's credentials and collects a departed node's VMs. Before, it had
// no --adaptor-config-dir and refused to start without --provider.
func TestClusterScopeFromTheAdaptorsSettings(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 5*time.Minute)
	c := startScopeCluster(ctx, t)
	aws := newAWSCloud(t)
	id := clusterUID(ctx, t, c)
	vms := seedNodes(ctx, t, c, aws.core, id, []string{"gone", "healthy"}, 2, ec2Type, ec2Image)

	cm := writeAdaptorDir(t, map[string]string{"CLOUD_PROVIDER": "aws", "AWS_REGION": "us-east-1",
		"AWS_SUBNET_ID": "subnet-0123456789abcdef0", "AWS_SG_IDS": "sg-0123456789abcdef0", "PODVM_AMI_ID": ec2Image,
		"PODVM_INSTANCE_TYPE": ec2Type, "DISABLECVM": "true", "PEERPODS_LIMIT_PER_NODE": "4"})
	secret := writeAdaptorDir(t, map[string]string{"AWS_ACCESS_KEY_ID": "AKIDE2ETEST", "AWS_SECRET_ACCESS_KEY": "e2e-secret-key"})
	env := append(os.Environ(), "AWS_EC2_METADATA_DISABLED=true", "AWS_CONFIG_FILE=/dev/null", "AWS_SHARED_CREDENTIALS_FILE=/dev/null")
	for _, k := range []string{"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "CAA_PROVIDER", "AWS_REGION"} {
		require.Empty(t, os.Getenv(k), "the test's own environment names no %s", k)
	}
	// The endpoint is the fake's: no adaptor key names one, so it is a flag.
	a := launchClusterCaaOn(t, c, "replica-a", []string{"--adaptor-config-dir", cm + "," + secret, "--aws-endpoint", aws.url}, env)
	require.Eventually(t, func() bool { return leaseHolder(ctx, c) == "replica-a" }, 30*time.Second, condPoll, "it leads")
	waitViewPublished(ctx, t, c, "gone")
	assert.Contains(t, a.logs.String(), `"key":"CLOUD_PROVIDER"`, "the mapping applied is logged")
	assert.NotContains(t, a.logs.String(), "e2e-secret-key", "no credential in the log")

	require.NoError(t, c.Client().CoreV1().Nodes().Delete(ctx, "gone", metav1.DeleteOptions{}))
	deletedAt := time.Now()
	requireCollectedAfterGrace(t, aws.core, id, "gone", vms["gone"], deletedAt, provider.StateTerminated)
	assert.Equal(t, map[string]provider.State{vms["healthy"][0]: provider.StateRunning, vms["healthy"][1]: provider.StateRunning},
		states(aws.core, vms["healthy"]), "the other node's VMs are kept")
}
