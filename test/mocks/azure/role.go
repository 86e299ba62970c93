package armfake

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"
)

// Role is an Azure custom role definition in the JSON shape that
// `az role definition create --role-definition` reads. The fake treats it
// as assigned to the caller at every scope it is asked about (the resource
// group and the network the README says to assign it at): a request is
// allowed when some entry of Actions matches its action and no entry of
// NotActions does, as Azure RBAC evaluates one role.
type Role struct {
	Name             string   `json:"Name"`
	IsCustom         bool     `json:"IsCustom"`
	Description      string   `json:"Description"`
	Actions          []string `json:"Actions"`
	NotActions       []string `json:"NotActions"`
	DataActions      []string `json:"DataActions"`
	NotDataActions   []string `json:"NotDataActions"`
	AssignableScopes []string `json:"AssignableScopes"`
}

// ReadRole reads a role definition file and checks its shape: a name, at
// least one action, only well-formed action patterns, and assignable
// scopes.
func ReadRole(path string) (*Role, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("role definition: %w", err)
	}
	var r Role
	dec := json.NewDecoder(strings.NewReader(string(raw)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return nil, fmt.Errorf("role definition %s: %w", path, err)
	}
	if err := r.check(); err != nil {
		return nil, fmt.Errorf("role definition %s: %w", path, err)
	}
	return &r, nil
}

func (r *Role) check() error {
	if r.Name == "" {
		return fmt.Errorf("the role has no Name")
	}
	if len(r.Actions) == 0 {
		return fmt.Errorf("the role has no Actions")
	}
	if len(r.AssignableScopes) == 0 {
		return fmt.Errorf("the role has no AssignableScopes")
	}
	for _, list := range [][]string{r.Actions, r.NotActions} {
		for _, a := range list {
			// An action is a provider namespace and a path, or "*".
			if a != "*" && (strings.Count(a, "/") < 1 || strings.ContainsAny(a, " \t\n")) {
				return fmt.Errorf("%q is not an action like Microsoft.Compute/virtualMachines/read", a)
			}
		}
	}
	for _, s := range r.AssignableScopes {
		if !strings.HasPrefix(s, "/subscriptions/") && s != "/" {
			return fmt.Errorf("assignable scope %q is not a subscription, group or resource", s)
		}
	}
	return nil
}

// Allows reports whether the role grants action.
func (r *Role) Allows(action string) bool {
	if r == nil {
		return false
	}
	matches := func(patterns []string) bool {
		return slices.ContainsFunc(patterns, func(p string) bool { return actionMatch(p, action) })
	}
	return matches(r.Actions) && !matches(r.NotActions)
}

// Without returns a copy of the role without action in its Actions.
func (r *Role) Without(action string) *Role {
	out := *r
	out.Actions = slices.DeleteFunc(slices.Clone(r.Actions), func(a string) bool { return strings.EqualFold(a, action) })
	return &out
}

// WithNotActions returns a copy of the role with notActions added.
func (r *Role) WithNotActions(notActions ...string) *Role {
	out := *r
	out.NotActions = append(slices.Clone(r.NotActions), notActions...)
	return &out
}

// actionMatch matches an action against an RBAC pattern: case-insensitive,
// and each * stands for any run of characters, slashes included
// ("Microsoft.Compute/*/read", "Microsoft.Network/*").
func actionMatch(pattern, action string) bool {
	p, a := strings.ToLower(pattern), strings.ToLower(action)
	parts := strings.Split(p, "*")
	if len(parts) == 1 {
		return p == a
	}
	if !strings.HasPrefix(a, parts[0]) {
		return false
	}
	a = a[len(parts[0]):]
	for i, part := range parts[1:] {
		last := i == len(parts)-2
		switch {
		case last:
			return strings.HasSuffix(a, part)
		default:
			at := strings.Index(a, part)
			if at < 0 {
				return false
			}
			a = a[at+len(part):]
		}
	}
	return true
}

// WithRole makes the fake authorize every request against the role that
// role returns at the time (nil: no role, every call refused); without
// this option every authenticated call is allowed. A call outside the role
// is answered as ARM does: 403 AuthorizationFailed naming the action and
// the scope, or LinkedAuthorizationFailed when the resource written
// references another (a subnet, a security group, a NIC) whose join action
// is missing. Resource Graph refuses a query without
// Microsoft.ResourceGraph/resources/read and shows only the resources the
// role may read. Polls of a long-running operation are not checked: the
// request that started it was.
func WithRole(role func() *Role) Option { return func(o *options) { o.role = role } }

