package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// stream is a short go test -json run: two packages, one failing test, a
// subtest and a line of plain text from the build.
const stream = `{"Time":"2026-12-06T09:00:00Z","Action":"start","Package":"a"}
{"Time":"2026-12-06T09:00:00Z","Action":"run","Package":"a","Test":"TestSlow"}
{"Time":"2026-12-06T09:00:01Z","Action":"output","Package":"a","Test":"TestSlow","Output":"=== RUN   TestSlow\n"}
{"Time":"2026-12-06T09:00:09Z","Action":"pass","Package":"a","Test":"TestSlow/sub","Elapsed":8}
{"Time":"2026-12-06T09:00:09Z","Action":"pass","Package":"a","Test":"TestSlow","Elapsed":9}
{"Time":"2026-12-06T09:00:09Z","Action":"pass","Package":"a","Test":"TestQuick","Elapsed":0.01}
{"Time":"2026-12-06T09:00:10Z","Action":"output","Package":"a","Output":"PASS\n"}
{"Time":"2026-12-06T09:00:10Z","Action":"output","Package":"a","Output":"ok  \ta\t10.0s\n"}
{"Time":"2026-12-06T09:00:10Z","Action":"pass","Package":"a","Elapsed":10}
plain text from go vet
{"Time":"2026-12-06T09:00:01Z","Action":"output","Package":"b","Test":"TestBroken","Output":"    b_test.go:9: wrong\n"}
{"Time":"2026-12-06T09:00:02Z","Action":"output","Package":"b","Test":"TestBroken","Output":"--- FAIL: TestBroken (2.00s)\n"}
{"Time":"2026-12-06T09:00:02Z","Action":"fail","Package":"b","Test":"TestBroken","Elapsed":2}
{"Time":"2026-12-06T09:00:20Z","Action":"output","Package":"b","Output":"FAIL\tb\t3.0s\n"}
{"Time":"2026-12-06T09:00:20Z","Action":"fail","Package":"b","Elapsed":3}
`

// A passing test's lines are dropped and a failing one's kept, as go test
// without -v prints them.
func TestReadPrintsAsGoTestAndTimes(t *testing.T) {
	var out bytes.Buffer
	s, err := read(strings.NewReader(stream), &out)
	require.NoError(t, err)
	assert.Equal(t, "ok  \ta\t10.0s\nplain text from go vet\n    b_test.go:9: wrong\n--- FAIL: TestBroken (2.00s)\nFAIL\tb\t3.0s\n", out.String())
	assert.True(t, s.Failed)
	assert.Equal(t, []timing{{"a", "", 10, "pass"}, {"b", "", 3, "fail"}}, s.Packages)
	// subtests are left out: their time is their parent's
	assert.Equal(t, []timing{{"a", "TestSlow", 9, "pass"}, {"a", "TestQuick", 0.01, "pass"}, {"b", "TestBroken", 2, "fail"}}, s.Tests)
	assert.Equal(t, "20s", s.Last.Sub(s.First).String())
}

func TestRunReportsAndFails(t *testing.T) {
	dir := t.TempDir()
	load := filepath.Join(dir, "load")
	require.NoError(t, os.WriteFile(load, []byte("1.50 0.75 0.20 2/300 4242\n"), 0o600))
	rep := filepath.Join(dir, "report.md")
	var out bytes.Buffer
	err := run(strings.NewReader(stream), &out, rep, 2, load)
	require.ErrorIs(t, err, errFailed)
	b, err := os.ReadFile(rep)
	require.NoError(t, err)
	md := string(b)
	assert.Contains(t, md, "load average before: 1.50 0.75 0.20")
	assert.Contains(t, md, "Wall time from the first event to the last: 20s")
	assert.Contains(t, md, "| a | 10.0 | pass |\n| b | 3.0 | fail |")
	// top 2: the slowest two, slowest first; the quick one left out
	assert.Contains(t, md, "| TestSlow | a | 9.0 | pass |\n| TestBroken | b | 2.0 | fail |\n")
	assert.NotContains(t, md, "TestQuick")
}

