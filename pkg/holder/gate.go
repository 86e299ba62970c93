package holder

import (
	"fmt"
	"sync"
	"time"
)

// Gate decides which hand-over requests reach the holder. It is closed
// (every request refused with a reason) except while the caa holds the
// ledger and reconciles; a pod whose hand-over failed is refused for the
// cooldown, so a container the kubelet restarts costs the node no second
// gap. Safe for concurrent use.
type Gate struct {
	Cooldown time.Duration

	mu      sync.Mutex
	open    bool
	refusal string
	failed  map[string]failure // by pod (its UID when known, else its name)
}

type failure struct {
	reason string
	until  time.Time
}

// Open lets requests through.
func (g *Gate) Open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.open, g.refusal = true, ""
}

// Close refuses every request with reason.
func (g *Gate) Close(reason string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.open, g.refusal = false, reason
}

// Failed records that the hand-over to pod failed at now, for reason.
func (g *Gate) Failed(pod, reason string, now time.Time) {
	if pod == "" {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.failed == nil {
		g.failed = map[string]failure{}
	}
	g.failed[pod] = failure{reason: reason, until: now.Add(g.Cooldown)}
}

// Admit reports whether a request from pod may go to the holder at now,
// and if not, why (a sentence the asker shows on its readiness).
func (g *Gate) Admit(pod string, now time.Time) (bool, string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.open {
		return false, g.refusal
	}
	if f, ok := g.failed[pod]; ok {
		if now.Before(f.until) {
			return false, fmt.Sprintf("pod %s failed a hand-over (%s); it is refused until %s: roll back, or delete the pod to try a new one at once",
				pod, f.reason, f.until.UTC().Format(time.RFC3339))
		}
		delete(g.failed, pod)
	}
	return true, ""
}
