package provider

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestSGXIsNotConfidential: an SGX instance is not a confidential VM (SGX
// guards application enclaves; the pod VM runs none), so a pod asking for
// it is refused naming the annotation, why, and the fix, whatever the type
// offers and whether or not the node is confidential; and a VM the cloud
// reports as SGX never counts as confidential (I12).
func TestSGXIsNotConfidential(t *testing.T) {
	assert.False(t, TEESGX.Confidential())
	assert.True(t, TEETDX.Confidential() && TEESEVSNP.Confidential())
	offersBoth := func(string) []TEE { return []TEE{TEETDX, TEESGX} }
	for _, confidential := range []bool{true, false} {
		c := SpecConfig{Confidential: confidential, TEEs: offersBoth}
		_, err := c.SelectTEE(map[string]string{AnnotationTEE: "SGX"}, "bx3dc-2x10")
		require.ErrorIs(t, err, ErrInvalidSpec)
		for _, want := range []string{AnnotationTEE, "not a confidential VM", "set it to tdx", "remove the annotation"} {
			assert.Contains(t, err.Error(), want)
		}
	}
	vm := VM{ID: "i-1", TEE: TEESGX}
	assert.NotEmpty(t, vm.Downgraded(TEETDX), "an SGX VM never serves a TDX pod")
}
