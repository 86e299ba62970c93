package ec2fake

import "testing"

func TestWildcardMatch(t *testing.T) {
	for _, tc := range []struct {
		pattern, s string
		want       bool
	}{
		{"podvm-*", "podvm-web-a1b2c3d4", true},
		{"podvm-*", "podvm-", true},
		{"podvm-*", "my-podvm-web", false},
		{"podvm-*", "PODVM-web", false},
		{"pod?m-*", "podvm-x", true},
		{"a*b*c", "axxbyyc", true},
		{"a*b*c", "axxbyy", false},
		{`a\*`, "a*", true},
		{`a\*`, "ab", false},
		{"exact", "exact", true},
		{"exact", "exactly", false},
	} {
		if got := wildcardMatch(tc.pattern, tc.s); got != tc.want {
			t.Errorf("wildcardMatch(%q, %q) = %v, want %v", tc.pattern, tc.s, got, tc.want)
		}
	}
}
