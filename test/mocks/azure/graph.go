package armfake

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/caa-project/caa/test/mocks/cloud"
)

// The fake Resource Graph: POST /providers/Microsoft.ResourceGraph/resources,
// the API version the SDK (armresourcegraph v0.10.0) sends, over the search
// index (see searchIndex), answering the KQL subset of kql.go in the
// objectArray format, paged with $skipToken (a summarize is not paged:
// its first page only, resultTruncated when groups were left out). A
// query is counted under cloud.OpList.

// GraphAPIVersion is the api-version of the query API the fake serves.
const GraphAPIVersion = "2024-04-01"

// GraphPath is where the query API answers.
const GraphPath = "/providers/Microsoft.ResourceGraph/resources"

// maxGraphTop is the largest $top Resource Graph takes.
const maxGraphTop = 1000

// WithSearchLag makes the Resource Graph index lag the VMs by lag on the
// fake's clock (see WithClock): a VM created less than lag ago is absent
// from queries, one deleted less than lag ago is still there with its last
// state, and a state change shows lag late. Default 0: the index is the
// core as it is.
//
// The fake sees the core when it serves a request (any route, the control
// routes included), so a change made on the core directly is stamped with
// the time of the next request: a test that changes the core directly and
// then moves the clock should make a request in between, or the change
// shows later than lag.
func WithSearchLag(lag time.Duration) Option { return func(o *options) { o.searchLag = lag } }

// WithClock sets the fake's own clock (default time.Now), on which the
// search index lags; give it the core's clock.
func WithClock(now func() time.Time) Option { return func(o *options) { o.now = now } }

// WithGraphPageSize sets the most rows a Resource Graph answer holds (a
// request's $top may ask for fewer). Default: the core's page size.
func WithGraphPageSize(n int) Option { return func(o *options) { o.graphPage = n } }

// graphRequest is the body of a query, as the SDK sends it.
type graphRequest struct {
	Subscriptions    []string      `json:"subscriptions"`
	ManagementGroups []string      `json:"managementGroups"`
	Query            string        `json:"query"`
	Options          *graphOptions `json:"options"`
	Facets           []any         `json:"facets"`
}

type graphOptions struct {
	SkipToken                string `json:"$skipToken,omitempty"`
	Top                      *int   `json:"$top,omitempty"`
	Skip                     *int   `json:"$skip,omitempty"`
	ResultFormat             string `json:"resultFormat,omitempty"`
	AllowPartialScopes       *bool  `json:"allowPartialScopes,omitempty"`
	AuthorizationScopeFilter string `json:"authorizationScopeFilter,omitempty"`
}

type graphResponse struct {
	TotalRecords    int64            `json:"totalRecords"`
	Count           int64            `json:"count"`
	ResultTruncated string           `json:"resultTruncated"`
	SkipToken       string           `json:"$skipToken,omitempty"`
	Data            []map[string]any `json:"data"`
	Facets          []any            `json:"facets"`
}

// graphError is Resource Graph's error body: a code and message, and
// details that say what was wrong with the query.
type graphError struct {
	status  int
	Code    string        `json:"code"`
	Message string        `json:"message"`
	Details []graphDetail `json:"details,omitempty"`
}

type graphDetail struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Line    int    `json:"line,omitempty"`
	Column  int    `json:"characterPositionInLine,omitempty"`
}

func writeGraphError(w http.ResponseWriter, e graphError) {
	writeJSON(w, e.status, struct {
		Error graphError `json:"error"`
	}{e})
}

// badQuery is the answer to a query outside the subset.
func badQuery(e *kqlError) graphError {
	return graphError{http.StatusBadRequest, "BadRequest", "Please provide below info when asking for support: timestamp, correlation id.",
		[]graphDetail{
			{Code: "InvalidQuery", Message: "Query is invalid. Please refer to the documentation for the Azure Resource Graph service and fix the error before retrying."},
			{Code: "ParserFailure", Message: e.msg, Line: e.line, Column: e.col},
		}}
}

func badRequest(code, format string, args ...any) graphError {
	return graphError{http.StatusBadRequest, "BadRequest", fmt.Sprintf(format, args...),
		[]graphDetail{{Code: code, Message: fmt.Sprintf(format, args...)}}}
}

// skipToken is what the fake's $skipToken holds: where the next page
// starts, and a digest of the query and scope it belongs to.
type skipToken struct {
	Offset int    `json:"o"`
	Query  string `json:"q"`
}

func queryDigest(req graphRequest) string {
	h := sha256.New()
	_, _ = io.WriteString(h, req.Query)
	for _, s := range req.Subscriptions {
		_, _ = io.WriteString(h, "\x00"+strings.ToLower(s))
	}
	return hex.EncodeToString(h.Sum(nil)[:8])
}

