package aws

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/test/conformance"
	ec2fake "github.com/caa-project/caa/test/mocks/aws"
	"github.com/caa-project/caa/test/mocks/cloud"
)

// TestATypeNotOfferedInTheZoneIsARefusalOfTheType: EC2 answers Unsupported
// for an instance type it does not offer in the subnet's zone; caa must
// take it as a refusal of the type (not a transient error retried for
// ever), saying that the type is what was refused.
func TestATypeNotOfferedInTheZoneIsARefusalOfTheType(t *testing.T) {
	ctx := context.Background()
	f := newFakeEC2(t, suiteOptions(), nil)
	spec := specFor(1)
	spec.InstanceType = "m7i.48xlarge" // a real type, not among the fake's offered ones
	_, err := f.provider.Create(ctx, spec)
	require.ErrorIs(t, err, provider.ErrInvalidSpec)
	assert.True(t, provider.Terminal(err))
	assert.Equal(t, provider.RefusedInstanceType, provider.RefusedPart(err))
	var pe *provider.Error
	require.ErrorAs(t, err, &pe)
	assert.Equal(t, "Unsupported", pe.Code)
	assert.Contains(t, pe.Message, "us-east-1a")
	assert.Empty(t, f.cloud.Instances())

	spec.Image = "ami-0badbadbadbadbad0"
	spec.InstanceType = conformance.TypeSmall
	_, err = f.provider.Create(ctx, spec)
	require.ErrorIs(t, err, provider.ErrInvalidSpec)
	assert.Equal(t, provider.RefusedImage, provider.RefusedPart(err))
}

// TestTheNodesNetworkIsNotThePodsFault: a subnet or security group EC2
// does not know is the node's configuration (ErrNodeConfig), not a refusal
// of any pod's spec, and is not terminal.
func TestTheNodesNetworkIsNotThePodsFault(t *testing.T) {
	ctx := context.Background()
	for name, edit := range map[string]func(*Config){
		"subnet": func(c *Config) { c.SubnetID = "subnet-0badbadbadbadbad0" },
		"group":  func(c *Config) { c.SecurityGroupIDs = []string{"sg-0badbadbadbadbad0"} },
	} {
		t.Run(name, func(t *testing.T) {
			f := newPolicyFake(t, nil, edit)
			_, err := f.provider.Create(ctx, policySpec(1))
			require.ErrorIs(t, err, provider.ErrNodeConfig)
			assert.NotErrorIs(t, err, provider.ErrInvalidSpec)
			assert.False(t, provider.Terminal(err))
			assert.NotEqual(t, f.provider.NodeConfig(), newPolicyFake(t, nil, nil).provider.NodeConfig(),
				"the node's configuration differs")
		})
	}
}

// TestATokenOfATerminatedInstanceIsSpent: a launch with the client token of
// a terminated instance is answered IdempotentInstanceTerminated:
// ErrKeySpent, never transient, and nothing is launched. A key that may
// have been sent is looked up first and finds the terminated instance
// while EC2 still lists it (about an hour).
func TestATokenOfATerminatedInstanceIsSpent(t *testing.T) {
	ctx := context.Background()
	clock := &conformance.Clock{}
	f := newFakeEC2(t, conformance.Options(clock), nil)
	spec := specFor(2)
	vm, err := f.provider.Create(ctx, spec)
	require.NoError(t, err)
	require.NoError(t, f.cloud.Kill(vm.ID))

	// A fresh-looking key sends the launch: EC2 refuses the token at once.
	_, err = f.provider.Create(ctx, spec)
	require.ErrorIs(t, err, provider.ErrKeySpent, "the token of a terminated instance launches nothing")
	spec.MaybeSent = true
	again, err := f.provider.Create(ctx, spec)
	require.NoError(t, err, "within the hour EC2 still lists it: the lookup by token finds it")
	assert.Equal(t, vm.ID, again.ID)
	assert.Equal(t, provider.StateTerminated, again.State)

	clock.Advance(2 * time.Hour)
	f.cloud.ResetCounters()
	_, err = f.provider.Create(ctx, spec)
	require.ErrorIs(t, err, provider.ErrKeySpent)
	var pe *provider.Error
	require.ErrorAs(t, err, &pe)
	assert.Equal(t, "IdempotentInstanceTerminated", pe.Code)
	assert.Equal(t, int64(1), f.cloud.Counters()[cloud.OpCreate], "not retried by the SDK")
	assert.Empty(t, f.cloud.Live())
}

