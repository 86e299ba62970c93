package armfake

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
)

// ErrAccessTokenExpired is what a WithAccessTokens check returns for a
// token past its expiry; ARM answers it ExpiredAuthenticationToken.
var ErrAccessTokenExpired = errors.New("access token expired")

// WithAccessTokens makes the fake accept a bearer token only when check
// returns nil for it (e.g. Entra.Check: tokens the fake Entra ID issued and
// not yet expired).
func WithAccessTokens(check func(token string) error) Option {
	return func(o *options) { o.tokenCheck = check }
}

// WithSubnets names the subnets that exist (ARM ids): a GET of another
// subnet is 404, and a NIC that references one is refused. Without it,
// every subnet id exists.
func WithSubnets(ids ...string) Option {
	return func(o *options) { o.subnets = slices.Clone(ids) }
}

const permissionsSuffix = "/providers/microsoft.authorization/permissions"

// permissionsScope returns the scope of a Microsoft.Authorization
// permissions request.
func permissionsScope(r *http.Request) (string, bool) {
	path := strings.TrimSuffix(r.URL.Path, "/")
	if !strings.HasSuffix(strings.ToLower(path), permissionsSuffix) {
		return "", false
	}
	scope := path[:len(path)-len(permissionsSuffix)]
	return scope, strings.HasPrefix(strings.ToLower(scope), "/subscriptions/")
}

// getGroup answers a read of the resource group the fake serves (route has
// refused any other).
func (s *server) getGroup(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{
		"id":         fmt.Sprintf("/subscriptions/%s/resourceGroups/%s", s.opts.subscription, s.opts.resourceGroup),
		"name":       s.opts.resourceGroup,
		"type":       "Microsoft.Resources/resourceGroups",
		"location":   s.opts.location,
		"properties": map[string]string{"provisioningState": "Succeeded"},
	})
}

func (s *server) subnetExists(id string) bool {
	return s.opts.subnets == nil || slices.ContainsFunc(s.opts.subnets, func(k string) bool { return strings.EqualFold(k, id) })
}

// getSubnet answers a read of a subnet: the ones WithSubnets names, or
// any without it.
func (s *server) getSubnet(w http.ResponseWriter, r *http.Request) {
	id := strings.TrimSuffix(r.URL.Path, "/")
	if !s.subnetExists(id) {
		writeError(w, apiError{http.StatusNotFound, "NotFound",
			fmt.Sprintf("Resource %s not found.", id), ""})
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"id": id, "name": r.PathValue("name"), "type": "Microsoft.Network/virtualNetworks/subnets",
		"properties": map[string]string{"addressPrefix": "10.20.0.0/24", "provisioningState": "Succeeded"},
	})
}

// listPermissions answers the caller's permissions at a scope: the role's
// actions and not-actions as one entry when it is assigned at or above the
// scope, none otherwise (every action, "*", without a role), as ARM lists
// what every assignment at or above the scope grants.
// A resource scope in the served group must exist.
func (s *server) listPermissions(w http.ResponseWriter, r *http.Request) {
	scope, _ := permissionsScope(r)
	if id, ok := parseResourceID(scope); ok && strings.EqualFold(id.group, s.opts.resourceGroup) && !s.scopeExists(id, scope) {
		writeError(w, apiError{http.StatusNotFound, "ResourceNotFound",
			fmt.Sprintf("The Resource '%s/%s' under resource group '%s' was not found.", id.typ, id.name, id.group), ""})
		return
	}
	entry := map[string][]string{"actions": {"*"}, "notActions": {}, "dataActions": {}, "notDataActions": {}}
	if s.opts.role != nil {
		if role := s.opts.role(); role != nil && s.covers(scope) {
			entry["actions"] = slices.Clone(role.Actions)
			entry["notActions"] = append([]string{}, role.NotActions...)
		} else {
			entry["actions"] = []string{}
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"value": []any{entry}})
}

// scopeExists reports whether a resource of the served group exists, for
// the kinds the fake keeps.
func (s *server) scopeExists(id resourceID, scope string) bool {
	switch {
	case id.is(vmType):
		_, ok := s.lookup(id.name)
		return ok
	case id.is(nicType):
		_, err := s.cloud.GetResource(key(scope))
		return err == nil
	}
	return true
}

// readable drops the Resource Graph documents of types the role may not
// read: Resource Graph shows a caller only what it may read.
func (s *server) readable(docs []map[string]any) []map[string]any {
	if s.opts.role == nil {
		return docs
	}
	role := s.opts.role()
	return slices.DeleteFunc(slices.Clone(docs), func(d map[string]any) bool {
		typ, _ := d["type"].(string)
		return !role.Allows(typ + "/read")
	})
}
