package vpcfake

import (
	"errors"
	"fmt"
	"net/http"
	"slices"

	"github.com/caa-project/caa/test/mocks/cloud"
)

// Network is the VPC, subnets and security groups the fake's reads know
// (WithNetwork). Without it, every id reads as found, in DefaultVPC.
type Network struct {
	VPC            string
	Subnets        []string
	SecurityGroups []string
	// GroupNames are the security groups' names by id, for the listing;
	// a group without one is named by its id.
	GroupNames map[string]string
	// DefaultGroup is the VPC's default security group, which VPC puts on
	// a network attachment that names none ("" : DefaultSecurityGroup).
	DefaultGroup string
	// WorkerGroup, when set, is the security group of the cluster's
	// workers (IBM Cloud's Kubernetes service names it kube-<cluster id>):
	// only an instance in it admits the workers' connections to the pod
	// VM (TCP 15150 to the forwarder, UDP 4789 for VXLAN); Reachable says
	// which instances the workers can reach.
	WorkerGroup string
}

// DefaultSecurityGroup is the id of the VPC's default security group when
// Network names none.
const DefaultSecurityGroup = "r006-default-sg"

// WithNetwork makes GET /v1/subnets/{id}, /v1/vpcs/{id} and
// /v1/security_groups/{id} find only these, and 404 anything else.
func WithNetwork(n Network) Option { return func(s *Server) { s.network = &n } }

// Operation names of the network and image reads.
const (
	OpSubnetGet         = "subnet.get"
	OpVPCGet            = "vpc.get"
	OpImageGet          = "image.get"
	OpSecurityGroupGet  = "security_group.get"
	OpSecurityGroupList = "security_group.list"
)

func (s *Server) vpcID() string {
	if s.network != nil && s.network.VPC != "" {
		return s.network.VPC
	}
	return DefaultVPC
}

func (s *Server) networkRef(r *http.Request, kind, path, id string) ref {
	return ref{CRN: crnPrefix + "us-south" + account + kind + ":" + id, Href: baseURL(r) + "/v1/" + path + "/" + id,
		ID: id, Name: id, ResourceType: kind}
}

// getSubnet is GET /v1/subnets/{id}.
func (s *Server) getSubnet(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if !s.permit(w, r, Access{Type: "subnet", Verb: "read", ID: id}) {
		return
	}
	if s.network != nil && !slices.Contains(s.network.Subnets, id) {
		writeProblem(w, http.StatusNotFound, "not_found", "Subnet not found", nil)
		return
	}
	v := s.networkRef(r, "subnet", "subnets", id)
	writeJSON(w, http.StatusOK, map[string]any{"id": v.ID, "crn": v.CRN, "href": v.Href, "name": v.Name,
		"resource_type": "subnet", "status": "available", "ipv4_cidr_block": "10.240.0.0/24",
		"vpc": s.networkRef(r, "vpc", "vpcs", s.vpcID())})
}

// getVPC is GET /v1/vpcs/{id}.
func (s *Server) getVPC(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if !s.permit(w, r, Access{Type: "vpc", Verb: "read", ID: id}) {
		return
	}
	if id != s.vpcID() && s.network != nil {
		writeProblem(w, http.StatusNotFound, "not_found", "VPC not found", nil)
		return
	}
	v := s.networkRef(r, "vpc", "vpcs", id)
	writeJSON(w, http.StatusOK, map[string]any{"id": v.ID, "crn": v.CRN, "href": v.Href, "name": v.Name,
		"resource_type": "vpc", "status": "available"})
}

// getSecurityGroup is GET /v1/security_groups/{id}.
func (s *Server) getSecurityGroup(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if !s.permit(w, r, Access{Type: "security-group", Verb: "read", ID: id}) {
		return
	}
	if s.network != nil && !slices.Contains(s.network.SecurityGroups, id) {
		writeProblem(w, http.StatusNotFound, "not_found", "Security group not found", nil)
		return
	}
	v := s.networkRef(r, "security_group", "security_groups", id)
	writeJSON(w, http.StatusOK, map[string]any{"id": v.ID, "crn": v.CRN, "href": v.Href, "name": v.Name,
		"resource_type": "security_group", "vpc": s.networkRef(r, "vpc", "vpcs", s.vpcID())})
}

