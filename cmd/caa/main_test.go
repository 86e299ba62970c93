package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"
	"sigs.k8s.io/yaml"

	"github.com/caa-project/caa/pkg/ledger"
	"github.com/caa-project/caa/pkg/ledger/ledgerapi"
)

// caaBin is the binary under test, built once by TestMain.
var caaBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "caa-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	caaBin = filepath.Join(dir, "caa")
	build := exec.Command("go", "build", "-ldflags", "-X main.version=v0.0.0-test", "-o", caaBin, ".")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build caa:", err)
		os.Exit(1)
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

type result struct {
	code           int
	stdout, stderr string
}

// caa runs the built binary; a hang fails the test instead of the suite.
func caa(t *testing.T, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, caaBin, args...)
	cmd.Env = append(os.Environ(), "CAA_LEDGER=")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	require.NoError(t, ctx.Err(), "caa %v did not finish", args)
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else {
		require.NoError(t, err)
	}
	return result{code: code, stdout: out.String(), stderr: errb.String()}
}

// oneLineError asserts the failure contract: non-zero, nothing on stdout,
// exactly one line on stderr that contains each want.
func oneLineError(t *testing.T, r result, code int, want ...string) {
	t.Helper()
	assert.Equal(t, code, r.code, "exit code; stderr: %s", r.stderr)
	assert.Empty(t, r.stdout)
	assert.Equal(t, 1, strings.Count(r.stderr, "\n"), "one line on stderr, got %q", r.stderr)
	assert.True(t, strings.HasPrefix(r.stderr, "caa: "), r.stderr)
	for _, w := range want {
		assert.Contains(t, r.stderr, w)
	}
}

func shortPath(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "caa")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return filepath.Join(dir, "ledger.db")
}

