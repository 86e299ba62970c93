package ledger

import (
	"encoding/binary"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"
)

func sandboxRecord(id string) Sandbox {
	return Sandbox{
		ID: id, PodUID: "uid-" + id, Namespace: "default", Name: "pod-" + id,
		NetNS: "/var/run/netns/cni-" + id, Phase: SandboxCreated,
	}
}

func TestSandboxRoundTripKeepsEveryField(t *testing.T) {
	l, _ := newTestLedger(t)
	s := sandboxRecord("sb1")
	s.Provider, s.VMID, s.VMName, s.Key = "aws", "i-1", "podvm-x", "sb-key-a1"
	s.InstanceType, s.Image, s.IPs = "t3.small", "ami-1", []string{"10.0.0.7"}
	s.AgentSocket, s.RelayAddr = "/run/peerpod/pods/sb1/agent.ttrpc", "10.0.0.7:15150"
	s.Tunnel = Tunnel{VXLANID: 555001, Port: 4789, LocalIP: "10.0.0.2", RemoteIP: "10.0.0.7"}
	s.CertSerials = []string{"0a1b", "0c2d"}
	s.Phase, s.Reason, s.Message, s.Attempt = SandboxRunning, "Started", "agent reachable", 2
	stored, err := l.PutSandbox(s)
	require.NoError(t, err)
	got, err := l.GetSandbox("sb1")
	require.NoError(t, err)
	assert.Equal(t, stored, got)
	assert.Equal(t, testNode, got.Node)
	assert.Equal(t, uint64(1), got.Revision)

	// A field a newer caa wrote survives this caa's update.
	got.unknown = appendString(nil, 900, "from a newer caa")
	got.Phase = SandboxDeleting
	again, err := l.PutSandbox(got)
	require.NoError(t, err)
	back, err := l.GetSandbox("sb1")
	require.NoError(t, err)
	assert.True(t, hasField(back.unknown, 900))
	assert.Equal(t, again.Revision, back.Revision)
}

func TestSandboxCompareAndSetAndOneVMOneSandbox(t *testing.T) {
	l, _ := newTestLedger(t)
	a, err := l.PutSandbox(sandboxRecord("a"))
	require.NoError(t, err)
	_, err = l.PutSandbox(sandboxRecord("a"))
	require.ErrorIs(t, err, ErrAlreadyExists)
	stale := a
	a.Phase = SandboxCreating
	_, err = l.PutSandbox(a)
	require.NoError(t, err)
	_, err = l.PutSandbox(stale)
	require.ErrorIs(t, err, ErrConflict, "a stale revision loses")

	b := sandboxRecord("b")
	b.Provider, b.VMID = "aws", "i-9"
	_, err = l.PutSandbox(b)
	require.NoError(t, err)
	c := sandboxRecord("c")
	c.Provider, c.VMID = "aws", "i-9"
	_, err = l.PutSandbox(c)
	require.ErrorIs(t, err, ErrConflict, "one VM belongs to one sandbox")

	bad := sandboxRecord("d")
	bad.Phase = "Sleeping"
	_, err = l.PutSandbox(bad)
	require.ErrorIs(t, err, ErrInvalid)
}

func TestSandboxDeleteKeepsHistoryAndPruneDropsIt(t *testing.T) {
	l, clock := newTestLedger(t)
	s, err := l.PutSandbox(sandboxRecord("sb"))
	require.NoError(t, err)
	s.Phase = SandboxDeleting
	s, err = l.PutSandbox(s)
	require.NoError(t, err)
	require.ErrorIs(t, l.DeleteSandbox("sb", s.Revision-1), ErrConflict)
	require.NoError(t, l.DeleteSandbox("sb", s.Revision))
	_, err = l.GetSandbox("sb")
	require.ErrorIs(t, err, ErrNotFound)
	hist, err := l.SandboxHistory("sb")
	require.NoError(t, err)
	require.Len(t, hist, 3)
	assert.Equal(t, []Action{ActionCreated, ActionUpdated, ActionDeleted}, []Action{hist[0].Action, hist[1].Action, hist[2].Action})

	live, err := l.PutSandbox(sandboxRecord("live"))
	require.NoError(t, err)
	n, err := l.PruneSandboxHistory(clock.Now().Add(-time.Hour))
	require.NoError(t, err)
	assert.Zero(t, n, "history newer than the cut stays")
	clock.Advance(48 * time.Hour)
	n, err = l.PruneSandboxHistory(clock.Now().Add(-time.Hour))
	require.NoError(t, err)
	assert.Equal(t, 1, n, "only the deleted sandbox's history goes")
	_, err = l.SandboxHistory("sb")
	require.ErrorIs(t, err, ErrNotFound)
	_, err = l.SandboxHistory(live.ID)
	require.NoError(t, err, "a live sandbox keeps its history however old")
}

