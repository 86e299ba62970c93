package aws

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"slices"
	"unicode/utf8"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"

	"github.com/caa-project/caa/pkg/provider"
)

const (
	// tagName is the tag the EC2 console shows as the instance's name.
	tagName = "Name"
	// maxTagValue is EC2's limit on a tag value, in characters.
	maxTagValue = 256
)

// clientToken is the RunInstances ClientToken for an idempotency key: the
// same key always gives the same token, 44 ASCII characters whatever the
// key's length or alphabet.
func clientToken(key string) string {
	sum := sha256.Sum256([]byte(key))
	return "caa-" + hex.EncodeToString(sum[:20])
}

// instanceTags layers, lowest first: the configuration's extra tags, the
// spec's, the Name tag (caa-<namespace>-<pod>, shortened to fit like every
// identity tag, see provider.Spec.DisplayName), and the identity tags of
// spec.Tags(). Nothing is cut here: caa's own tags fit EC2's limits by
// construction, and Create refuses others that do not (checkTags).
func instanceTags(configured map[string]string, spec provider.Spec) map[string]string {
	extra := make(map[string]string, len(configured)+len(spec.ExtraTags)+1)
	maps.Copy(extra, configured)
	maps.Copy(extra, spec.ExtraTags)
	extra[tagName] = spec.DisplayName(maxTagValue)
	spec.ExtraTags = extra
	return spec.Tags()
}

// checkTags applies EC2's limits on tag keys and values (in characters),
// as ErrInvalidSpec naming the tag, rather than letting EC2 refuse the
// launch or cutting a value silently.
func checkTags(tags map[string]string) error {
	for _, k := range slices.Sorted(maps.Keys(tags)) {
		switch {
		case utf8.RuneCountInString(k) > maxTagKey:
			return fmt.Errorf("%w: tag key %.40q... is longer than EC2's %d characters", provider.ErrInvalidSpec, k, maxTagKey)
		case utf8.RuneCountInString(tags[k]) > maxTagValue:
			return fmt.Errorf("%w: the value of tag %q is longer than EC2's %d characters", provider.ErrInvalidSpec, k, maxTagValue)
		}
	}
	return nil
}

// ec2Tags sorts tags by key, so that requests are the same every time.
func ec2Tags(m map[string]string) []types.Tag {
	out := make([]types.Tag, 0, len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		out = append(out, types.Tag{Key: awssdk.String(k), Value: awssdk.String(m[k])})
	}
	return out
}

// toVM maps an EC2 instance onto the provider's VM.
func toVM(in types.Instance) provider.VM {
	tags := make(map[string]string, len(in.Tags))
	for _, t := range in.Tags {
		tags[awssdk.ToString(t.Key)] = awssdk.ToString(t.Value)
	}
	vm := provider.VM{
		ID:           awssdk.ToString(in.InstanceId),
		Name:         tags[tagName],
		State:        stateOf(in.State, in.StateReason),
		Tags:         tags,
		CreatedAt:    awssdk.ToTime(in.LaunchTime),
		InstanceType: string(in.InstanceType),
		Image:        awssdk.ToString(in.ImageId),
		TEE:          teeOf(in),
	}
	if vm.Name == "" {
		vm.Name = vm.ID
	}
	if in.Placement != nil {
		vm.Zone = awssdk.ToString(in.Placement.AvailabilityZone)
	}
	for _, ip := range []*string{in.PrivateIpAddress, in.PublicIpAddress} {
		if s := awssdk.ToString(ip); s != "" {
			vm.IPs = append(vm.IPs, s)
		}
	}
	return vm
}

// launchFailures are the state reasons of an instance that ended before it
// ever ran: EC2 shows it as terminated, caa as Failed, so that the cause
// shows. Failed is Dead (provider.State): the caller replaces the VM and
// deletes it, which for EC2 is one TerminateInstances that changes nothing,
// since EC2 has already released the instance and its volume.
var launchFailures = map[string]bool{
	"Server.InternalError":                true,
	"Server.InsufficientInstanceCapacity": true,
	"Client.InternalError":                true,
	"Client.InvalidSnapshot.NotFound":     true,
	"Client.VolumeLimitExceeded":          true,
}

// stateOf maps EC2's instance state onto provider.State. shutting-down is
// Stopping: going, not gone yet.
func stateOf(s *types.InstanceState, reason *types.StateReason) provider.State {
	if s == nil {
		return provider.StateUnknown
	}
	switch s.Name {
	case types.InstanceStateNamePending:
		return provider.StatePending
	case types.InstanceStateNameRunning:
		return provider.StateRunning
	case types.InstanceStateNameShuttingDown, types.InstanceStateNameStopping:
		return provider.StateStopping
	case types.InstanceStateNameStopped:
		return provider.StateStopped
	case types.InstanceStateNameTerminated:
		if reason != nil && launchFailures[awssdk.ToString(reason.Code)] {
			return provider.StateFailed
		}
		return provider.StateTerminated
	}
	return provider.StateUnknown
}