// PrincipalID is the object id the fake's refusals name as the caller.
const PrincipalID = "5c2f0d8e-caa0-4e11-9a7b-00000000ca11"

// WithRoleScopes says where the role of WithRole is assigned: it grants
// its actions only at these scopes and below them (ARM ids, compared case
// insensitively, segment by segment). Without it the role holds at every
// scope. Resource Graph's query, which has no scope of its own, is allowed
// when the role grants its action anywhere.
func WithRoleScopes(scopes ...string) Option {
	return func(o *options) { o.roleScopes = slices.Clone(scopes) }
}

// covers reports whether the role is assigned at scope or above it.
func (s *server) covers(scope string) bool {
	if s.opts.roleScopes == nil || scope == "/" {
		return true
	}
	scope = strings.ToLower(strings.TrimSuffix(scope, "/"))
	return slices.ContainsFunc(s.opts.roleScopes, func(at string) bool {
		at = strings.ToLower(strings.TrimSuffix(at, "/"))
		return scope == at || strings.HasPrefix(scope, at+"/")
	})
}

// grants reports whether the role grants action at scope.
func (s *server) grants(action, scope string) bool {
	return s.opts.role == nil || (s.covers(scope) && s.opts.role().Allows(action))
}

// authorize checks one action at scope; the error is ARM's answer.
func (s *server) authorize(action, scope string) *apiError {
	if s.grants(action, scope) {
		return nil
	}
	return &apiError{http.StatusForbidden, "AuthorizationFailed", fmt.Sprintf(
		"The client '%s' with object id '%s' does not have authorization to perform action '%s' over scope '%s' or the scope is invalid. "+
			"If access was recently granted, please refresh your credentials.", PrincipalID, PrincipalID, action, scope), ""}
}

// authorizeLinked checks the join action on a resource that a write at
// scope references.
func (s *server) authorizeLinked(action, scope, joinAction, linked string) *apiError {
	if s.grants(joinAction, linked) {
		return nil
	}
	return &apiError{http.StatusForbidden, "LinkedAuthorizationFailed", fmt.Sprintf(
		"The client '%s' with object id '%s' has permission to perform action '%s' on scope '%s'; however, "+
			"it does not have permission to perform action(s) '%s' on the linked scope(s) '%s' (respectively) or the linked scope(s) are invalid.",
		PrincipalID, PrincipalID, action, scope, joinAction, linked), ""}
}

// requestAction names the RBAC action a request needs and the scope it is
// checked at; skip is true for requests that are not authorized on their
// own (operation polls, unknown routes).
func requestAction(r *http.Request) (action, scope string, skip bool) {
	path := strings.TrimSuffix(r.URL.Path, "/")
	lower := strings.ToLower(path)
	verb := map[string]string{http.MethodPut: "write", http.MethodDelete: "delete"}[r.Method]
	if verb == "" {
		verb = "read"
	}
	switch {
	case isGraph(r):
		return "Microsoft.ResourceGraph/resources/read", "/", false
	case strings.Contains(lower, "/operations/"):
		return "", "", true
	case strings.HasSuffix(lower, permissionsSuffix):
		return "Microsoft.Authorization/permissions/read", path[:len(path)-len(permissionsSuffix)], false
	case strings.Contains(lower, "/microsoft.compute/virtualmachines"):
		return "Microsoft.Compute/virtualMachines/" + verb, path, false
	case strings.Contains(lower, "/microsoft.network/networkinterfaces"):
		return "Microsoft.Network/networkInterfaces/" + verb, path, false
	case strings.Contains(lower, "/microsoft.network/virtualnetworks/") && strings.Contains(lower, "/subnets/"):
		return "Microsoft.Network/virtualNetworks/subnets/" + verb, path, false
	case !strings.Contains(lower, "/providers/") && strings.Contains(lower, "/resourcegroups/"):
		return "Microsoft.Resources/subscriptions/resourceGroups/" + verb, path, false
	}
	return "", "", true
}
