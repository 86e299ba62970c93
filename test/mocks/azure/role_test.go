package armfake_test

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	armfake "github.com/caa-project/caa/test/mocks/azure"
	"github.com/caa-project/caa/test/mocks/cloud"
)

func TestRoleMatching(t *testing.T) {
	r := &armfake.Role{Name: "r", Actions: []string{"Microsoft.Compute/virtualMachines/*", "microsoft.network/*/read", "Microsoft.ResourceGraph/resources/read"},
		NotActions: []string{"Microsoft.Compute/virtualMachines/delete"}}
	for action, want := range map[string]bool{
		"Microsoft.Compute/virtualMachines/read":             true,
		"microsoft.compute/VIRTUALMACHINES/write":            true,
		"Microsoft.Compute/virtualMachines/delete":           false, // NotActions
		"Microsoft.Compute/disks/delete":                     false,
		"Microsoft.Network/networkInterfaces/read":           true,
		"Microsoft.Network/virtualNetworks/subnets/read":     true, // * spans slashes
		"Microsoft.Network/networkInterfaces/write":          false,
		"Microsoft.ResourceGraph/resources/read":             true,
		"Microsoft.ResourceGraph/resources/readx":            false,
		"Microsoft.Network/networkInterfaces/join/action":    false,
		"Microsoft.Compute/virtualMachinesX/read":            false,
		"Microsoft.Authorization/permissions/read":           false,
		"Microsoft.Compute/virtualMachines/extensions/write": true,
	} {
		assert.Equal(t, want, r.Allows(action), action)
	}
	assert.True(t, (&armfake.Role{Actions: []string{"*"}}).Allows("Microsoft.Anything/at/all"))
	assert.False(t, (*armfake.Role)(nil).Allows("Microsoft.Compute/virtualMachines/read"))
	assert.False(t, r.Without("Microsoft.ResourceGraph/resources/read").Allows("Microsoft.ResourceGraph/resources/read"))
	assert.True(t, r.Allows("Microsoft.ResourceGraph/resources/read"), "Without copies")
}

func TestReadRoleRefusesBadShapes(t *testing.T) {
	r, err := armfake.ReadRole(filepath.Join("..", "..", "..", "deploy", "overlays", "azure", "role.json"))
	require.NoError(t, err)
	assert.NotEmpty(t, r.Actions)
	dir := t.TempDir()
	for name, body := range map[string]string{
		"no actions":    `{"Name":"x","IsCustom":true,"Actions":[],"AssignableScopes":["/subscriptions/s"]}`,
		"unknown field": `{"Name":"x","Actions":["a/b"],"AssignableScopes":["/subscriptions/s"],"Permissions":[]}`,
		"bad action":    `{"Name":"x","Actions":["read everything"],"AssignableScopes":["/subscriptions/s"]}`,
		"no scopes":     `{"Name":"x","Actions":["a/b"]}`,
	} {
		p := filepath.Join(dir, strings.ReplaceAll(name, " ", "-"))
		require.NoError(t, os.WriteFile(p, []byte(body), 0o600))
		_, err := armfake.ReadRole(p)
		assert.Error(t, err, name)
	}
}

// roleFake is the fake with a role the test can change.
func newRoleFake(t *testing.T, role *armfake.Role) (*fake, *atomic.Pointer[armfake.Role]) {
	t.Helper()
	var held atomic.Pointer[armfake.Role]
	held.Store(role)
	c := cloud.New(cloud.Options{PageSize: 2, Images: []string{image, platform}, Types: []string{size}})
	srv := httptest.NewServer(armfake.NewServer(c, armfake.WithBearerToken(token), armfake.WithRole(held.Load), armfake.WithSubnets(subnet)))
	t.Cleanup(srv.Close)
	return &fake{t: t, cloud: c, url: srv.URL}, &held
}

