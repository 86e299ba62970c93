package cloud

import "sync"

// DocCache keeps the documents a front end rendered from the core (a search
// index's or a resource graph's JSON objects), by a key that changes with
// the document, usually the JSON it was decoded from. A large listing
// rendered every VM again, decode included, and that was most of its time
// in the fakes: time a real cloud's index does not spend on the request,
// and that a benchmark would count against caa. Documents handed out are
// shared: callers never write to them (copy the levels they change).
//
// The cache holds two generations: Turn (or the current one growing past
// Max entries) drops what the generation before did not use.
type DocCache struct {
	// Max bounds one generation; 0 means 40,000.
	Max int

	mu        sync.Mutex
	cur, prev map[string]map[string]any
}

// Turn starts a generation. A front end that renders everything at once
// calls it before each rendering.
func (c *DocCache) Turn() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.prev, c.cur = c.cur, make(map[string]map[string]any, len(c.cur))
}

// Get returns the document cached under key, or builds and caches it.
func (c *DocCache) Get(key string, build func() map[string]any) map[string]any {
	c.mu.Lock()
	d, ok := c.cur[key]
	if !ok {
		if d, ok = c.prev[key]; ok {
			c.put(key, d)
		}
	}
	c.mu.Unlock()
	if ok {
		return d
	}
	d = build()
	c.mu.Lock()
	c.put(key, d)
	c.mu.Unlock()
	return d
}

func (c *DocCache) put(key string, d map[string]any) {
	limit := c.Max
	if limit <= 0 {
		limit = 40000
	}
	if len(c.cur) >= limit {
		c.prev, c.cur = c.cur, nil
	}
	if c.cur == nil {
		c.cur = map[string]map[string]any{}
	}
	c.cur[key] = d
}
