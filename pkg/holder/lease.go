package holder

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"
)

// LeasePath is the lease file of the ledger at ledgerPath.
func LeasePath(ledgerPath string) string { return ledgerPath + ".lease" }

// Lease is what the caa holding the ledger says about itself, beside the
// ledger, renewed while its reconcile loop is alive. A caa waiting on the
// file lock reads it to say who holds the lock and whether that holder
// still makes progress. It is never a reason to break the lock: only the
// holder's process ending frees the lock (the kernel drops it), so a hung
// holder is waited for, live, with the reason on readiness, until its own
// probes restart it.
type Lease struct {
	Holder   string    `json:"holder"` // the holder's pod, pid and version
	PID      int       `json:"pid"`
	Renewed  time.Time `json:"renewed"`
	Deadline time.Time `json:"deadline"`
}

// WriteLease replaces the lease file atomically (write, then rename).
func WriteLease(path string, l Lease) error {
	data, err := json.Marshal(l)
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return fmt.Errorf("lease %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("lease %s: %w", path, err)
	}
	return nil
}

// ReadLease reads the lease file; os.ErrNotExist when there is none.
func ReadLease(path string) (Lease, error) {
	var l Lease
	data, err := os.ReadFile(path)
	if err != nil {
		return l, err
	}
	if err := json.Unmarshal(data, &l); err != nil {
		return l, fmt.Errorf("lease %s: %w", path, err)
	}
	return l, nil
}

// Renew keeps the lease at path for holder until ctx ends, renewing it
// every ttl/3 (LeaseTTL in the daemon) while alive says the holder's loop
// makes progress. A holder that stops (SIGSTOP, a deadlock that stalls
// its loop) stops renewing, and its lease runs out within ttl.
func Renew(ctx context.Context, path, holder string, pid int, ttl time.Duration, alive func() bool) {
	t := time.NewTicker(ttl / 3)
	defer t.Stop()
	for {
		if alive() {
			at := time.Now()
			_ = WriteLease(path, Lease{Holder: holder, PID: pid, Renewed: at, Deadline: at.Add(ttl)})
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// DescribeLockHolder says, for a caa waiting on the ledger's lock at now,
// who holds it according to the lease at path.
func DescribeLockHolder(path string, now time.Time) string {
	l, err := ReadLease(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return "the ledger lock is held by a process that left no lease (a caa without leases, or one that hung before its first renewal)"
	case err != nil:
		return "the ledger lock is held; its lease is unreadable: " + err.Error()
	case now.After(l.Deadline):
		return fmt.Sprintf("the ledger lock is held by %s, whose lease expired %s ago: it is hung (stopped or deadlocked); "+
			"the lock is not broken on a timeout, it frees when that process ends (its pod's probes restart it, or delete that pod)",
			l.Holder, now.Sub(l.Deadline).Round(time.Second))
	}
	return fmt.Sprintf("the ledger lock is held by %s, whose lease was renewed %s ago", l.Holder, now.Sub(l.Renewed).Round(time.Second))
}

// LockWait is how a caa waits for a ledger lock another process holds.
type LockWait struct {
	LeasePath string
	Locked    func(error) bool    // the open failed because the lock is held
	Beat      func(time.Time)     // the liveness heartbeat
	Say       func(reason string) // the readiness reason
	Prefix    string              // what the caa is waiting for, e.g. "taking the ledger back"
	Every     time.Duration       // heartbeat period; HeartbeatEvery when zero
}

// Wait calls open until it returns anything but a locked error, or ctx
// ends. It beats the heartbeat all along (an open blocks up to its own
// timeout) and, after each locked attempt, says who holds the lock by the
// lease. It never breaks the lock: a held lock means a live holder.
func Wait[T any](ctx context.Context, w LockWait, open func(context.Context) (T, error)) (T, error) {
	every := w.Every
	if every <= 0 {
		every = HeartbeatEvery
	}
	bctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			w.Beat(time.Now())
			select {
			case <-bctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	defer func() { stop(); <-done }()
	for {
		began := time.Now()
		v, err := open(ctx)
		if err == nil || !w.Locked(err) || ctx.Err() != nil {
			return v, err
		}
		w.Say(w.Prefix + ": " + DescribeLockHolder(w.LeasePath, time.Now()))
		// An open that gave up at once is paced; one that waited out its
		// own lock timeout is tried again at once.
		if pause := every - time.Since(began); pause > 0 {
			t := time.NewTimer(pause)
			select {
			case <-ctx.Done():
				t.Stop()
				return v, err
			case <-t.C:
			}
		}
	}
}
