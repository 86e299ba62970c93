package azure_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/pkg/ledger"
	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/pkg/provider/azure"
	"github.com/caa-project/caa/test/lifetest"
	armfake "github.com/caa-project/caa/test/mocks/azure"
	"github.com/caa-project/caa/test/mocks/cloud"
)

// These tests run caa's reconciler in-process (test/lifetest), with this
// provider through the SDK, against a fake ARM that authorizes every call
// against the shipped role (deploy/overlays/azure/role.json): the whole
// life of a node's VMs under exactly that role, and what each missing
// action does.

const (
	lifeCluster = "cluster-life"
	lifeNode    = "node-a"
	lifeImage   = "Canonical:ubuntu-24_04-lts:server:latest"
	lifeSize    = "Standard_D2as_v5"
)

// lifeConfig is one node on a fake ARM whose role the test can change,
// starting with role.
func lifeConfig(t *testing.T, role *armfake.Role) lifetest.Config {
	f := newRoleFake(t, role, nil)
	return lifetest.Config{
		Provider: f.provider, Cloud: f.cloud, Name: azure.ProviderName,
		Cluster: lifeCluster, Node: lifeNode, Type: lifeSize, Image: lifeImage,
		PreflightFirst: true,
		// A record names its VM by name; the core's id is the test's.
		RecordVM: func(r ledger.Record) string {
			for _, in := range f.cloud.Instances() {
				if in.Name == r.VMName {
					return in.ID
				}
			}
			return ""
		},
		Orphan: func(t *testing.T) string {
			spec := provider.Spec{Key: "orphan-key", Cluster: lifeCluster, Node: lifeNode, PodUID: "uid-gone", PodNamespace: "team", PodName: "gone"}
			orphan, err := f.cloud.Create(cloud.CreateRequest{Name: "caa-orphan-0123456789ab", UniqueName: true, Tags: spec.Tags(),
				InstanceType: lifeSize, Image: lifeImage})
			require.NoError(t, err)
			return orphan.ID
		},
		Logs: f.logs, Refused: "AuthorizationFailed",
		Deny:    func(action string) { f.role.Store(role.Without(action)) },
		Restore: func() { f.role.Store(role) },
	}
}

// TestWholeLifeUnderTheShippedRole: preflight, start and create, restart
// and adopt, recreate a killed VM, delete a gone pod's VM, collect an
// orphan, and rebuild the ledger from the cloud, every call under exactly
// deploy/overlays/azure/role.json, none refused.
func TestWholeLifeUnderTheShippedRole(t *testing.T) {
	lifetest.WholeLife(t, lifeConfig(t, shippedRole(t)))
}

// TestEachMissingActionStopsTheNodeAndLosesNothing takes each action out
// of the role in turn. The preflight names it; and at the step of the life
// that needs it, the pass fails with a daemon-blocking error that names it
// and the role file (the preflight-only actions are named by the preflight
// alone), nothing crashes, no VM is deleted or made twice and no record
// lost; once the action is given back, the preflight passes and the same
// reconciler converges.
func TestEachMissingActionStopsTheNodeAndLosesNothing(t *testing.T) {
	full := shippedRole(t)
	preflightOnly := map[string]bool{
		"Microsoft.Resources/subscriptions/resourceGroups/read": true,
		"Microsoft.Authorization/permissions/read":              true,
		"Microsoft.Network/virtualNetworks/subnets/read":        true,
	}
	var perms []lifetest.Permission
	for _, action := range full.Actions {
		perms = append(perms, lifetest.Permission{Name: action, PreflightOnly: preflightOnly[action]})
	}
	lifetest.EachMissing(t, perms, lifetest.Missing{
		Noun:      "action",
		Passes:    3, // a pass may end on the first failure it meets
		Preflight: true,
		Mentions:  []string{azure.RoleFile},
	}, func(t *testing.T) lifetest.Config { return lifeConfig(t, full) })
}
