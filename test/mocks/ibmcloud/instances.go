package vpcfake

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/test/mocks/cloud"
)

// Limits the VPC API enforces on what the fake parses.
const (
	maxBody         = 1 << 20
	maxUserData     = 64 << 10
	maxNameLen      = 63
	maxTagLen       = 128
	defaultLimit    = 50
	maxLimit        = 100
	defaultCapacity = 100
)

var (
	// nameRE is the VPC rule for resource names.
	nameRE = regexp.MustCompile(`^-?([a-z]|[a-z][-a-z0-9]*[a-z0-9]|[0-9][-a-z0-9]*([a-z]|[-a-z][-a-z0-9]*[a-z0-9]))$`)
	// tagRE is the IBM Cloud rule for user tags.
	tagRE = regexp.MustCompile(`^[A-Za-z0-9 _.:-]+$`)
)

// fieldError is a request the API refuses, with the field to blame.
type fieldError struct {
	code, field, msg string
}

func (e *fieldError) Error() string { return e.field + ": " + e.msg }

func required(field string) *fieldError {
	return &fieldError{"validation_required_field", field, "Missing a required field: " + field + "."}
}

func badField(field, msg string) *fieldError { return &fieldError{"bad_field", field, msg} }

// createInstance is POST /v1/instances with an instance-by-image prototype.
func (s *Server) createInstance(w http.ResponseWriter, r *http.Request) {
	var p instancePrototype
	if !decodeJSON(w, r, &p) {
		return
	}
	if err := validatePrototype(&p); err != nil {
		var fe *fieldError
		errors.As(err, &fe)
		writeProblem(w, http.StatusBadRequest, fe.code, fe.msg, fieldTarget(fe.field))
		return
	}
	tee, fe := checkConfidential(&p)
	if fe != nil {
		writeProblem(w, http.StatusBadRequest, fe.code, fe.msg, fieldTarget(fe.field))
		return
	}
	if !s.permit(w, r, s.createAccess(&p)...) {
		return
	}
	if pr := s.unknownNetwork(&p); pr != nil {
		writeProblem(w, http.StatusNotFound, pr.Code, pr.Message, pr.Target)
		return
	}

	nic, vol, deleteWith := s.sideResources(&p)
	userData := []byte(nil)
	if p.UserData != nil {
		userData = []byte(*p.UserData)
	}
	in, err := s.cloud.Create(cloud.CreateRequest{
		Name:         p.Name,
		UniqueName:   true,
		InstanceType: p.Profile.Name,
		Image:        p.Image.ID,
		TEE:          tee,
		UserData:     userData,
		Resources:    []string{nic.ID, vol.ID},
		DeleteWith:   deleteWith,
		// Outside the workers' security group the pod VM never answers:
		// the fleet boots nothing for it.
		Unreachable: s.unreachable(p.Name, requestedGroups(&p)),
	})
	if err != nil {
		// A refused create leaves nothing behind.
		_ = s.cloud.DeleteResource(nic.ID)
		_ = s.cloud.DeleteResource(vol.ID)
		writeCoreError(w, err, "Instance")
		return
	}
	s.remember(in.ID, volumeFromResource(vol), p.Zone.Name)
	s.record(in.ID, &p)
	byID := map[string]cloud.Resource{nic.ID: nic, vol.ID: vol}
	writeJSON(w, http.StatusCreated, instanceViewOf(baseURL(r), in, byID))
}

// decodeJSON reads one JSON object strictly: known fields only, nothing
// after it. It answers the VPC error itself and reports success.
func decodeJSON(w http.ResponseWriter, r *http.Request, v any) bool {
	if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt != "application/json" {
		writeProblem(w, http.StatusUnsupportedMediaType, "unsupported_media_type", "The request body must be application/json.", nil)
		return false
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody))
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil && dec.Decode(&struct{}{}) != io.EOF {
		err = errors.New("data after the JSON object")
	}
	if err == nil {
		return true
	}
	if f, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		writeProblem(w, http.StatusBadRequest, "invalid_request_field", "A field provided in the request is not valid.", fieldTarget(strings.Trim(f, `"`)))
		return false
	}
	// The decoder's message may quote the body; the answer does not.
	writeProblem(w, http.StatusBadRequest, "bad_request", "The request body is not valid JSON of the expected shape.", nil)
	return false
}

