package clouds

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestFindCloud(t *testing.T) {
	clouds := Compiled()
	require.Len(t, clouds, 3, "the default build has every cloud")
	assert.Equal(t, "aws, azure or ibmcloud", Names(clouds))
	for _, name := range Known {
		c, err := Find(clouds, name)
		require.NoError(t, err)
		assert.Equal(t, name, c.Name)
	}
	_, err := Find(clouds, "gcp")
	assert.ErrorContains(t, err, `--provider "gcp": want aws, azure or ibmcloud`)
	_, err = Find(clouds[:1], "ibmcloud")
	assert.ErrorContains(t, err, "built without ibmcloud", "a known cloud left out of the build says so")

	// Each command gets settings of its own.
	a, b := Compiled(), Compiled()
	assert.NotSame(t, a[0], b[0])
}
