package cloud

import (
	"slices"
	"strconv"
	"strings"
	"time"
)

// The core keeps its instances and side resources indexed by tag, so that a
// front end answering a listing filtered by tag (EC2's tag: filters, a
// Resource Graph query's where on tags, a Global Search tags: term) touches
// the resources that hold the tag, not the whole account. A real cloud
// answers such a query from an index on its own hardware; a fake that
// walked every VM per query made the benchmarks count an account's size
// against caa.
//
// The index is a narrowing, never the answer: it is keyed by tag key and
// value both in lower case, so it holds a superset of what any exact or
// case-blind comparison accepts, and the front end still applies its own
// test (case, operator, visibility) to every candidate.

// TagTerm asks for what holds the tag Key with one of Values. The core
// compares without case; the caller decides exactly.
type TagTerm struct {
	Key    string
	Values []string
}

func tagSlot(k, v string) string { return strings.ToLower(k) + "\x00" + strings.ToLower(v) }

// indexInstance files a new instance under each of its tags. Tags never
// change after Create, and instances stay in the core for good, so the
// lists only grow, in creation order.
func (c *Cloud) indexInstance(in *Instance) {
	if c.byTag == nil {
		c.byTag = map[string][]*Instance{}
	}
	for k, v := range in.Tags {
		slot := tagSlot(k, v)
		if l := c.byTag[slot]; len(l) > 0 && l[len(l)-1] == in {
			continue // two keys alike but for case, with values alike
		}
		c.byTag[slot] = append(c.byTag[slot], in)
	}
}

// candidates are the instances that may pass terms, in creation order: those
// of the term with the fewest. ok is false when terms narrow nothing.
func (c *Cloud) candidates(terms []TagTerm) (out []*Instance, ok bool) {
	if len(terms) == 0 {
		return nil, false
	}
	best, slots := -1, 0
	for _, t := range terms {
		var got []*Instance
		seen := map[string]bool{}
		for _, v := range t.Values {
			slot := tagSlot(t.Key, v)
			if seen[slot] {
				continue
			}
			seen[slot] = true
			got = append(got, c.byTag[slot]...)
		}
		if best < 0 || len(got) < best {
			best, out, slots = len(got), got, len(seen)
		}
	}
	if slots > 1 {
		// Lists of several values interleave, and an instance with keys
		// alike but for case may be in two: back to creation order, once.
		slices.SortFunc(out, func(a, b *Instance) int { return a.seq - b.seq })
		out = slices.Compact(out)
	}
	return out, true
}

// ListTagged is List over the instances that hold every term's tag with one
// of its values, compared without case (match decides exactly): a page costs
// the candidates, not the cloud. Tokens are List's: a page of one may be
// continued by the other with the same match.
func (c *Cloud) ListTagged(terms []TagTerm, match func(Instance) bool, token string, size int) ([]Instance, string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	from, ok := c.candidates(terms)
	if !ok {
		from = c.order
	}
	return c.listFrom(from, c.matchTerms(terms, match), token, size)
}

// matchTerms adds the terms' own test (without case) to match, so that
// ListTagged never answers wider than its terms whatever match does.
func (c *Cloud) matchTerms(terms []TagTerm, match func(Instance) bool) func(Instance) bool {
	if len(terms) == 0 {
		return match
	}
	return func(in Instance) bool {
		for _, t := range terms {
			if !holds(in.Tags, t) {
				return false
			}
		}
		return match == nil || match(in)
	}
}

func holds(tags map[string]string, t TagTerm) bool {
	for k, v := range tags {
		if strings.EqualFold(k, t.Key) && slices.ContainsFunc(t.Values, func(w string) bool { return strings.EqualFold(v, w) }) {
			return true
		}
	}
	return false
}

// listFrom is List over from, a creation-ordered slice of the instances.
func (c *Cloud) listFrom(from []*Instance, match func(Instance) bool, token string, size int) ([]Instance, string, error) {
	if size <= 0 || size > c.opts.PageSize {
		size = c.opts.PageSize
	}
	after := 0
	if token != "" {
		n, err := strconv.Atoi(token)
		if err != nil || n < 0 {
			return nil, "", errBadToken(token)
		}
		after = n
	}
	now := c.opts.Now()
	first, _ := slices.BinarySearchFunc(from, after+1, func(in *Instance, seq int) int { return in.seq - seq })
	var page []Instance
	for _, in := range from[first:] {
		if !c.visible(in, now) {
			continue
		}
		if match != nil && !match(c.peek(in, now)) {
			continue
		}
		if len(page) == size {
			return page, strconv.Itoa(page[len(page)-1].seq), nil
		}
		page = append(page, c.view(in, now))
	}
	return page, "", nil
}

// ResourcesTagged is Resources of kind ("" for all) that hold every term's
// tag, compared without case, sorted by id.
func (c *Cloud) ResourcesTagged(kind string, terms []TagTerm) []Resource {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(terms) == 0 {
		return c.resourcesLocked(kind)
	}
	var from map[string]*Resource
	for _, t := range terms {
		got := map[string]*Resource{}
		for _, v := range t.Values {
			for id, r := range c.resByTag[tagSlot(t.Key, v)] {
				got[id] = r
			}
		}
		if from == nil || len(got) < len(from) {
			from = got
		}
	}
	var out []Resource
	for _, r := range from {
		if (kind == "" || r.Kind == kind) && !slices.ContainsFunc(terms, func(t TagTerm) bool { return !holds(r.Tags, t) }) {
			out = append(out, *r)
		}
	}
	slices.SortFunc(out, func(a, b Resource) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// indexResource files r under its tags; unindexResource takes it out.
func (c *Cloud) indexResource(r *Resource) {
	if c.resByTag == nil {
		c.resByTag = map[string]map[string]*Resource{}
	}
	for k, v := range r.Tags {
		slot := tagSlot(k, v)
		if c.resByTag[slot] == nil {
			c.resByTag[slot] = map[string]*Resource{}
		}
		c.resByTag[slot][r.ID] = r
	}
}

func (c *Cloud) unindexResource(r *Resource) {
	for k, v := range r.Tags {
		slot := tagSlot(k, v)
		delete(c.resByTag[slot], r.ID)
		if len(c.resByTag[slot]) == 0 {
			delete(c.resByTag, slot)
		}
	}
}

// Version says whether what the cloud shows can have changed: gen moves
// with every change to its instances, side resources and fault knobs, and
// quiet is false while a change driven by the clock alone may be pending
// (an instance still booting or not yet visible, a terminated one still
// shown). A front end may serve again an answer it made at (gen, quiet
// true) while Version still returns that gen, as far as the core goes.
func (c *Cloud) Version() (gen uint64, quiet bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.gen, !c.opts.Now().Before(c.quietAt)
}

// changed records a change: a new generation, and the time until which
// the clock alone may still change what it changed (zero: none).
func (c *Cloud) changed(until time.Time) {
	c.gen++
	if until.After(c.quietAt) {
		c.quietAt = until
	}
}
