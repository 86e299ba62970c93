package aws

import (
	"context"
	"log/slog"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/internal/logbuf"
	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/test/conformance"
	ec2fake "github.com/caa-project/caa/test/mocks/aws"
	"github.com/caa-project/caa/test/mocks/cloud"
)

// These tests run the provider against a fake EC2 that enforces the IAM
// policy shipped in deploy/overlays/aws/iam-policy.json: every call caa
// makes passes under it, each of its permissions is needed, and Preflight
// names what is missing or wrong.

const (
	policyImage = "ami-00000000000000def"
	policyType  = "t3.small"
)

// shippedPolicy reads the policy the deployment documents.
func shippedPolicy(t testing.TB) *ec2fake.Policy {
	t.Helper()
	p, err := ec2fake.ReadPolicy(filepath.Join("..", "..", "..", filepath.FromSlash(PolicyFile)))
	require.NoError(t, err)
	return p
}

// newPolicyFake is a fake EC2 that knows one subnet and security group,
// one image and one instance type, and authorizes every call against
// policy (nil: allow all), with a provider configured for exactly those.
func newPolicyFake(t testing.TB, policy func() *ec2fake.Policy, edit func(*Config)) fakeEC2 {
	t.Helper()
	c := cloud.New(ec2fake.CloudOptions(cloud.Options{Images: []string{policyImage}, Types: []string{policyType}}))
	srv := httptest.NewServer(ec2fake.NewServer(c, ec2fake.WithCredentials(testAccessKeyID, testSecretKey),
		ec2fake.WithNetwork([]string{testSubnet}, []string{testGroup}), ec2fake.WithPolicyFunc(policy)))
	t.Cleanup(srv.Close)
	isolateSDK(t, testAccessKeyID, testSecretKey)
	logs := &logbuf.Buffer{}
	cfg := Config{
		Region: testRegion, SubnetID: testSubnet, SecurityGroupIDs: []string{testGroup},
		Image: policyImage, InstanceType: policyType,
		ExtraTags: map[string]string{"team": "platform"},
		Endpoint:  srv.URL, MaxBackoff: 20 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	if edit != nil {
		edit(&cfg)
	}
	p, err := New(context.Background(), cfg)
	require.NoError(t, err)
	return fakeEC2{provider: p, cloud: c, url: srv.URL, logs: logs}
}

func policySpec(n int) provider.Spec {
	s := conformance.Spec(n, "node-a")
	s.InstanceType, s.Image = policyType, policyImage
	return s
}

// TestTheShippedPolicyCoversEveryCall: Create (with its client-token
// lookup), Get, List and Delete, and Preflight, all pass under exactly the
// shipped policy.
func TestTheShippedPolicyCoversEveryCall(t *testing.T) {
	ctx := context.Background()
	policy := shippedPolicy(t)
	f := newPolicyFake(t, func() *ec2fake.Policy { return policy }, nil)
	require.NoError(t, f.provider.Preflight(ctx), "preflight with no instance of caa's yet")
	vm, err := f.provider.Create(ctx, policySpec(1))
	require.NoError(t, err)
	again, err := f.provider.Create(ctx, policySpec(1))
	require.NoError(t, err, "the idempotent replay")
	assert.Equal(t, vm.ID, again.ID)
	_, err = f.provider.Get(ctx, vm.ID)
	require.NoError(t, err)
	vms, err := f.provider.List(ctx, provider.Selector{Cluster: conformance.Cluster, Node: "node-a"})
	require.NoError(t, err)
	assert.Len(t, vms, 1)
	require.NoError(t, f.provider.Preflight(ctx), "preflight with one of caa's instances to dry-run a terminate on")
	assert.Len(t, f.cloud.Live(), 1, "the preflight's dry runs made and ended nothing")
	require.NoError(t, f.provider.Delete(ctx, vm.ID))
	assert.Empty(t, f.cloud.Live())
}

// TestEachPermissionIsNeeded takes each action out of the shipped policy
// in turn: the provider calls that need it fail with ErrAuth naming it,
// the others still pass, and Preflight reports it before any of them.
func TestEachPermissionIsNeeded(t *testing.T) {
	ctx := context.Background()
	full := shippedPolicy(t)
	actions := full.Actions()
	require.Equal(t, []string{"ec2:CreateTags", "ec2:DescribeInstances", "ec2:RunInstances", "ec2:TerminateInstances"}, actions,
		"the policy holds exactly the actions the provider calls")
	for _, action := range actions {
		t.Run(action, func(t *testing.T) {
			var current atomic.Pointer[ec2fake.Policy]
			current.Store(full)
			f := newPolicyFake(t, current.Load, nil)
			// One instance of caa's made under the full policy, so the
			// terminate can be dry-run and tried.
			existing, err := f.provider.Create(ctx, policySpec(1))
			require.NoError(t, err)
			current.Store(full.Without(action))

			needs := func(name string, err error, needed bool) {
				t.Helper()
				if !needed {
					assert.NoError(t, err, "%s does not need %s", name, action)
					return
				}
				require.Error(t, err, "%s needs %s", name, action)
				assert.ErrorIs(t, err, provider.ErrAuth, "%s without %s", name, action)
				assert.Contains(t, err.Error(), action, "the error of %s names the missing permission", name)
			}
			perr := f.provider.Preflight(ctx)
			needs("Preflight", perr, true)
			_, err = f.provider.Create(ctx, policySpec(2))
			needs("Create of a fresh key", err, action == "ec2:RunInstances" || action == "ec2:CreateTags")
			resumed := policySpec(3)
			resumed.MaybeSent = true
			_, err = f.provider.Create(ctx, resumed)
			needs("Create of a key that may have been sent", err, action != "ec2:TerminateInstances")
			_, err = f.provider.Get(ctx, existing.ID)
			needs("Get", err, action == "ec2:DescribeInstances")
			_, err = f.provider.List(ctx, provider.Selector{Cluster: conformance.Cluster, Node: "node-a"})
			needs("List", err, action == "ec2:DescribeInstances")
			err = f.provider.Delete(ctx, existing.ID)
			needs("Delete", err, action == "ec2:TerminateInstances")
			live := 1 // the existing instance
			if action != "ec2:TerminateInstances" {
				live-- // deleted
			} else {
				live++ // the resumed create's
			}
			if action != "ec2:RunInstances" && action != "ec2:CreateTags" {
				live++ // the fresh create's
			}
			assert.Len(t, f.cloud.Live(), live)
			t.Logf("preflight without %s: %v", action, perr)
		})
	}
}

// TestTagConditionsAreEnforced: the policy's tag conditions, not only its
// actions, decide. A launch without caa's tags and a terminate of an
// instance caa did not tag are refused; caa's own pass.
func TestTagConditionsAreEnforced(t *testing.T) {
	ctx := context.Background()
	policy := shippedPolicy(t)
	f := newPolicyFake(t, func() *ec2fake.Policy { return policy }, nil)

	// An instance someone else launched in the account, without caa's tags.
	foreign, err := f.cloud.Create(cloud.CreateRequest{Image: policyImage, InstanceType: policyType, Tags: map[string]string{"team": "other"}})
	require.NoError(t, err)
	err = f.provider.Delete(ctx, foreign.ID)
	require.ErrorIs(t, err, provider.ErrAuth, "caa may not terminate an instance it did not tag")
	assert.Contains(t, err.Error(), "ec2:TerminateInstances")
	assert.Len(t, f.cloud.Live(), 1)

	// A launch whose tags miss caa-managed-by=caa: the provider never sends
	// one, so ask through its client directly.
	spec := policySpec(3)
	tags := instanceTags(nil, spec)
	tags[provider.TagManagedBy] = "someone-else"
	in := f.provider.runInput(spec, clientToken(spec.Key), tags)
	_, err = f.provider.api.RunInstances(ctx, in)
	err = classify(opCreate, err)
	require.ErrorIs(t, err, provider.ErrAuth, "a launch not tagged caa-managed-by=caa is refused")
	assert.Contains(t, err.Error(), "ec2:RunInstances")
	assert.Contains(t, err.Error(), "UnauthorizedOperation")

	_, err = f.provider.Create(ctx, spec)
	require.NoError(t, err, "the same launch with caa's tags passes")
}

// TestPreflightNamesTheSettingToFix: a subnet, security group, image or
// instance type EC2 does not know fails Preflight naming the flag and
// environment variable (a type EC2 does not offer in the subnet's zone
// also names the zone), and makes nothing. The subnet and the groups are
// the node's configuration (ErrNodeConfig); the image and type, what a pod
// may also choose (ErrInvalidSpec).
func TestPreflightNamesTheSettingToFix(t *testing.T) {
	ctx := context.Background()
	policy := shippedPolicy(t)
	for _, tc := range []struct {
		setting string
		kind    error
		edit    func(*Config)
		also    string
	}{
		{"--aws-subnet-id", provider.ErrNodeConfig, func(c *Config) { c.SubnetID = "subnet-0badbadbadbadbad0" }, ""},
		{"--aws-security-group-ids", provider.ErrNodeConfig, func(c *Config) { c.SecurityGroupIDs = []string{testGroup, "sg-0badbadbadbadbad0"} }, ""},
		{"--aws-image", provider.ErrInvalidSpec, func(c *Config) { c.Image = "ami-0badbadbadbadbad0" }, ""},
		{"--aws-instance-type", provider.ErrInvalidSpec, func(c *Config) { c.InstanceType = "x9.colossal" }, "zone us-east-1a"},
		{"--aws-instance-type", provider.ErrInvalidSpec, func(c *Config) { c.InstanceType = "not a type" }, ""},
	} {
		t.Run(tc.setting, func(t *testing.T) {
			f := newPolicyFake(t, func() *ec2fake.Policy { return policy }, tc.edit)
			err := f.provider.Preflight(ctx)
			require.ErrorIs(t, err, tc.kind)
			assert.Contains(t, err.Error(), tc.setting)
			assert.Contains(t, err.Error(), tc.also)
			assert.Contains(t, err.Error(), "ec2:RunInstances")
			assert.Empty(t, f.cloud.Instances(), "a dry run makes nothing")
		})
	}
}

// TestPreflightWithoutAnImageChecksTheRest: with no configured image the
// launch cannot be dry-run (pods name their image), but the read still is.
func TestPreflightWithoutAnImageChecksTheRest(t *testing.T) {
	ctx := context.Background()
	full := shippedPolicy(t)
	var current atomic.Pointer[ec2fake.Policy]
	current.Store(full)
	f := newPolicyFake(t, current.Load, func(c *Config) { c.Image = "" })
	require.NoError(t, f.provider.Preflight(ctx))
	current.Store(full.Without("ec2:DescribeInstances"))
	err := f.provider.Preflight(ctx)
	require.ErrorIs(t, err, provider.ErrAuth)
	assert.Contains(t, err.Error(), "ec2:DescribeInstances")
}

// TestPreflightSendsNoSecrets: what Preflight reports carries neither the
// keys nor caa's user data, whatever fails.
func TestPreflightSendsNoSecrets(t *testing.T) {
	ctx := context.Background()
	full := shippedPolicy(t)
	for _, action := range full.Actions() {
		var current atomic.Pointer[ec2fake.Policy]
		current.Store(full)
		f := newPolicyFake(t, current.Load, nil)
		_, err := f.provider.Create(ctx, policySpec(1))
		require.NoError(t, err)
		current.Store(full.Without(action))
		err = f.provider.Preflight(ctx)
		require.Error(t, err)
		for _, s := range []string{testSecretKey, testAccessKeyID} {
			assert.False(t, strings.Contains(err.Error(), s), "%s: a credential in the preflight error", action)
			assert.False(t, strings.Contains(f.logs.String(), s), "%s: a credential in the log", action)
		}
	}
}
