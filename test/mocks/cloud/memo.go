package cloud

import "sync"

// Stamp is what a front end's answer depends on beyond its request: the
// core's generation (Version) and the front end's own (its writes and
// controls). An answer made at one stamp may be served again only at the
// same stamp.
type Stamp [2]uint64

// Memo keeps values a front end made at one Stamp, by key (the request):
// a value made at another stamp is never returned. It holds at most Max
// values (0: 64), the pages of a few listings; past that it starts again.
type Memo[V any] struct {
	Max int

	mu    sync.Mutex
	stamp Stamp
	vals  map[string]V
}

// Get returns the value kept for key at stamp.
func (m *Memo[V]) Get(key string, stamp Stamp) (V, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.stamp != stamp {
		var zero V
		return zero, false
	}
	v, ok := m.vals[key]
	return v, ok
}

// Put keeps v for key at stamp, forgetting what was kept at another.
func (m *Memo[V]) Put(key string, stamp Stamp, v V) {
	m.mu.Lock()
	defer m.mu.Unlock()
	limit := m.Max
	if limit <= 0 {
		limit = 64
	}
	if m.vals == nil || m.stamp != stamp || len(m.vals) >= limit {
		m.stamp, m.vals = stamp, map[string]V{}
	}
	m.vals[key] = v
}
