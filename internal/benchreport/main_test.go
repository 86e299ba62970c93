package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const sampleOutput = `goos: linux
BenchmarkOpenScan100k-2   	       5	 150000000 ns/op	       150.0 ms/op
BenchmarkOpenScan100k-2   	       5	 170000000 ns/op	       170.0 ms/op
BenchmarkOpenScan100k-2   	       5	 160000000 ns/op	       160.0 ms/op
BenchmarkPutBatched-2     	      10	  10000000 ns/op	      4000 records/s
BenchmarkPutDurable-2     	     100	   4000000 ns/op
BenchmarkFsyncFloor-2     	     100	   1000000 ns/op
BenchmarkList/10k-2       	      10	  20000000 ns/op	  1000 B/op	  10 allocs/op
PASS
`

func TestParseGroupsRunsByNameAndUnit(t *testing.T) {
	s, order, err := parse(strings.NewReader(sampleOutput))
	require.NoError(t, err)
	assert.Equal(t, []string{"BenchmarkOpenScan100k", "BenchmarkPutBatched", "BenchmarkPutDurable", "BenchmarkFsyncFloor", "BenchmarkList/10k"}, order)
	assert.Equal(t, []float64{150, 170, 160}, s["BenchmarkOpenScan100k"]["ms/op"])
	assert.Equal(t, []float64{10}, s["BenchmarkList/10k"]["allocs/op"])
}

func TestReportJudgesTargetsOnTheMedian(t *testing.T) {
	s, order, err := parse(strings.NewReader(sampleOutput))
	require.NoError(t, err)
	var out bytes.Buffer
	failed := report(&out, s, order)
	assert.Equal(t, 2, failed, "4000 records/s misses 5000; 4x the floor misses 3x")
	text := out.String()
	assert.Contains(t, text, "| OpenScan100k | ms/op | 3 | 150 | 160 | 170 |")
	assert.Regexp(t, `open \+ full scan.*\| 160 ms/op \| <= 200 ms/op .*\| pass \|`, text)
	assert.Regexp(t, `batched durable writes.*\| 4000 records/s \| >= 5000 records/s .*\| MISS \|`, text)
	assert.Regexp(t, `durable single put.*\| 4.00 ms/op \| <= 3x bound \| 1.00 ms/op \| 4.00x \| MISS \|`, text)
}

func TestPerCallBoundUsesTheBenchmarksOwnCalls(t *testing.T) {
	s, order, err := parse(strings.NewReader(`BenchmarkAWS/latency=50ms/List1000-2  2  600000000 ns/op  10.00 calls/op
BenchmarkAWS/latency=50ms/List1000-2  2  620000000 ns/op  10.00 calls/op
`))
	require.NoError(t, err)
	var out bytes.Buffer
	report(&out, s, order)
	assert.Contains(t, out.String(), "| AWS List1000 at 50 ms/call (bound: calls/op x 50 ms) | 610 ms/op | - | 500 ms/op | 1.22x | measured |")
}

func TestStatsMedianOfEvenCount(t *testing.T) {
	lo, med, hi := stats([]float64{4, 1, 3, 2})
	assert.Equal(t, []float64{1, 2.5, 4}, []float64{lo, med, hi})
}
