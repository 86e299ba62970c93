package main

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/pkg/ledger"
	"github.com/caa-project/caa/pkg/ledger/ledgerapi"
)

const (
	sbRun  = "5b1ac0de00000000000000000000000000000000000000000000000000000001"
	sbLost = "5b1ac0de00000000000000000000000000000000000000000000000000000002"
	sbGone = "5b1ac0de00000000000000000000000000000000000000000000000000000003"
)

// sandboxFixture adds to fixture's pods a node of the remote hypervisor
// mode: pod shop/web with a running sandbox and a lost one, and a stopped
// sandbox whose history remains.
func sandboxFixture(t *testing.T) (string, *ledger.Ledger) {
	t.Helper()
	path, l := fixture(t)
	put := func(s ledger.Sandbox) ledger.Sandbox {
		stored, err := l.PutSandbox(s)
		require.NoError(t, err)
		return stored
	}
	for i, id := range []string{sbLost, sbRun} {
		s := put(ledger.Sandbox{ID: id, PodUID: "uid-web", Namespace: "shop", Name: "web", NetNS: "/var/run/netns/cni-" + id[:8],
			Provider: "aws", InstanceType: "t3.small", Image: "ami-0podvm", AgentSocket: "/run/peerpod/pods/" + id + "/agent.ttrpc",
			Phase: ledger.SandboxCreated, Tunnel: ledger.Tunnel{VXLANID: 555000 + i, Port: 4789, LocalIP: "10.0.0.1"},
			Confidential: map[string]string{sbRun: "sev-snp"}[id]})
		s.Phase, s.Attempt, s.Key, s.CertSerials = ledger.SandboxCreating, 1, "sb-"+id+"-a1", []string{"3f9a0c" + id[63:]}
		s = put(s)
		ip := "10.1.0." + id[63:]
		s.VMID, s.IPs, s.RelayAddr, s.Tunnel.RemoteIP, s.Phase = "i-0sb"+id[63:], []string{ip}, ip+":15150", ip, ledger.SandboxRunning
		s = put(s)
		if id == sbLost {
			s.Phase, s.Reason, s.Message = ledger.SandboxLost, "VMLost", "the cloud shows VM i-0sb2 terminated"
			put(s)
		}
	}
	g := put(ledger.Sandbox{ID: sbGone, PodUID: "uid-old", Namespace: "shop", Name: "old", Phase: ledger.SandboxCreated})
	require.NoError(t, l.DeleteSandbox(sbGone, g.Revision))
	return path, l
}

func TestLedgerShowsSandboxes(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	path, l := sandboxFixture(t)
	require.NoError(t, l.Close())
	checkSandboxCommands(t, path)
}

// The same answers come from a daemon holding the ledger, over its socket.
func TestLedgerShowsSandboxesFromTheDaemon(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	path, l := sandboxFixture(t)
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
	checkSandboxCommands(t, path)
}

