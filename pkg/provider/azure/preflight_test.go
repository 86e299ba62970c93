package azure_test

import (
	"context"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/pkg/provider/azure"
	armfake "github.com/caa-project/caa/test/mocks/azure"
	"github.com/caa-project/caa/test/mocks/cloud"
)

const securityGroupID = "/subscriptions/" + armfake.DefaultSubscription +
	"/resourceGroups/caa-net/providers/Microsoft.Network/networkSecurityGroups/peerpods-nsg"

// shippedRole is deploy/overlays/azure/role.json.
func shippedRole(t testing.TB) *armfake.Role {
	t.Helper()
	r, err := armfake.ReadRole(filepath.Join("..", "..", "..", azure.RoleFile))
	require.NoError(t, err)
	return r
}

// roleFake is a fake ARM that authorizes every call against the role the
// test holds, knows one subnet, and a provider on it with a security group
// set (so that every action of the role is used).
type roleFake struct {
	role     atomic.Pointer[armfake.Role]
	cloud    *cloud.Cloud
	provider *azure.Provider
	logs     func() string
}

func newRoleFake(t testing.TB, role *armfake.Role, edit func(*azure.Config), fakeOpts ...armfake.Option) *roleFake {
	t.Helper()
	f := &roleFake{}
	f.role.Store(role)
	h, _ := newHarnessOn(t, cloud.Options{Images: []string{lifeImage}, Types: []string{lifeSize}}, staticToken(testToken),
		append([]armfake.Option{armfake.WithRole(f.role.Load), armfake.WithSubnets(subnetID)}, fakeOpts...),
		func(c *azure.Config) {
			c.SecurityGroupID = securityGroupID
			if edit != nil {
				edit(c)
			}
		})
	f.cloud, f.provider, f.logs = h.Cloud, h.Provider.(*azure.Provider), h.Logs
	return f
}

// TestRoleFileHasExactlyTheRequiredActions: role.json grants what the
// provider says it uses, no more, no less, and no wildcard.
func TestRoleFileHasExactlyTheRequiredActions(t *testing.T) {
	r := shippedRole(t)
	assert.ElementsMatch(t, azure.RequiredActions(), r.Actions)
	assert.Empty(t, r.NotActions)
	assert.Empty(t, r.DataActions)
	assert.True(t, r.IsCustom)
	for _, a := range r.Actions {
		assert.NotContains(t, a, "*", "least privilege: no wildcard")
	}
	for _, s := range r.AssignableScopes {
		assert.Contains(t, s, "/resourceGroups/", "assignable at a group or below, never a whole subscription")
	}
}

func TestPreflightPassesUnderTheShippedRole(t *testing.T) {
	f := newRoleFake(t, shippedRole(t), nil)
	require.NoError(t, f.provider.Preflight(context.Background()))
	assert.Empty(t, f.cloud.Live(), "the preflight creates nothing")
	c := f.cloud.Counters()
	assert.Zero(t, c[cloud.OpCreate]+c[armfake.OpNICCreate]+c[cloud.OpDelete]+c[armfake.OpNICDelete], "no write")
	assert.Equal(t, int64(3), c[armfake.OpPermissions], "permissions at the group, the subnet and the security group")
}

// TestPreflightNamesEachMissingAction takes each action out of the role in
// turn: the preflight fails with ErrAuth naming it and the role file.
func TestPreflightNamesEachMissingAction(t *testing.T) {
	full := shippedRole(t)
	for _, action := range full.Actions {
		t.Run(action, func(t *testing.T) {
			f := newRoleFake(t, full.Without(action), nil)
			err := f.provider.Preflight(context.Background())
			require.Error(t, err)
			assert.ErrorIs(t, err, provider.ErrAuth)
			assert.NotErrorIs(t, err, provider.ErrInvalidSpec)
			assert.Contains(t, err.Error(), action)
			assert.Contains(t, err.Error(), azure.RoleFile)
			assert.NotContains(t, err.Error(), testToken)
		})
	}
}