func TestDecodeSandboxNeverPanics(t *testing.T) {
	good := encodeSandbox(sandboxRecord("x"))
	for i := range good {
		_, _ = decodeSandbox(good[:i])
	}
	_, err := decodeSandbox([]byte{9})
	assert.Error(t, err)
}

// testMigrationSandboxes: a schema-1 file holding today's pod records
// opens under this build, gains the sandbox buckets, keeps every record
// byte for byte, and takes sandboxes.
func testMigrationSandboxes(t *testing.T) {
	clock := newClock()
	opts := testOptions(t, clock)
	l := openLedger(t, opts)
	r := mustPut(t, l, withVM(podRecord("uid-1"), "i-1"))
	require.NoError(t, l.Close())
	// Take the file back to what a schema-1 caa wrote.
	var before []byte
	rawUpdate(t, opts.Path, func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketSandboxes, bucketSandboxHistory} {
			require.NoError(t, tx.DeleteBucket(b))
		}
		before = append([]byte(nil), tx.Bucket(bucketRecords).Get([]byte(r.PodUID))...)
		return tx.Bucket(bucketMeta).Put(keySchema, binary.BigEndian.AppendUint32(nil, 1))
	})
	rawView(t, opts.Path, func(tx *bolt.Tx) error {
		assert.Nil(t, tx.Bucket(bucketSandboxes))
		return nil
	})

	l2 := openLedger(t, opts)
	assert.Equal(t, 2, l2.Meta().SchemaVersion)
	got, err := l2.Get(r.PodUID)
	require.NoError(t, err)
	assert.Equal(t, r, got, "today's records are untouched")
	_, err = l2.PutSandbox(sandboxRecord("sb"))
	require.NoError(t, err)
	list, err := l2.ListSandboxes()
	require.NoError(t, err)
	assert.Len(t, list, 1)
	require.NoError(t, l2.Close())
	rawView(t, opts.Path, func(tx *bolt.Tx) error {
		assert.Equal(t, before, tx.Bucket(bucketRecords).Get([]byte(r.PodUID)))
		assert.Equal(t, 1, int(binary.BigEndian.Uint32(tx.Bucket(bucketMeta).Get(keyCompat))), "additive: compat stays at 1, an older caa still opens the file")
		return nil
	})
}