func checkSandboxCommands(t *testing.T, path string) {
	t.Run("ls table goes on with the sandboxes", func(t *testing.T) {
		r := caa(t, "ledger", "ls", "--ledger", path)
		require.Equal(t, 0, r.code, r.stderr)
		pods, sandboxes, ok := strings.Cut(strings.TrimSpace(r.stdout), "\n\n")
		require.True(t, ok, "two tables: %s", r.stdout)
		assert.Len(t, strings.Split(pods, "\n"), 4, "the pod records, as before")
		lines := strings.Split(sandboxes, "\n")
		require.Len(t, lines, 3)
		assert.Regexp(t, `^SANDBOX\s+POD\s+NAMESPACE\s+PHASE\s+VM\s+TEE\s+IP\s+VXLAN\s+ATTEMPT\s+AGE$`, lines[0])
		assert.Regexp(t, `^5b1ac0de0000\s+web\s+shop\s+Lost\s+i-0sb2\s+none\s+10\.1\.0\.2\s+555000\s+1\s+\d+s$`, lines[1])
		assert.Regexp(t, `^5b1ac0de0000\s+web\s+shop\s+Running\s+i-0sb1\s+sev-snp\s+10\.1\.0\.1\s+555001\s+1\s+\d+s$`, lines[2])
	})

	t.Run("ls json keeps its list of records", func(t *testing.T) {
		r := caa(t, "ledger", "ls", "--ledger", path, "-o", "json")
		require.Equal(t, 0, r.code, r.stderr)
		var recs []ledger.Record
		require.NoError(t, json.Unmarshal([]byte(r.stdout), &recs))
		assert.Len(t, recs, 3)
	})

	t.Run("sandboxes json has what serving them again needs, never a key", func(t *testing.T) {
		r := caa(t, "ledger", "sandboxes", "--ledger", path, "-o", "json")
		require.Equal(t, 0, r.code, r.stderr)
		var ss []ledger.Sandbox
		require.NoError(t, json.Unmarshal([]byte(r.stdout), &ss))
		require.Len(t, ss, 2)
		run := ss[1]
		assert.Equal(t, sbRun, run.ID)
		assert.Equal(t, "uid-web", run.PodUID)
		assert.Equal(t, "i-0sb1", run.VMID)
		assert.Equal(t, "10.1.0.1:15150", run.RelayAddr)
		assert.Equal(t, ledger.Tunnel{VXLANID: 555001, Port: 4789, LocalIP: "10.0.0.1", RemoteIP: "10.1.0.1"}, run.Tunnel)
		assert.Equal(t, []string{"3f9a0c1"}, run.CertSerials)
		assert.NotContains(t, strings.ToLower(r.stdout), "private")
		assert.NotContains(t, r.stdout, "BEGIN")

		r = caa(t, "ledger", "sb", "--ledger", path, "--phase", "running")
		require.Equal(t, 0, r.code, r.stderr)
		assert.Len(t, strings.Split(strings.TrimSpace(r.stdout), "\n"), 2, r.stdout)
	})

	t.Run("get by sandbox id shows it and its history", func(t *testing.T) {
		r := caa(t, "ledger", "get", sbLost, "--ledger", path)
		require.Equal(t, 0, r.code, r.stderr)
		assert.Regexp(t, `Sandbox:\s+`+sbLost, r.stdout)
		assert.Regexp(t, `Phase:\s+Lost`, r.stdout)
		assert.Regexp(t, `Tunnel:\s+VXLAN 555000, UDP port 4789, 10\.0\.0\.1 \(node\) to 10\.1\.0\.2 \(VM\)`, r.stdout)
		assert.Regexp(t, `Certificate serials:\s+3f9a0c2`, r.stdout)
		assert.Regexp(t, `created\s+Created\s+-\s+0\s+1`, r.stdout)
		assert.Regexp(t, `updated\s+Lost\s+i-0sb2\s+1\s+4\s+VMLost`, r.stdout)

		r = caa(t, "ledger", "get", sbGone, "--ledger", path, "-o", "json")
		require.Equal(t, 0, r.code, r.stderr)
		var d struct {
			Sandbox *ledger.Sandbox       `json:"sandbox"`
			History []ledger.SandboxEvent `json:"history"`
		}
		require.NoError(t, json.Unmarshal([]byte(r.stdout), &d))
		assert.Nil(t, d.Sandbox, "deleted; its history stays")
		require.Len(t, d.History, 2)
		assert.Equal(t, ledger.ActionDeleted, d.History[1].Action)
	})

	t.Run("get by pod name shows the pod's sandboxes", func(t *testing.T) {
		r := caa(t, "ledger", "get", "shop/web", "--ledger", path)
		require.Equal(t, 0, r.code, r.stderr)
		assert.Contains(t, r.stdout, "Running")
		assert.Contains(t, r.stdout, "Lost")
		r = caa(t, "ledger", "get", "shop/web", "--ledger", path, "-o", "json")
		require.Equal(t, 0, r.code, r.stderr)
		var d recordDetail
		require.NoError(t, json.Unmarshal([]byte(r.stdout), &d))
		assert.Nil(t, d.Record)
		assert.Len(t, d.Sandboxes, 2)
	})

	t.Run("an unknown id is one clear error", func(t *testing.T) {
		oneLineError(t, caa(t, "ledger", "get", "no-such-thing", "--ledger", path), 1, "no-such-thing", "not found")
		oneLineError(t, caa(t, "ledger", "sandboxes", "--phase", "Sleeping", "--ledger", path), 2, "--phase", "Sleeping")
	})

	t.Run("stats counts the sandboxes by phase", func(t *testing.T) {
		r := caa(t, "ledger", "stats", "--ledger", path)
		require.Equal(t, 0, r.code, r.stderr)
		assert.Regexp(t, `Sandboxes:\s+2\n\s+Running:\s+1\n\s+Lost:\s+1\n`, r.stdout)
		r = caa(t, "ledger", "stats", "--ledger", path, "-o", "json")
		require.Equal(t, 0, r.code, r.stderr)
		var st ledger.Stats
		require.NoError(t, json.Unmarshal([]byte(r.stdout), &st))
		assert.Equal(t, 2, st.Sandboxes)
		assert.Equal(t, 1, st.SandboxesByPhase[ledger.SandboxLost])
	})

	t.Run("verify passes a sound ledger with sandboxes", func(t *testing.T) {
		r := caa(t, "ledger", "verify", "--ledger", path)
		require.Equal(t, 0, r.code, r.stdout+r.stderr)
	})
}

// A daemon older than the sandboxes answers their paths 404: `ls` still
// lists the records and succeeds, and `sandboxes` says what is wrong.
func TestLedgerAgainstADaemonOlderThanSandboxes(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	path, l := sandboxFixture(t)
	sock := ledgerapi.SocketPath(path)
	api := ledgerapi.NewHandler(&ledgerapi.Local{L: l, KeepOpen: true}, nil)
	old := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/v1/sandboxes") {
			http.NotFound(w, r)
			return
		}
		api.ServeHTTP(w, r)
	})
	ln, err := net.Listen("unix", sock)
	require.NoError(t, err)
	srv := &http.Server{Handler: old, ReadHeaderTimeout: time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })

	r := caa(t, "ledger", "ls", "--ledger", path)
	require.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stdout, "alpha")
	assert.NotContains(t, r.stdout, "SANDBOX")
	oneLineError(t, caa(t, "ledger", "sandboxes", "--ledger", path), 1, "older caa")
}