// listSecurityGroups is GET /v1/security_groups, filter vpc.id: the
// Network's groups, by id, in pages.
func (s *Server) listSecurityGroups(w http.ResponseWriter, r *http.Request) {
	q, ok := pageQuery(w, r, "vpc.id")
	if !ok || !s.permit(w, r, Access{Type: "security-group", Verb: "list", Group: anyGroup}) {
		return
	}
	var ids []string
	if s.network != nil && (q.filters["vpc.id"] == "" || q.filters["vpc.id"] == s.vpcID()) {
		ids = slices.Sorted(slices.Values(s.network.SecurityGroups))
	}
	from := 0
	if q.start != "" {
		i := slices.Index(ids, q.start)
		if i < 0 {
			writeProblem(w, http.StatusBadRequest, "invalid_id_format", "Bad ID format: the start token is not one this API issued.", queryTarget("start", ""))
			return
		}
		from = i
	}
	to := min(from+q.limit, len(ids))
	next := ""
	if to < len(ids) {
		next = ids[to]
	}
	groups := []map[string]any{}
	for _, id := range ids[from:to] {
		v := s.networkRef(r, "security_group", "security_groups", id)
		groups = append(groups, map[string]any{"id": v.ID, "crn": v.CRN, "href": v.Href, "name": s.groupName(id),
			"resource_type": "security_group", "rules": []any{}, "targets": []any{},
			"vpc": s.networkRef(r, "vpc", "vpcs", s.vpcID())})
	}
	first, nextLink := q.links(baseURL(r)+"/v1/security_groups", next)
	out := map[string]any{"security_groups": groups, "limit": q.limit, "total_count": len(ids), "first": first}
	if nextLink != nil {
		out["next"] = nextLink
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) groupName(id string) string {
	if s.network != nil && s.network.GroupNames[id] != "" {
		return s.network.GroupNames[id]
	}
	return id
}

// Reachable reports whether the cluster's workers can reach instance id
// (TCP 15150, UDP 4789), and why not: with Network.WorkerGroup set, only
// an instance whose primary network attachment is in that group is
// reachable; one that named no group is in the VPC's default group only,
// as VPC does. Without a WorkerGroup every instance is reachable.
func (s *Server) Reachable(id string) (bool, string) {
	req, ok := s.CreateRequest(id)
	if !ok {
		if s.network == nil || s.network.WorkerGroup == "" {
			return true, ""
		}
		return false, fmt.Sprintf("instance %s was not made through the API", id)
	}
	why := s.unreachable(id, req.SecurityGroups)
	return why == "", why
}

// unreachable says why the workers cannot reach an instance in groups (none
// named: the VPC's default group), or "" when they can: always, with no
// workers' group set.
func (s *Server) unreachable(name string, groups []string) string {
	if s.network == nil || s.network.WorkerGroup == "" {
		return ""
	}
	if len(groups) == 0 {
		def := s.network.DefaultGroup
		if def == "" {
			def = DefaultSecurityGroup
		}
		groups = []string{def}
	}
	if slices.Contains(groups, s.network.WorkerGroup) {
		return ""
	}
	return fmt.Sprintf("instance %s is in security groups %v, not the workers' %s (%s): the workers' TCP 15150 and UDP 4789 do not reach it",
		name, groups, s.network.WorkerGroup, s.groupName(s.network.WorkerGroup))
}

// getImage is GET /v1/images/{id}: the images the core offers.
func (s *Server) getImage(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if !s.permit(w, r, Access{Type: "image", Verb: "read", ID: id}) {
		return
	}
	if err := s.cloud.CheckSpec(id, ""); errors.Is(err, cloud.ErrBadImage) {
		writeProblem(w, http.StatusNotFound, "not_found", "Image not found", nil)
		return
	}
	v := s.networkRef(r, "image", "images", id)
	writeJSON(w, http.StatusOK, map[string]any{"id": v.ID, "crn": v.CRN, "href": v.Href, "name": v.Name,
		"resource_type": "image", "status": "available", "visibility": "private"})
}
