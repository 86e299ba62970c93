package vpcfake

import (
	"errors"
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
}

// WithNetwork makes GET /v1/subnets/{id}, /v1/vpcs/{id} and
// /v1/security_groups/{id} find only these, and 404 anything else.
func WithNetwork(n Network) Option { return func(s *Server) { s.network = &n } }

// Operation names of the network and image reads.
const (
	OpSubnetGet        = "subnet.get"
	OpVPCGet           = "vpc.get"
	OpImageGet         = "image.get"
	OpSecurityGroupGet = "security_group.get"
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
