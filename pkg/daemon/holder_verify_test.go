package daemon

import (
	"context"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/pkg/handover"
	"github.com/caa-project/caa/pkg/holder"
)

// askHolder serves n's hand-over socket and asks it as me.
func askHolder(t *testing.T, n *nodeDaemon, me handover.Peer) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	path := filepath.Join(t.TempDir(), "ledger.handover.sock")
	ln, err := handover.Listen(path)
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	go func() { _ = ln.Serve(ctx, n.handle) }()
	ho, err := handover.Ask(ctx, path, me)
	if ho != nil {
		ho.Close()
	}
	return err
}

// TestUnverifiableAskerIsRefused: a caa outside a pod (no POD_NAMESPACE)
// can verify no asker; before, it handed the ledger to any local process
// that asked (a second caa started by hand took it over).
func TestUnverifiableAskerIsRefused(t *testing.T) {
	n := &nodeDaemon{log: slog.New(slog.DiscardHandler), f: &Options{}}
	n.unverifiedAskers("POD_NAMESPACE is not set")
	n.takeRequests(make(chan *handover.Request, 1))
	err := askHolder(t, n, handover.Peer{Pod: "caa-by-hand"})
	require.ErrorIs(t, err, handover.ErrRefused)
	assert.ErrorContains(t, err, "cannot verify who asks")

	n.f.handoverUnverified = true // tests, by-hand runs: the explicit opt-in
	n.unverifiedAskers("POD_NAMESPACE is not set")
	got := make(chan *handover.Request, 1)
	n.takeRequests(got)
	go func() { r := <-got; r.Refuse("test: seen") }()
	err = askHolder(t, n, handover.Peer{Pod: "caa-by-hand"})
	assert.ErrorContains(t, err, "test: seen", "the request reached the holder")
}

// TestCooldownKeysOnVerifiedIdentity: a failed hand-over cools down the
// identity the verifier vouched for, not the name the asker gave. Before,
// the cooldown was looked up (and recorded) by the asker's own words.
func TestCooldownKeysOnVerifiedIdentity(t *testing.T) {
	n := &nodeDaemon{log: slog.New(slog.DiscardHandler), f: &Options{}, gate: holder.Gate{Cooldown: time.Hour}}
	// The verifier vouches for the pod the kernel or the apiserver says the
	// asker runs in, whatever it claims.
	n.verify = func(_ context.Context, r *handover.Request) (string, error) { return "uid-" + r.From.Namespace, nil }
	got := make(chan *handover.Request, 4)
	n.takeRequests(got)
	// Ended by a channel of its own: closing got could race with a send
	// the race detector cannot order (the answer comes back through the
	// kernel).
	done := make(chan struct{})
	go func() {
		for {
			select {
			case r := <-got:
				r.Refuse("test: reached the holder, verified " + r.Verified)
			case <-done:
				return
			}
		}
	}()
	t.Cleanup(func() { close(done) })

	// A local process (verified as uid-intruder) named the real new pod and
	// failed its hand-over: the cooldown is the intruder's.
	n.gate.Failed("uid-intruder", "went away", time.Now())
	err := askHolder(t, n, handover.Peer{Pod: "caa-new", UID: "uid-intruder", Namespace: "real"})
	assert.ErrorContains(t, err, "reached the holder, verified uid-real", "the real pod is not refused for the intruder's failure")
	err = askHolder(t, n, handover.Peer{Pod: "caa-new", UID: "uid-real", Namespace: "intruder"})
	assert.ErrorContains(t, err, "failed a hand-over", "the intruder stays refused whatever it names")
}
