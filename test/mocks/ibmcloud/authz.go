package vpcfake

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"slices"
	"sort"
	"strings"

	"github.com/caa-project/caa/test/mocks/cloud"
)

// IBM Cloud IAM access policies, as the fake enforces them.
//
// A policy file is {"policies": [...]}, each element the body the IAM
// Policy Management API takes (POST /v1/policies): type "access", subjects
// by iam_id, roles by CRN, resources by attributes. The fake reads the
// attributes that scope VPC Infrastructure Services (serviceName "is")
// resources:
//
//	serviceName      "is"
//	<type>Id         the resource type, and "*" or one resource's id:
//	                 instanceId, volumeId, subnetId, vpcId, imageId,
//	                 securityGroupId, virtualNetworkInterfaceId
//	resourceGroupId  the resource group of the resource (optional)
//	accountId        ignored (one account per fake)
//
// and resource groups themselves (resourceType "resource-group", resource
// the group's id), whose Viewer role lets a caller create resources in the
// group. Roles expand to actions the way IAM's platform and service roles
// do for VPC: Viewer reads and lists, Operator adds operate (attaching an
// instance to a subnet, a security group or a VPC), Editor adds create,
// update and delete, Administrator is Editor here (the fake has no access
// management). A call is allowed when one policy whose subject is the
// caller grants, on a resource that matches, a role that includes the
// action; anything else is 403 with VPC's error body naming the action.

// RoleCRN is the CRN of an IAM platform role by name.
func RoleCRN(name string) string { return "crn:v1:bluemix:public:iam::::role:" + name }

// Policies is a parsed policy file.
type Policies struct {
	Policies []AccessPolicy `json:"policies"`
}

// AccessPolicy is one IAM access policy.
type AccessPolicy struct {
	Type        string       `json:"type"`
	Description string       `json:"description,omitempty"`
	Subjects    []attrSet    `json:"subjects"`
	Roles       []policyRole `json:"roles"`
	Resources   []attrSet    `json:"resources"`
}

type attrSet struct {
	Attributes []attribute `json:"attributes"`
}

type attribute struct {
	Name     string `json:"name"`
	Operator string `json:"operator,omitempty"`
	Value    string `json:"value"`
}

type policyRole struct {
	RoleID string `json:"role_id"`
}

// ReadPolicies reads a policy file, replacing each key of subst found in a
// value (the file's REPLACE_ME placeholders) with its value.
func ReadPolicies(path string, subst map[string]string) (*Policies, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("policy file: %w", err)
	}
	return ParsePolicies(b, subst)
}

// ParsePolicies parses a policy file's content (see ReadPolicies).
func ParsePolicies(b []byte, subst map[string]string) (*Policies, error) {
	var p Policies
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		return nil, fmt.Errorf("policy file: %w", err)
	}
	if len(p.Policies) == 0 {
		return nil, fmt.Errorf("policy file: no policies")
	}
	for i := range p.Policies {
		ap := &p.Policies[i]
		if ap.Type != "access" {
			return nil, fmt.Errorf("policy %d: type %q, want access", i, ap.Type)
		}
		if len(ap.Subjects) == 0 || len(ap.Roles) == 0 || len(ap.Resources) == 0 {
			return nil, fmt.Errorf("policy %d: needs subjects, roles and resources", i)
		}
		for _, r := range ap.Roles {
			if _, ok := roleVerbs[strings.TrimPrefix(r.RoleID, RoleCRN(""))]; !ok || !strings.HasPrefix(r.RoleID, RoleCRN("")) {
				return nil, fmt.Errorf("policy %d: role %q is not a role the fake expands", i, r.RoleID)
			}
		}
		for _, sets := range [][]attrSet{ap.Subjects, ap.Resources} {
			for j := range sets {
				for k := range sets[j].Attributes {
					a := &sets[j].Attributes[k]
					if a.Operator != "" && a.Operator != "stringEquals" {
						return nil, fmt.Errorf("policy %d: operator %q is not one the fake knows", i, a.Operator)
					}
					for from, to := range subst {
						a.Value = strings.ReplaceAll(a.Value, from, to)
					}
				}
			}
		}
	}
	return &p, nil
}

// roleVerbs are the action verbs each role grants.
var roleVerbs = map[string][]string{
	"Viewer":        {"read", "list"},
	"Operator":      {"read", "list", "operate"},
	"Editor":        {"read", "list", "operate", "create", "update", "delete"},
	"Administrator": {"read", "list", "operate", "create", "update", "delete"},
}

// Resource types of service "is", by the attribute that scopes them.
var typeAttrs = map[string]string{
	"instance":                  "instanceId",
	"volume":                    "volumeId",
	"subnet":                    "subnetId",
	"vpc":                       "vpcId",
	"image":                     "imageId",
	"security-group":            "securityGroupId",
	"virtual-network-interface": "virtualNetworkInterfaceId",
}

