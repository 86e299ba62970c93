package ledger

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const (
	crashChildEnv = "CAA_LEDGER_CRASH_CHILD" // the ledger path the child writes
	crashSeedEnv  = "CAA_LEDGER_CRASH_SEED"  // replay a run: the seed it logged
)

// TestCrashChild is the writer TestCrashDurability kills. Without its
// variable it does nothing. It acknowledges every Put on stdout only after
// Put has returned, so an acknowledged write is one caa would act on.
func TestCrashChild(t *testing.T) {
	path := os.Getenv(crashChildEnv)
	if path == "" {
		return
	}
	seed, err := strconv.ParseUint(os.Getenv(crashSeedEnv), 10, 64)
	require.NoError(t, err)
	l, err := Open(Options{Path: path, Node: testNode, Cluster: testCluster, Timeout: 5 * time.Second})
	require.NoError(t, err)
	// No Close: the parent kills this process mid-write.
	recs, err := l.List(Filter{})
	require.NoError(t, err)
	epoch := l.Meta().OpenEpoch
	rng := rand.New(rand.NewPCG(seed, epoch))

	// Bounded, so a child whose parent died does not write forever.
	deadline := time.Now().Add(30 * time.Second)
	for i := 0; i < 10000 && time.Now().Before(deadline); i++ {
		vm := fmt.Sprintf("i-e%d-%d", epoch, i)
		var r Record
		k := -1
		if len(recs) == 0 || rng.IntN(3) == 0 {
			r = withVM(podRecord(fmt.Sprintf("pod-e%d-%d", epoch, i)), vm)
		} else {
			k = rng.IntN(len(recs))
			r = recs[k]
			r.Attempt++
			r.Phase = Phases[rng.IntN(len(Phases))]
			r.VMID = vm // move the VM so the index changes too
		}
		stored, err := l.Put(r)
		require.NoError(t, err)
		if k >= 0 {
			recs[k] = stored
		} else {
			recs = append(recs, stored)
		}
		_, err = os.Stdout.Write([]byte("ack " + stored.PodUID + " " + strconv.FormatUint(stored.Revision, 10) + "\n"))
		require.NoError(t, err)
	}
	t.Errorf("the child was never killed")
}

func TestCrashDurability(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv(crashSeedEnv); s != "" {
		var err error
		seed, err = strconv.ParseUint(s, 10, 64)
		require.NoError(t, err)
	}
	t.Logf("seed %d (set %s to replay)", seed, crashSeedEnv)
	rng := rand.New(rand.NewPCG(seed, 0))
	path := filepath.Join(t.TempDir(), "ledger.db")

	const rounds = 20
	known := map[string]uint64{} // what the ledger holds, as far as acks tell
	totalAcks := 0
	for round := range rounds {
		killAfter := 1 + rng.IntN(200)
		acks := runAndKill(t, path, seed+uint64(round), killAfter)
		t.Logf("round %d: killed after %d acks (%d read in all)", round, killAfter, len(acks))
		require.GreaterOrEqual(t, len(acks), killAfter)
		totalAcks += len(acks)

		acked := map[string]uint64{}
		for _, a := range acks {
			acked[a.uid] = max(acked[a.uid], a.rev)
		}
		l, err := Open(Options{Path: path, Node: testNode, Cluster: testCluster, ReadOnly: true, Timeout: 5 * time.Second})
		require.NoError(t, err, "round %d: reopen after the kill", round)
		for uid, rev := range acked {
			r, err := l.Get(uid)
			if assert.NoError(t, err, "round %d: acknowledged %s@%d is lost", round, uid, rev) {
				assert.GreaterOrEqual(t, r.Revision, rev, "round %d: %s went back from acknowledged revision %d", round, uid, rev)
			}
		}
		recs, err := l.List(Filter{})
		require.NoError(t, err)
		// At most the one write in flight at the kill is unacknowledged.
		unacked := 0
		for _, r := range recs {
			want := max(known[r.PodUID], acked[r.PodUID])
			if r.Revision != want {
				assert.Equal(t, want+1, r.Revision, "round %d: %s", round, r.PodUID)
				unacked++
			}
			known[r.PodUID] = r.Revision
		}
		assert.LessOrEqual(t, unacked, 1, "round %d: more writes landed than were in flight", round)
		assert.Len(t, recs, len(known), "round %d: a record disappeared", round)
		probs, err := l.Verify()
		require.NoError(t, err)
		assert.Empty(t, probs, "round %d", round)
		require.NoError(t, l.Close())
		if t.Failed() {
			t.FailNow()
		}
	}

	l, err := Open(Options{Path: path, Node: testNode, Cluster: testCluster, Timeout: 5 * time.Second})
	require.NoError(t, err)
	defer func() { require.NoError(t, l.Close()) }()
	assert.Equal(t, uint64(rounds+1), l.Meta().OpenEpoch, "every child opened the file once")
	assertVerifies(t, l)
	t.Logf("%d acknowledged writes over %d kills, %d records", totalAcks, rounds, len(known))
}

type ack struct {
	uid string
	rev uint64
}

// runAndKill starts a writer on path, SIGKILLs it once it has acknowledged
// killAfter writes, and returns every acknowledgement it printed.
func runAndKill(t *testing.T, path string, seed uint64, killAfter int) []ack {
	t.Helper()
	// A hang guard only: the kill comes from the acks. Under a loaded -race
	// run a child took over 30s to reach its kill point and was killed by
	// this timeout instead, which the test rightly refuses.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := childTest(ctx, "TestCrashChild", crashChildEnv+"="+path, crashSeedEnv+"="+strconv.FormatUint(seed, 10))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())

	var acks []ack
	var other strings.Builder
	killed := false
	r := bufio.NewReader(stdout)
	for {
		line, err := r.ReadString('\n')
		if errors.Is(err, io.EOF) {
			break // a line cut short by the kill is no acknowledgement
		}
		require.NoError(t, err)
		f := strings.Fields(line)
		if len(f) != 3 || f[0] != "ack" {
			other.WriteString(line)
			continue
		}
		rev, err := strconv.ParseUint(f[2], 10, 64)
		require.NoError(t, err, "ack line %q", line)
		acks = append(acks, ack{f[1], rev})
		if len(acks) == killAfter && !killed {
			require.NoError(t, cmd.Process.Kill())
			killed = true
		}
	}
	err = cmd.Wait()
	require.True(t, killed, "the child stopped after %d acks by itself (%v):\n%s%s", len(acks), err, other.String(), stderr.String())
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit)
	status, ok := exit.Sys().(syscall.WaitStatus)
	require.True(t, ok)
	require.True(t, status.Signaled() && status.Signal() == syscall.SIGKILL,
		"the child must die of the SIGKILL, not of its own error (%v):\n%s%s", err, other.String(), stderr.String())
	return acks
}
