package vpcfake

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseQuery(t *testing.T) {
	terms, err := parseQuery(`family:is AND  type:volume AND tags:"a\"b\\c:d" AND tags:x_2a`)
	require.NoError(t, err)
	assert.Equal(t, []term{{"family", "is"}, {"type", "volume"}, {"tags", `a"b\c:d`}, {"tags", "x_2a"}}, terms)

	for _, q := range []string{`family:is OR type:volume`, `tags:"open`, `tags:a*`, `family:is AND`, `(family:is)`, `foo:bar`} {
		_, err := parseQuery(q)
		assert.Error(t, err, q)
	}
}

func TestCursorRoundTrips(t *testing.T) {
	c := searchCursor{Query: `tags:"x"`, Fields: []string{"crn"}, After: 7}
	got, err := decodeCursor(encodeCursor(c))
	require.NoError(t, err)
	assert.Equal(t, c, got)
	_, err = decodeCursor(encodeCursor(searchCursor{After: -1}))
	assert.Error(t, err)
}
