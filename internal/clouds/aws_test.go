//go:build caa_aws || !(caa_aws || caa_azure || caa_ibmcloud)

package clouds

import (
	"context"
	"log/slog"
	"net/http/httptest"
	"path/filepath"
	"testing"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/test/conformance"
	ec2fake "github.com/caa-project/caa/test/mocks/aws"
	"github.com/caa-project/caa/test/mocks/cloud"
)

func awsEnv(t *testing.T) {
	dir := t.TempDir()
	for k, v := range map[string]string{
		"AWS_ACCESS_KEY_ID": "AKIACAATESTKEY4D1F00", "AWS_SECRET_ACCESS_KEY": "caa-test-secret", "AWS_SESSION_TOKEN": "",
		"AWS_PROFILE": "", "AWS_CONFIG_FILE": filepath.Join(dir, "config"), "AWS_SHARED_CREDENTIALS_FILE": filepath.Join(dir, "credentials"),
		"AWS_EC2_METADATA_DISABLED": "", "AWS_EC2_METADATA_SERVICE_ENDPOINT": "", "AWS_ENDPOINT_URL": "", "AWS_ENDPOINT_URL_EC2": "",
		"AWS_REGION": "", "CAA_AWS_REGION": "", "CAA_AWS_SUBNET_ID": "", "CAA_AWS_SECURITY_GROUP_IDS": "",
	} {
		t.Setenv(k, v)
	}
}

func openAWS(t *testing.T, args ...string) *Cloud {
	t.Helper()
	c, err := Find(Compiled(), "aws")
	require.NoError(t, err)
	fs := pflag.NewFlagSet("caa", pflag.ContinueOnError)
	c.AddFlags(fs)
	require.NoError(t, fs.Parse(args))
	return c
}

// Day one on EC2 with upstream's settings: no security groups named. caa
// takes the worker's own from its instance metadata, so the worker reaches
// the pod VMs; launched into the VPC's default group they would never
// answer (the fake marks them so, as EC2's default group behaves).
func TestAWSWithoutGroupsUsesTheWorkers(t *testing.T) {
	awsEnv(t)
	core := cloud.New(ec2fake.CloudOptions(conformance.Options(&conformance.Clock{})))
	ec2 := httptest.NewServer(ec2fake.NewServer(core))
	t.Cleanup(ec2.Close)
	md := httptest.NewServer(ec2fake.NodeIMDS(ec2fake.Node{
		Region: "us-east-1", MAC: "0e:00:00:00:00:01", Subnet: "subnet-0123456789abcdef0", Groups: []string{"sg-0123456789abcdef0"},
	}, nil))
	t.Cleanup(md.Close)
	t.Setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", md.URL)

	c := openAWS(t, "--aws-endpoint", ec2.URL, "--aws-region", "us-east-1", "--aws-subnet-id", "subnet-0123456789abcdef0", "--aws-image", "ami-0123456789abcdef0", "--aws-instance-type", "m6a.large")
	p, _, err := c.Open(context.Background(), slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	vm, err := p.Create(context.Background(), conformance.Spec(1, "node-a"))
	require.NoError(t, err)
	in, err := core.Get(vm.ID)
	require.NoError(t, err)
	assert.Empty(t, in.Unreachable, "the worker reaches its pod VM")
}

// Off EC2, with no groups named, caa refuses to start and says what to set.
func TestAWSWithoutGroupsOrMetadataRefusesToStart(t *testing.T) {
	awsEnv(t)
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	c := openAWS(t, "--aws-endpoint", "http://127.0.0.1:1", "--aws-region", "us-east-1", "--aws-subnet-id", "subnet-0123456789abcdef0")
	_, _, err := c.Open(context.Background(), slog.New(slog.DiscardHandler))
	require.Error(t, err)
	assert.ErrorContains(t, err, "--aws-security-group-ids or CAA_AWS_SECURITY_GROUP_IDS")
	assert.ErrorContains(t, err, "UDP 4789")
}
