package relayd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"time"
)

// Client calls a relay daemon's control socket.
type Client struct {
	// Socket is the control socket's path (caa's --relay-socket).
	Socket string
	// Timeout bounds a call other than Reach (default 10 s).
	Timeout time.Duration
}

// ErrUnavailable wraps a failure to reach the daemon at all (not running,
// socket missing), as opposed to an error it answered with.
var ErrUnavailable = errors.New("relay daemon unavailable")

// Do sends one request and returns the answer; an answered error is
// returned as an error too.
func (c *Client) Do(ctx context.Context, req Request) (Response, error) {
	timeout := c.Timeout
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	if req.Op == OpReach {
		timeout = max(timeout, req.Wait+5*time.Second)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", c.Socket)
	if err != nil {
		return Response{}, fmt.Errorf("%w: %s: %w (is `caa relay` running on this node?)", ErrUnavailable, c.Socket, err)
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	if err := json.NewEncoder(conn).Encode(req); err != nil {
		return Response{}, fmt.Errorf("%w: send %s: %w", ErrUnavailable, req.Op, err)
	}
	var resp Response
	if err := json.NewDecoder(conn).Decode(&resp); err != nil {
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return Response{}, fmt.Errorf("%w: %s: no answer: %w", ErrUnavailable, req.Op, err)
	}
	if resp.Error != "" {
		return resp, fmt.Errorf("relay daemon: %s %s: %s", req.Op, req.Sandbox, resp.Error)
	}
	return resp, nil
}

// Serve asks the daemon to serve sandbox's agent socket (idempotent).
func (c *Client) Serve(ctx context.Context, sandbox, socket, addr, serverName string) (Response, error) {
	return c.Do(ctx, Request{Op: OpServe, Sandbox: sandbox, Socket: socket, Addr: addr, ServerName: serverName})
}

// Stop asks the daemon to close sandbox's socket and connections.
func (c *Client) Stop(ctx context.Context, sandbox string) error {
	_, err := c.Do(ctx, Request{Op: OpStop, Sandbox: sandbox})
	return err
}

// List returns what the daemon serves and its boot id.
func (c *Client) List(ctx context.Context) ([]Entry, string, error) {
	resp, err := c.Do(ctx, Request{Op: OpList})
	return resp.Entries, resp.Boot, err
}

// Reach waits until the daemon reaches sandbox's forwarder (the agent's
// health check answers through a mutual-TLS connection), for up to ctx's
// deadline (30 s without one).
func (c *Client) Reach(ctx context.Context, sandbox string) error {
	wait := 30 * time.Second
	if dl, ok := ctx.Deadline(); ok {
		wait = time.Until(dl)
	}
	if wait <= 0 {
		return fmt.Errorf("relay daemon: reach %s: %w", sandbox, context.DeadlineExceeded)
	}
	_, err := c.Do(ctx, Request{Op: OpReach, Sandbox: sandbox, Wait: wait})
	if err != nil && ctx.Err() != nil {
		return fmt.Errorf("%w: %w", ctx.Err(), err)
	}
	return err
}
