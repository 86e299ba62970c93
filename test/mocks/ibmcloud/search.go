package vpcfake

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/test/mocks/cloud"
)

// The Global Search part of the fake: POST /v3/resources/search over an
// index of the VPC instances and their boot volumes (two documents per
// instance) that lags the core by the server's search lag, on the core's
// clock. A volume shows its user tags; an instance, the user tags
// attached to it through Global Tagging (tagging.go).
//
// The query language is the subset caa sends, parsed, not pattern
// matched: terms joined by AND, each field:value with the field one of
// family, type or tags and the value a bare word of [A-Za-z0-9._-] or a
// double-quoted phrase with \" and \\ escapes. tags matches a document
// holding that tag, compared without case, as IBM Cloud compares tags.
// Anything else (OR, NOT, parentheses, wildcards, another field) is
// answered 400 with the API's error body, so a query the fake cannot
// answer exactly never silently widens or narrows a listing.

// OpSearch is not an operation name of its own: a search page is a
// listing, counted under cloud.OpList (as the instance listing is) so that
// a listing's pages count the same whichever API serves them. The budget
// charges it to ClassSearch.

const (
	searchPath         = "/v3/resources/search"
	defaultSearchLimit = 10
	maxSearchLimit     = 1000
	searchMoreInfo     = "https://cloud.ibm.com/apidocs/search"
)

// WithUntaggedSeeds makes instances seeded straight into the core show in
// the index without tags of their own, as VMs made before caa tagged
// instances do: only their boot volumes carry caa's tags.
func WithUntaggedSeeds() Option { return func(s *Server) { s.untaggedSeeds = true } }

// WithSearchLag makes the search index lag the VMs by d, on the core's
// clock: a VM created less than d ago is not found yet, one deleted less
// than d ago is still found. The default, 0, is an index in step with VPC.
func WithSearchLag(d time.Duration) Option { return func(s *Server) { s.searchLag = d } }

// searchDoc is one indexed resource: an instance's boot volume, or the
// instance itself.
type searchDoc struct {
	typ                 string // "volume" or "instance"
	crn, id, name, zone string
	group               string   // its resource group, for the caller's view
	tags                []string // as shown: "key:value", lower case
	// For an instance: the instance as the index last saw it, whose VPC
	// document (doc) is built only for a hit, and the status the index
	// shows ("" : the instance's own).
	in     cloud.Instance
	status string
}

// searchRequest is the body the SDK sends.
type searchRequest struct {
	Query        *string  `json:"query"`
	Fields       []string `json:"fields"`
	SearchCursor *string  `json:"search_cursor"`
}

// searchCursor is what the fake's opaque cursor holds: the search, and
// the core position after the last hit returned.
type searchCursor struct {
	Query  string   `json:"q"`
	Fields []string `json:"f,omitempty"`
	After  int      `json:"a"`
}

// term is one field:value of a parsed query.
type term struct{ field, value string }

// searchFlags are the query parameters the SDK may send that take
// true, false or any; the fake serves only the default, false.
var searchFlags = []string{"is_deleted", "is_reclaimed", "can_tag", "is_project_resource"}

// search is POST /v3/resources/search.
func (s *Server) search(w http.ResponseWriter, r *http.Request) {
	limit, ok := searchParams(w, r)
	if !ok {
		return
	}
	var req searchRequest
	if !decodeSearchJSON(w, r, &req) {
		return
	}
	cur := searchCursor{Query: "*"}
	if req.SearchCursor != nil {
		// With a cursor, the API ignores the rest of the body.
		c, err := decodeCursor(*req.SearchCursor)
		if err != nil {
			writeSearchProblem(w, http.StatusBadRequest, "bad_request", "The search_cursor is not one this API issued.")
			return
		}
		cur = c
	} else {
		if req.Query != nil {
			cur.Query = *req.Query
		}
		cur.Fields = req.Fields
	}
	terms, err := parseQuery(cur.Query)
	if err != nil {
		writeSearchProblem(w, http.StatusBadRequest, "bad_request", "The query is not valid: "+err.Error())
		return
	}
	// A page holds as many hits as the limit asks for while there are
	// more (the core's page size does not cut it), and every answer
	// carries a live cursor, the last and the empty one included: the
	// API's reference (the search operation of Global Search v3, and the
	// search_cursor field of its request body in IBM's platform-services
	// SDK) says the first call returns a live cursor to use on every later
	// call until the result set comes back empty, and that a client may
	// stop once a page holds fewer items than the limit. A client that
	// stops only on an empty page pays one more search per listing here,
	// as it does against the real service.
	// With no policies every caller sees the same answer: while nothing
	// changed, the answer to the same page of the same search is the one
	// made last time (fullIndex says when nothing changed).
	key := baseURL(r) + "\x00" + strconv.Itoa(limit) + "\x00" + encodeCursor(cur)
	stamp, cacheable := s.indexStamp()
	cacheable = cacheable && s.policies() == nil
	if cacheable {
		if raw, ok := s.answers.Get(key, stamp); ok {
			writeJSONBytes(w, http.StatusOK, raw)
			return
		}
	}
	items := []map[string]any{}
	next := cur
	// Search shows only what the caller may view: a volume it may not
	// read is left out, as if it were not there.
	visible := map[string]func(id, group string) bool{"volume": s.visibleTo(r, "volume"), "instance": s.visibleTo(r, "instance")}
	docs, byID := s.index(cur.After)
	next.After = cur.After + len(docs)
	for i, doc := range docs {
		if !doc.matches(terms) || !visible[doc.typ](doc.id, doc.group) {
			continue
		}
		items = append(items, doc.item(cur.Fields, baseURL(r), byID, &s.docCache))
		if len(items) == limit {
			next.After = cur.After + i + 1
			break
		}
	}
	raw, err := json.Marshal(map[string]any{"items": items, "limit": limit, "search_cursor": encodeCursor(next)})
	if err != nil {
		writeSearchProblem(w, http.StatusInternalServerError, "internal_error", "The fake could not encode its answer.")
		return
	}
	raw = append(raw, '\n')
	if cacheable {
		s.answers.Put(key, stamp, raw)
	}
	writeJSONBytes(w, http.StatusOK, raw)
}

