package ledgerapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/caa-project/caa/pkg/ledger"
)

// Client reads a ledger from the daemon that holds it.
type Client struct {
	socket string
	hc     *http.Client
}

var _ Reader = (*Client)(nil)

// NewClient talks to the daemon on socket; every request is bounded by
// timeout as well as by its context.
func NewClient(socket string, timeout time.Duration) *Client {
	if timeout <= 0 {
		timeout = DefaultDialTimeout
	}
	dialer := &net.Dialer{Timeout: timeout}
	return &Client{
		socket: socket,
		hc: &http.Client{
			Timeout: timeout,
			Transport: &http.Transport{
				DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
					return dialer.DialContext(ctx, "unix", socket)
				},
				DisableCompression: true,
			},
		},
	}
}

// Meta returns the daemon's ledger meta; it doubles as the liveness probe
// of the socket.
func (c *Client) Meta(ctx context.Context) (m ledger.Meta, err error) {
	err = c.get(ctx, "/v1/meta", &m)
	return m, err
}

// List returns the matching records.
func (c *Client) List(ctx context.Context, f ledger.Filter) ([]ledger.Record, error) {
	q := url.Values{}
	for _, p := range f.Phases {
		q.Add("phase", string(p))
	}
	path := "/v1/records"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	var body recordsBody
	if err := c.get(ctx, path, &body); err != nil {
		return nil, err
	}
	if body.Error != "" {
		return body.Records, fmt.Errorf("%w: %s (from %s)", ledger.ErrCorrupt, body.Error, c.Source())
	}
	return body.Records, nil
}

// Get returns one record.
func (c *Client) Get(ctx context.Context, uid string) (r ledger.Record, err error) {
	err = c.get(ctx, "/v1/records/"+url.PathEscape(uid), &r)
	return r, err
}

// History returns one pod's history.
func (c *Client) History(ctx context.Context, uid string) ([]ledger.Event, error) {
	var body eventsBody
	err := c.get(ctx, "/v1/history/"+url.PathEscape(uid), &body)
	return body.Events, err
}

// HistoryPage returns one page of every pod's history.
func (c *Client) HistoryPage(ctx context.Context, after string, pods int) (ledger.HistoryPage, error) {
	q := url.Values{"pods": {strconv.Itoa(pods)}}
	if after != "" {
		q.Set("after", after)
	}
	var p ledger.HistoryPage
	err := c.get(ctx, "/v1/history?"+q.Encode(), &p)
	return p, err
}

// AllHistory returns every pod's history by time, asking for it page by
// page so that the daemon never reads it all in one transaction.
func (c *Client) AllHistory(ctx context.Context) ([]ledger.Event, error) {
	return allHistory(ctx, c)
}

// Stats summarises the daemon's ledger.
func (c *Client) Stats(ctx context.Context) (s ledger.Stats, err error) {
	err = c.get(ctx, "/v1/stats", &s)
	return s, err
}

// Verify asks the daemon to check its ledger.
func (c *Client) Verify(ctx context.Context) ([]ledger.Problem, error) {
	var body problemsBody
	err := c.get(ctx, "/v1/verify", &body)
	return body.Problems, err
}

// ErrNotServed: the daemon does not know the request (a caa older than
// it); the CLI says so rather than failing.
var ErrNotServed = errors.New("the daemon does not serve this request (it runs an older caa)")

// Sandboxes returns every sandbox record.
func (c *Client) Sandboxes(ctx context.Context) ([]ledger.Sandbox, error) {
	var body sandboxesBody
	if err := c.get(ctx, "/v1/sandboxes", &body); err != nil {
		return nil, err
	}
	if body.Error != "" {
		return body.Sandboxes, fmt.Errorf("%w: %s (from %s)", ledger.ErrCorrupt, body.Error, c.Source())
	}
	return body.Sandboxes, nil
}

// Sandbox returns one sandbox record.
func (c *Client) Sandbox(ctx context.Context, id string) (s ledger.Sandbox, err error) {
	err = c.get(ctx, "/v1/sandboxes/"+url.PathEscape(id), &s)
	return s, err
}

// SandboxHistory returns one sandbox's history.
func (c *Client) SandboxHistory(ctx context.Context, id string) ([]ledger.SandboxEvent, error) {
	var body sandboxEventsBody
	err := c.get(ctx, "/v1/sandboxes/"+url.PathEscape(id)+"/history", &body)
	return body.Events, err
}

// Source names the socket.
func (c *Client) Source() string { return "daemon on " + c.socket }

// Close releases idle connections.
func (c *Client) Close() error {
	c.hc.CloseIdleConnections()
	return nil
}

func (c *Client) get(ctx context.Context, path string, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://caa"+path, nil)
	if err != nil {
		return fmt.Errorf("ledger API %s: %w", path, err)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return fmt.Errorf("ledger API on %s: %w", c.socket, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 512<<20))
	if err != nil {
		return fmt.Errorf("ledger API %s: read reply: %w", path, err)
	}
	if resp.StatusCode != http.StatusOK {
		var eb errorBody
		if json.Unmarshal(data, &eb) != nil || eb.Error == "" {
			if resp.StatusCode == http.StatusNotFound {
				return fmt.Errorf("ledger API %s on %s: %w", path, c.socket, ErrNotServed)
			}
			return fmt.Errorf("ledger API %s: HTTP %d from %s", path, resp.StatusCode, c.socket)
		}
		for _, k := range errorKinds {
			if k.kind == eb.Kind {
				return &remoteError{msg: eb.Error, kind: k.err}
			}
		}
		return errors.New(eb.Error)
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("ledger API %s: decode reply: %w", path, err)
	}
	return nil
}

// remoteError carries the daemon's message and its sentinel kind.
type remoteError struct {
	msg  string
	kind error
}

func (e *remoteError) Error() string { return e.msg }
func (e *remoteError) Unwrap() error { return e.kind }