func validatePrototype(p *instancePrototype) error {
	switch {
	case p.Image == nil || p.Image.ID == "":
		return required("image.id")
	case p.Zone == nil || p.Zone.Name == "":
		return required("zone.name")
	case p.Profile == nil || p.Profile.Name == "":
		return required("profile.name")
	case p.Name != "" && (len(p.Name) > maxNameLen || !nameRE.MatchString(p.Name)):
		return badField("name", "The name must be at most 63 lowercase letters, digits and hyphens, starting with a letter.")
	case p.VPC != nil && p.VPC.ID == "":
		return required("vpc.id")
	case p.ResourceGroup != nil && p.ResourceGroup.ID == "":
		return required("resource_group.id")
	case p.UserData != nil && len(*p.UserData) > maxUserData:
		return badField("user_data", fmt.Sprintf("The user data must be at most %d bytes.", maxUserData))
	}
	for i, k := range p.Keys {
		if k.ID == "" {
			return required(fmt.Sprintf("keys[%d].id", i))
		}
	}
	if err := validateNetwork(p); err != nil {
		return err
	}
	return validateBootVolume(p.BootVolumeAttachment)
}

func validateNetwork(p *instancePrototype) error {
	var subnet *idRef
	var groups []idRef
	switch a, n := p.PrimaryNetworkAttachment, p.PrimaryNetworkInterface; {
	case a == nil && n == nil:
		return required("primary_network_attachment")
	case a != nil && n != nil:
		return badField("primary_network_interface", "Specify primary_network_attachment or primary_network_interface, not both.")
	case a != nil:
		if a.VirtualNetworkInterface == nil {
			return required("primary_network_attachment.virtual_network_interface")
		}
		subnet, groups = a.VirtualNetworkInterface.Subnet, a.VirtualNetworkInterface.SecurityGroups
	default:
		subnet, groups = n.Subnet, n.SecurityGroups
	}
	if subnet == nil || subnet.ID == "" {
		return required("subnet.id")
	}
	for i, g := range groups {
		if g.ID == "" {
			return required(fmt.Sprintf("security_groups[%d].id", i))
		}
	}
	return nil
}

// unknownNetwork refuses, with WithNetwork, a create whose subnet or
// security group the fake does not know: 404 not_found whose target names
// the prototype's field. The VPC API's error model puts the offending
// field in errors[].target (the API reference's "Errors" section); the
// exact code VPC uses for a missing subnet on create is this fake's
// assumption (not_found, as for the subnet's own read).
func (s *Server) unknownNetwork(p *instancePrototype) *problemItem {
	if s.network == nil {
		return nil
	}
	prefix := "primary_network_interface"
	subnet, groups := (*idRef)(nil), []idRef(nil)
	switch a, n := p.PrimaryNetworkAttachment, p.PrimaryNetworkInterface; {
	case a != nil && a.VirtualNetworkInterface != nil:
		prefix = "primary_network_attachment.virtual_network_interface"
		subnet, groups = a.VirtualNetworkInterface.Subnet, a.VirtualNetworkInterface.SecurityGroups
	case n != nil:
		subnet, groups = n.Subnet, n.SecurityGroups
	}
	if subnet != nil && !slices.Contains(s.network.Subnets, subnet.ID) {
		return &problemItem{Code: "not_found", Message: "Subnet not found", Target: &problemTarget{Name: prefix + ".subnet.id", Type: "field"}}
	}
	for i, g := range groups {
		if s.network.SecurityGroups != nil && !slices.Contains(s.network.SecurityGroups, g.ID) {
			return &problemItem{Code: "not_found", Message: "Security group not found",
				Target: &problemTarget{Name: fmt.Sprintf("%s.security_groups[%d].id", prefix, i), Type: "field"}}
		}
	}
	return nil
}

func validateBootVolume(b *bootVolumeAttachmentProto) error {
	if b == nil {
		return nil
	}
	v := b.Volume
	switch {
	case v == nil:
		return required("boot_volume_attachment.volume")
	case v.Profile == nil || v.Profile.Name == "":
		return required("boot_volume_attachment.volume.profile")
	case v.Capacity != nil && (*v.Capacity < 10 || *v.Capacity > 250):
		return badField("boot_volume_attachment.volume.capacity", "The boot volume capacity must be from 10 to 250 gigabytes.")
	case v.Name != "" && (len(v.Name) > maxNameLen || !nameRE.MatchString(v.Name)):
		return badField("boot_volume_attachment.volume.name", "The name must be at most 63 lowercase letters, digits and hyphens, starting with a letter.")
	}
	for _, t := range v.UserTags {
		if len(t) > maxTagLen || !tagRE.MatchString(t) {
			return badField("boot_volume_attachment.volume.user_tags",
				"A user tag must be 1 to 128 characters: letters, digits, spaces, underscores, hyphens, periods and colons.")
		}
	}
	return nil
}

