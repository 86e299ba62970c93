package adaptorvm

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

// The adaptor's names, worked out by hand from its rule (lowered, [a-z0-9-]
// kept, the rest '-', the pod cut to 48, eight characters of the sandbox).
func TestNameIsTheAdaptors(t *testing.T) {
	sid := "9f3c1d2e4b5a69788776655443322110fedcba9876543210abcdef0123456789"
	assert.Equal(t, "podvm-nginx-9f3c1d2e", Name("nginx", sid))
	assert.Equal(t, "podvm-web-0-example-com-9f3c1d2e", Name("web-0.example.com", sid), "a dot becomes '-'")
	assert.Equal(t, "podvm-nginx-9f3c1d2e", Name("NGINX", sid), "lowered")
	long := strings.Repeat("a", 60)
	got := Name(long, sid)
	assert.Equal(t, "podvm-"+strings.Repeat("a", 48)+"-9f3c1d2e", got)
	assert.Len(t, got, 63)
	assert.Equal(t, "podvm-"+strings.Repeat("b", 48)+"-9f3c1d2e", Name(strings.Repeat("b", 48), sid), "48 fit whole")
}

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		name, pod, sb string
		ok            bool
	}{
		{"podvm-nginx-9f3c1d2e", "nginx", "9f3c1d2e", true},
		{"podvm-web-0-9f3c1d2e", "web-0", "9f3c1d2e", true},
		{"podvm-" + strings.Repeat("a", 48) + "-9f3c1d2e", strings.Repeat("a", 48), "9f3c1d2e", true},
		{"podvm-" + strings.Repeat("a", 49) + "-9f3c1d2e", "", "", false}, // longer than 63
		{"caa-team-nginx", "", "", false},
		{"podvm-9f3c1d2e", "", "", false},
		{"podvm-nginx_9f3c1d2e", "", "", false},
		{"podvm-Nginx-9f3c1d2e", "", "", false}, // the adaptor lowers
		{"podvm-nginx-9f3c1d2", "", "", false},
	} {
		pod, sb, ok := Parse(tc.name)
		assert.Equal(t, tc.ok, ok, tc.name)
		assert.Equal(t, tc.pod, pod, tc.name)
		assert.Equal(t, tc.sb, sb, tc.name)
	}
}