// Verify checks the sandboxes as it checks the pod records: a clean ledger
// has no problem, and each kind of damage is named where it is.
func TestVerifyChecksSandboxes(t *testing.T) {
	l, _ := newTestLedger(t)
	run := sandboxRecord("sb-run")
	run.Provider, run.VMID, run.Phase = "aws", "i-run", SandboxRunning
	run.AgentSocket, run.RelayAddr = "/run/peerpod/pods/sb-run/agent.ttrpc", "10.0.0.7:15150"
	run.Tunnel = Tunnel{VXLANID: 555000, Port: 4789}
	_, err := l.PutSandbox(run)
	require.NoError(t, err)
	other := sandboxRecord("sb-other")
	other.Tunnel = Tunnel{VXLANID: 555001, Port: 4789}
	_, err = l.PutSandbox(other)
	require.NoError(t, err)
	probs, err := l.Verify()
	require.NoError(t, err)
	assert.Empty(t, probs, "a sound ledger")

	// Damage written past PutSandbox's checks, as a bug or a bad disk would.
	bad := func(s Sandbox) []byte {
		if s.Node == "" {
			s.Node = testNode
		}
		return encodeSandbox(s)
	}
	half := run
	half.ID, half.VMID, half.RelayAddr, half.Tunnel.VXLANID = "sb-half", "", "", 0
	dupVM := run
	dupVM.ID, dupVM.Tunnel.VXLANID = "sb-dup", 555009
	dupVX := other
	dupVX.ID = "sb-vx"
	noKey := sandboxRecord("sb-nokey")
	noKey.Phase = SandboxCreating
	elsewhere := sandboxRecord("sb-else")
	elsewhere.Node = "node-b"
	require.NoError(t, l.update(func(btx *bolt.Tx) error {
		b := btx.Bucket(bucketSandboxes)
		for k, v := range map[string][]byte{
			"sb-half": bad(half), "sb-dup": bad(dupVM), "sb-vx": bad(dupVX), "sb-nokey": bad(noKey), "sb-else": bad(elsewhere),
			"sb-moved": bad(sandboxRecord("sb-elsewhere")), "sb-junk": {0x7f, 1, 2},
		} {
			if err := b.Put([]byte(k), v); err != nil {
				return err
			}
		}
		hb, err := btx.Bucket(bucketSandboxHistory).CreateBucketIfNotExists([]byte("sb-junk"))
		if err != nil {
			return err
		}
		return hb.Put(seqKey(1), []byte{0x01, 0xff})
	}))
	probs, err = l.Verify()
	require.NoError(t, err)
	got := map[string]string{}
	for _, p := range probs {
		got[p.Where] += p.What + "; "
	}
	assert.Contains(t, got["sandboxes/sb-half"], "cannot be served again")
	assert.Contains(t, got["sandboxes/sb-run"], "VM aws/i-run is also recorded for sandbox sb-dup")
	assert.Contains(t, got["sandboxes/sb-vx"], "VXLAN id 555001 is also sandbox sb-other's")
	assert.Contains(t, got["sandboxes/sb-nokey"], "idempotency key")
	assert.Contains(t, got["sandboxes/sb-else"], "node-b")
	assert.Contains(t, got["sandboxes/sb-moved"], `holds sandbox id "sb-elsewhere"`)
	assert.Contains(t, got["sandboxes/sb-junk"], "does not decode")
	assert.Contains(t, got["sandboxHistory/sb-junk/0000000000000001"], "does not decode")
	assert.Len(t, got, 8, "%v", got)
}

// A VM recorded both for a pod (informer mode) and for a sandbox is named.
func TestVerifyNamesAVMOfBothAPodAndASandbox(t *testing.T) {
	l, _ := newTestLedger(t)
	_, err := l.Put(Record{PodUID: "uid-1", Namespace: "default", Name: "web", Phase: PhaseRunning, Provider: "aws", VMID: "i-1", Key: "uid-1-a1", Attempt: 1})
	require.NoError(t, err)
	s := sandboxRecord("sb-1")
	s.Provider, s.VMID, s.Phase = "aws", "i-1", SandboxLost
	_, err = l.PutSandbox(s)
	require.NoError(t, err)
	probs, err := l.Verify()
	require.NoError(t, err)
	require.Len(t, probs, 1)
	assert.Equal(t, "sandboxes/sb-1", probs[0].Where)
	assert.Contains(t, probs[0].What, "also recorded for pod uid-1")
}

func TestValidSandboxID(t *testing.T) {
	long := strings.Repeat("a", MaxSandboxIDLen)
	for _, tc := range []struct {
		id   string
		want bool
	}{
		{"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", true},
		{"a", true},
		{"Pod-1_x.y", true},
		{long, true},
		{long + "a", false},
		{"", false},
		{"-a", false},
		{".a", false},
		{"_a", false},
		{"a/b", false},
		{"../x", false},
		{"a b", false},
		{"a\x00", false},
		{"é", false},
		{"a:b", false},
	} {
		assert.Equal(t, tc.want, ValidSandboxID(tc.id), "%q", tc.id)
	}
}
