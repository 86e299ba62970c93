package aws

import (
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/stretchr/testify/assert"

	"github.com/caa-project/caa/pkg/provider"
)

func TestStateMapping(t *testing.T) {
	tests := []struct {
		state  string
		reason string
		want   provider.State
	}{
		{"pending", "", provider.StatePending},
		{"running", "", provider.StateRunning},
		{"shutting-down", "", provider.StateStopping},
		{"stopping", "", provider.StateStopping},
		{"stopped", "Client.UserInitiatedShutdown", provider.StateStopped},
		{"terminated", "", provider.StateTerminated},
		{"terminated", "Client.UserInitiatedShutdown", provider.StateTerminated},
		{"terminated", "Server.SpotInstanceTermination", provider.StateTerminated},
		{"terminated", "Server.InternalError", provider.StateFailed},
		{"terminated", "Server.InsufficientInstanceCapacity", provider.StateFailed},
		{"terminated", "Client.VolumeLimitExceeded", provider.StateFailed},
		{"terminated", "Client.InvalidSnapshot.NotFound", provider.StateFailed},
		{"hibernating", "", provider.StateUnknown},
	}
	for _, tc := range tests {
		var reason *types.StateReason
		if tc.reason != "" {
			reason = &types.StateReason{Code: awssdk.String(tc.reason)}
		}
		got := stateOf(&types.InstanceState{Name: types.InstanceStateName(tc.state)}, reason)
		assert.Equal(t, tc.want, got, "%s (%s)", tc.state, tc.reason)
	}
	assert.Equal(t, provider.StateUnknown, stateOf(nil, nil))
}

func TestToVM(t *testing.T) {
	launched := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	vm := toVM(types.Instance{
		InstanceId: awssdk.String("i-0123456789abcdef0"), ImageId: awssdk.String("ami-0123456789abcdef0"),
		InstanceType: types.InstanceTypeT3Micro, LaunchTime: &launched,
		State:            &types.InstanceState{Name: types.InstanceStateNameRunning},
		Placement:        &types.Placement{AvailabilityZone: awssdk.String("eu-west-1b")},
		PrivateIpAddress: awssdk.String("10.0.0.7"), PublicIpAddress: awssdk.String("203.0.113.9"),
		Tags: []types.Tag{{Key: awssdk.String("Name"), Value: awssdk.String("caa-ns-web")}, {Key: awssdk.String("caa-node"), Value: awssdk.String("n1")}},
	})
	assert.Equal(t, provider.VM{
		ID: "i-0123456789abcdef0", Name: "caa-ns-web", State: provider.StateRunning,
		IPs: []string{"10.0.0.7", "203.0.113.9"}, Tags: map[string]string{"Name": "caa-ns-web", "caa-node": "n1"},
		CreatedAt: launched, InstanceType: "t3.micro", Image: "ami-0123456789abcdef0", Zone: "eu-west-1b",
	}, vm)

	bare := toVM(types.Instance{InstanceId: awssdk.String("i-0123456789abcdef0")})
	assert.Equal(t, "i-0123456789abcdef0", bare.Name, "no Name tag: the id")
	assert.Equal(t, provider.StateUnknown, bare.State)
	assert.Empty(t, bare.IPs)
}

func TestClientToken(t *testing.T) {
	keys := []string{"", "uid-0001-a1", "uid-0001-a2", strings.Repeat("k", 500), "ключ-ü-1"}
	seen := map[string]string{}
	for _, k := range keys {
		tok := clientToken(k)
		assert.Equal(t, tok, clientToken(k), "deterministic")
		assert.LessOrEqual(t, len(tok), 64, "EC2's limit")
		assert.Regexp(t, `^caa-[0-9a-f]{40}$`, tok)
		if other, dup := seen[tok]; dup {
			t.Errorf("keys %q and %q share token %s", other, k, tok)
		}
		seen[tok] = k
	}
}

func TestInstanceTagsAndName(t *testing.T) {
	spec := provider.Spec{
		Key: "k1", Cluster: "c1", Node: "n1", PodUID: "u1", PodNamespace: "ns", PodName: "web",
		ExtraTags: map[string]string{"team": "spec", provider.TagNode: "spoofed", "Name": "mine"},
	}
	tags := instanceTags(map[string]string{"team": "config", "env": "prod"}, spec)
	assert.Equal(t, map[string]string{
		"team": "spec", "env": "prod", "Name": "caa-ns-web",
		provider.TagCluster: "c1", provider.TagNode: "n1", provider.TagPodUID: "u1", provider.TagPod: "ns/web",
		provider.TagKey: "k1", provider.TagManagedBy: provider.ManagedByValue,
	}, tags, "config < spec < Name < identity")
	assert.Equal(t, map[string]string{"team": "spec", provider.TagNode: "spoofed", "Name": "mine"}, spec.ExtraTags, "the caller's map is untouched")

	// Two long pods that differ only at the end: nothing is cut silently,
	// and their tags and names stay apart.
	a, b := spec, spec
	a.PodNamespace, a.PodName = strings.Repeat("n", 63), strings.Repeat("p", 240)+"-aaaaaaaaaaa1"
	b.PodNamespace, b.PodName = a.PodNamespace, strings.Repeat("p", 240)+"-bbbbbbbbbbb2"
	ta, tb := instanceTags(nil, a), instanceTags(nil, b)
	assert.NotEqual(t, ta[provider.TagPod], tb[provider.TagPod])
	assert.NotEqual(t, ta["Name"], tb["Name"])
	for _, tags := range []map[string]string{ta, tb} {
		for k, v := range tags {
			assert.LessOrEqual(t, utf8.RuneCountInString(v), maxTagValue, "tag %s", k)
		}
		assert.True(t, strings.HasPrefix(tags[provider.TagPod], a.PodNamespace+"/ppp"), tags[provider.TagPod])
		assert.True(t, strings.HasPrefix(tags["Name"], "caa-"+a.PodNamespace+"-ppp"), tags["Name"])
	}
	assert.Equal(t, provider.PodTag(a.PodNamespace, a.PodName), ta[provider.TagPod])
	assert.Equal(t, a.DisplayName(maxTagValue), ta["Name"])
}

func TestTagsOverEC2LimitsAreRefused(t *testing.T) {
	assert.NoError(t, checkTags(map[string]string{"k": strings.Repeat("ü", maxTagValue)}))
	err := checkTags(map[string]string{"k": strings.Repeat("v", maxTagValue+1)})
	assert.ErrorIs(t, err, provider.ErrInvalidSpec)
	assert.Contains(t, err.Error(), `tag "k"`)
	assert.ErrorIs(t, checkTags(map[string]string{strings.Repeat("k", maxTagKey+1): "v"}), provider.ErrInvalidSpec)
}

func TestEC2TagsAreSorted(t *testing.T) {
	got := ec2Tags(map[string]string{"b": "2", "a": "1"})
	assert.Equal(t, []types.Tag{{Key: awssdk.String("a"), Value: awssdk.String("1")}, {Key: awssdk.String("b"), Value: awssdk.String("2")}}, got)
}
