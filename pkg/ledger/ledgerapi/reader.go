// Package ledgerapi lets the `caa ledger` CLI read a ledger whether a daemon
// holds it (over the daemon's unix socket) or not (by opening the file read-only).
//
// The protocol is HTTP/1.1 with JSON bodies over a unix socket at
// SocketPath(ledger), mode 0600, served only by the process that holds the
// ledger open for writing. It is read-only and versioned by path (/v1/...):
//
//	GET /v1/meta                  -> ledger.Meta
//	GET /v1/records[?phase=P...]  -> {"records": [Record...], "error": "..."}
//	GET /v1/records/{uid}         -> Record
//	GET /v1/history?pods=N[&after=UID]
//	                              -> {"events": [Event...], "next": "UID"}
//	                                 the history of at most N pods whose UIDs
//	                                 follow after (N=0: the default of 100, at
//	                                 most 1000); next, when set, is the after
//	                                 of the following page
//	GET /v1/history               -> {"events": [Event...]} every pod, by time
//	                                 (for older clients; read page by page)
//	GET /v1/history/{uid}         -> {"events": [Event...]}
//	GET /v1/stats                 -> ledger.Stats
//	GET /v1/verify                -> {"problems": [Problem...]}
//	GET /v1/sandboxes             -> {"sandboxes": [Sandbox...], "error": "..."}
//	                                 the kata sandboxes of the remote
//	                                 hypervisor mode (none in the informer mode)
//	GET /v1/sandboxes/{id}        -> Sandbox
//	GET /v1/sandboxes/{id}/history -> {"events": [SandboxEvent...]}
//
// A daemon older than the sandboxes answers their paths 404 without a
// JSON body; the client reports that as ErrNotServed.
//
// Failures answer a status code and {"error": "...", "kind": "..."}; the
// kind names the ledger sentinel (not_found, corrupt, ...) so a client's
// errors still satisfy errors.Is(err, ledger.ErrNotFound) and friends.
package ledgerapi

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/caa-project/caa/pkg/ledger"
)

// Reader is the read side of a ledger, local or remote.
type Reader interface {
	Meta(ctx context.Context) (ledger.Meta, error)
	// List returns the matching records; with some undecodable it returns
	// the good ones and an error wrapping ledger.ErrCorrupt.
	List(ctx context.Context, f ledger.Filter) ([]ledger.Record, error)
	Get(ctx context.Context, podUID string) (ledger.Record, error)
	History(ctx context.Context, podUID string) ([]ledger.Event, error)
	// HistoryPage is the history of at most pods pods (deleted pods too)
	// whose UIDs follow after; see ledger.Ledger.HistoryPage.
	HistoryPage(ctx context.Context, after string, pods int) (ledger.HistoryPage, error)
	// AllHistory is every pod's history (deleted pods too), oldest first,
	// read page by page.
	AllHistory(ctx context.Context) ([]ledger.Event, error)
	Stats(ctx context.Context) (ledger.Stats, error)
	Verify(ctx context.Context) ([]ledger.Problem, error)
	// Sandboxes returns every sandbox record (remote hypervisor mode),
	// ordered by id; with some undecodable it returns the good ones and an
	// error wrapping ledger.ErrCorrupt. A ledger older than the sandboxes
	// holds none.
	Sandboxes(ctx context.Context) ([]ledger.Sandbox, error)
	Sandbox(ctx context.Context, id string) (ledger.Sandbox, error)
	SandboxHistory(ctx context.Context, id string) ([]ledger.SandboxEvent, error)
	// Source says where the answers come from, for messages.
	Source() string
	Close() error
}

// Local reads an open ledger in this process.
type Local struct {
	L *ledger.Ledger
	// KeepOpen leaves the ledger open on Close (the daemon owns it).
	KeepOpen bool
}

var _ Reader = (*Local)(nil)

// Meta returns the ledger's meta.
func (r *Local) Meta(context.Context) (ledger.Meta, error) { return r.L.Meta(), nil }

// List returns the matching records.
func (r *Local) List(_ context.Context, f ledger.Filter) ([]ledger.Record, error) { return r.L.List(f) }

// Get returns one record.
func (r *Local) Get(_ context.Context, uid string) (ledger.Record, error) { return r.L.Get(uid) }

// History returns one pod's history.
func (r *Local) History(_ context.Context, uid string) ([]ledger.Event, error) {
	return r.L.History(uid)
}

// HistoryPage reads one page of every pod's history.
func (r *Local) HistoryPage(_ context.Context, after string, pods int) (ledger.HistoryPage, error) {
	return r.L.HistoryPage(after, pods)
}

// AllHistory merges every pod's history by time, read page by page.
func (r *Local) AllHistory(ctx context.Context) ([]ledger.Event, error) {
	return allHistory(ctx, r)
}

// allHistory walks every page of r's history, each page one short read on
// the ledger's side, and sorts the events by time.
func allHistory(ctx context.Context, r Reader) ([]ledger.Event, error) {
	var all []ledger.Event
	after := ""
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		p, err := r.HistoryPage(ctx, after, ledger.DefaultHistoryPagePods)
		if err != nil {
			return nil, err
		}
		all = append(all, p.Events...)
		if p.Next == "" {
			break
		}
		if p.Next <= after {
			return nil, fmt.Errorf("history from %s: the page after %q names %q as the next: the cursor went backwards", r.Source(), after, p.Next)
		}
		after = p.Next
	}
	slices.SortStableFunc(all, func(a, b ledger.Event) int { return a.Time.Compare(b.Time) })
	return all, nil
}

// Stats summarises the ledger.
func (r *Local) Stats(context.Context) (ledger.Stats, error) { return r.L.Stats() }

// Verify checks the ledger.
func (r *Local) Verify(context.Context) ([]ledger.Problem, error) { return r.L.Verify() }

// Sandboxes returns every sandbox; a file of schema 1 has none.
func (r *Local) Sandboxes(context.Context) ([]ledger.Sandbox, error) {
	ss, err := r.L.ListSandboxes()
	if errors.Is(err, ledger.ErrSchema) {
		return nil, nil
	}
	return ss, err
}

// Sandbox returns one sandbox.
func (r *Local) Sandbox(_ context.Context, id string) (ledger.Sandbox, error) {
	s, err := r.L.GetSandbox(id)
	if errors.Is(err, ledger.ErrSchema) {
		return s, fmt.Errorf("sandbox %s: %w", id, ledger.ErrNotFound)
	}
	return s, err
}

// SandboxHistory returns one sandbox's history.
func (r *Local) SandboxHistory(_ context.Context, id string) ([]ledger.SandboxEvent, error) {
	es, err := r.L.SandboxHistory(id)
	if errors.Is(err, ledger.ErrSchema) {
		return nil, fmt.Errorf("history of sandbox %s: %w", id, ledger.ErrNotFound)
	}
	return es, err
}

// Source names the file.
func (r *Local) Source() string {
	if r.L.ReadOnly() {
		return "file " + r.L.Path() + " (read-only)"
	}
	return "file " + r.L.Path()
}

// Close closes the ledger unless KeepOpen.
func (r *Local) Close() error {
	if r.KeepOpen {
		return nil
	}
	return r.L.Close()
}

// SocketPath is where the daemon holding ledgerPath serves this API.
func SocketPath(ledgerPath string) string { return ledgerPath + ".sock" }

// DefaultDialTimeout bounds how long a client waits for a daemon to answer.
const DefaultDialTimeout = 3 * time.Second
