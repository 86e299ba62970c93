package ledgerapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/caa-project/caa/internal/unixsock"
	"github.com/caa-project/caa/pkg/ledger"
)

// errorKinds maps each ledger sentinel to its wire name and status code.
var errorKinds = []struct {
	err    error
	kind   string
	status int
}{
	{ledger.ErrNotFound, "not_found", http.StatusNotFound},
	{ledger.ErrInvalid, "invalid", http.StatusBadRequest},
	{ledger.ErrCorrupt, "corrupt", http.StatusInternalServerError},
	{ledger.ErrConflict, "conflict", http.StatusConflict},
	{ledger.ErrAlreadyExists, "already_exists", http.StatusConflict},
	{ledger.ErrSchema, "schema", http.StatusInternalServerError},
	{ledger.ErrReadOnly, "read_only", http.StatusForbidden},
}

type errorBody struct {
	Error string `json:"error"`
	Kind  string `json:"kind,omitempty"`
}

type recordsBody struct {
	Records []ledger.Record `json:"records"`
	// Error is set when some records did not decode (the rest are above).
	Error string `json:"error,omitempty"`
}

type eventsBody struct {
	Events []ledger.Event `json:"events"`
}

type sandboxesBody struct {
	Sandboxes []ledger.Sandbox `json:"sandboxes"`
	// Error is set when some sandboxes did not decode (the rest are above).
	Error string `json:"error,omitempty"`
}

type sandboxEventsBody struct {
	Events []ledger.SandboxEvent `json:"events"`
}

type problemsBody struct {
	Problems []ledger.Problem `json:"problems"`
}

// NewHandler serves the read-only API from r.
func NewHandler(r Reader, log *slog.Logger) http.Handler {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	h := &handler{r: r, log: log}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/meta", h.meta)
	mux.HandleFunc("GET /v1/records", h.list)
	mux.HandleFunc("GET /v1/records/{uid}", h.get)
	mux.HandleFunc("GET /v1/history", h.allHistory)
	mux.HandleFunc("GET /v1/history/{uid}", h.history)
	mux.HandleFunc("GET /v1/stats", h.stats)
	mux.HandleFunc("GET /v1/verify", h.verify)
	mux.HandleFunc("GET /v1/sandboxes", h.sandboxes)
	mux.HandleFunc("GET /v1/sandboxes/{id}", h.sandbox)
	mux.HandleFunc("GET /v1/sandboxes/{id}/history", h.sandboxHistory)
	return mux
}

type handler struct {
	r   Reader
	log *slog.Logger
}

func (h *handler) meta(w http.ResponseWriter, req *http.Request) {
	m, err := h.r.Meta(req.Context())
	h.reply(w, m, err)
}

func (h *handler) list(w http.ResponseWriter, req *http.Request) {
	var f ledger.Filter
	for _, s := range req.URL.Query()["phase"] {
		p, err := ledger.ParsePhase(s)
		if err != nil {
			h.reply(w, nil, err)
			return
		}
		f.Phases = append(f.Phases, p)
	}
	recs, err := h.r.List(req.Context(), f)
	body := recordsBody{Records: recs}
	if err != nil {
		if !errors.Is(err, ledger.ErrCorrupt) || recs == nil {
			h.reply(w, nil, err)
			return
		}
		body.Error = err.Error()
	}
	h.reply(w, body, nil)
}

func (h *handler) get(w http.ResponseWriter, req *http.Request) {
	r, err := h.r.Get(req.Context(), req.PathValue("uid"))
	h.reply(w, r, err)
}

func (h *handler) history(w http.ResponseWriter, req *http.Request) {
	es, err := h.r.History(req.Context(), req.PathValue("uid"))
	h.reply(w, eventsBody{Events: es}, err)
}

