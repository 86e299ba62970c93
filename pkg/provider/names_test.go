package provider

import (
	"crypto/sha256"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// longPods are a 63-character namespace and two 253-character pod names
// that share their first 240 characters: the longest Kubernetes allows.
func longPods() (ns, a, b string) {
	ns = "n" + strings.Repeat("s", 61) + "1"
	prefix := strings.Repeat("web-frontend.", 18) + strings.Repeat("x", 6) // 240
	return ns, prefix + "-aaaaaaaaaaa1", prefix + "-bbbbbbbbbbb2"
}

func TestShorten(t *testing.T) {
	assert.Equal(t, "team/pod-3", Shorten("team/pod-3", 100), "what fits is kept as it is")
	assert.Equal(t, strings.Repeat("a", 100), Shorten(strings.Repeat("a", 100), 100))

	long := strings.Repeat("a", 101)
	got := Shorten(long, 100)
	assert.Len(t, got, 100)
	assert.True(t, strings.HasPrefix(got, strings.Repeat("a", 100-1-HashLen)+"+"), got)
	assert.Regexp(t, `\+[0-9a-f]{12}$`, got)
	assert.Equal(t, got, Shorten(long, 100), "deterministic")
	assert.NotEqual(t, got, Shorten(strings.Repeat("a", 102), 100), "the hash covers the whole value")

	// Never cut inside a character.
	wide := strings.Repeat("é", 60) // 120 bytes
	got = Shorten(wide, 100)
	assert.LessOrEqual(t, len(got), 100)
	assert.True(t, strings.HasPrefix(got, strings.Repeat("é", 43)+"+"), got)
}

func TestPodTagFitsEveryCloudAndKeepsPodsApart(t *testing.T) {
	assert.Equal(t, "team/pod-3", PodTag("team", "pod-3"))
	ns, a, b := longPods()
	ta, tb := PodTag(ns, a), PodTag(ns, b)
	assert.NotEqual(t, ta, tb, "pods that share a long prefix get distinct tags")
	for _, tag := range []string{ta, tb} {
		assert.LessOrEqual(t, len(tag), MaxPodTag)
		assert.True(t, strings.HasPrefix(tag, ns+"/web-frontend."), "a person can still read it: %s", tag)
	}
	// The IBM Cloud user tag "caa-pod:<value>" takes 128 characters, and
	// its escaping turns '/' and '+' into three each.
	assert.LessOrEqual(t, len(TagPod)+1+MaxPodTag+2*2, 128)
}

func TestTagsFitEveryCloud(t *testing.T) {
	ns, a, b := longPods()
	spec := func(name, uid string) Spec {
		return Spec{Key: uid + "-a1", Cluster: "cluster-7f3a", Node: strings.Repeat("node.", 50) + "abc",
			PodUID: uid, PodNamespace: ns, PodName: name, InstanceType: "t", Image: "i",
			ExtraTags: map[string]string{TagPod: "overridden"}}
	}
	sa, sb := spec(a, "0f8e2c4a-1b2c-4d5e-8f90-a1b2c3d4e5f6"), spec(b, "1f8e2c4a-1b2c-4d5e-8f90-a1b2c3d4e5f6")
	require.NoError(t, sa.Validate())
	ta, tb := sa.Tags(), sb.Tags()
	for _, tags := range []map[string]string{ta, tb} {
		for k, v := range tags {
			assert.LessOrEqual(t, len(v), MaxTagValue, "tag %s", k)
		}
	}
	assert.Equal(t, PodTag(ns, a), ta[TagPod], "identity tags win over extra tags")
	assert.NotEqual(t, ta[TagPod], tb[TagPod])
	assert.NotEqual(t, ta[TagPodUID], tb[TagPodUID])

	tooLong := sa
	tooLong.Node = strings.Repeat("n", MaxTagValue+1)
	assert.ErrorIs(t, tooLong.Validate(), ErrInvalidSpec, "an identity tag that cannot be cut must fit")
	tooLong = sa
	tooLong.Key = strings.Repeat("k", MaxTagValue+1)
	assert.ErrorIs(t, tooLong.Validate(), ErrInvalidSpec)
}

func TestDisplayName(t *testing.T) {
	s := Spec{PodNamespace: "team", PodName: "pod-4"}
	assert.Equal(t, "caa-team-pod-4", s.DisplayName(MaxTagValue))
	ns, a, b := longPods()
	na := Spec{PodNamespace: ns, PodName: a}.DisplayName(MaxTagValue)
	nb := Spec{PodNamespace: ns, PodName: b}.DisplayName(MaxTagValue)
	assert.NotEqual(t, na, nb)
	assert.LessOrEqual(t, len(na), MaxTagValue)
	assert.True(t, strings.HasPrefix(na, "caa-"+ns+"-web-frontend."), na)
}

func TestDNSLabel(t *testing.T) {
	label := regexp.MustCompile(`^[a-z]([a-z0-9-]*[a-z0-9])?$`)
	sum := func(s string) []byte { h := sha256.Sum256([]byte(s)); return h[:] }
	tests := []struct {
		readable   string
		hashLen    int
		max        int
		wantPrefix string
	}{
		{"uid-0001-a1", 12, 63, "caa-uid-0001-a1-"},
		{"Pod_UID/Attempt:2", 12, 63, "caa-pod-uid-attempt-2-"},
		{"__--__", 12, 63, "caa-"},
		{"", 20, 40, "caa-"},
		{strings.Repeat("x", 100), 12, 63, "caa-" + strings.Repeat("x", 46) + "-"},
		{strings.Repeat("a", 14) + "/b", 20, 40, "caa-" + strings.Repeat("a", 14) + "-"},
		{"ABCDEFGHIJKLMNO_", 20, 40, "caa-abcdefghijklmno-"},
	}
	for _, tc := range tests {
		got := DNSLabel("caa-", tc.readable, sum(tc.readable), tc.hashLen, tc.max)
		assert.True(t, strings.HasPrefix(got, tc.wantPrefix), "%q -> %q, want prefix %q", tc.readable, got, tc.wantPrefix)
		assert.Len(t, got, len(tc.wantPrefix)+tc.hashLen, "%q -> %q", tc.readable, got)
		assert.LessOrEqual(t, len(got), tc.max)
		assert.Regexp(t, label, got)
	}
}
