package ec2fake

import (
	"encoding/base64"
	"encoding/xml"
	"errors"
	"fmt"
	"hash/fnv"
	"net/http"
	"slices"
	"strings"

	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/test/mocks/cloud"
)

var describeParams = []string{"Filter.#.Name", "Filter.#.Value.#", "InstanceId.#", "MaxResults", "NextToken", "DryRun"}

// filter is one Filter.N: the instance matches when the named field matches
// one of the values. A tag: filter's value may use EC2's wildcards (* any
// run of characters, ? one character, a backslash escapes either), as the
// EC2 API reference's DescribeInstances "Filter" describes; other fields
// match exactly.
type filter struct {
	name   string
	values []string
}

func parseFilters(q query) ([]filter, *apiError) {
	var out []filter
	for _, n := range q.indexes("Filter") {
		f := filter{name: q.get("Filter." + n + ".Name"), values: q.list("Filter." + n + ".Value")}
		switch {
		case f.name == "":
			return nil, missing("Filter." + n + ".Name")
		case !knownFilter(f.name):
			return nil, invalidValue("The filter '%s' is invalid", f.name)
		case len(f.values) == 0:
			return nil, invalidValue("The filter '%s' has no values.", f.name)
		}
		out = append(out, f)
	}
	return out, nil
}

func knownFilter(name string) bool {
	switch name {
	case "instance-id", "instance-state-name", "client-token", "tag-key", "instance-type", "image-id", "availability-zone":
		return true
	}
	key, ok := strings.CutPrefix(name, "tag:")
	return ok && key != ""
}

func (f filter) matches(in cloud.Instance) bool {
	if f.name == "tag-key" {
		return slices.ContainsFunc(f.values, func(k string) bool { _, ok := in.Tags[k]; return ok })
	}
	if key, ok := strings.CutPrefix(f.name, "tag:"); ok {
		v, has := in.Tags[key]
		return has && slices.ContainsFunc(f.values, func(pattern string) bool { return wildcardMatch(pattern, v) })
	}
	var field string
	switch f.name {
	case "instance-id":
		field = in.ID
	case "instance-state-name":
		field = ec2State(in.State).Name
	case "client-token":
		field = in.Token
	case "instance-type":
		field = in.InstanceType
	case "image-id":
		field = in.Image
	case "availability-zone":
		field = in.Zone
	}
	return slices.Contains(f.values, field)
}

// tagTerms are the tag: filters, for the core's tag index to narrow a
// listing by (it compares without case; the filters decide exactly).
func tagTerms(fs []filter) []cloud.TagTerm {
	var out []cloud.TagTerm
	for _, f := range fs {
		// A wildcard value is no exact term: the filter alone decides it.
		if key, ok := strings.CutPrefix(f.name, "tag:"); ok && !slices.ContainsFunc(f.values, hasWildcard) {
			out = append(out, cloud.TagTerm{Key: key, Values: f.values})
		}
	}
	return out
}

// filterKey identifies a filter set, so that a NextToken is honoured only
// with the filters that produced it.
func filterKey(fs []filter) string {
	h := fnv.New64a()
	for _, f := range fs {
		fmt.Fprintf(h, "%q=%q;", f.name, f.values)
	}
	return fmt.Sprintf("%016x", h.Sum64())
}

func encodeToken(core, key string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(core + "|" + key))
}

func decodeToken(token, key string) (string, *apiError) {
	if token == "" {
		return "", nil
	}
	bad := &apiError{http.StatusBadRequest, "InvalidPaginationToken", "The specified pagination token is not valid or is expired."}
	raw, err := base64.RawURLEncoding.DecodeString(token)
	if err != nil {
		return "", bad
	}
	core, k, ok := strings.Cut(string(raw), "|")
	if !ok || k != key || core == "" {
		return "", bad
	}
	return core, nil
}

