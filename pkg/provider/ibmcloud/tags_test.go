package ibmcloud

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/pkg/provider"
)

var (
	// vpcNameRE is VPC's rule for resource names.
	vpcNameRE = regexp.MustCompile(`^-?([a-z]|[a-z][-a-z0-9]*[a-z0-9]|[0-9][-a-z0-9]*([a-z]|[-a-z][-a-z0-9]*[a-z0-9]))$`)
	// ibmTagRE is IBM Cloud's rule for user tags, less the length.
	ibmTagRE = regexp.MustCompile(`^[A-Za-z0-9 _.:-]+$`)
)

func spec(cluster, key string) provider.Spec {
	return provider.Spec{Cluster: cluster, Key: key, PodName: "p"}
}

func TestInstanceName(t *testing.T) {
	tests := []struct {
		key  string
		frag string
	}{
		{"3f2a9c1e-77b0-4c1d-9a8e-0d1c2b3a4f5e-a1", "caa-3f2a9c1e-77b0-4-"},
		{"web-0", "caa-web-0-"},
		{"My.App_Server--1", "caa-my-app-server-1-"},
		{"---", "caa-"},
		{"", "caa-"},
		{"0day", "caa-0day-"},
		{strings.Repeat("abcdefghij", 30), "caa-abcdefghijabcde-"},
		{"abcdefghijabcd-x", "caa-abcdefghijabcd-"},
		{"pod-ünïcode", "caa-pod-n-code-"},
	}
	for _, tc := range tests {
		t.Run(tc.key, func(t *testing.T) {
			name := instanceName(spec("c1", tc.key))
			assert.True(t, strings.HasPrefix(name, tc.frag), "%s has prefix %s", name, tc.frag)
			assert.Len(t, strings.TrimPrefix(name, tc.frag), nameHashLen)
			assert.LessOrEqual(t, len(name), 40)
			assert.Regexp(t, vpcNameRE, name)
			assert.Equal(t, name, instanceName(spec("c1", tc.key)), "deterministic")
		})
	}
	base := instanceName(spec("c1", "k1"))
	assert.NotEqual(t, base, instanceName(spec("c1", "k2")), "the key names the VM")
	assert.NotEqual(t, base, instanceName(spec("c2", "k1")), "and so does the cluster")
	other := spec("c1", "k1")
	other.PodName, other.Node, other.InstanceType = "q", "n2", "bx2-8x32"
	assert.Equal(t, base, instanceName(other), "and nothing else")
	assert.NotEqual(t, instanceName(spec("a:b", "c")), instanceName(spec("a", "b:c")), "fields are separated")
}

func TestTagsRoundTrip(t *testing.T) {
	tests := map[string]map[string]string{
		"identity": spec("c", "k").Tags(),
		"suite": {
			provider.TagCluster: "cluster-7f3a", provider.TagNode: "node-a", provider.TagPodUID: "uid-0003",
			provider.TagPod: "team/pod-3", provider.TagKey: "uid-0003-a1", provider.TagManagedBy: "caa", "cost-center": "cc-42",
		},
		"awkward characters": {
			"Cost_Center": "CC:42/β", "with space": " lead and trail ", "empty": "", "under_score": "a_b_c", "x_z1": "looks like a piece",
		},
		"long values are cut": {
			provider.TagPod:  "a-namespace-of-sixty-three-characters-which-is-the-limit-for-one/" + strings.Repeat("pod-name.", 28),
			provider.TagNode: strings.Repeat("worker.", 36) + "example",
			"note":           strings.Repeat("Ü", 100),
		},
	}
	for name, tags := range tests {
		t.Run(name, func(t *testing.T) {
			user, err := encodeUserTags(tags)
			require.NoError(t, err)
			for _, u := range user {
				assert.LessOrEqual(t, len(u), maxUserTag, u)
				assert.Regexp(t, ibmTagRE, u)
				assert.Equal(t, strings.ToLower(u), u, "no case to lose")
			}
			assert.Equal(t, tags, decodeUserTags(user))
			again, err := encodeUserTags(tags)
			require.NoError(t, err)
			assert.Equal(t, user, again, "stable order")
		})
	}
}