func TestRunPassesWhenAllPass(t *testing.T) {
	ok := `{"Action":"pass","Package":"a","Test":"TestX","Elapsed":1}
{"Action":"pass","Package":"a","Elapsed":1}
`
	var out bytes.Buffer
	require.NoError(t, run(strings.NewReader(ok), &out, "", 30, ""))
}

func TestBuildFailureFails(t *testing.T) {
	bf := `{"ImportPath":"a","Action":"build-output","Output":"a/x.go:1: syntax error\n"}
{"ImportPath":"a","Action":"build-fail"}
`
	var out bytes.Buffer
	require.ErrorIs(t, run(strings.NewReader(bf), &out, "", 30, ""), errFailed)
	assert.Equal(t, "a/x.go:1: syntax error\n", out.String())
}

// A failed test's testify reports come again at the end, without the
// logs around them; a test without one is named with where to look.
func TestFailuresAreRepeatedAtTheEnd(t *testing.T) {
	ev := func(test, out string) string {
		b, err := json.Marshal(map[string]string{"Action": "output", "Package": "p", "Test": test, "Output": out})
		require.NoError(t, err)
		return string(b) + "\n"
	}
	in := ev("TestA", "=== RUN   TestA\n") +
		ev("TestA", "    a_test.go:7: a log line\n") +
		ev("TestA", "    a_test.go:9: \n") +
		ev("TestA", "        \tError Trace:\t/src/a_test.go:9\n") +
		ev("TestA", "        \tError:      \tCondition never satisfied\n") +
		ev("TestA", "        \tTest:       \tTestA\n") +
		ev("TestA", "        \tMessages:   \tthe pod runs\n") +
		ev("TestA", "    cluster.go:80: apiserver log "+strings.Repeat("x", 600)+"\n") +
		ev("TestA", "--- FAIL: TestA (1.00s)\n") +
		`{"Action":"fail","Package":"p","Test":"TestA","Elapsed":1}` + "\n" +
		ev("TestB", "    b_test.go:3: boom\n") +
		`{"Action":"fail","Package":"p","Test":"TestB","Elapsed":1}` + "\n" +
		// A subtest's report is the subtest's, and its parent, which
		// has none of its own, is not listed apart.
		ev("TestC/sub", "    c_test.go:5: \n") +
		ev("TestC/sub", "        \tError Trace:\t/src/c_test.go:5\n") +
		ev("TestC/sub", "        \tError:      \tShould be true\n") +
		`{"Action":"fail","Package":"p","Test":"TestC/sub","Elapsed":1}` + "\n" +
		ev("TestC", "--- FAIL: TestC (1.00s)\n") +
		`{"Action":"fail","Package":"p","Test":"TestC","Elapsed":1}` + "\n" +
		`{"Action":"fail","Package":"p","Elapsed":2}` + "\n"
	var out bytes.Buffer
	require.ErrorIs(t, run(strings.NewReader(in), &out, "", 30, ""), errFailed)
	got := out.String()
	i := strings.Index(got, "testtimes: the failed tests' assertions, again:")
	require.Positive(t, i, "a summary after the output:\n%s", got)
	assert.Equal(t, `testtimes: the failed tests' assertions, again:
--- TestA (p)
    a_test.go:9: 
        	Error:      	Condition never satisfied
        	Test:       	TestA
        	Messages:   	the pod runs
--- TestB (p)
    no testify report (t.Fatal or a panic): its output is above
--- TestC/sub (p)
    c_test.go:5: 
        	Error:      	Should be true
`, got[i:])
}

func TestAssertionsClipLongLines(t *testing.T) {
	got := assertions([]string{"    x_test.go:1: \n", "        \tError Trace:\tx\n", "        \tError:      \t" + strings.Repeat("y", 2*maxLineLen) + "\n"})
	require.Len(t, got, 2)
	assert.Len(t, got[1], maxLineLen+len(" [...]"))
}