// sideResources creates the network attachment (or interface) and the boot
// volume the prototype asks for, and says which die with the instance.
func (s *Server) sideResources(p *instancePrototype) (nic, vol cloud.Resource, deleteWith []string) {
	common := map[string]string{"zone": p.Zone.Name}
	if p.VPC != nil {
		common["vpc"] = p.VPC.ID
	}
	if p.ResourceGroup != nil {
		common["resource_group"] = p.ResourceGroup.ID
	}
	props := func(extra map[string]string) map[string]string {
		out := map[string]string{}
		for k, v := range common {
			out[k] = v
		}
		for k, v := range extra {
			out[k] = v
		}
		return out
	}

	if a := p.PrimaryNetworkAttachment; a != nil {
		v := a.VirtualNetworkInterface
		nic = cloud.Resource{ID: s.newID("vni"), Kind: KindVNI, Name: v.Name, Props: props(map[string]string{
			"subnet": v.Subnet.ID, "security_groups": joinIDs(v.SecurityGroups),
			"attachment_id": s.newID("att"), "attachment_name": a.Name,
		})}
		if v.AutoDelete == nil || *v.AutoDelete {
			deleteWith = append(deleteWith, nic.ID)
		}
	} else {
		n := p.PrimaryNetworkInterface
		nic = cloud.Resource{ID: s.newID("nic"), Kind: KindNetworkInterface, Name: n.Name, Props: props(map[string]string{
			"subnet": n.Subnet.ID, "security_groups": joinIDs(n.SecurityGroups),
		})}
		deleteWith = append(deleteWith, nic.ID)
	}

	vol = cloud.Resource{ID: s.newID("vol"), Kind: KindVolume, Props: props(map[string]string{
		"profile": "general-purpose", "capacity": strconv.Itoa(defaultCapacity),
		"attachment_id": s.newID("vatt"), "delete_volume_on_instance_delete": "true",
	})}
	if b := p.BootVolumeAttachment; b != nil {
		vol.Name = b.Volume.Name
		vol.Tags = parseUserTags(b.Volume.UserTags)
		vol.Props["profile"] = b.Volume.Profile.Name
		vol.Props["attachment_name"] = b.Name
		if b.Volume.Capacity != nil {
			vol.Props["capacity"] = strconv.FormatInt(*b.Volume.Capacity, 10)
		}
		if b.DeleteVolumeOnInstanceDelete != nil && !*b.DeleteVolumeOnInstanceDelete {
			vol.Props["delete_volume_on_instance_delete"] = "false"
		}
	}
	if vol.Props["delete_volume_on_instance_delete"] == "true" {
		deleteWith = append(deleteWith, vol.ID)
	}
	return s.cloud.PutResource(nic), s.cloud.PutResource(vol), deleteWith
}

func joinIDs(refs []idRef) string {
	ids := make([]string, len(refs))
	for i, r := range refs {
		ids[i] = r.ID
	}
	return strings.Join(ids, ",")
}

// getInstance is GET /v1/instances/{id}.
func (s *Server) getInstance(w http.ResponseWriter, r *http.Request) {
	in, err := s.liveInstance(r.PathValue("id"))
	if !s.permit(w, r, Access{Type: "instance", Verb: "read", ID: r.PathValue("id"), Group: s.instanceGroup(in, err)}) {
		return
	}
	if err != nil {
		writeCoreError(w, err, "Instance")
		return
	}
	writeJSON(w, http.StatusOK, instanceViewOf(baseURL(r), in, s.resourcesByID()))
}