func (s *server) queryResources(w http.ResponseWriter, r *http.Request) {
	if v := r.URL.Query().Get("api-version"); v != GraphAPIVersion {
		writeGraphError(w, badRequest("InvalidApiVersionParameter", "The api-version '%s' is not served by this fake; use %s.", v, GraphAPIVersion))
		return
	}
	var req graphRequest
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err == nil {
		dec := json.NewDecoder(strings.NewReader(string(body)))
		dec.DisallowUnknownFields()
		err = dec.Decode(&req)
	}
	if err != nil {
		writeGraphError(w, badRequest("InvalidRequestContent", "The request content was invalid and could not be deserialized."))
		return
	}
	opts := graphOptions{}
	if req.Options != nil {
		opts = *req.Options
	}
	switch {
	case strings.TrimSpace(req.Query) == "":
		writeGraphError(w, badRequest("MissingQuery", "The query is required."))
		return
	case len(req.ManagementGroups) > 0 || len(req.Subscriptions) == 0:
		writeGraphError(w, badRequest("UnsupportedScope", "This fake serves queries scoped to subscriptions only."))
		return
	case len(req.Facets) > 0:
		writeGraphError(w, badRequest("UnsupportedFacets", "This fake serves no facets."))
		return
	case opts.ResultFormat != "" && opts.ResultFormat != "objectArray":
		writeGraphError(w, badRequest("UnsupportedResultFormat", "This fake serves the objectArray result format only."))
		return
	case opts.Top != nil && (*opts.Top < 1 || *opts.Top > maxGraphTop):
		writeGraphError(w, badRequest("InvalidTop", "$top must be between 1 and %d.", maxGraphTop))
		return
	case opts.Skip != nil && *opts.Skip < 0:
		writeGraphError(w, badRequest("InvalidSkip", "$skip must not be negative."))
		return
	}
	q, perr := parseKQL(req.Query)
	if perr != nil {
		writeGraphError(w, badQuery(perr))
		return
	}
	offset := 0
	if opts.SkipToken != "" {
		var tok skipToken
		raw, err := base64.RawURLEncoding.DecodeString(opts.SkipToken)
		if err == nil {
			err = json.Unmarshal(raw, &tok)
		}
		if err != nil || tok.Query != queryDigest(req) || tok.Offset < 0 {
			writeGraphError(w, badRequest("InvalidSkipToken", "The $skipToken is not one this query handed out."))
			return
		}
		offset = tok.Offset
	}
	if opts.Skip != nil {
		offset = *opts.Skip
	}
	size := s.opts.graphPage
	if size <= 0 {
		size = s.cloud.PageSize()
	}
	if opts.Top != nil && *opts.Top < size {
		size = *opts.Top
	}

	key := string(body)
	stamp, cacheable := s.answerStamp()
	if cacheable {
		if raw, ok := s.answers.Get(key, stamp); ok {
			writeJSONBytes(w, http.StatusOK, raw)
			return
		}
	}
	// Every page of a query is cut from the same rows: while nothing
	// changes, the next page's are the last page's.
	rowsKey := req.Query
	for _, sub := range req.Subscriptions {
		rowsKey += "\x00" + strings.ToLower(sub)
	}
	rows, ok := s.answerRows.Get(rowsKey, stamp)
	if !cacheable || !ok {
		var docs []map[string]any
		if slices.ContainsFunc(req.Subscriptions, func(sub string) bool { return strings.EqualFold(sub, s.opts.subscription) }) {
			docs = s.readable(s.indexed(q.tagTerms(), q.tagFilter()))
		}
		rows = q.run(docs)
		if cacheable {
			s.answerRows.Put(rowsKey, stamp, rows)
		}
	}
	out := graphResponse{TotalRecords: int64(len(rows)), ResultTruncated: "false", Data: []map[string]any{}, Facets: []any{}}
	if offset < len(rows) {
		end := min(len(rows), offset+size)
		out.Data = rows[offset:end]
		if end < len(rows) && q.summarizes() {
			// Resource Graph pages no summarize ("simplified first
			// page only"): no token, and a flag that groups are missing.
			out.ResultTruncated = "true"
		} else if end < len(rows) {
			raw, _ := json.Marshal(skipToken{Offset: end, Query: queryDigest(req)})
			out.SkipToken = base64.RawURLEncoding.EncodeToString(raw)
		}
	}
	out.Count = int64(len(out.Data))
	raw, err := json.Marshal(out)
	if err != nil {
		writeGraphError(w, graphError{http.StatusInternalServerError, "InternalServerError", "The fake could not encode its answer.", nil})
		return
	}
	raw = append(raw, '\n')
	if cacheable {
		s.answers.Put(key, stamp, raw)
	}
	writeJSONBytes(w, http.StatusOK, raw)
}

// answerStamp is what an answer made now depends on beyond its request:
// the core's generation and the fake's own. cacheable is false when the
// answer may change with the clock alone: a lagging index, a VM still
// booting, not yet visible or still being created, a deleted one still
// shown; or when a role decides what is readable (WithRole's function may
// answer differently from one call to the next).
func (s *server) answerStamp() (stamp cloud.Stamp, cacheable bool) {
	fe := s.gen.Load()
	core, quiet := s.cloud.Version()
	return cloud.Stamp{core, fe}, quiet && s.index == nil && s.opts.role == nil && s.opts.createDuration == 0
}

// indexed is what the index shows now: the core itself without a lag.
// Without a lag only the resources that hold the terms' tags (the core's
// index finds them) and whose tags pass keep (nil: all) are rendered: a real index does not render the subscription to answer a
// query filtered by tag. A lagging index observes everything.
func (s *server) indexed(terms []cloud.TagTerm, keep func(tags map[string]string) bool) []map[string]any {
	if s.index == nil {
		docs := s.documentsWhere(terms, keep)
		out := make([]map[string]any, len(docs))
		for i, d := range docs {
			out[i] = d.body
		}
		return out
	}
	s.index.observe(s.documents())
	return s.index.snapshot()
}

// observeIndex brings a lagging index up to date with the core.
func (s *server) observeIndex() {
	if s.index != nil {
		s.index.observe(s.documents())
	}
}

// isGraph reports whether r is a Resource Graph query.
func isGraph(r *http.Request) bool { return r.URL.Path == GraphPath }
