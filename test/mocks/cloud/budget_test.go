package cloud

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func newManualClock() *testClock {
	return &testClock{now: time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)}
}

func TestBudgetBurstThenRefillPerSecond(t *testing.T) {
	clk := newManualClock()
	b := NewBudget(clk.Now, map[string]Limit{"read": {Burst: 100, Refill: 20, Per: time.Second}})

	for i := range 100 {
		require.True(t, b.Take("read", Charge{Class: "read"}).OK, "call %d is within the burst", i+1)
	}
	refused := b.Take("read", Charge{Class: "read"})
	assert.False(t, refused.OK, "the 101st call in the same instant is refused")
	assert.Equal(t, 50*time.Millisecond, refused.Wait, "one token comes back every 1/20 s")
	assert.Equal(t, 1, refused.RetryAfterSeconds(), "Retry-After never says 0")

	clk.Advance(49 * time.Millisecond)
	assert.False(t, b.Take("read", Charge{Class: "read"}).OK, "0.98 of a token is not a token")
	clk.Advance(time.Millisecond)
	assert.True(t, b.Take("read", Charge{Class: "read"}).OK, "after 50ms one token is back")

	// One second refills 20, and no more: the 21st call is refused.
	clk.Advance(time.Second)
	for i := range 20 {
		require.True(t, b.Take("read", Charge{Class: "read"}).OK, "refilled call %d", i+1)
	}
	assert.False(t, b.Take("read", Charge{Class: "read"}).OK)

	// A long idle time fills the bucket to its size, not beyond.
	clk.Advance(time.Hour)
	tokens, ok := b.Tokens("read", "")
	require.True(t, ok)
	assert.InDelta(t, 100, tokens, 1e-9)

	assert.Equal(t, map[string]float64{"read": 0}, b.LowWater(), "the bucket was emptied")
	c := b.Counts()["read"]
	assert.Equal(t, ClassCount{Calls: 124, Throttled: 3}, c)
	assert.Equal(t, int64(3), b.Throttled())
	b.ResetCounts()
	assert.Empty(t, b.Counts())
	assert.Empty(t, b.LowWater())
	require.True(t, b.Take("read", Charge{Class: "read"}).OK)
	assert.Equal(t, map[string]float64{"read": 99}, b.LowWater())
	tokens, _ = b.Tokens("read", "")
	assert.InDelta(t, 99, tokens, 1e-9, "resetting counts leaves the buckets alone")
}

func TestBudgetPerMinuteRefillAndRetryAfter(t *testing.T) {
	clk := newManualClock()
	// Azure's VM writes: 1,500 in the bucket, 500 a minute back.
	b := NewBudget(clk.Now, map[string]Limit{"write": {Burst: 1500, Refill: 500, Per: time.Minute}})
	for range 1500 {
		require.True(t, b.Take("write", Charge{Class: "write"}).OK)
	}
	r := b.Take("write", Charge{Class: "write"})
	require.False(t, r.OK)
	assert.Equal(t, 120*time.Millisecond, r.Wait, "500 a minute is one token per 120ms")

	clk.Advance(30 * time.Second)
	tokens, _ := b.Tokens("write", "")
	assert.InDelta(t, 250, tokens, 1e-9, "half a minute gives back half of 500")
	for range 250 {
		require.True(t, b.Take("write", Charge{Class: "write"}).OK)
	}
	assert.False(t, b.Take("write", Charge{Class: "write"}).OK)
}

func TestBudgetPerKeyBucketsAndAllOrNothing(t *testing.T) {
	clk := newManualClock()
	b := NewBudget(clk.Now, map[string]Limit{
		"get":    {Burst: 1000, Refill: 1000, Per: time.Minute},
		"get-vm": {Burst: 3, Refill: 12, Per: time.Minute},
	})
	get := func(vm string) Take {
		return b.Take("get", Charge{Class: "get"}, Charge{Class: "get-vm", Key: vm})
	}
	for range 3 {
		require.True(t, get("a").OK)
	}
	r := get("a")
	require.False(t, r.OK, "vm a's own bucket is empty")
	assert.Equal(t, 5*time.Second, r.Wait, "12 a minute is one every 5s")
	assert.Equal(t, []int64{997, 0}, r.Remaining, "the refused call took nothing from the subscription's bucket")
	assert.True(t, get("b").OK, "vm b has a bucket of its own")

	clk.Advance(5 * time.Second)
	r = get("a")
	assert.True(t, r.OK)
	assert.Equal(t, []int64{999, 0}, r.Remaining, "5s refilled the subscription bucket to its top")

	// Several tokens at once, as a launch of several instances costs.
	b2 := NewBudget(clk.Now, map[string]Limit{"launch": {Burst: 10, Refill: 2, Per: time.Second}})
	assert.True(t, b2.Take("run", Charge{Class: "launch", Tokens: 8}).OK)
	r = b2.Take("run", Charge{Class: "launch", Tokens: 4})
	assert.False(t, r.OK)
	assert.Equal(t, time.Second, r.Wait, "2 tokens short at 2 a second")
	assert.Equal(t, 1, r.RetryAfterSeconds())
	r = b2.Take("run", Charge{Class: "launch", Tokens: 11})
	assert.False(t, r.OK, "more than the bucket holds is never granted")

	// A class without a limit is free.
	r = b2.Take("other", Charge{Class: "unmetered"})
	assert.True(t, r.OK)
	assert.Equal(t, []int64{-1}, r.Remaining)
	assert.Equal(t, ClassCount{Calls: 3, Throttled: 2}, b2.Counts()["run"])
}

func TestBudgetRetryAfterRoundsUp(t *testing.T) {
	clk := newManualClock()
	b := NewBudget(clk.Now, map[string]Limit{"list": {Burst: 1, Refill: 300, Per: time.Minute}})
	require.True(t, b.Take("list", Charge{Class: "list"}).OK)
	r := b.Take("list", Charge{Class: "list"})
	assert.Equal(t, 200*time.Millisecond, r.Wait)
	assert.Equal(t, 1, r.RetryAfterSeconds())

	slow := NewBudget(clk.Now, map[string]Limit{"x": {Burst: 1, Refill: 1, Per: 90 * time.Second}})
	require.True(t, slow.Take("x", Charge{Class: "x"}).OK)
	clk.Advance(time.Second)
	r = slow.Take("x", Charge{Class: "x"})
	assert.Equal(t, 89*time.Second, r.Wait)
	assert.Equal(t, 89, r.RetryAfterSeconds())
}

func TestBudgetIsSafeForConcurrentUse(t *testing.T) {
	b := NewBudget(nil, map[string]Limit{"read": {Burst: 50, Refill: 1, Per: time.Hour}})
	var wg sync.WaitGroup
	var mu sync.Mutex
	granted := 0
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 20 {
				if b.Take("read", Charge{Class: "read"}).OK {
					mu.Lock()
					granted++
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	assert.Equal(t, 50, granted, "exactly the burst is granted (the refill in the test's time is far below a token)")
	assert.Equal(t, ClassCount{Calls: 160, Throttled: 110}, b.Counts()["read"])
}