// searchParams checks the query parameters and returns the limit.
func searchParams(w http.ResponseWriter, r *http.Request) (int, bool) {
	limit := defaultSearchLimit
	for k, vs := range r.URL.Query() {
		v := vs[0]
		switch {
		case k == "account_id" || k == "timeout" || k == "x-request-id":
		case k == "limit":
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > maxSearchLimit {
				writeSearchProblem(w, http.StatusBadRequest, "bad_request", fmt.Sprintf("The limit must be a whole number from 1 to %d.", maxSearchLimit))
				return 0, false
			}
			limit = n
		case slices.Contains(searchFlags, k):
			if v != "false" {
				writeSearchProblem(w, http.StatusBadRequest, "bad_request", "The fake serves only "+k+"=false.")
				return 0, false
			}
		default:
			writeSearchProblem(w, http.StatusBadRequest, "bad_request", "The fake does not support the query parameter "+k+".")
			return 0, false
		}
	}
	return limit, true
}

// decodeSearchJSON reads the body strictly, answering the API's error.
func decodeSearchJSON(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		writeSearchProblem(w, http.StatusBadRequest, "bad_request", "The request body is not a search request.")
		return false
	}
	return true
}

// index is the search index now, from position after on. It holds two
// documents per core instance, at positions 2i (its boot volume) and
// 2i+1 (the instance), for every instance created at least the lag ago
// and not deleted longer than the lag ago; a cursor counts positions. An
// instance deleted less than the lag ago shows with status "deleting",
// the last VPC shows of it. State changes of a live instance show at once
// (the lag applies to creation and deletion only), unless a test pinned
// what the index shows (PinIndexStatus).
func (s *Server) index(after int) ([]searchDoc, map[string]cloud.Resource) {
	all, byID := s.fullIndex()
	if after >= len(all) {
		return nil, byID
	}
	return all[after:], byID
}

// fullIndex is the whole index (see index) and the side resources it was
// built from. It is built again only when something may have changed it:
// while the core's and the fake's generations stand and no change was due
// on the clock when it was built (no lag: creations and deletions show at
// once; no boot pending), the index is the last one built. A listing's
// pages, and a warm restart's listing, search an unchanged account; the
// real service answers from its index, on its own hardware, and the fake's
// building of the whole index again for every page was time counted
// against caa. What it returns is shared: callers only read it.
func (s *Server) fullIndex() ([]searchDoc, map[string]cloud.Resource) {
	stamp, cacheable := s.indexStamp()
	if cacheable {
		if built, ok := s.built.Get("", stamp); ok {
			return built.docs, built.byID
		}
	}
	all := s.cloud.Instances()
	now := s.cloud.Now()
	byID := s.resourcesByID()
	out := make([]searchDoc, 0, 2*len(all))
	for _, in := range all {
		vol, ok := s.docOf(in, byID)
		visible := !now.Before(in.CreatedAt.Add(s.searchLag)) &&
			(in.State != provider.StateTerminated || now.Before(in.EndedAt.Add(s.searchLag)))
		inst := searchDoc{}
		if visible {
			inst = s.instanceDoc(in, byID)
		}
		if !ok || !visible {
			// Keep positions: a cursor counts positions.
			vol = searchDoc{}
		}
		out = append(out, vol, inst)
	}
	if cacheable {
		s.built.Put("", stamp, builtIndex{docs: out, byID: byID})
	}
	return out, byID
}

