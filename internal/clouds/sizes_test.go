//go:build caa_azure || !(caa_aws || caa_azure || caa_ibmcloud)

package clouds

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/pkg/provider"
)

// TestAzureTDXSizesAreKnown: --instance-types may name Azure's Intel TDX
// sizes (DCesv5, ECesv5) without their size, and each runs TDX.
func TestAzureTDXSizesAreKnown(t *testing.T) {
	c, err := Find(Compiled(), "azure")
	require.NoError(t, err)
	types, err := provider.ParseInstanceTypes("Standard_DC2es_v5,Standard_DC96es_v5,Standard_EC2es_v5,Standard_EC128es_v5", c.Types())
	require.NoError(t, err)
	assert.Equal(t, []provider.InstanceType{
		{Name: "Standard_DC2es_v5", VCPUs: 2, MemoryMiB: 8 << 10},
		{Name: "Standard_DC96es_v5", VCPUs: 96, MemoryMiB: 384 << 10},
		{Name: "Standard_EC2es_v5", VCPUs: 2, MemoryMiB: 16 << 10},
		{Name: "Standard_EC128es_v5", VCPUs: 128, MemoryMiB: 768 << 10},
	}, types)
	for _, ty := range c.Types() {
		if ty.Name[len(ty.Name)-6:] == "es_v5" {
			assert.Equal(t, []provider.TEE{provider.TEETDX}, c.TEEs(ty.Name), ty.Name)
		}
	}
}
