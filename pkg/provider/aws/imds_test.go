package aws

import (
	"context"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	ec2fake "github.com/caa-project/caa/test/mocks/aws"
)

const workerGroup = "sg-0f0e0d0c0b0a09080"

func workerIMDS(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(ec2fake.NodeIMDS(ec2fake.Node{
		Region: testRegion, MAC: "0e:11:22:33:44:55", Subnet: testSubnet, Groups: []string{workerGroup, testGroup},
	}, nil))
	t.Cleanup(srv.Close)
	return srv.URL
}

// With no security groups, region or subnet, caa takes the worker's own
// from its instance metadata, as upstream does: the VMs then share the
// worker's groups and the worker reaches them.
func TestEmptySettingsComeFromTheWorkersMetadata(t *testing.T) {
	ctx := context.Background()
	url := workerIMDS(t)
	f := newFakeEC2(t, suiteOptions(), func(c *Config) {
		c.Region, c.SubnetID, c.SecurityGroupIDs, c.IMDSEndpoint = "", "", nil, url
		require.NoError(t, c.FillFromIMDS(ctx))
		assert.Equal(t, testRegion, c.Region)
		assert.Equal(t, testSubnet, c.SubnetID)
		assert.Equal(t, []string{workerGroup, testGroup}, c.SecurityGroupIDs)
	})
	assert.Contains(t, f.logs.String(), "aws settings taken from the worker's instance metadata")
	vm, err := f.provider.Create(ctx, specFor(1))
	require.NoError(t, err)
	in, err := f.cloud.Get(vm.ID)
	require.NoError(t, err)
	assert.Empty(t, in.Unreachable, "the VM is in the worker's groups")
}

// Settings given are never replaced, and nothing is read for them.
func TestGivenSettingsAreKept(t *testing.T) {
	cfg := Config{Region: "eu-west-1", SubnetID: testSubnet, SecurityGroupIDs: []string{testGroup}, IMDSEndpoint: "http://127.0.0.1:1"}
	require.NoError(t, cfg.FillFromIMDS(context.Background()), "nothing to read: no call")
	assert.Equal(t, []string{testGroup}, cfg.SecurityGroupIDs)

	cfg.SecurityGroupIDs = nil
	cfg.IMDSEndpoint = workerIMDS(t)
	require.NoError(t, cfg.FillFromIMDS(context.Background()))
	assert.Equal(t, "eu-west-1", cfg.Region, "a given region stays")
	assert.Equal(t, []string{workerGroup, testGroup}, cfg.SecurityGroupIDs)
}

// Off EC2 (or with the metadata service out of reach) caa refuses to
// start and names what to set, with the rules the groups need.
func TestNoMetadataNamesTheFlags(t *testing.T) {
	srv := httptest.NewServer(nil) // 404 for everything
	t.Cleanup(srv.Close)
	cfg := Config{Region: testRegion, SubnetID: testSubnet, IMDSEndpoint: srv.URL}
	err := cfg.FillFromIMDS(context.Background())
	require.Error(t, err)
	for _, want := range []string{"--aws-security-group-ids or CAA_AWS_SECURITY_GROUP_IDS", "TCP 15150", "UDP 4789"} {
		assert.ErrorContains(t, err, want)
	}
	assert.NotContains(t, err.Error(), "--aws-region", "only what is missing is named")
}

// The fake EC2 refuses what EC2 does: a VM launched with no group goes into
// the VPC's default group and the worker never reaches it.
func TestFakeDefaultGroupIsUnreachable(t *testing.T) {
	ctx := context.Background()
	f := newFakeEC2(t, suiteOptions(), func(c *Config) { c.SecurityGroupIDs = nil })
	vm, err := f.provider.Create(ctx, specFor(1))
	require.NoError(t, err, "EC2 takes the launch")
	in, err := f.cloud.Get(vm.ID)
	require.NoError(t, err)
	assert.Contains(t, in.Unreachable, "default security group")
}