// describeInstances lists instances: those named by InstanceId.N (every one
// must exist, as EC2 insists), or a page of all of them, each filtered.
// DescribeInstances has no resource-level permissions: it is authorized
// on "*" alone.
func (s *server) describeInstances(q query, c caller) (any, *apiError) {
	if e := q.check(describeParams...); e != nil {
		return nil, e
	}
	dry, e := dryRun(q)
	if e != nil {
		return nil, e
	}
	if e := s.authorize(c, []check{{"ec2:DescribeInstances", "*", map[string][]string{"aws:RequestedRegion": {c.region}}}}); e != nil {
		return nil, e
	}
	if dry {
		return nil, dryRunOK
	}
	filters, e := parseFilters(q)
	if e != nil {
		return nil, e
	}
	ids, e := q.instanceIDs()
	if e != nil {
		return nil, e
	}
	maxResults, hasMax, e := q.intParam("MaxResults", 5, 1000)
	if e != nil {
		return nil, e
	}
	match := func(in cloud.Instance) bool {
		for _, f := range filters {
			if !f.matches(in) {
				return false
			}
		}
		return true
	}
	resp := describeInstancesResponse{RequestID: s.requestID()}
	if len(ids) > 0 {
		if hasMax || q.has("NextToken") {
			return nil, &apiError{http.StatusBadRequest, "InvalidParameterCombination", "The parameter instancesSet cannot be used with the parameter maxResults or nextToken"}
		}
		found, e := s.getAll(ids)
		if e != nil {
			return nil, e
		}
		resp.Reservations = s.reservations(slices.DeleteFunc(found, func(in cloud.Instance) bool { return !match(in) }))
		return resp, nil
	}
	key := filterKey(filters)
	start, e := decodeToken(q.get("NextToken"), key)
	if e != nil {
		return nil, e
	}
	// While nothing changed (the core, the fake's launches) and no change
	// was due on the clock, the same page of the same listing is the one
	// encoded last time.
	memoKey := fmt.Sprintf("%q\x00%s\x00%d", filters, start, maxResults)
	stamp, cacheable := s.answerStamp()
	if cacheable {
		if a, ok := s.answers.Get(memoKey, stamp); ok {
			resp.Reservations.Encoded, resp.NextToken = a.encoded, a.next
			return resp, nil
		}
	}
	page, next, err := s.cloud.ListTagged(tagTerms(filters), match, start, maxResults)
	if err != nil {
		return nil, &apiError{http.StatusBadRequest, "InvalidPaginationToken", "The specified pagination token is not valid or is expired."}
	}
	resp.Reservations = s.reservations(page)
	if next != "" {
		resp.NextToken = encodeToken(next, key)
	}
	if cacheable {
		if enc, err := encodeItems(resp.Reservations.Items); err == nil {
			resp.Reservations = reservationSet{Encoded: enc}
			s.answers.Put(memoKey, stamp, memoAnswer{encoded: enc, next: resp.NextToken})
		}
	}
	return resp, nil
}

// encodeItems is the XML of reservations' items as reservationSet holds
// them.
func encodeItems(items []reservationXML) (string, error) {
	var b strings.Builder
	enc := xml.NewEncoder(&b)
	for _, it := range items {
		if err := enc.EncodeElement(it, xml.StartElement{Name: xml.Name{Local: "item"}}); err != nil {
			return "", err
		}
	}
	if err := enc.Flush(); err != nil {
		return "", err
	}
	return b.String(), nil
}

// answerStamp is what a listing's answer depends on beyond its request:
// the core's generation and the fake's own; cacheable is false while a
// change is due on the clock alone (a boot, an invisible instance, a
// terminated one still shown).
func (s *server) answerStamp() (stamp cloud.Stamp, cacheable bool) {
	fe := s.gen.Load()
	core, quiet := s.cloud.Version()
	return cloud.Stamp{core, fe}, quiet
}

// memoAnswer is a listing's encoded page and its next token.
type memoAnswer struct{ encoded, next string }