// fixture writes a ledger with two running pods, one failed, and one
// deleted pod whose history remains.
func fixture(t *testing.T) (path string, l *ledger.Ledger) {
	t.Helper()
	path = shortPath(t)
	l, err := ledger.Open(ledger.Options{Path: path, Node: "worker-1", Cluster: "cluster-x", Timeout: time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	put := func(r ledger.Record) ledger.Record {
		stored, err := l.Put(r)
		require.NoError(t, err)
		return stored
	}
	for _, p := range []struct{ uid, name, vm string }{{"uid-b", "beta", "i-0b"}, {"uid-a", "alpha", "i-0a"}} {
		r := ledger.Record{PodUID: p.uid, Namespace: "team", Name: p.name, RuntimeClass: "kata-remote",
			Provider: "aws", Key: p.uid + "-1", InstanceType: "m6i.large", Phase: ledger.PhaseCreating, Attempt: 1}
		if p.name == "alpha" { // asked to be an SEV-SNP VM; beta is a record from before caa recorded it
			r.InstanceType, r.Confidential = "m6a.large", "sev-snp"
		}
		r = put(r)
		r.VMID, r.Phase, r.IPs = p.vm, ledger.PhaseRunning, []string{"10.0.0.7"}
		put(r)
	}
	put(ledger.Record{PodUID: "uid-f", Namespace: "team", Name: "broken", Phase: ledger.PhaseFailed,
		Reason: "InvalidSpec", Message: "machine_type m9.huge is not allowed", Attempt: 1})
	gone := put(ledger.Record{PodUID: "uid-gone", Namespace: "old", Name: "done", Provider: "aws",
		VMID: "i-0g", Phase: ledger.PhaseRunning, Attempt: 1})
	require.NoError(t, l.Delete(gone.PodUID, gone.Revision))
	return path, l
}

func TestLedgerCommandsOnAFile(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	path, l := fixture(t)
	require.NoError(t, l.Close())

	t.Run("ls table", func(t *testing.T) {
		r := caa(t, "ledger", "ls", "--ledger", path)
		require.Equal(t, 0, r.code, r.stderr)
		lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
		require.Len(t, lines, 4)
		assert.Regexp(t, `^POD\s+NAMESPACE\s+PHASE\s+VM\s+TYPE\s+TEE\s+ATTEMPT\s+AGE$`, lines[0])
		assert.Regexp(t, `^alpha\s+team\s+Running\s+i-0a\s+m6a\.large\s+sev-snp\s+1\s+\d+s$`, lines[1])
		assert.Regexp(t, `^beta\s+team\s+Running\s+i-0b\s+m6i\.large\s+none\s+`, lines[2], "a record from before is read as not confidential")
		assert.Regexp(t, `^broken\s+team\s+Failed\s+-\s+-\s+none\s+1\s+`, lines[3])
	})

	t.Run("ls json and phase filter", func(t *testing.T) {
		r := caa(t, "ledger", "ls", "--ledger", path, "-o", "json", "--phase", "failed")
		require.Equal(t, 0, r.code, r.stderr)
		var recs []ledger.Record
		require.NoError(t, json.Unmarshal([]byte(r.stdout), &recs))
		require.Len(t, recs, 1)
		assert.Equal(t, "InvalidSpec", recs[0].Reason)
	})

	t.Run("ls yaml", func(t *testing.T) {
		r := caa(t, "ledger", "ls", "--ledger", path, "-o", "yaml")
		require.Equal(t, 0, r.code, r.stderr)
		var recs []map[string]any
		require.NoError(t, yaml.Unmarshal([]byte(r.stdout), &recs))
		require.Len(t, recs, 3)
		assert.Equal(t, "uid-a", recs[0]["podUID"])
	})

	t.Run("get by name shows record and history", func(t *testing.T) {
		r := caa(t, "ledger", "get", "team/alpha", "--ledger", path)
		require.Equal(t, 0, r.code, r.stderr)
		assert.Regexp(t, `Pod UID:\s+uid-a`, r.stdout)
		assert.Regexp(t, `VM:\s+i-0a`, r.stdout)
		assert.Regexp(t, `Confidential \(TEE\):\s+sev-snp`, r.stdout)
		assert.Regexp(t, `Revision:\s+2`, r.stdout)
		assert.Contains(t, r.stdout, "History:")
		assert.Regexp(t, `created\s+Creating\s+-\s+1\s+1`, r.stdout)
		assert.Regexp(t, `updated\s+Running\s+i-0a\s+1\s+2`, r.stdout)
	})

	t.Run("get json by uid", func(t *testing.T) {
		r := caa(t, "ledger", "get", "uid-b", "--ledger", path, "-o", "json")
		require.Equal(t, 0, r.code, r.stderr)
		var d struct {
			Record  ledger.Record  `json:"record"`
			History []ledger.Event `json:"history"`
		}
		require.NoError(t, json.Unmarshal([]byte(r.stdout), &d))
		assert.Equal(t, "i-0b", d.Record.VMID)
		assert.Len(t, d.History, 2)
	})

	t.Run("get a deleted pod shows its history", func(t *testing.T) {
		r := caa(t, "ledger", "get", "old/done", "--ledger", path)
		require.Equal(t, 0, r.code, r.stderr)
		assert.Contains(t, r.stdout, "(deleted; history below)")
		assert.Regexp(t, `deleted\s+Running\s+i-0g`, r.stdout)
	})

	t.Run("get unknown pod", func(t *testing.T) {
		oneLineError(t, caa(t, "ledger", "get", "team/nobody", "--ledger", path), 1, "team/nobody", "not found")
	})

	t.Run("history of every pod", func(t *testing.T) {
		r := caa(t, "ledger", "history", "--ledger", path)
		require.Equal(t, 0, r.code, r.stderr)
		lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
		assert.Len(t, lines, 1+7, "header plus 2+2+1+2 events")
		assert.Contains(t, lines[0], "POD")
		assert.Contains(t, r.stdout, "old/done")
	})

	t.Run("export is JSON lines with stable names", func(t *testing.T) {
		r := caa(t, "ledger", "export", "--ledger", path)
		require.Equal(t, 0, r.code, r.stderr)
		sc := bufio.NewScanner(strings.NewReader(r.stdout))
		var n int
		for sc.Scan() {
			var m map[string]any
			require.NoError(t, json.Unmarshal(sc.Bytes(), &m), sc.Text())
			for _, k := range []string{"podUID", "namespace", "name", "node", "phase", "attempt", "createdAt", "updatedAt", "revision"} {
				assert.Contains(t, m, k)
			}
			n++
		}
		assert.Equal(t, 3, n)
		assert.Contains(t, r.stdout, `"idempotencyKey":"uid-a-1"`)
		assert.Contains(t, r.stdout, `"vmID":"i-0a"`)
	})

	t.Run("stats", func(t *testing.T) {
		r := caa(t, "ledger", "stats", "--ledger", path)
		require.Equal(t, 0, r.code, r.stderr)
		assert.Regexp(t, `Node:\s+worker-1`, r.stdout)
		assert.Regexp(t, `Records:\s+3`, r.stdout)
		assert.Regexp(t, `Running:\s+2`, r.stdout)
		assert.Regexp(t, `Indexed VMs:\s+2`, r.stdout)
		r = caa(t, "ledger", "stats", "--ledger", path, "-o", "json")
		var s ledger.Stats
		require.NoError(t, json.Unmarshal([]byte(r.stdout), &s))
		assert.Equal(t, 7, s.HistoryEntries)
	})

	t.Run("verify clean", func(t *testing.T) {
		r := caa(t, "ledger", "verify", "--ledger", path)
		assert.Equal(t, 0, r.code, r.stderr)
		assert.Equal(t, "ok: no problems found\n", r.stdout)
	})

	t.Run("version", func(t *testing.T) {
		r := caa(t, "version")
		assert.Equal(t, "caa v0.0.0-test\n", r.stdout)
	})
}

func TestLedgerVerifyReportsEachProblem(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	path, l := fixture(t)
	require.NoError(t, l.Close())
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	require.NoError(t, err)
	require.NoError(t, db.Update(func(tx *bolt.Tx) error {
		if err := tx.Bucket([]byte("vms")).Delete([]byte("aws\x00i-0a")); err != nil {
			return err
		}
		return tx.Bucket([]byte("records")).Put([]byte("uid-junk"), []byte("not a record"))
	}))
	require.NoError(t, db.Close())

	r := caa(t, "ledger", "verify", "--ledger", path)
	assert.Equal(t, 1, r.code)
	assert.Contains(t, r.stdout, "problem: records/uid-a: VM aws/i-0a is not indexed")
	assert.Contains(t, r.stdout, "problem: records/uid-junk: does not decode")
	assert.Equal(t, "caa: verify: 2 problem(s) in file "+path+" (read-only)\n", r.stderr)

	// ls shows what still decodes and fails loudly about the rest.
	r = caa(t, "ledger", "ls", "--ledger", path)
	assert.Equal(t, 1, r.code)
	assert.Contains(t, r.stdout, "alpha")
	assert.Contains(t, r.stderr, "uid-junk")
}

func TestLedgerBadInput(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	dir := t.TempDir()
	notLedger := filepath.Join(dir, "notes.txt")
	require.NoError(t, os.WriteFile(notLedger, []byte("this is not a ledger\n"), 0o600))
	missing := filepath.Join(dir, "missing.db")

	tests := []struct {
		name string
		args []string
		code int
		want []string
	}{
		{"missing file", []string{"ledger", "ls", "--ledger", missing}, 1, []string{missing, "no such file"}},
		{"not a ledger", []string{"ledger", "ls", "--ledger", notLedger}, 1, []string{notLedger, "corrupt"}},
		{"a directory", []string{"ledger", "stats", "--ledger", dir}, 1, []string{"directory"}},
		{"unknown flag", []string{"ledger", "ls", "--bogus"}, 2, []string{"--bogus"}},
		{"bad output", []string{"ledger", "ls", "-o", "xml", "--ledger", missing}, 2, []string{"xml", "table, json or yaml"}},
		{"bad phase", []string{"ledger", "ls", "--phase", "Sleeping", "--ledger", missing}, 2, []string{"--phase", "Sleeping"}},
		{"bad timeout", []string{"ledger", "ls", "--timeout", "0s", "--ledger", missing}, 2, []string{"--timeout"}},
		{"no subcommand", []string{"ledger"}, 2, []string{"needs a subcommand"}},
		{"unknown subcommand", []string{"ledger", "frob"}, 2, []string{`"frob"`}},
		{"unknown command", []string{"frob"}, 2, []string{`"frob"`}},
		{"get needs a pod", []string{"ledger", "get", "--ledger", missing}, 2, []string{"one pod UID"}},
		{"get half a name", []string{"ledger", "get", "team/", "--ledger", missing}, 1, []string{missing}},
		{"empty ledger flag", []string{"ledger", "ls", "--ledger", ""}, 2, []string{"--ledger is empty"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			oneLineError(t, caa(t, tc.args...), tc.code, tc.want...)
		})
	}
}

func TestLedgerHeldByADaemon(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	path, l := fixture(t) // stays open for writing, like a running daemon

	t.Run("without its socket the CLI fails within the timeout", func(t *testing.T) {
		start := time.Now()
		r := caa(t, "ledger", "ls", "--ledger", path, "--timeout", "300ms")
		oneLineError(t, r, 1, path, "locked", fmt.Sprintf("process %d", os.Getpid()), ledgerapi.SocketPath(path))
		assert.Less(t, time.Since(start), 20*time.Second)
	})

	sock := ledgerapi.SocketPath(path)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ledgerapi.Serve(ctx, sock, &ledgerapi.Local{L: l, KeepOpen: true}, nil) }()
	t.Cleanup(func() { cancel(); <-done })
	require.Eventually(t, func() bool {
		c, err := net.Dial("unix", sock)
		if err == nil {
			_ = c.Close()
		}
		return err == nil
	}, 5*time.Second, 10*time.Millisecond)

	t.Run("with its socket every command answers", func(t *testing.T) {
		r := caa(t, "ledger", "ls", "--ledger", path)
		require.Equal(t, 0, r.code, r.stderr)
		assert.Contains(t, r.stdout, "alpha")
		assert.Contains(t, r.stdout, "broken")

		r = caa(t, "ledger", "get", "team/beta", "--ledger", path)
		require.Equal(t, 0, r.code, r.stderr)
		assert.Regexp(t, `VM:\s+i-0b`, r.stdout)

		r = caa(t, "ledger", "stats", "--ledger", path)
		require.Equal(t, 0, r.code, r.stderr)
		assert.Contains(t, r.stdout, "daemon on "+sock)

		r = caa(t, "ledger", "verify", "--ledger", path)
		assert.Equal(t, 0, r.code, r.stderr)

		r = caa(t, "ledger", "export", "--ledger", path)
		require.Equal(t, 0, r.code, r.stderr)
		assert.Equal(t, 3, strings.Count(r.stdout, "\n"))

		r = caa(t, "ledger", "get", "team/nobody", "--ledger", path)
		oneLineError(t, r, 1, "not found", "daemon on "+sock)
	})

	t.Run("the daemon's writes are visible at once", func(t *testing.T) {
		_, err := l.Put(ledger.Record{PodUID: "uid-new", Namespace: "team", Name: "gamma", Phase: ledger.PhaseCreating, Attempt: 1})
		require.NoError(t, err)
		r := caa(t, "ledger", "ls", "--ledger", path, "--phase", "Creating")
		require.Equal(t, 0, r.code, r.stderr)
		assert.Contains(t, r.stdout, "gamma")
	})
}

// A pod deleted and created again under the same name, and a pod whose VM
// died and was replaced: what `caa ledger history` and `get` show of them.
func TestLedgerHistoryOfRecreatedPods(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	path := shortPath(t)
	l, err := ledger.Open(ledger.Options{Path: path, Node: "worker-1", Cluster: "cluster-x", Timeout: time.Second})
	require.NoError(t, err)
	put := func(r ledger.Record) ledger.Record {
		stored, err := l.Put(r)
		require.NoError(t, err)
		return stored
	}
	oldUID, newUID := "7c9e6679-0001-4000-8000-00000000000a", "7c9e6679-0002-4000-8000-00000000000b"
	old := put(ledger.Record{PodUID: oldUID, Namespace: "team", Name: "web", Provider: "aws", VMID: "i-0w1",
		Phase: ledger.PhaseRunning, Attempt: 1})
	// The new pod of the same name is recorded before the old one's record goes.
	put(ledger.Record{PodUID: newUID, Namespace: "team", Name: "web", Phase: ledger.PhaseCreating, Attempt: 1})
	old.Phase = ledger.PhaseDeleting
	old = put(old)
	require.NoError(t, l.Delete(oldUID, old.Revision))

	db := put(ledger.Record{PodUID: "uid-db", Namespace: "team", Name: "db", Provider: "aws", VMID: "i-0dead",
		Phase: ledger.PhaseRunning, Attempt: 1})
	db.Phase, db.VMID, db.ReplacesVMID, db.Attempt = ledger.PhaseCreating, "", "i-0dead", 2
	db = put(db)
	db.Phase, db.VMID = ledger.PhaseRunning, "i-0live"
	put(db)
	require.NoError(t, l.Close())

	r := caa(t, "ledger", "history", "--ledger", path)
	require.Equal(t, 0, r.code, r.stderr)
	t.Log("\n" + r.stdout)
	assert.Regexp(t, `(?m)^TIME\s+POD\s+UID\s+ACTION\s+PHASE\s+VM\s+ATTEMPT\s+REV\s+REASON$`, r.stdout)
	assert.Regexp(t, `(?m)team/web\s+7c9e6679-0001\s+created\s+Running\s+i-0w1\s`, r.stdout)
	assert.Regexp(t, `(?m)team/web\s+7c9e6679-0002\s+created\s+Creating\s+-\s`, r.stdout)
	assert.Regexp(t, `(?m)team/web\s+7c9e6679-0001\s+deleted\s+Deleting\s+i-0w1\s`, r.stdout)
	assert.Regexp(t, `(?m)team/db\s+uid-db\s+updated\s+Creating\s+- \(replaces i-0dead\)\s+2\s`, r.stdout)
	assert.Regexp(t, `(?m)team/db\s+uid-db\s+updated\s+Running\s+i-0live \(replaces i-0dead\)\s+2\s`, r.stdout)

	r = caa(t, "ledger", "get", "team/db", "--ledger", path)
	require.Equal(t, 0, r.code, r.stderr)
	assert.Regexp(t, `VM:\s+i-0live\n`, r.stdout)
	assert.Regexp(t, `Replaces VM:\s+i-0dead \(dead; named here until the cloud has deleted it\)`, r.stdout)
	assert.Regexp(t, `updated\s+Running\s+i-0live \(replaces i-0dead\)`, r.stdout)

	// The name now means the new pod; the old one is reached by its UID.
	r = caa(t, "ledger", "get", "team/web", "--ledger", path)
	require.Equal(t, 0, r.code, r.stderr)
	assert.Regexp(t, `Pod UID:\s+`+newUID, r.stdout)
	r = caa(t, "ledger", "get", oldUID, "--ledger", path)
	require.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stdout, "(deleted; history below)")
}