// TestRoleIsEnforcedOnEveryRoute: each call outside the role gets ARM's
// AuthorizationFailed naming the action and the scope; a reference whose
// join action is missing gets LinkedAuthorizationFailed; nothing changes.
func TestRoleIsEnforcedOnEveryRoute(t *testing.T) {
	all := &armfake.Role{Name: "all", Actions: []string{"*"}}
	f, role := newRoleFake(t, all)
	nic := nics + "/n1"
	require.Equal(t, http.StatusCreated, f.do(http.MethodPut, nic, nicBody()).status)

	for _, tc := range []struct {
		method, path, action string
		body                 any
		code                 string
	}{
		{http.MethodGet, vms + "/vm1", "Microsoft.Compute/virtualMachines/read", nil, "AuthorizationFailed"},
		{http.MethodPut, vms + "/vm1", "Microsoft.Compute/virtualMachines/write", vmBody("n1"), "AuthorizationFailed"},
		{http.MethodDelete, vms + "/vm1", "Microsoft.Compute/virtualMachines/delete", nil, "AuthorizationFailed"},
		{http.MethodPut, vms + "/vm1", "Microsoft.Network/networkInterfaces/join/action", vmBody("n1"), "LinkedAuthorizationFailed"},
		{http.MethodGet, nic, "Microsoft.Network/networkInterfaces/read", nil, "AuthorizationFailed"},
		{http.MethodPut, nics + "/n2", "Microsoft.Network/networkInterfaces/write", nicBody(), "AuthorizationFailed"},
		{http.MethodPut, nics + "/n2", "Microsoft.Network/virtualNetworks/subnets/join/action", nicBody(), "LinkedAuthorizationFailed"},
		{http.MethodDelete, nic, "Microsoft.Network/networkInterfaces/delete", nil, "AuthorizationFailed"},
		{http.MethodGet, group, "Microsoft.Resources/subscriptions/resourceGroups/read", nil, "AuthorizationFailed"},
		{http.MethodGet, subnet, "Microsoft.Network/virtualNetworks/subnets/read", nil, "AuthorizationFailed"},
		{http.MethodGet, group + "/providers/Microsoft.Authorization/permissions", "Microsoft.Authorization/permissions/read", nil, "AuthorizationFailed"},
		{http.MethodGet, subnet + "/providers/Microsoft.Authorization/permissions", "Microsoft.Authorization/permissions/read", nil, "AuthorizationFailed"},
		{http.MethodPost, armfake.GraphPath + "?api-version=2024-04-01", "Microsoft.ResourceGraph/resources/read",
			map[string]any{"subscriptions": []string{armfake.DefaultSubscription}, "query": "Resources | where type =~ 'microsoft.compute/virtualmachines' | project id"}, "AuthorizationFailed"},
	} {
		t.Run(tc.method+" "+tc.action, func(t *testing.T) {
			role.Store(all.WithNotActions(tc.action))
			before := len(f.cloud.Instances())
			r := f.do(tc.method, tc.path, tc.body)
			assert.Equal(t, http.StatusForbidden, r.status, r.raw)
			assert.Equal(t, tc.code, r.code())
			msg := str(r.body, "error", "message")
			assert.Contains(t, msg, "'"+tc.action+"'")
			assert.Contains(t, msg, armfake.PrincipalID)
			assert.Len(t, f.cloud.Instances(), before, "nothing changed")
		})
	}
	role.Store(all)
	r := f.do(http.MethodGet, group+"/providers/Microsoft.Authorization/permissions", nil)
	require.Equal(t, http.StatusOK, r.status, r.raw)
	assert.Equal(t, "*", str(r.body, "value", 0, "actions", 0))
}