// TestPreflightHonoursWildcardsAndNotActions: a broader role with
// wildcards passes; a NotAction takes an action away again and is named.
func TestPreflightHonoursWildcardsAndNotActions(t *testing.T) {
	wide := &armfake.Role{Name: "wide", IsCustom: true, AssignableScopes: []string{"/subscriptions/x/resourceGroups/y"},
		Actions: []string{"Microsoft.Compute/virtualMachines/*", "Microsoft.Compute/disks/*", "microsoft.network/*", "Microsoft.Resources/subscriptions/resourceGroups/read",
			"Microsoft.Authorization/*/read", "Microsoft.ResourceGraph/resources/read"}}
	f := newRoleFake(t, wide, nil)
	require.NoError(t, f.provider.Preflight(context.Background()))

	f.role.Store(wide.WithNotActions("Microsoft.Network/*/delete"))
	err := f.provider.Preflight(context.Background())
	require.ErrorIs(t, err, provider.ErrAuth)
	assert.Contains(t, err.Error(), "Microsoft.Network/networkInterfaces/delete")
	assert.NotContains(t, err.Error(), "virtualMachines/delete")

	f.role.Store(&armfake.Role{Name: "all", Actions: []string{"*"}})
	require.NoError(t, f.provider.Preflight(context.Background()))
}

// TestPreflightNamesAWrongSetting: a resource group or subnet that does not
// exist is ErrInvalidSpec naming the setting.
func TestPreflightNamesAWrongSetting(t *testing.T) {
	for name, tc := range map[string]struct {
		edit func(*azure.Config)
		want string
	}{
		"resource group": {func(c *azure.Config) { c.ResourceGroup = "no-such-group" }, "--azure-resource-group (CAA_AZURE_RESOURCE_GROUP)"},
		"subnet": {func(c *azure.Config) { c.SubnetID = strings.Replace(subnetID, "peerpods", "elsewhere", 1) },
			"--azure-subnet-id (CAA_AZURE_SUBNET_ID)"},
	} {
		t.Run(name, func(t *testing.T) {
			f := newRoleFake(t, shippedRole(t), tc.edit)
			err := f.provider.Preflight(context.Background())
			require.ErrorIs(t, err, provider.ErrInvalidSpec)
			assert.NotErrorIs(t, err, provider.ErrAuth)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

// TestPreflightNeedsTheRoleAtBothScopes: the role assigned at the resource
// group alone leaves the subnet (in the network's own group) without it;
// the preflight names the subnet's action and scope. Assigned also at the
// virtual network, as the README says, it passes.
func TestPreflightNeedsTheRoleAtBothScopes(t *testing.T) {
	group := "/subscriptions/" + armfake.DefaultSubscription + "/resourceGroups/" + armfake.DefaultResourceGroup
	vnet := subnetID[:strings.Index(subnetID, "/subnets/")]
	nsgGroup := securityGroupID[:strings.Index(securityGroupID, "/providers/")]

	f := newRoleFake(t, shippedRole(t), nil, armfake.WithRoleScopes(group))
	err := f.provider.Preflight(context.Background())
	require.ErrorIs(t, err, provider.ErrAuth)
	assert.Contains(t, err.Error(), "Microsoft.Network/virtualNetworks/subnets/read")
	assert.Contains(t, err.Error(), subnetID)

	f = newRoleFake(t, shippedRole(t), nil, armfake.WithRoleScopes(group, vnet))
	err = f.provider.Preflight(context.Background())
	require.ErrorIs(t, err, provider.ErrAuth, "the security group is not under the network")
	assert.Contains(t, err.Error(), securityGroupID)

	f = newRoleFake(t, shippedRole(t), nil, armfake.WithRoleScopes(group, vnet, nsgGroup))
	require.NoError(t, f.provider.Preflight(context.Background()))
}