// Access is one permission a call needs: an action on one resource.
type Access struct {
	// Type is the VPC resource type (instance, volume, ...) or
	// "resource-group".
	Type string
	// Verb is read, list, operate, create or delete.
	Verb string
	// ID is the resource's id ("" for a create or a listing).
	ID string
	// Group is the resource group it lives in ("" when unknown).
	Group string
}

// Action is the IAM action's name: is.instance.instance.create, or
// resource-controller.group.retrieve.
func (a Access) Action() string {
	if a.Type == "resource-group" {
		return "resource-controller.group.retrieve"
	}
	return "is." + a.Type + "." + a.Type + "." + a.Verb
}

func (a Access) String() string {
	if a.Type == "resource-group" {
		return a.Action() + " on resource group " + a.Group
	}
	s := a.Action() + " on " + a.Type
	if a.ID != "" {
		s += " " + a.ID
	}
	if a.Group != "" && a.Group != anyGroup {
		s += " in resource group " + a.Group
	}
	return s
}

// Allows reports whether a policy grants iamID the access.
func (p *Policies) Allows(iamID string, a Access) bool {
	if p == nil {
		return true
	}
	for _, ap := range p.Policies {
		if !ap.hasSubject(iamID) || !ap.grants(a) {
			continue
		}
		for _, res := range ap.Resources {
			if res.matches(a) {
				return true
			}
		}
	}
	return false
}

func (ap AccessPolicy) hasSubject(iamID string) bool {
	for _, s := range ap.Subjects {
		for _, a := range s.Attributes {
			if a.Name == "iam_id" && a.Value == iamID {
				return true
			}
		}
	}
	return false
}

func (ap AccessPolicy) grants(a Access) bool {
	verb := a.Verb
	if a.Type == "resource-group" {
		verb = "read"
	}
	for _, r := range ap.Roles {
		if slices.Contains(roleVerbs[strings.TrimPrefix(r.RoleID, RoleCRN(""))], verb) {
			return true
		}
	}
	return false
}

func (s attrSet) matches(a Access) bool {
	attrs := map[string]string{}
	for _, at := range s.Attributes {
		attrs[at.Name] = at.Value
	}
	if a.Type == "resource-group" {
		return attrs["resourceType"] == "resource-group" && (attrs["resource"] == a.Group || attrs["resource"] == "*" || a.Group == anyGroup)
	}
	if attrs["serviceName"] != "is" {
		return false
	}
	// A policy on the whole service names no resource type; one on a type
	// names it by its id attribute, "*" for every resource of the type.
	var typed string
	for _, attr := range typeAttrs {
		if _, ok := attrs[attr]; ok {
			if typed != "" {
				return false // two types in one resource: the fake does not guess
			}
			typed = attr
		}
	}
	if typed != "" {
		if typed != typeAttrs[a.Type] {
			return false
		}
		if v := attrs[typed]; v != "*" && v != a.ID {
			return false
		}
	}
	if g, ok := attrs["resourceGroupId"]; ok && a.Group != anyGroup && g != a.Group {
		return false
	}
	return true
}

// Without returns the policies minus one grant: the role roleName on the
// resource of policy i. A policy left without a role is dropped.
func (p *Policies) Without(g Grant) *Policies {
	out := &Policies{}
	for i, ap := range p.Policies {
		if i != g.Policy {
			out.Policies = append(out.Policies, ap)
			continue
		}
		var roles []policyRole
		for _, r := range ap.Roles {
			if r.RoleID != g.Role {
				roles = append(roles, r)
			}
		}
		if len(roles) > 0 {
			ap.Roles = roles
			out.Policies = append(out.Policies, ap)
		}
	}
	return out
}

// Grant is one role of one policy.
type Grant struct {
	Policy int
	Role   string
	// What names the resource: "is instanceId=* resourceGroupId=rg".
	What string
	// Type is the resource type the grant is on (instance, subnet, ...,
	// resource-group); "" for a policy on the whole service.
	Type string
}

// ActionPrefix is what every action the grant allows starts with:
// "is.subnet.subnet." or "resource-controller.group.".
func (g Grant) ActionPrefix() string {
	if g.Type == "resource-group" {
		return "resource-controller.group."
	}
	if g.Type == "" {
		return "is."
	}
	return "is." + g.Type + "." + g.Type + "."
}

func (g Grant) String() string {
	return strings.TrimPrefix(g.Role, RoleCRN("")) + " on " + g.What
}

