package relayd

import (
	"testing"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The allow list from the environment is --allow-uid's default; a bad
// value names the variable and the fix.
func TestAllowUIDsFromTheEnvironment(t *testing.T) {
	t.Setenv("CAA_RELAY_ALLOW_UIDS", "0, 1000")
	got, err := envUIDs("CAA_RELAY_ALLOW_UIDS")
	require.NoError(t, err)
	assert.Equal(t, []uint{0, 1000}, got)
	fs := pflag.NewFlagSet("relay", pflag.ContinueOnError)
	NewOptions("test").AddFlags(fs)
	v, err := fs.GetUintSlice("allow-uid")
	require.NoError(t, err)
	assert.Equal(t, []uint{0, 1000}, v, "the variable is the flag's default")

	t.Setenv("CAA_RELAY_ALLOW_UIDS", "4294967296")
	_, err = envUIDs("CAA_RELAY_ALLOW_UIDS")
	assert.ErrorContains(t, err, "is not a uid")
}