func TestTagEncoding(t *testing.T) {
	user, err := encodeUserTags(map[string]string{provider.TagPod: "team/pod-3", "Env": "Prod"})
	require.NoError(t, err)
	assert.Equal(t, []string{"_45nv:_50rod", "caa-pod:team_2fpod-3"}, user)

	long, err := encodeTag("k", strings.Repeat("_", 60))
	require.NoError(t, err)
	require.Len(t, long, 2, "180 escaped bytes make two pieces")
	assert.True(t, strings.HasPrefix(long[0], "k_z0:_5f"))
	assert.True(t, strings.HasPrefix(long[1], "k_z1:_5f"))
	for _, piece := range long {
		_, v, _ := strings.Cut(piece, ":")
		assert.Zero(t, len(v)%3, "no escape split across pieces: %s", piece)
	}

	_, err = encodeTag(strings.Repeat("k", 125), "0123456789")
	assert.ErrorIs(t, err, provider.ErrInvalidSpec, "a key too long for even one piece")
	_, err = encodeTag("", "v")
	assert.ErrorIs(t, err, provider.ErrInvalidSpec)

	assert.Equal(t, "caa-node:node-a", firstTag(provider.TagNode, "node-a"), "the filter is the node's own tag")
	longNode := strings.Repeat("n", 200)
	first, err := encodeTag(provider.TagNode, longNode)
	require.NoError(t, err)
	assert.Equal(t, first[0], firstTag(provider.TagNode, longNode), "or its first piece")
}

func TestDecodeForeignAndBrokenTags(t *testing.T) {
	got := decodeUserTags([]string{
		"env:prod",           // a person's tag
		"cost_center:x",      // an escape that does not escape back: not ours, kept
		"standalone",         // no value
		"team/raw:ns/pod",    // written straight into the fake's core
		"k_z0:aa", "k_z2:cc", // piece 1 missing: dropped
		"m_z0:ab", "m_z1:_2f!", // a piece that is not escaped text: kept raw
	})
	assert.Equal(t, map[string]string{
		"env": "prod", "cost_center": "x", "standalone": "", "team/raw": "ns/pod", "m": "ab_2f!",
	}, got)
}

func FuzzTagsRoundTrip(f *testing.F) {
	f.Add("caa-pod", "team/pod-3")
	f.Add("K_z1", strings.Repeat("x_", 90))
	f.Add("", "")
	f.Fuzz(func(t *testing.T, k, v string) {
		if !utf8.ValidString(k) || !utf8.ValidString(v) {
			return // tag text comes from Kubernetes objects: always UTF-8
		}
		user, err := encodeUserTags(map[string]string{k: v})
		if k == "" || len(escape(k)) > maxUserTag-len(chunkMark)-4 {
			if err == nil {
				assert.Equal(t, map[string]string{k: v}, decodeUserTags(user))
			}
			return
		}
		require.NoError(t, err)
		for _, u := range user {
			require.LessOrEqual(t, len(u), maxUserTag, fmt.Sprintf("%q", u))
			require.Regexp(t, ibmTagRE, u)
		}
		require.Equal(t, map[string]string{k: v}, decodeUserTags(user))
	})
}

// TestInstanceNamesNeverChange pins names made by earlier versions: the
// name is the idempotency key, so a create retried after an upgrade must
// find the instance the old version made under the same key.
func TestInstanceNamesNeverChange(t *testing.T) {
	for key, want := range map[string]string{
		"uid-0001-a1": "caa-uid-0001-a1-f431d29e99f02ef73e5d",
		"0f8e2c4a-1b2c-4d5e-8f90-a1b2c3d4e5f6-a1": "caa-0f8e2c4a-1b2c-4-6bb9e6f15c074e77bc58",
		"Pod_UID/Attempt:2":                       "caa-pod-uid-attempt-f8e24542ce92f986a568",
		"__--__":                                  "caa-9f5043ba3aacd81f6dba",
		"abcdefghijklmn-op":                       "caa-abcdefghijklmn-6fe24dc6f47ad4ec1718",
		"abcdefghijklmno-p":                       "caa-abcdefghijklmno-f0f386b8fbe03d7207ae",
		"ABCDEFGHIJKLMNO_":                        "caa-abcdefghijklmno-219796dc58800ef96f8c",
		"":                                        "caa-5b8d9a8dc2ce545c2e8c",
	} {
		assert.Equal(t, want, instanceName(provider.Spec{Cluster: "cluster-7f3a", Key: key}), "key %q", key)
	}
}
