package main

import (
	"context"
	"encoding/json"
	"os"
	"path"
	"sync"

	"github.com/containerd/ttrpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Calls is the JSON the counter writes: per method (the ttrpc method name,
// "CreateContainer"), how often it was answered, failed or unimplemented.
type Calls struct {
	Served        map[string]int `json:"served"`
	Failed        map[string]int `json:"failed"`
	Unimplemented map[string]int `json:"unimplemented"`
}

// counter counts the calls and rewrites its file after each one.
type counter struct {
	file string
	mu   sync.Mutex
	c    Calls
}

func newCounter(file string) *counter {
	return &counter{file: file, c: Calls{Served: map[string]int{}, Failed: map[string]int{}, Unimplemented: map[string]int{}}}
}

// intercept is the server's unary interceptor: every call passes it.
func (c *counter) intercept(ctx context.Context, unmarshal ttrpc.Unmarshaler, info *ttrpc.UnaryServerInfo, method ttrpc.Method) (any, error) {
	resp, err := method(ctx, unmarshal)
	name := path.Base(info.FullMethod)
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case err == nil:
		c.c.Served[name]++
	case status.Code(err) == codes.Unimplemented:
		c.c.Unimplemented[name]++
	default:
		c.c.Failed[name]++
	}
	c.write()
	return resp, err
}

// write replaces the file in one rename, so a reader never sees half of it.
func (c *counter) write() {
	if c.file == "" {
		return
	}
	b, err := json.Marshal(c.c)
	if err != nil {
		return
	}
	tmp := c.file + ".tmp"
	if os.WriteFile(tmp, b, 0o644) == nil {
		_ = os.Rename(tmp, c.file)
	}
}

// unimplemented is the answer to a call the stand-in does not serve.
func unimplemented(method string) error {
	return status.Errorf(codes.Unimplemented, "kata agent stand-in: %s is not implemented", method)
}
