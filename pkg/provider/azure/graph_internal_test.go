package azure

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/pkg/provider"
)

func TestKQLString(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"node-a", `'node-a'`},
		{"", `''`},
		{`it's`, `'it\'s'`},
		{`say "hi"`, `'say \"hi\"'`},
		{`back\slash`, `'back\\slash'`},
		{`\'`, `'\\\''`},
		{"two\nlines\r\tx", `'two\nlines\r\tx'`},
		{"ünïcödé | where", `'ünïcödé | where'`},
	} {
		got, err := kqlString(tc.in)
		require.NoError(t, err, "%q", tc.in)
		assert.Equal(t, tc.want, got, "%q", tc.in)
	}
	for _, bad := range []string{"nul\x00", "bell\a", "del\x7f", "esc\x1b["} {
		_, err := kqlString(bad)
		assert.Error(t, err, "%q", bad)
	}
}

func TestQueryForRefusesControlCharacters(t *testing.T) {
	p := &Provider{cfg: Config{ResourceGroup: "rg"}}
	_, err := p.queryFor(provider.Selector{Cluster: "c\x00", Node: "n"})
	require.ErrorIs(t, err, provider.ErrInvalidSpec)
	assert.Contains(t, err.Error(), "cluster")
	q, err := p.queryFor(provider.Selector{Cluster: "c", Node: "n"})
	require.NoError(t, err)
	assert.Contains(t, q, `tags['caa-node'] == 'n'`)
	assert.Contains(t, q, `resourceGroup =~ 'rg'`)
}

func TestQuotaGate(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var g quotaGate
	hdr := func(remaining, reset string) http.Header {
		h := http.Header{}
		h.Set(headerQuotaRemaining, remaining)
		h.Set(headerQuotaResets, reset)
		return h
	}
	g.note(hdr("3", "00:00:04"), now)
	assert.Zero(t, g.wait(now), "queries left: no wait")
	g.note(http.Header{}, now)
	assert.Zero(t, g.wait(now), "no headers: no wait")
	g.note(hdr("0", "garbage"), now)
	assert.Zero(t, g.wait(now), "an unreadable reset is ignored")
	g.note(hdr("0", "00:01:02.5"), now)
	assert.Equal(t, 62500*time.Millisecond, g.wait(now))
	assert.Equal(t, 2500*time.Millisecond, g.wait(now.Add(time.Minute)))
	assert.Zero(t, g.wait(now.Add(63*time.Second)))
	g.note(hdr("0", "00:00:01"), now)
	assert.Equal(t, 62500*time.Millisecond, g.wait(now), "a shorter reset never shortens a longer wait")
}

func TestParseHMS(t *testing.T) {
	for in, want := range map[string]time.Duration{
		"00:00:05": 5 * time.Second, "01:02:03": time.Hour + 2*time.Minute + 3*time.Second, " 00:00:00 ": 0,
	} {
		got, ok := parseHMS(in)
		assert.True(t, ok, in)
		assert.Equal(t, want, got, in)
	}
	for _, bad := range []string{"", "5", "00:05", "aa:bb:cc", "-1:00:00"} {
		_, ok := parseHMS(bad)
		assert.False(t, ok, bad)
	}
}
