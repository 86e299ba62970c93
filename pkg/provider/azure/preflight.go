package azure

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/runtime"

	"github.com/caa-project/caa/pkg/provider"
)

const opPreflight = "preflight"

// RoleFile is the custom role definition with exactly the actions caa
// needs; errors about a missing permission point at it.
const RoleFile = "deploy/overlays/azure/role.json"

// API versions of the calls Preflight makes through the ARM pipeline (no
// SDK module for them is part of caa's build).
const (
	resourcesAPIVersion     = "2021-04-01"
	permissionsAPIVersion   = "2022-04-01"
	networkReadAPIVersion   = "2024-05-01"
	maxPermissionPages      = 20
	actionGroupRead         = "Microsoft.Resources/subscriptions/resourceGroups/read"
	actionPermissionsRead   = "Microsoft.Authorization/permissions/read"
	actionSubnetRead        = "Microsoft.Network/virtualNetworks/subnets/read"
	actionSubnetJoin        = "Microsoft.Network/virtualNetworks/subnets/join/action"
	actionSecurityGroupJoin = "Microsoft.Network/networkSecurityGroups/join/action"
	actionDiskWrite         = "Microsoft.Compute/disks/write"
	actionDiskDelete        = "Microsoft.Compute/disks/delete"
)

// GroupActions are the RBAC actions caa uses on its resource group: the
// preflight's reads, the VMs, NICs and OS disks it creates, reads and deletes, the
// NIC's attachment to its VM, and the Resource Graph query of List.
var GroupActions = []string{
	actionGroupRead,
	actionPermissionsRead,
	"Microsoft.Compute/virtualMachines/read",
	"Microsoft.Compute/virtualMachines/write",
	"Microsoft.Compute/virtualMachines/delete",
	// The OS disk a VM's create makes from the image, and deletes with the
	// VM (deleteOption Delete): ARM checks these on the disk too (a linked
	// access check), though caa never calls the disks API itself.
	actionDiskWrite,
	actionDiskDelete,
	"Microsoft.Network/networkInterfaces/read",
	"Microsoft.Network/networkInterfaces/write",
	"Microsoft.Network/networkInterfaces/delete",
	"Microsoft.Network/networkInterfaces/join/action",
	"Microsoft.ResourceGraph/resources/read",
}

// SubnetActions are the actions caa uses on the subnet of
// Config.SubnetID (which may be in another group): the preflight reads it
// and its permissions there, and every NIC joins it.
var SubnetActions = []string{actionSubnetRead, actionPermissionsRead, actionSubnetJoin}

// SecurityGroupActions are the actions caa uses on the network security
// group of Config.SecurityGroupID, when one is set.
var SecurityGroupActions = []string{actionPermissionsRead, actionSecurityGroupJoin}