// allHistory answers one page when the request names one (pods or after),
// and else, for clients older than the pages, every page in one reply.
// Either way the ledger is read in short transactions, one per page.
func (h *handler) allHistory(w http.ResponseWriter, req *http.Request) {
	q := req.URL.Query()
	if !q.Has("pods") && !q.Has("after") {
		es, err := h.r.AllHistory(req.Context())
		h.reply(w, eventsBody{Events: es}, err)
		return
	}
	pods := 0
	if s := q.Get("pods"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 {
			h.reply(w, nil, fmt.Errorf("%w: pods=%q: want a count of pods", ledger.ErrInvalid, s))
			return
		}
		pods = n
	}
	p, err := h.r.HistoryPage(req.Context(), q.Get("after"), pods)
	h.reply(w, p, err)
}

func (h *handler) stats(w http.ResponseWriter, req *http.Request) {
	s, err := h.r.Stats(req.Context())
	h.reply(w, s, err)
}

func (h *handler) verify(w http.ResponseWriter, req *http.Request) {
	ps, err := h.r.Verify(req.Context())
	h.reply(w, problemsBody{Problems: ps}, err)
}

func (h *handler) sandboxes(w http.ResponseWriter, req *http.Request) {
	ss, err := h.r.Sandboxes(req.Context())
	body := sandboxesBody{Sandboxes: ss}
	if err != nil {
		if !errors.Is(err, ledger.ErrCorrupt) || ss == nil {
			h.reply(w, nil, err)
			return
		}
		body.Error = err.Error()
	}
	if body.Sandboxes == nil {
		body.Sandboxes = []ledger.Sandbox{}
	}
	h.reply(w, body, nil)
}

func (h *handler) sandbox(w http.ResponseWriter, req *http.Request) {
	s, err := h.r.Sandbox(req.Context(), req.PathValue("id"))
	h.reply(w, s, err)
}

func (h *handler) sandboxHistory(w http.ResponseWriter, req *http.Request) {
	es, err := h.r.SandboxHistory(req.Context(), req.PathValue("id"))
	h.reply(w, sandboxEventsBody{Events: es}, err)
}

func (h *handler) reply(w http.ResponseWriter, body any, err error) {
	w.Header().Set("Content-Type", "application/json")
	if err != nil {
		status, kind := http.StatusInternalServerError, ""
		for _, k := range errorKinds {
			if errors.Is(err, k.err) {
				status, kind = k.status, k.kind
				break
			}
		}
		if status >= 500 {
			h.log.Warn("ledger API request failed", "err", err)
		}
		w.WriteHeader(status)
		body = errorBody{Error: err.Error(), Kind: kind}
	}
	if encErr := json.NewEncoder(w).Encode(body); encErr != nil {
		h.log.Debug("ledger API reply not sent", "err", encErr)
	}
}

// Serve answers the API on a unix socket at path (mode 0600) until ctx is
// done. A socket file left by a dead daemon is replaced; one that still
// answers is refused, since two daemons must never share a ledger.
func Serve(ctx context.Context, path string, r Reader, log *slog.Logger) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	// The ledger directory is 0700, so the socket is private from its first
	// instant; the mode states the intent even where the directory is not.
	ln, err := unixsock.Listen(path, unixsock.Options{Mode: 0o600})
	if errors.Is(err, unixsock.ErrServed) {
		return fmt.Errorf("serve ledger API: %s is answered by another process: %w", path, err)
	}
	if err != nil {
		return fmt.Errorf("serve ledger API on %s: %w", path, err)
	}
	srv := &http.Server{
		Handler:           NewHandler(r, log),
		ReadHeaderTimeout: 5 * time.Second,
		BaseContext:       func(net.Listener) context.Context { return ctx },
	}
	log.Info("serving ledger API", "socket", path)
	// Serve closes ln when it returns, and ln's Close removes the socket
	// file while it is still the one ln bound.
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case <-ctx.Done():
		shutdownCtx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdownCtx)
		err = <-errc
	case err = <-errc:
	}
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return fmt.Errorf("serve ledger API on %s: %w", path, err)
}
