package main

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestS10BoundIsTheBudgetsScheduleAndTheLastCalls(t *testing.T) {
	res := []s10Result{{starts: []time.Duration{time.Second, 18 * time.Second, 19 * time.Second}, startErrs: make([]error, 3),
		startCalls: map[string]int64{"create": 100, "get": 100}, stopCalls: map[string]int64{"delete": 100}}}
	rows := s10Rows(s10Case{name: "100 at once"}, 100, 4*time.Millisecond, res)
	assert.Equal(t, "every StartVM answered", rows[0].Metric)
	// (100 - 10) / 5 a second, then RunInstances and the read, then a relayed call.
	assert.InDelta(t, 18000+100+4, rows[0].Bound, 0.001)
	assert.Equal(t, []float64{19000}, rows[0].Runs, "the last answer")
	assert.Equal(t, []float64{1000}, rows[1].Runs, "the first")
	assert.Equal(t, []float64{1}, rows[3].Runs, "creates per sandbox")
	assert.Equal(t, []float64{1}, rows[4].Runs, "reads per sandbox: the read that sees it run (a fresh key is not looked up)")

	spent := s10Rows(s10Case{name: "spent", spent: true}, 100, 4*time.Millisecond, res)
	// The account's bucket, empty, gives back 5 a second: 100 / 5.
	assert.InDelta(t, 20000+100+4, spent[0].Bound, 0.001)
}

func TestThrottleTextFindsWhatKataWouldSee(t *testing.T) {
	assert.True(t, throttleText(errors.New("rpc error: code = Internal desc = sandbox x: create its VM: aws create: throttled: RequestLimitExceeded")))
	assert.False(t, throttleText(errors.New("sandbox x: pod gone")))
}

func TestS11RowsPerSandboxAndGrowth(t *testing.T) {
	samples := map[int][2]procSample{
		0:   {{anon: 10000, rss: 30000, fds: 20, goroutines: 50}, {anon: 3000, rss: 9000, fds: 8}},
		100: {{anon: 20000, rss: 45000, fds: 320, goroutines: 450, heapAlloc: 6000, heapKept: 11000}, {anon: 13000, rss: 20000, fds: 308}},
	}
	// The warm-up left 3,000 KiB more in caa (a high-water mark); the
	// measured cycles add 1,000 KiB above that.
	warm := [2]procSample{{anon: 23000, rss: 48000, fds: 320, goroutines: 450, heapAlloc: 6050, heapKept: 13000}, {anon: 13200, rss: 20000, fds: 308}}
	after := [2]procSample{{anon: 24000, rss: 49000, fds: 321, goroutines: 452, heapAlloc: 6150, heapKept: 16000}, {anon: 13500, rss: 20000, fds: 308}}
	rows := s11Rows([]int{0, 100}, samples, 100, 1000, warm, after, 0)
	byName := map[string]Row{}
	for _, r := range rows {
		byName[r.Case+": "+r.Metric] = r
	}
	assert.Equal(t, []float64{100}, byName["caa, per sandbox (0 to 100): RSS anonymous"].Runs)
	assert.Equal(t, "pass", byName["caa, per sandbox (0 to 100): RSS anonymous"].Result())
	assert.Equal(t, []float64{4}, byName["caa, per sandbox (0 to 100): goroutines"].Runs)
	assert.Equal(t, []float64{3}, byName["caa relay, per sandbox (0 to 100): open files"].Runs)
	growth := "caa, growth over 1000 cycles (100 slots), from after the warm-up: "
	assert.Equal(t, []float64{1000}, byName[growth+"RSS anonymous"].Runs)
	assert.Equal(t, "pass", byName[growth+"RSS anonymous"].Result())
	assert.Equal(t, []float64{2}, byName[growth+"goroutines"].Runs)
	assert.Equal(t, "pass", byName[growth+"goroutines"].Result())
	assert.Equal(t, []float64{100}, byName[growth+"Go heap allocated (go_memstats_heap_alloc_bytes)"].Runs)
	assert.Equal(t, []float64{3000}, byName[growth+"Go heap kept from the OS (heap_sys - heap_released)"].Runs)

	// A cost per cycle shows above the warm-up's mark and misses.
	leak := after
	leak[0].anon = warm[0].anon + 3000
	rows = s11Rows([]int{0, 100}, samples, 100, 1000, warm, leak, 0)
	for _, r := range rows {
		if r.Case+": "+r.Metric == growth+"RSS anonymous" {
			assert.Equal(t, "MISS", r.Result())
		}
	}

	// The warm-up's rise is reported against the reading before it.
	wr := map[string]Row{}
	for _, r := range s11WarmRows(samples[100], warm, 100, 200) {
		wr[r.Case+": "+r.Metric] = r
	}
	assert.Equal(t, []float64{3000}, wr["caa, rise over the warm-up (200 cycles, 100 side by side): RSS anonymous"].Runs)
	assert.Equal(t, []float64{200}, wr["caa relay, rise over the warm-up (200 cycles, 100 side by side): RSS anonymous"].Runs)
	assert.False(t, wr["caa, rise over the warm-up (200 cycles, 100 side by side): RSS anonymous"].HasLimit)
	_, hasObjects := wr["caa, rise over the warm-up (200 cycles, 100 side by side): Go heap objects"]
	assert.False(t, hasObjects)

	// The last half's rows: the same differences, with caa's heap objects.
	hr := map[string]Row{}
	for _, r := range s11HalfRows(warm, after, 100, 500) {
		hr[r.Case+": "+r.Metric] = r
	}
	assert.Equal(t, []float64{1000}, hr["caa, growth over the last 500 cycles (100 slots): RSS anonymous"].Runs)
	assert.Equal(t, []float64{100}, hr["caa, growth over the last 500 cycles (100 slots): Go heap allocated (go_memstats_heap_alloc_bytes)"].Runs)
	assert.Contains(t, hr, "caa, growth over the last 500 cycles (100 slots): Go heap objects")
	assert.Equal(t, []float64{300}, hr["caa relay, growth over the last 500 cycles (100 slots): RSS anonymous"].Runs)
	assert.NotContains(t, hr, "caa relay, growth over the last 500 cycles (100 slots): Go heap objects")
}
