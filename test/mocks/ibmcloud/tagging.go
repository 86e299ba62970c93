package vpcfake

import (
	"errors"
	"net/http"
	"slices"
	"strconv"
	"strings"
)

// The Global Tagging part of the fake: POST /v3/tags/attach, the one call
// of IBM Cloud's Global Tagging API (its reference, "Attach tags", and
// globaltaggingv1 in IBM's platform-services Go SDK) that caa makes.
//
// VPC's POST /instances takes no tags for the instance (only its boot
// volume's user_tags), so an instance made through the API carries none
// until an attach names its CRN. What the fake checks, as the service
// does: tag_type user (the default; service and access tags are not
// caa's), resources given by CRN (a query or an IMS id is refused),
// every tag name at most 128 characters of [A-Za-z0-9 _.:-], and the
// caller's right to update the instance (IBM's tagging guide: attaching
// a user tag takes the Editor role on the resource). The answer is 200
// with one result per resource, is_error true for a resource that could
// not be tagged (here: an instance that does not exist). The tags are
// kept per instance, lower case, as IBM Cloud shows them, and the search
// index shows them on the instance's document after the search lag.

// OpTagAttach counts POST /v3/tags/attach calls.
const OpTagAttach = "tags.attach"

const tagAttachPath = "/v3/tags/attach"

// OpTagList counts GET /v3/tags calls.
const OpTagList = "tags.list"

const tagListPath = "/v3/tags"

// attachRequest is the body the SDK sends.
type attachRequest struct {
	TagName   *string  `json:"tag_name"`
	TagNames  []string `json:"tag_names"`
	Resources []struct {
		ResourceID   string  `json:"resource_id"`
		ResourceType *string `json:"resource_type"`
	} `json:"resources"`
	Query any `json:"query"`
}

// attachTags is POST /v3/tags/attach.
func (s *Server) attachTags(w http.ResponseWriter, r *http.Request) {
	for k, vs := range r.URL.Query() {
		switch {
		case k == "tag_type":
			if vs[0] != "user" {
				writeSearchProblem(w, http.StatusBadRequest, "bad_request", "The fake attaches only user tags (tag_type=user).")
				return
			}
		case k == "account_id" || k == "replace" || k == "update":
			if (k == "replace" || k == "update") && vs[0] != "false" {
				writeSearchProblem(w, http.StatusBadRequest, "bad_request", "The fake serves only "+k+"=false.")
				return
			}
		default:
			writeSearchProblem(w, http.StatusBadRequest, "bad_request", "The fake does not support the query parameter "+k+".")
			return
		}
	}
	var req attachRequest
	if !decodeSearchJSON(w, r, &req) {
		return
	}
	names := req.TagNames
	if req.TagName != nil {
		names = append(names, *req.TagName)
	}
	switch {
	case req.Query != nil:
		writeSearchProblem(w, http.StatusBadRequest, "bad_request", "The fake tags resources named by CRN only, not by query.")
		return
	case len(req.Resources) == 0:
		writeSearchProblem(w, http.StatusBadRequest, "bad_request", "resources is required.")
		return
	case len(names) == 0:
		writeSearchProblem(w, http.StatusBadRequest, "bad_request", "tag_names is required.")
		return
	}
	for _, n := range names {
		if len(n) > maxTagLen || !tagRE.MatchString(n) {
			writeSearchProblem(w, http.StatusBadRequest, "bad_request",
				"A tag name must be at most 128 characters of letters, digits, spaces and _ . : -.")
			return
		}
	}
	type result struct {
		ResourceID string `json:"resource_id"`
		IsError    bool   `json:"is_error"`
		Message    string `json:"message,omitempty"`
	}
	results := make([]result, 0, len(req.Resources))
	for _, res := range req.Resources {
		id, ok := instanceIDOfCRN(res.ResourceID)
		if !ok {
			results = append(results, result{ResourceID: res.ResourceID, IsError: true, Message: "The fake tags VPC instances only."})
			continue
		}
		in, err := s.liveInstance(id)
		if !s.permit(w, r, Access{Type: "instance", Verb: "update", ID: id, Group: s.instanceGroup(in, err)}) {
			return
		}
		if err != nil {
			results = append(results, result{ResourceID: res.ResourceID, IsError: true, Message: "The resource was not found."})
			continue
		}
		s.mu.Lock()
		tags := s.instanceTags[id]
		for _, n := range names {
			if n = strings.ToLower(n); !slices.Contains(tags, n) {
				tags = append(tags, n)
			}
		}
		slices.Sort(tags)
		s.instanceTags[id] = tags
		s.mu.Unlock()
		results = append(results, result{ResourceID: res.ResourceID})
	}
	writeJSON(w, http.StatusOK, map[string]any{"results": results})
}

// instanceIDOfCRN is the id at the end of a VPC instance CRN.
func instanceIDOfCRN(crn string) (string, bool) {
	parts := strings.Split(crn, ":")
	if len(parts) != 10 || parts[0] != "crn" || parts[4] != "is" || parts[8] != "instance" || parts[9] == "" {
		return "", false
	}
	return parts[9], true
}

// InstanceTags returns the user tags attached to an instance through
// Global Tagging, for tests; nil when none were.
func (s *Server) InstanceTags(id string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.instanceTags[id])
}

// shownInstanceTags are the tags the index shows on an instance: those
// attached through the API, or, for an instance seeded straight into the
// core (which no API call made), its core tags, as if caa had attached
// them.
func (s *Server) shownInstanceTags(id string, seeded bool, core map[string]string) []string {
	s.mu.Lock()
	tags, ok := s.instanceTags[id]
	s.mu.Unlock()
	if ok || !seeded {
		return tags
	}
	return formatUserTags(core)
}

// listTags is GET /v3/tags: the user tags attached in the account, by
// name, paged by offset and limit (at most 1,000, the API's largest) as
// the API's reference ("Get all tags") gives them.
func (s *Server) listTags(w http.ResponseWriter, r *http.Request) {
	offset, limit := 0, 100
	for k, vs := range r.URL.Query() {
		var err error
		switch k {
		case "tag_type":
			if vs[0] != "user" {
				writeSearchProblem(w, http.StatusBadRequest, "bad_request", "The fake lists only user tags (tag_type=user).")
				return
			}
		case "account_id", "attached_only", "order_by_name", "timeout", "full_data", "providers", "attached_to":
		case "offset":
			offset, err = strconv.Atoi(vs[0])
		case "limit":
			limit, err = strconv.Atoi(vs[0])
			if err == nil && (limit < 1 || limit > 1000) {
				err = errors.New("out of range")
			}
		default:
			writeSearchProblem(w, http.StatusBadRequest, "bad_request", "The fake does not support the query parameter "+k+".")
			return
		}
		if err != nil || offset < 0 {
			writeSearchProblem(w, http.StatusBadRequest, "bad_request", "The query parameter "+k+" is not valid.")
			return
		}
	}
	s.mu.Lock()
	var names []string
	for _, tags := range s.instanceTags {
		for _, t := range tags {
			if !slices.Contains(names, t) {
				names = append(names, t)
			}
		}
	}
	s.mu.Unlock()
	slices.Sort(names)
	items := []map[string]string{}
	for _, n := range names[min(offset, len(names)):min(offset+limit, len(names))] {
		items = append(items, map[string]string{"name": n})
	}
	writeJSON(w, http.StatusOK, map[string]any{"total_count": len(names), "offset": offset, "limit": limit, "items": items})
}
