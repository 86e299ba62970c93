package provider

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestSameVMIgnoresCase(t *testing.T) {
	compute := "/subscriptions/s/resourceGroups/CAA-RG/providers/Microsoft.Compute/virtualMachines/caa-a"
	graph := "/subscriptions/s/resourceGroups/caa-rg/providers/Microsoft.Compute/virtualMachines/caa-a"
	assert.True(t, SameVM(compute, graph))
	assert.Equal(t, VMKey(compute), VMKey(graph))
	assert.False(t, SameVM(compute, graph+"b"))
	assert.False(t, SameVM("i-0abc", "i-0abd"))
}