// TestSEVSNPFromANonUEFIAMIIsARefusalOfTheImage: SEV-SNP needs an AMI
// whose boot mode is uefi or uefi-preferred. EC2 refuses the launch from
// any other; caa takes it as a refusal of the pod's image (terminal, the
// image named as what was refused), and a UEFI AMI launches.
func TestSEVSNPFromANonUEFIAMIIsARefusalOfTheImage(t *testing.T) {
	ctx := context.Background()
	const bios, none, uefi = "ami-0000000000000b105", "ami-00000000000000000", "ami-000000000000000ef"
	f := newFakeEC2(t, cloud.Options{}, nil,
		ec2fake.WithImageBootMode(bios, ec2fake.BootModeLegacyBIOS),
		ec2fake.WithImageBootMode(none, ec2fake.BootModeNone),
		ec2fake.WithImageBootMode(uefi, ec2fake.BootModeUEFI))
	spec := specFor(1)
	spec.InstanceType, spec.TEE = "m6a.large", provider.TEESEVSNP
	for _, image := range []string{bios, none} {
		spec.Image = image
		_, err := f.provider.Create(ctx, spec)
		require.ErrorIs(t, err, provider.ErrInvalidSpec, image)
		assert.True(t, provider.Terminal(err))
		assert.Equal(t, provider.RefusedImage, provider.RefusedPart(err))
		assert.ErrorContains(t, err, "uefi")
		assert.ErrorContains(t, err, image)
	}
	assert.Empty(t, f.cloud.Instances())

	spec.TEE = provider.TEENone
	_, err := f.provider.Create(ctx, spec)
	require.NoError(t, err, "an ordinary VM boots from the BIOS AMI")
	spec.Image, spec.TEE, spec.Key = uefi, provider.TEESEVSNP, spec.Key+"-uefi"
	vm, err := f.provider.Create(ctx, spec)
	require.NoError(t, err)
	assert.Equal(t, provider.TEESEVSNP, vm.TEE)
}

// TestUserDataOverEC2sCapIsRefusedBeforeTheCall: EC2 takes at most 16 KB
// of user data before base64; caa declares the cap (for the sandbox
// manager, which drops the image-pull credentials first) and refuses a
// larger one itself, with the sizes, without a call. The fake EC2 refuses
// it as EC2 does when it gets there.
func TestUserDataOverEC2sCapIsRefusedBeforeTheCall(t *testing.T) {
	ctx := context.Background()
	f := newFakeEC2(t, suiteOptions(), nil)
	assert.Equal(t, 16384, provider.UserDataLimitOf(f.provider))
	spec := specFor(1)
	spec.UserData = make([]byte, 16384)
	_, err := f.provider.Create(ctx, spec)
	require.NoError(t, err, "exactly the cap fits")

	spec = specFor(2)
	spec.UserData = make([]byte, 16385)
	f.cloud.ResetCounters()
	_, err = f.provider.Create(ctx, spec)
	require.ErrorIs(t, err, provider.ErrInvalidSpec)
	assert.ErrorContains(t, err, "user data is 16385 bytes, EC2 takes at most 16384")
	assert.Zero(t, f.cloud.Counters()[cloud.OpCreate], "no call")

	// The fake's own answer, past caa's check.
	_, err = f.provider.api.RunInstances(ctx, f.provider.runInput(spec, clientToken(spec.Key), instanceTags(nil, spec)))
	var pe *provider.Error
	require.ErrorAs(t, classify(opCreate, err), &pe)
	assert.Equal(t, "InvalidParameterValue", pe.Code)
	assert.Equal(t, "User data is limited to 16384 bytes.", pe.Message)
}
