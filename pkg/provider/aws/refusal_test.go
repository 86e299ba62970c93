package aws

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/test/conformance"
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

// TestATokenOfATerminatedInstanceIsSpent: once EC2 no longer lists the
// terminated instance a client token launched, a launch with that token
// is answered IdempotentInstanceTerminated: ErrKeySpent, never transient,
// and nothing is launched.
func TestATokenOfATerminatedInstanceIsSpent(t *testing.T) {
	ctx := context.Background()
	clock := &conformance.Clock{}
	f := newFakeEC2(t, conformance.Options(clock), nil)
	spec := specFor(2)
	vm, err := f.provider.Create(ctx, spec)
	require.NoError(t, err)
	require.NoError(t, f.cloud.Kill(vm.ID))

	again, err := f.provider.Create(ctx, spec)
	require.NoError(t, err, "within the hour EC2 still lists it: the token finds it")
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
