package cloud

import (
	"maps"
	"math"
	"sync"
	"time"
)

// Limit is one published token bucket: it holds at most Burst tokens, a
// call takes one (or more, see Charge), and it gains Refill tokens every
// Per, continuously. A bucket nobody has used yet is full.
type Limit struct {
	Burst  float64
	Refill float64
	Per    time.Duration
}

// PerSecond is a bucket of burst tokens refilling refill a second.
func PerSecond(burst, refill float64) Limit {
	return Limit{Burst: burst, Refill: refill, Per: time.Second}
}

// PerMinute is a bucket of burst tokens refilling refill a minute.
func PerMinute(burst, refill float64) Limit {
	return Limit{Burst: burst, Refill: refill, Per: time.Minute}
}

// perSecond is the refill rate in tokens per second.
func (l Limit) perSecond() float64 {
	if l.Per <= 0 {
		return 0
	}
	return l.Refill / l.Per.Seconds()
}

// Charge is what one call costs one bucket: Tokens (1 when 0) from the
// bucket of limit Class, the account-wide one when Key is empty, else the
// one kept for Key (a bucket per VM, say).
type Charge struct {
	Class  string
	Key    string
	Tokens float64
}

// Take is a Budget's answer to one call.
type Take struct {
	// OK: every bucket had the tokens and they were taken.
	OK bool
	// Wait, when refused, is how long until every charged bucket would
	// have the tokens the call asked for.
	Wait time.Duration
	// Remaining is each charged bucket's whole tokens after the call, in
	// the order of the charges.
	Remaining []int64
}

// RetryAfterSeconds is Wait in whole seconds for a Retry-After header:
// rounded up, and at least 1.
func (t Take) RetryAfterSeconds() int {
	return max(1, int(math.Ceil(t.Wait.Seconds())))
}

// ClassCount is what a Budget saw of one class of calls.
type ClassCount struct {
	Calls     int64 `json:"calls"`
	Throttled int64 `json:"throttled"`
}

type bucketKey struct{ class, key string }

type bucket struct {
	tokens float64
	at     time.Time
}

// Budget enforces a cloud's published request limits: token buckets by
// operation class, account-wide or per resource. Front ends classify each
// call and ask Take; a refused call gets the cloud's throttling reply. It
// counts calls and refusals by class. Safe for concurrent use.
type Budget struct {
	now    func() time.Time
	limits map[string]Limit

	mu      sync.Mutex
	buckets map[bucketKey]*bucket
	counts  map[string]ClassCount
	// low is the fewest tokens any bucket of a class held after a call.
	low map[string]float64
}

// NewBudget returns a budget over limits (by class name) on the clock now
// (time.Now when nil).
func NewBudget(now func() time.Time, limits map[string]Limit) *Budget {
	if now == nil {
		now = time.Now
	}
	return &Budget{now: now, limits: maps.Clone(limits), buckets: map[bucketKey]*bucket{}, counts: map[string]ClassCount{}, low: map[string]float64{}}
}

// Limits returns the limits by class.
func (b *Budget) Limits() map[string]Limit { return maps.Clone(b.limits) }

// Take counts one call of class and charges every bucket in charges, all or
// nothing: if one bucket lacks the tokens, none is charged and the call is
// refused. A charge whose class has no limit is free.
func (b *Budget) Take(class string, charges ...Charge) Take {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.now()
	out := Take{OK: true, Remaining: make([]int64, len(charges))}
	type step struct {
		b    *bucket
		cost float64
	}
	steps := make([]step, len(charges))
	for i, ch := range charges {
		lim, ok := b.limits[ch.Class]
		if !ok {
			out.Remaining[i] = -1
			continue
		}
		bk := b.refill(bucketKey{ch.Class, ch.Key}, lim, now)
		cost := ch.Tokens
		if cost <= 0 {
			cost = 1
		}
		steps[i] = step{bk, cost}
		if bk.tokens >= cost {
			continue
		}
		out.OK = false
		wait := time.Duration(math.MaxInt64)
		if rate := lim.perSecond(); rate > 0 && cost <= lim.Burst {
			wait = time.Duration(math.Ceil((cost - bk.tokens) / rate * float64(time.Second)))
		}
		out.Wait = max(out.Wait, wait)
	}
	c := b.counts[class]
	c.Calls++
	if !out.OK {
		c.Throttled++
	}
	b.counts[class] = c
	for i, s := range steps {
		if s.b == nil {
			continue
		}
		if out.OK {
			s.b.tokens -= s.cost
		}
		out.Remaining[i] = int64(math.Floor(s.b.tokens))
		if low, seen := b.low[charges[i].Class]; !seen || s.b.tokens < low {
			b.low[charges[i].Class] = s.b.tokens
		}
	}
	return out
}

// refill returns the bucket for k with the tokens it gained since it was
// last touched.
func (b *Budget) refill(k bucketKey, lim Limit, now time.Time) *bucket {
	bk, ok := b.buckets[k]
	if !ok {
		bk = &bucket{tokens: lim.Burst, at: now}
		b.buckets[k] = bk
		return bk
	}
	if gap := now.Sub(bk.at); gap > 0 {
		bk.tokens = min(lim.Burst, bk.tokens+gap.Seconds()*lim.perSecond())
		bk.at = now
	}
	return bk
}

// Tokens is what the bucket of class and key holds now (the limit's Burst
// for a bucket never charged); ok is false for a class with no limit.
func (b *Budget) Tokens(class, key string) (tokens float64, ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	lim, ok := b.limits[class]
	if !ok {
		return 0, false
	}
	k := bucketKey{class, key}
	if _, seen := b.buckets[k]; !seen {
		return lim.Burst, true
	}
	return b.refill(k, lim, b.now()).tokens, true
}

// Drain takes every token of class's account-wide bucket without a
// request (the take counts under the class "test-drain"), so a test can
// start from an empty bucket.
func (b *Budget) Drain(class string) {
	tokens, _ := b.Tokens(class, "")
	b.Take("test-drain", Charge{Class: class, Tokens: tokens})
}

// Counts returns calls and refusals by class.
func (b *Budget) Counts() map[string]ClassCount {
	b.mu.Lock()
	defer b.mu.Unlock()
	return maps.Clone(b.counts)
}

// Throttled is how many calls of any class were refused.
func (b *Budget) Throttled() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	var n int64
	for _, c := range b.counts {
		n += c.Throttled
	}
	return n
}

// LowWater is, by bucket class, the fewest tokens a bucket of the class
// held right after a call since the budget was made or its counts reset:
// how close the calls came to a refusal (0 or less: they reached it).
// Classes no call charged are absent.
func (b *Budget) LowWater() map[string]float64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return maps.Clone(b.low)
}

// ResetCounts zeroes the counts and the low-water marks; the buckets keep
// their tokens.
func (b *Budget) ResetCounts() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.counts = map[string]ClassCount{}
	b.low = map[string]float64{}
}
