package provider

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSplitList(t *testing.T) {
	assert.Equal(t, []string{"a", "b c", "d"}, SplitList(" a,, b c ,d,"))
	assert.Nil(t, SplitList(" , "))
}

func TestParseTags(t *testing.T) {
	tags, err := ParseTags("team = platform, env=prod,empty=")
	require.NoError(t, err)
	assert.Equal(t, map[string]string{"team": "platform", "env": "prod", "empty": ""}, tags)
	tags, err = ParseTags("")
	require.NoError(t, err)
	assert.Empty(t, tags)
	for _, bad := range []string{"team", "=x", "a=1,b"} {
		_, err := ParseTags(bad)
		assert.Error(t, err, bad)
	}
}

func TestFirstEnv(t *testing.T) {
	t.Setenv("CAA_TEST_A", "")
	t.Setenv("CAA_TEST_B", "b")
	assert.Equal(t, "b", FirstEnv("CAA_TEST_A", "CAA_TEST_B"))
	assert.Equal(t, "", FirstEnv("CAA_TEST_A"))
}