// RequiredActions is every action caa may use: what RoleFile grants.
func RequiredActions() []string {
	var out []string
	for _, a := range slices.Concat(GroupActions, SubnetActions, SecurityGroupActions) {
		if !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	return out
}

var _ provider.Preflighter = (*Provider)(nil)

// Preflight checks, without changing anything, that the resource group and
// the subnet exist and that the caller's role grants every action caa will
// use there: it reads the group, reads the caller's permissions on it
// (Microsoft.Authorization/permissions, the list of actions and
// notActions of every role assigned at or above the scope), reads the
// subnet and the permissions on it, and on the security group when one is
// set; then compares them with GroupActions, SubnetActions and
// SecurityGroupActions, wildcards and notActions included.
//
// A missing permission is an error wrapping provider.ErrAuth that names
// every missing action and the scope, and points at RoleFile; a resource
// group or subnet that does not exist is one wrapping
// provider.ErrInvalidSpec that names the setting.
func (p *Provider) Preflight(ctx context.Context) error {
	group := fmt.Sprintf("/subscriptions/%s/resourceGroups/%s", p.cfg.SubscriptionID, p.cfg.ResourceGroup)
	if err := p.armGet(ctx, group, resourcesAPIVersion, nil); err != nil {
		return p.preflightReadErr(err, "read the resource group", "resource-group", "CAA_AZURE_RESOURCE_GROUP", p.cfg.ResourceGroup)
	}
	if err := p.requireActions(ctx, group, GroupActions); err != nil {
		return err
	}
	if err := p.armGet(ctx, p.cfg.SubnetID, networkReadAPIVersion, nil); err != nil {
		return p.preflightReadErr(err, "read the subnet", "subnet-id", "CAA_AZURE_SUBNET_ID", p.cfg.SubnetID)
	}
	if err := p.requireActions(ctx, p.cfg.SubnetID, SubnetActions); err != nil {
		return err
	}
	if p.cfg.SecurityGroupID != "" {
		if err := p.requireActions(ctx, p.cfg.SecurityGroupID, SecurityGroupActions); err != nil {
			if errors.Is(err, provider.ErrNotFound) {
				return fmt.Errorf("%s %s: %w: --azure-security-group-id (CAA_AZURE_SECURITY_GROUP_ID): %s does not exist: %w",
					ProviderName, opPreflight, provider.ErrInvalidSpec, p.cfg.SecurityGroupID, err)
			}
			return err
		}
	}
	return nil
}

// preflightReadErr explains a failed read of a configured resource: not
// found names the setting, a refusal the role file.
func (p *Provider) preflightReadErr(err error, what, flag, env, value string) error {
	err = classify(opPreflight, err)
	var pe *provider.Error
	switch {
	case errors.As(err, &pe) && (pe.Status == http.StatusNotFound || strings.EqualFold(pe.Code, "ResourceGroupNotFound")):
		return fmt.Errorf("%s %s: %w: --azure-%s (%s): %q does not exist in subscription %s: %w",
			ProviderName, opPreflight, provider.ErrInvalidSpec, flag, env, value, p.cfg.SubscriptionID, err)
	case errors.As(err, &pe) && strings.EqualFold(pe.Code, "SubscriptionNotFound"):
		return fmt.Errorf("%s %s: --azure-subscription-id (CAA_AZURE_SUBSCRIPTION_ID): the credential sees no subscription %s: %w",
			ProviderName, opPreflight, p.cfg.SubscriptionID, err)
	}
	// err names the provider and the operation already.
	return fmt.Errorf("%s %s: %w", what, value, err)
}

// permission is one entry of the permissions API's answer.
type permission struct {
	Actions    []string `json:"actions"`
	NotActions []string `json:"notActions"`
}

// requireActions reads the caller's permissions at scope and fails naming
// every action of want they do not grant.
func (p *Provider) requireActions(ctx context.Context, scope string, want []string) error {
	var perms []permission
	next := ""
	for page := 0; ; page++ {
		if page == maxPermissionPages {
			return fmt.Errorf("%s %s: permissions at %s: more than %d pages", ProviderName, opPreflight, scope, maxPermissionPages)
		}
		var body struct {
			Value    []permission `json:"value"`
			NextLink string       `json:"nextLink"`
		}
		path := scope + "/providers/Microsoft.Authorization/permissions"
		if next != "" {
			path = next
		}
		if err := p.armGet(ctx, path, permissionsAPIVersion, &body); err != nil {
			err = classify(opPreflight, err)
			return fmt.Errorf("read the caller's permissions at %s (needs %s): %w", scope, actionPermissionsRead, err)
		}
		perms = append(perms, body.Value...)
		if body.NextLink == "" {
			break
		}
		next = body.NextLink
	}
	var missing []string
	for _, a := range want {
		if !granted(perms, a) {
			missing = append(missing, a)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%s %s: %w: the caller's roles lack %s at scope %s; grant caa the role in %s",
			ProviderName, opPreflight, provider.ErrAuth, strings.Join(missing, ", "), scope, RoleFile)
	}
	return nil
}

// granted reports whether one permission entry grants action: one of its
// actions matches and none of its notActions does (a notAction removes an
// action from its own entry only, as RBAC evaluates each role).
func granted(perms []permission, action string) bool {
	return slices.ContainsFunc(perms, func(p permission) bool {
		match := func(patterns []string) bool {
			return slices.ContainsFunc(patterns, func(pat string) bool { return wildcardMatch(pat, action) })
		}
		return match(p.Actions) && !match(p.NotActions)
	})
}

// wildcardMatch matches an RBAC action pattern, case-insensitively, where
// * stands for any run of characters.
func wildcardMatch(pattern, s string) bool {
	pattern, s = strings.ToLower(pattern), strings.ToLower(s)
	star := strings.IndexByte(pattern, '*')
	if star < 0 {
		return pattern == s
	}
	if !strings.HasPrefix(s, pattern[:star]) {
		return false
	}
	rest := pattern[star+1:]
	for i := star; i <= len(s); i++ {
		if wildcardMatch(rest, s[i:]) {
			return true
		}
	}
	return false
}

// armGet GETs path (an ARM path, or an absolute nextLink) through the
// provider's ARM pipeline (credential, retries, logging) under a read
// deadline, and decodes a 200 answer into out when out is not nil.
func (p *Provider) armGet(ctx context.Context, path, apiVersion string, out any) error {
	ctx, cancel := p.readCtx(ctx)
	defer cancel()
	u := path
	if !strings.HasPrefix(path, "https://") && !strings.HasPrefix(path, "http://") {
		u = runtime.JoinPaths(p.arm.Endpoint(), path)
	}
	req, err := runtime.NewRequest(ctx, http.MethodGet, u)
	if err != nil {
		return err
	}
	if q := req.Raw().URL.Query(); q.Get("api-version") == "" {
		q.Set("api-version", apiVersion)
		req.Raw().URL.RawQuery = q.Encode()
	}
	req.Raw().Header.Set("Accept", "application/json")
	resp, err := p.arm.Pipeline().Do(req)
	if err != nil {
		return err
	}
	if !runtime.HasStatusCode(resp, http.StatusOK) {
		return runtime.NewResponseError(resp)
	}
	if out == nil {
		runtime.Drain(resp)
		return nil
	}
	raw, err := runtime.Payload(resp)
	if err != nil {
		return err
	}
	return json.Unmarshal(raw, out)
}