// Grants lists every role of every policy.
func (p *Policies) Grants() []Grant {
	var out []Grant
	for i, ap := range p.Policies {
		var what []string
		typ := ""
		for _, res := range ap.Resources {
			var parts []string
			for _, a := range res.Attributes {
				if a.Name != "accountId" {
					parts = append(parts, a.Name+"="+a.Value)
				}
				if a.Name == "resourceType" && a.Value == "resource-group" {
					typ = "resource-group"
				}
				for t, attr := range typeAttrs {
					if a.Name == attr {
						typ = t
					}
				}
			}
			sort.Strings(parts)
			what = append(what, strings.Join(parts, " "))
		}
		for _, r := range ap.Roles {
			out = append(out, Grant{Policy: i, Role: r.RoleID, What: strings.Join(what, "; "), Type: typ})
		}
	}
	return out
}

// permit answers 403 unless the caller may do every access; it reports
// whether the handler may go on. The body is VPC's error shape, its
// message naming the first action missing.
func (s *Server) permit(w http.ResponseWriter, r *http.Request, accesses ...Access) bool {
	pol := s.policies()
	if pol == nil {
		return true
	}
	who := s.caller(r)
	for _, a := range accesses {
		if !pol.Allows(who, a) {
			writeProblem(w, http.StatusForbidden, "forbidden",
				fmt.Sprintf("You are not authorized to perform this action: %s is not granted to %s by any access policy.", a, who), nil)
			return false
		}
	}
	return true
}

// policies is the policy in force, nil to allow everything.
func (s *Server) policies() *Policies {
	if s.policyFn == nil {
		return nil
	}
	return s.policyFn()
}

// anyGroup as an Access's group matches a policy in any resource group:
// a listing needs the list action somewhere, and shows only what the
// caller may read.
const anyGroup = "\x00any"

func groupOrAny(g string, err error) string {
	if err != nil || g == "" {
		return anyGroup
	}
	return g
}

// instanceGroup is the resource group of an instance that was found.
func (s *Server) instanceGroup(in cloud.Instance, err error) string {
	if err != nil {
		return anyGroup
	}
	return groupOf(nicOf(in, s.resourcesByID()))
}

// visibleTo says which resources of a type the caller may read, for
// listings and search, which leave the rest out.
func (s *Server) visibleTo(r *http.Request, typ string) func(id, group string) bool {
	pol := s.policies()
	if pol == nil {
		return func(string, string) bool { return true }
	}
	who := s.caller(r)
	return func(id, group string) bool {
		return pol.Allows(who, Access{Type: typ, Verb: "read", ID: id, Group: group})
	}
}

// createAccess is what POST /instances needs of the caller: create the
// instance and the boot volume and network interface it comes with, in
// the resource group; attach to the subnet, security groups and VPC
// (operate); read the image; and view the resource group itself.
func (s *Server) createAccess(p *instancePrototype) []Access {
	group := DefaultResourceGroup
	if p.ResourceGroup != nil {
		group = p.ResourceGroup.ID
	}
	out := []Access{
		{Type: "instance", Verb: "create", Group: group},
		{Type: "resource-group", Verb: "read", Group: group},
		{Type: "volume", Verb: "create", Group: group},
	}
	var subnet *idRef
	var groups []idRef
	if a := p.PrimaryNetworkAttachment; a != nil {
		out = append(out, Access{Type: "virtual-network-interface", Verb: "create", Group: group})
		subnet, groups = a.VirtualNetworkInterface.Subnet, a.VirtualNetworkInterface.SecurityGroups
	} else {
		subnet, groups = p.PrimaryNetworkInterface.Subnet, p.PrimaryNetworkInterface.SecurityGroups
	}
	out = append(out, Access{Type: "subnet", Verb: "operate", ID: subnet.ID})
	for _, g := range groups {
		out = append(out, Access{Type: "security-group", Verb: "operate", ID: g.ID})
	}
	vpc := s.vpcID()
	if p.VPC != nil {
		vpc = p.VPC.ID
	}
	return append(out, Access{Type: "vpc", Verb: "operate", ID: vpc}, Access{Type: "image", Verb: "read", ID: p.Image.ID})
}

// deleteAccess is what DELETE /instances/{id} needs: delete the instance
// and what goes with it (its boot volume, an auto-deleted virtual network
// interface; caa's always is, and the fake asks for it whenever the
// instance has one).
func (s *Server) deleteAccess(in cloud.Instance, err error) []Access {
	group := s.instanceGroup(in, err)
	out := []Access{{Type: "instance", Verb: "delete", ID: in.ID, Group: group}}
	if err != nil {
		return out
	}
	byID := s.resourcesByID()
	out = append(out, Access{Type: "volume", Verb: "delete", ID: bootVolumeOf(in, byID).id, Group: group})
	if nic, ok := sideOf(in, byID, KindVNI); ok {
		out = append(out, Access{Type: "virtual-network-interface", Verb: "delete", ID: nic.ID, Group: group})
	}
	return out
}