// indexStamp is what the index depends on beyond the clock: the core's
// generation and the fake's own. cacheable is false when the clock alone
// may change it: a lag, a boot pending.
func (s *Server) indexStamp() (stamp cloud.Stamp, cacheable bool) {
	fe := s.gen.Load()
	core, quiet := s.cloud.Version()
	return cloud.Stamp{core, fe}, quiet && s.searchLag == 0
}

// builtIndex is an index fullIndex built, with the side resources it was
// built from.
type builtIndex struct {
	docs []searchDoc
	byID map[string]cloud.Resource
}

// instanceDoc is the index document of an instance. One seeded straight
// into the core (no API call made it) shows its core tags, as if caa had
// attached them.
func (s *Server) instanceDoc(in cloud.Instance, byID map[string]cloud.Resource) searchDoc {
	s.mu.Lock()
	_, made := s.docs[in.ID]
	status := s.pinned[in.ID]
	s.mu.Unlock()
	nic := nicOf(in, byID)
	zone := propOr(nic, "zone", in.Zone)
	return searchDoc{
		typ: "instance", crn: crnPrefix + zone + account + "instance:" + in.ID, id: in.ID, name: in.Name, zone: zone,
		group: groupOf(nic), tags: s.shownInstanceTags(in.ID, !made && !s.untaggedSeeds, in.Tags), in: in, status: status,
	}
}

// PinIndexStatus makes the search index show status (a VPC instance
// status such as "stopped") for the instance until it is unpinned with
// "": a stale index, for tests that check the index never decides alone.
func (s *Server) PinIndexStatus(id, status string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gen.Add(1)
	if status == "" {
		delete(s.pinned, id)
		return
	}
	s.pinned[id] = status
}

// docOf is the index document of an instance's boot volume: the one
// remembered when the instance was created through the API (its volume is
// gone once it is deleted, but the lagging index still shows it), else the
// volume the core shows.
func (s *Server) docOf(in cloud.Instance, byID map[string]cloud.Resource) (searchDoc, bool) {
	s.mu.Lock()
	doc, ok := s.docs[in.ID]
	s.mu.Unlock()
	if ok {
		return doc, true
	}
	if in.State == provider.StateTerminated && len(in.Resources) > 0 {
		// Its volume is gone and was never remembered.
		return searchDoc{}, false
	}
	return newSearchDoc(bootVolumeOf(in, byID), in.Zone), true
}

// remember keeps the index document of a new instance's boot volume.
func (s *Server) remember(instanceID string, b bootVolume, zone string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.docs[instanceID] = newSearchDoc(b, zone)
}

func newSearchDoc(b bootVolume, zone string) searchDoc {
	if b.zone != "" {
		zone = b.zone
	}
	return searchDoc{typ: "volume", crn: b.crn(zone), id: b.id, name: b.name, zone: zone, group: b.group, tags: formatUserTags(b.tags)}
}

func (d searchDoc) matches(terms []term) bool {
	if d.crn == "" {
		return false
	}
	for _, t := range terms {
		switch t.field {
		case "family":
			if t.value != "is" {
				return false
			}
		case "type":
			if t.value != d.typ {
				return false
			}
		case "tags":
			if !slices.ContainsFunc(d.tags, func(tag string) bool { return strings.EqualFold(tag, t.value) }) {
				return false
			}
		}
	}
	return true
}

// item is the hit with the requested fields; the CRN always. An
// instance's hit also holds doc, the instance's VPC document (as GET
// /v1/instances/{id} shows it, with the status the index shows), and a
// field "doc.a.b" asks for that part of it only, nested as in doc.
func (d searchDoc) item(fields []string, base string, byID map[string]cloud.Resource, cache *cloud.DocCache) map[string]any {
	all := map[string]any{
		"crn": d.crn, "name": d.name, "type": d.typ, "family": "is", "service_name": "is",
		"account_id": "fakeaccount", "resource_id": d.id, "region": regionOf(d.zone), "tags": d.tags,
	}
	if d.typ == "instance" {
		all["doc"] = d.document(base, byID, cache)
	}
	if len(fields) == 0 {
		fields = []string{"account_id", "name", "type", "family"}
	}
	out := map[string]any{"crn": d.crn}
	for _, f := range fields {
		if f == "*" {
			return all
		}
		if v, ok := all[f]; ok {
			out[f] = v
			continue
		}
		if path, ok := strings.CutPrefix(f, "doc."); ok && all["doc"] != nil {
			copyPath(out, all, append([]string{"doc"}, strings.Split(path, ".")...))
		}
	}
	return out
}