// TestPermissionsAPIServesTheRole: the caller's permissions at the group
// and at a subnet are the role's actions and notActions; an unknown
// subnet is 404; the group's resources must exist.
func TestPermissionsAPIServesTheRole(t *testing.T) {
	r := &armfake.Role{Name: "r", Actions: []string{"Microsoft.Compute/virtualMachines/read", "Microsoft.Network/*", "Microsoft.Authorization/permissions/read", "Microsoft.Resources/subscriptions/resourceGroups/read"},
		NotActions: []string{"Microsoft.Network/*/delete"}}
	f, _ := newRoleFake(t, r.WithNotActions())
	for _, scope := range []string{group, subnet} {
		got := f.do(http.MethodGet, scope+"/providers/Microsoft.Authorization/permissions", nil)
		require.Equal(t, http.StatusOK, got.status, got.raw)
		assert.Equal(t, "Microsoft.Network/*", str(got.body, "value", 0, "actions", 1))
		assert.Equal(t, "Microsoft.Network/*/delete", str(got.body, "value", 0, "notActions", 0))
	}
	assert.Equal(t, http.StatusNotFound, f.do(http.MethodGet, vms+"/none/providers/Microsoft.Authorization/permissions", nil).status)
	assert.Equal(t, "ResourceGroupNotFound", f.do(http.MethodGet, "/subscriptions/"+armfake.DefaultSubscription+
		"/resourceGroups/other/providers/Microsoft.Authorization/permissions", nil).code())
	assert.Equal(t, http.StatusOK, f.do(http.MethodGet, subnet, nil).status)
	assert.Equal(t, http.StatusNotFound, f.do(http.MethodGet, strings.Replace(subnet, "/s", "/other", 1), nil).status)
	assert.Equal(t, http.StatusOK, f.do(http.MethodGet, group, nil).status)
	// A NIC on a subnet that does not exist is refused.
	body := nicBody()
	body["properties"].(map[string]any)["ipConfigurations"].([]any)[0].(map[string]any)["properties"].(map[string]any)["subnet"] =
		map[string]any{"id": strings.Replace(subnet, "/s", "/other", 1)}
	assert.Equal(t, "InvalidResourceReference", f.do(http.MethodPut, nics+"/n9", body).code())
}

// TestResourceGraphShowsOnlyReadableTypes: without NIC read, a query sees
// the VMs and not their NICs.
func TestResourceGraphShowsOnlyReadableTypes(t *testing.T) {
	all := &armfake.Role{Name: "all", Actions: []string{"*"}}
	f, role := newRoleFake(t, all)
	require.Equal(t, http.StatusCreated, f.do(http.MethodPut, nics+"/n1", nicBody()).status)
	query := map[string]any{"subscriptions": []string{armfake.DefaultSubscription}, "query": "Resources | project id, type"}
	count := func() (vmsSeen, nicsSeen int) {
		r := f.do(http.MethodPost, armfake.GraphPath+"?api-version=2024-04-01", query)
		require.Equal(t, http.StatusOK, r.status, r.raw)
		for _, row := range r.body["data"].([]any) {
			switch strings.ToLower(row.(map[string]any)["type"].(string)) {
			case "microsoft.compute/virtualmachines":
				vmsSeen++
			case "microsoft.network/networkinterfaces":
				nicsSeen++
			}
		}
		return vmsSeen, nicsSeen
	}
	_, n := count()
	assert.Equal(t, 1, n)
	role.Store(all.WithNotActions("Microsoft.Network/networkInterfaces/read"))
	_, n = count()
	assert.Zero(t, n)
}

// TestRoleScopes: a role assigned at the group grants nothing at a subnet
// in another group; assigned at the subnet's network too, it does.
func TestRoleScopes(t *testing.T) {
	all := &armfake.Role{Name: "all", Actions: []string{"*"}}
	c := cloud.New(cloud.Options{Images: []string{platform}, Types: []string{size}})
	for _, tc := range []struct {
		scopes []string
		subnet int
	}{
		{[]string{group}, http.StatusForbidden},
		{[]string{strings.ToUpper(group), subnet[:strings.Index(subnet, "/subnets/")]}, http.StatusOK},
	} {
		srv := httptest.NewServer(armfake.NewServer(c, armfake.WithBearerToken(token), armfake.WithRole(func() *armfake.Role { return all }),
			armfake.WithRoleScopes(tc.scopes...)))
		f := &fake{t: t, cloud: c, url: srv.URL}
		assert.Equal(t, http.StatusOK, f.do(http.MethodGet, group, nil).status, "%v", tc.scopes)
		assert.Equal(t, http.StatusOK, f.do(http.MethodGet, group+"/providers/Microsoft.Authorization/permissions", nil).status)
		r := f.do(http.MethodGet, subnet, nil)
		assert.Equal(t, tc.subnet, r.status, "%v", tc.scopes)
		r = f.do(http.MethodPut, nics+"/n1", nicBody())
		if tc.subnet == http.StatusForbidden {
			assert.Equal(t, "LinkedAuthorizationFailed", r.code(), "the subnet join is checked at the subnet")
		} else {
			assert.Equal(t, http.StatusCreated, r.status, r.raw)
		}
		srv.Close()
	}
}
