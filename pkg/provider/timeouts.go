package provider

import (
	"context"
	"time"
)

// The default per-call timeouts of the cloud providers. Each provider's
// Config has a ReadTimeout and a WriteTimeout that override them.
const (
	// DefaultReadTimeout bounds one read: a Get, one page of a List, a
	// lookup before a create.
	DefaultReadTimeout = 30 * time.Second
	// DefaultWriteTimeout bounds one create or delete call, with the wait
	// for its long-running operation where the cloud has one.
	DefaultWriteTimeout = 2 * time.Minute
)

// CallContext bounds one cloud call: ctx with a deadline timeout from now
// (def when timeout is not positive). A sooner deadline of ctx stays. The
// call, its SDK retries included, then ends with context.DeadlineExceeded
// instead of hanging on a cloud that stopped answering.
func CallContext(ctx context.Context, timeout, def time.Duration) (context.Context, context.CancelFunc) {
	if timeout <= 0 {
		timeout = def
	}
	return context.WithTimeout(ctx, timeout)
}