// deleteInstance is DELETE /v1/instances/{id}: 204, or 404 once it is gone.
func (s *Server) deleteInstance(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	in, err := s.liveInstance(id)
	if !s.permit(w, r, s.deleteAccess(in, err)...) {
		return
	}
	if err == nil {
		err = s.cloud.Delete(id)
	}
	if err != nil {
		writeCoreError(w, err, "Instance")
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// listInstances is GET /v1/instances with the filters the fake supports.
func (s *Server) listInstances(w http.ResponseWriter, r *http.Request) {
	q, ok := pageQuery(w, r, "name", "vpc.id", "resource_group.id")
	if !ok {
		return
	}
	name, vpc, rg := q.filters["name"], q.filters["vpc.id"], q.filters["resource_group.id"]
	listGroup := rg
	if listGroup == "" {
		listGroup = anyGroup
	}
	if !s.permit(w, r, Access{Type: "instance", Verb: "list", Group: listGroup}) {
		return
	}
	byID := s.resourcesByID()
	visible := s.visibleTo(r, "instance")
	match := func(in cloud.Instance) bool {
		if in.State == provider.StateTerminated || (name != "" && in.Name != name) {
			return false
		}
		nic := nicOf(in, byID)
		return (vpc == "" || vpcOf(nic) == vpc) && (rg == "" || groupOf(nic) == rg) && visible(in.ID, groupOf(nic))
	}
	page, next, total, ok := s.page(w, match, q)
	if !ok {
		return
	}
	base := baseURL(r)
	out := instanceCollection{Instances: []instanceView{}, Limit: q.limit, TotalCount: total}
	out.First, out.Next = q.links(base+"/v1/instances", next)
	for _, in := range page {
		out.Instances = append(out.Instances, instanceViewOf(base, in, byID))
	}
	writeJSON(w, http.StatusOK, out)
}

// listQuery is a parsed collection request.
type listQuery struct {
	limit   int
	start   string
	filters map[string]string
}

// pageQuery parses limit, start and the allowed filters, refusing any
// other query parameter so that a filter the fake lacks never silently
// widens a listing.
func pageQuery(w http.ResponseWriter, r *http.Request, filters ...string) (listQuery, bool) {
	q := listQuery{limit: defaultLimit, filters: map[string]string{}}
	for k, vs := range r.URL.Query() {
		v := vs[0]
		switch {
		case k == "version" || k == "generation":
		case k == "start":
			q.start = v
		case k == "limit":
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > maxLimit {
				writeProblem(w, http.StatusBadRequest, "bad_field", fmt.Sprintf("The limit must be a whole number from 1 to %d.", maxLimit), queryTarget("limit", v))
				return q, false
			}
			q.limit = n
		default:
			known := false
			for _, f := range filters {
				known = known || f == k
			}
			if !known {
				writeProblem(w, http.StatusBadRequest, "invalid_query_parameter", "The fake does not support this query parameter.", queryTarget(k, ""))
				return q, false
			}
			q.filters[k] = v
		}
	}
	return q, true
}

// links are the first and next page links, carrying the filters and limit.
func (q listQuery) links(path, next string) (link, *link) {
	base := path + "?limit=" + strconv.Itoa(q.limit)
	for k, v := range q.filters {
		base += "&" + k + "=" + url.QueryEscape(v)
	}
	first := link{Href: base}
	if next == "" {
		return first, nil
	}
	return first, &link{Href: base + "&start=" + url.QueryEscape(next)}
}

// page returns one page of the matching instances, the next token, and how
// many match in all.
func (s *Server) page(w http.ResponseWriter, match func(cloud.Instance) bool, q listQuery) ([]cloud.Instance, string, int, bool) {
	page, next, err := s.cloud.List(match, q.start, q.limit)
	if err != nil {
		writeProblem(w, http.StatusBadRequest, "invalid_id_format", "Bad ID format: the start token is not one this API issued.", queryTarget("start", ""))
		return nil, "", 0, false
	}
	return page, next, s.cloud.Count(match), true
}

// resourcesByID is a snapshot of the core's side resources, taken outside
// the core's lock so list filters can use it.
//
// Side resources change only with the core's generation, so the map is read
// again only when that moved: a read of one instance or volume used to copy
// every resource of the account. The map is shared: callers only read it.
func (s *Server) resourcesByID() map[string]cloud.Resource {
	gen, _ := s.cloud.Version()
	stamp := cloud.Stamp{gen, 0}
	if byID, ok := s.resources.Get("", stamp); ok {
		return byID
	}
	byID := s.cloud.ResourceIndex()
	s.resources.Put("", stamp, byID)
	return byID
}

// Requested is what the create of an instance asked for on the wire, as
// the fake received it: the fields a profile's defaults fill when left out
// (nil or empty here when the request left them out), and the primary
// network attachment's security groups.
type Requested struct {
	// ConfidentialComputeMode is "" when the request left it out.
	ConfidentialComputeMode string
	// EnableSecureBoot is nil when the request left it out.
	EnableSecureBoot *bool
	SecurityGroups   []string
}

func (s *Server) record(instanceID string, p *instancePrototype) {
	r := Requested{ConfidentialComputeMode: p.ConfidentialComputeMode, EnableSecureBoot: p.EnableSecureBoot, SecurityGroups: requestedGroups(p)}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.requested[instanceID] = r
}

// requestedGroups are the security groups a prototype's primary network
// attachment (or interface) names; nil when it names none.
func requestedGroups(p *instancePrototype) []string {
	var groups []string
	switch a, n := p.PrimaryNetworkAttachment, p.PrimaryNetworkInterface; {
	case a != nil && a.VirtualNetworkInterface != nil:
		groups = strings.Split(joinIDs(a.VirtualNetworkInterface.SecurityGroups), ",")
	case n != nil:
		groups = strings.Split(joinIDs(n.SecurityGroups), ",")
	}
	if len(groups) == 1 && groups[0] == "" {
		return nil
	}
	return groups
}

// CreateRequest is what the create of instance id asked for; false for an
// instance the fake's API did not make.
func (s *Server) CreateRequest(id string) (Requested, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.requested[id]
	return r, ok
}