// document is the instance's VPC JSON as a map, shared through cache while
// that JSON is unchanged.
func (d searchDoc) document(base string, byID map[string]cloud.Resource, cache *cloud.DocCache) map[string]any {
	v := instanceViewOf(base, d.in, byID)
	if d.status != "" {
		v.Status = d.status
	}
	b, _ := json.Marshal(v)
	return cache.Get(string(b), func() map[string]any {
		var m map[string]any
		_ = json.Unmarshal(b, &m)
		return m
	})
}

// copyPath copies src's value at path into dst, creating the maps on the
// way; nothing when src has no value there.
func copyPath(dst, src map[string]any, path []string) {
	v, ok := src[path[0]]
	if !ok {
		return
	}
	if len(path) == 1 {
		dst[path[0]] = v
		return
	}
	sub, ok := v.(map[string]any)
	if !ok {
		return
	}
	next, _ := dst[path[0]].(map[string]any)
	if next == nil {
		next = map[string]any{}
	}
	before := len(next)
	copyPath(next, sub, path[1:])
	if len(next) > before || dst[path[0]] != nil {
		dst[path[0]] = next
	}
}

// regionOf is the region of a zone name like us-south-1.
func regionOf(zone string) string {
	if i := strings.LastIndexByte(zone, '-'); i > 0 {
		return zone[:i]
	}
	return zone
}

// parseQuery parses the query subset the fake understands (see the top
// of this file).
func parseQuery(q string) ([]term, error) {
	p := queryParser{s: q}
	var terms []term
	for {
		p.skipSpace()
		t, err := p.term()
		if err != nil {
			return nil, err
		}
		terms = append(terms, t)
		p.skipSpace()
		if p.done() {
			return terms, nil
		}
		if w := p.word(); w != "AND" {
			return nil, fmt.Errorf("expected AND at offset %d, found %q", p.i, w)
		}
	}
}

type queryParser struct {
	s string
	i int
}

func (p *queryParser) done() bool { return p.i >= len(p.s) }

func (p *queryParser) skipSpace() {
	for !p.done() && p.s[p.i] == ' ' {
		p.i++
	}
}

func bareByte(c byte) bool {
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-'
}

// word reads a run of bare characters.
func (p *queryParser) word() string {
	start := p.i
	for !p.done() && bareByte(p.s[p.i]) {
		p.i++
	}
	return p.s[start:p.i]
}

func (p *queryParser) term() (term, error) {
	field := p.word()
	switch field {
	case "family", "type", "tags":
	case "":
		return term{}, fmt.Errorf("expected a field at offset %d", p.i)
	default:
		return term{}, fmt.Errorf("the fake does not search the field %q", field)
	}
	if p.done() || p.s[p.i] != ':' {
		return term{}, fmt.Errorf("expected ':' after %s", field)
	}
	p.i++
	if !p.done() && p.s[p.i] == '"' {
		v, err := p.phrase()
		return term{field, v}, err
	}
	v := p.word()
	if v == "" {
		return term{}, fmt.Errorf("expected a value for %s at offset %d", field, p.i)
	}
	if !p.done() && p.s[p.i] != ' ' {
		return term{}, fmt.Errorf("unexpected %q at offset %d", p.s[p.i], p.i)
	}
	return term{field, v}, nil
}

// phrase reads a double-quoted phrase.
func (p *queryParser) phrase() (string, error) {
	p.i++ // the opening quote
	var b strings.Builder
	for !p.done() {
		c := p.s[p.i]
		p.i++
		switch c {
		case '"':
			if !p.done() && p.s[p.i] != ' ' {
				return "", fmt.Errorf("unexpected %q after a phrase at offset %d", p.s[p.i], p.i)
			}
			return b.String(), nil
		case '\\':
			if p.done() {
				return "", errors.New("the query ends in an escape")
			}
			b.WriteByte(p.s[p.i])
			p.i++
		default:
			b.WriteByte(c)
		}
	}
	return "", errors.New("a phrase is not closed")
}

func encodeCursor(c searchCursor) string {
	b, _ := json.Marshal(c)
	return base64.RawURLEncoding.EncodeToString(b)
}

func decodeCursor(s string) (searchCursor, error) {
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return searchCursor{}, err
	}
	var c searchCursor
	if err := json.Unmarshal(b, &c); err != nil {
		return searchCursor{}, err
	}
	if c.After < 0 {
		return searchCursor{}, errors.New("negative position")
	}
	return c, nil
}

// writeSearchProblem writes Global Search's error body, which has the
// shape of the VPC one (errors, trace, status_code).
func writeSearchProblem(w http.ResponseWriter, status int, code, msg string) {
	writeJSON(w, status, problem{
		Errors:     []problemItem{{Code: code, Message: msg, MoreInfo: searchMoreInfo}},
		Trace:      randomHex(16),
		StatusCode: status,
	})
}