// getAll returns the named instances, or InvalidInstanceID.NotFound naming
// every one that is missing.
func (s *server) getAll(ids []string) ([]cloud.Instance, *apiError) {
	var found []cloud.Instance
	var missingIDs []string
	for _, id := range slices.Compact(slices.Sorted(slices.Values(ids))) {
		in, err := s.cloud.Get(id)
		switch {
		case errors.Is(err, cloud.ErrNotFound):
			missingIDs = append(missingIDs, id)
		case err != nil:
			return nil, coreError(err, id)
		default:
			found = append(found, in)
		}
	}
	switch len(missingIDs) {
	case 0:
		return found, nil
	case 1:
		return nil, coreError(cloud.ErrNotFound, missingIDs[0])
	}
	return nil, &apiError{http.StatusBadRequest, "InvalidInstanceID.NotFound",
		fmt.Sprintf("The instance IDs '%s' do not exist", strings.Join(missingIDs, ", "))}
}

// reservations puts each instance in its own reservation, as one
// RunInstances per instance makes them.
func (s *server) reservations(ins []cloud.Instance) reservationSet {
	var out reservationSet
	for _, in := range ins {
		x := renderInstance(in, s.launchOf(in.ID))
		out.Items = append(out.Items, reservationXML{
			ReservationID: reservationID(in.ID), OwnerID: ownerID, Groups: x.Groups, Instances: []instanceXML{x},
		})
	}
	return out
}

var terminateParams = []string{"InstanceId.#", "DryRun"}

// terminateInstances terminates every named instance, or none when one of
// them does not exist. Terminating a terminated instance is not an error.
// Each instance is authorized with its own tags as aws:ResourceTag/...,
// once EC2 has found it (an id it does not know is NotFound, DryRun or
// not, since an unknown instance has no tags to decide on).
func (s *server) terminateInstances(q query, c caller) (any, *apiError) {
	if e := q.check(terminateParams...); e != nil {
		return nil, e
	}
	dry, e := dryRun(q)
	if e != nil {
		return nil, e
	}
	ids, e := q.instanceIDs()
	if e != nil {
		return nil, e
	}
	if len(ids) == 0 {
		return nil, missing("InstanceId")
	}
	before, e := s.getAll(ids)
	if e != nil {
		return nil, e
	}
	var checks []check
	for _, in := range before {
		ctx := tagContext(in.Tags, false)
		ctx["aws:RequestedRegion"] = []string{c.region}
		checks = append(checks, check{"ec2:TerminateInstances", c.arn("instance/" + in.ID), ctx})
	}
	if e := s.authorize(c, checks); e != nil {
		return nil, e
	}
	if dry {
		return nil, dryRunOK
	}
	resp := terminateInstancesResponse{RequestID: s.requestID()}
	for _, in := range before {
		if err := s.cloud.Delete(in.ID); err != nil {
			return nil, coreError(err, in.ID)
		}
		change := stateChangeXML{InstanceID: in.ID, PreviousState: ec2State(in.State), CurrentState: ec2State(provider.StateTerminated)}
		if now, err := s.cloud.Get(in.ID); err == nil {
			change.CurrentState = ec2State(now.State)
		}
		resp.Changes = append(resp.Changes, change)
	}
	return resp, nil
}

func hasWildcard(v string) bool { return strings.ContainsAny(v, "*?") }

// wildcardMatch reports whether s matches pattern: * any run of
// characters, ? one, \ makes the next character literal.
func wildcardMatch(pattern, s string) bool {
	if pattern == "" {
		return s == ""
	}
	switch c := pattern[0]; {
	case c == '*':
		for i := 0; i <= len(s); i++ {
			if wildcardMatch(pattern[1:], s[i:]) {
				return true
			}
		}
		return false
	case c == '?':
		return s != "" && wildcardMatch(pattern[1:], s[1:])
	case c == '\\' && len(pattern) > 1:
		return s != "" && s[0] == pattern[1] && wildcardMatch(pattern[2:], s[1:])
	default:
		return s != "" && s[0] == c && wildcardMatch(pattern[1:], s[1:])
	}
}
