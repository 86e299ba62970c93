package deploy_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestAzureRoleGrantsTheOSDiskAndSaysWhy: the Azure role grants the disk
// actions that ARM checks on the OS disk a VM's create makes from its image
// and that its delete deletes with it (deleteOption Delete), no disk action
// beyond them, and the overlay's README lists every action of the role with
// why it is there.
func TestAzureRoleGrantsTheOSDiskAndSaysWhy(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(deployDir(t), "overlays", "azure", "role.json"))
	require.NoError(t, err)
	var role struct{ Actions []string }
	require.NoError(t, json.Unmarshal(raw, &role))
	assert.Subset(t, role.Actions, []string{"Microsoft.Compute/disks/write", "Microsoft.Compute/disks/delete"})
	assert.NotContains(t, role.Actions, "Microsoft.Compute/disks/read", "caa never reads a disk")
	for _, a := range role.Actions {
		assertReadmeSays(t, "overlays/azure", "| `"+a+"` |", "the README's table says why the role has "+a)
	}
}
