package armfake

import (
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// operation is a long-running operation as its Azure-AsyncOperation URL
// reports it. The fake's operations are terminal from the start (Succeeded,
// or Failed with the error ARM would report once the work was tried), unless
// the fake was made WithSlowOperations: then each reports InProgress for its
// first polls, and the replies carry the wait ARM asks for. They are kept
// for the fake's lifetime, so a retried poll finds them.
type operation struct {
	status  string
	err     *apiError
	started time.Time
	// pending is how many more polls report InProgress; until, when set,
	// is the time on the fake's clock before which every poll does.
	pending int
	until   time.Time
}

// askToWait sets the header with which a reply of a slow operation asks the
// client to wait before its next poll.
func (s *server) askToWait(w http.ResponseWriter) {
	if s.opts.slowPolls > 0 {
		w.Header().Set("Retry-After-Ms", strconv.FormatInt(s.opts.slowWait.Milliseconds(), 10))
	}
}

// accepted answers a PUT or DELETE that started a long-running operation:
// the status code, an Azure-AsyncOperation header to poll, and the body
// (nil for none). fail, when set, is how the operation ends.
func (s *server) accepted(w http.ResponseWriter, r *http.Request, status int, namespace string, body any, fail *apiError) {
	s.acceptedUntil(w, r, status, namespace, body, fail, time.Time{})
}

// acceptedUntil is accepted for an operation that stays InProgress until
// until on the fake's clock (zero: no such wait).
func (s *server) acceptedUntil(w http.ResponseWriter, r *http.Request, status int, namespace string, body any, fail *apiError, until time.Time) {
	op := operation{status: "Succeeded", started: time.Now(), pending: s.opts.slowPolls, until: until}
	if !until.IsZero() && w.Header().Get("Retry-After") == "" {
		// ARM asks to poll a long-running operation again in a while.
		w.Header().Set("Retry-After", "1")
	}
	if fail != nil {
		op.status, op.err = "Failed", fail
	}
	s.askToWait(w)
	s.mu.Lock()
	s.opSeq++
	id := fmt.Sprintf("%08x-0000-4000-8000-%012x", s.opSeq, s.opSeq)
	s.ops[id] = op
	s.mu.Unlock()

	q := url.Values{"api-version": {r.URL.Query().Get("api-version")}}
	w.Header().Set("Azure-AsyncOperation", fmt.Sprintf("%s/subscriptions/%s/providers/%s/locations/%s/operations/%s?%s",
		baseURL(r), s.opts.subscription, namespace, s.opts.location, id, q.Encode()))
	if body == nil {
		w.WriteHeader(status)
		return
	}
	writeJSON(w, status, body)
}

func (s *server) getOperation(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	s.mu.Lock()
	op, ok := s.ops[id]
	inProgress := ok && op.pending > 0
	if inProgress {
		op.pending--
		s.ops[id] = op
	}
	waiting := ok && !op.until.IsZero() && s.opts.now().Before(op.until)
	s.mu.Unlock()
	if waiting {
		w.Header().Set("Retry-After", "1")
		writeJSON(w, http.StatusOK, operationStatus{ID: r.URL.Path, Name: id, Status: "InProgress", StartTime: op.started})
		return
	}
	if !ok {
		writeError(w, apiError{http.StatusNotFound, "NotFound", fmt.Sprintf("The operation '%s' was not found.", id), ""})
		return
	}
	if inProgress {
		s.askToWait(w)
		writeJSON(w, http.StatusOK, operationStatus{ID: r.URL.Path, Name: id, Status: "InProgress", StartTime: op.started})
		return
	}
	writeJSON(w, http.StatusOK, operationStatus{
		ID: r.URL.Path, Name: id, Status: op.status, StartTime: op.started, EndTime: op.started, Error: op.err,
	})
}
