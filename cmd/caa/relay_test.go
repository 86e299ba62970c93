package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/ttrpc"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/internal/agentproto"
	"github.com/caa-project/caa/internal/logbuf"
	"github.com/caa-project/caa/pkg/pki"
	"github.com/caa-project/caa/pkg/relayd"
	"github.com/caa-project/caa/pkg/relayd/relaydtest"
	"github.com/caa-project/caa/pkg/sandbox"
)

// registrantEnv makes this test binary, re-executed, play caa's side of the
// relay daemon (sandbox.RelaydSide, the code `caa run --relay-socket`
// uses): register one sandbox, wait until its forwarder answers, say
// "ready" and stay up until killed.
const registrantEnv = "CAA_TEST_RELAY_REGISTRANT"

func init() {
	spec := os.Getenv(registrantEnv)
	if spec == "" {
		return
	}
	// control socket, agent socket, forwarder, server name
	f := strings.Split(spec, "|")
	side := &sandbox.RelaydSide{Client: &relayd.Client{Socket: f[0]}}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	r, err := side.StartRelay(ctx, f[1], f[2], f[3])
	if err == nil {
		err = r.WaitReachable(ctx)
	}
	cancel()
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	fmt.Println("ready")
	select {}
}

// registrant starts a caa-side process and waits for its "ready".
func registrant(t *testing.T, ctl, sock, addr, name string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), registrantEnv+"="+strings.Join([]string{ctl, sock, addr, name}, "|"))
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "ready\n", line)
	return cmd
}

// TestRelayBinarySurvivesCaaSIGKILL runs the real `caa relay` and kills the
// process that registered the sandbox with SIGKILL, then starts another
// (caa's restart): the shim's connection through the relay process never
// notices. The relay's own SIGTERM closes its sockets.
func TestRelayBinarySurvivesCaaSIGKILL(t *testing.T) {
	dir, err := os.MkdirTemp("", "rl") // unix socket paths are capped at 108 bytes
	require.NoError(t, err)
	defer os.RemoveAll(dir)
	ca, err := pki.LoadOrCreateCA(dir)
	require.NoError(t, err)
	require.NoError(t, relayd.WriteClientFile(dir, ca))
	fw := relaydtest.StartForwarder(t, ca, "podvm-x")
	ctl, sock := filepath.Join(dir, "relay.sock"), filepath.Join(dir, "pods", "sb-1", "agent.ttrpc")

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	relayCmd := exec.CommandContext(ctx, caaBin, "relay", "--socket", ctl, "--agent-ca-dir", dir)
	relayLog := &logbuf.Buffer{}
	relayCmd.Stderr = relayLog
	require.NoError(t, relayCmd.Start())
	defer func() { _ = relayCmd.Process.Kill() }()
	client := &relayd.Client{Socket: ctl}
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, _, err := client.List(ctx); err == nil {
			break
		}
		require.True(t, time.Now().Before(deadline), "caa relay never served its control socket: %s", relayLog.String())
		time.Sleep(10 * time.Millisecond)
	}
	fi, err := os.Stat(ctl)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm())

	first := registrant(t, ctl, sock, fw.Addr(), "podvm-x")

	conn, err := net.Dial("unix", sock)
	require.NoError(t, err)
	cl := ttrpc.NewClient(conn)
	defer cl.Close()
	waited := make(chan error, 1)
	go func() {
		st, err := agentproto.WaitProcess(ctx, cl, "c1", "")
		if err == nil && st != 9 {
			err = fmt.Errorf("WaitProcess answered %d, want 9", st)
		}
		waited <- err
	}()
	require.NoError(t, fw.Agent.AwaitWaiting(ctx, "c1"))
	stream, err := net.Dial("unix", sock)
	require.NoError(t, err)
	_, err = stream.Write(relaydtest.StreamMagic)
	require.NoError(t, err)

	var (
		mu     sync.Mutex
		checks int
		misses []error
	)
	hctx, hstop := context.WithCancel(ctx)
	hdone := make(chan struct{})
	go func() {
		defer close(hdone)
		for hctx.Err() == nil {
			cctx, ccancel := context.WithTimeout(hctx, time.Second)
			_, err := agentproto.Check(cctx, cl)
			ccancel()
			mu.Lock()
			if hctx.Err() == nil {
				checks++
				if err != nil {
					misses = append(misses, err)
				}
			}
			mu.Unlock()
			time.Sleep(20 * time.Millisecond)
		}
	}()
	var sent []byte
	send := func(n int) {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(len(sent) + i)
		}
		_, err := stream.Write(b)
		require.NoError(t, err)
		sent = append(sent, b...)
	}
	send(64 << 10)

	// SIGKILL of caa, then a new caa registers the sandbox again.
	require.NoError(t, first.Process.Signal(syscall.SIGKILL))
	_ = first.Wait()
	send(64 << 10)
	registrant(t, ctl, sock, fw.Addr(), "podvm-x")
	send(64 << 10)
	mu.Lock()
	before := checks
	mu.Unlock()
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return checks >= before+5 }, 10*time.Second, 5*time.Millisecond)
	hstop()
	<-hdone
	assert.Empty(t, misses, "the health check never misses")

	require.True(t, fw.Agent.Release("c1", 9))
	require.NoError(t, <-waited, "the WaitProcess in flight across the SIGKILL completes")
	require.NoError(t, stream.SetReadDeadline(time.Now().Add(10*time.Second)))
	got := make([]byte, len(sent))
	_, err = io.ReadFull(stream, got)
	require.NoError(t, err)
	assert.Equal(t, sent, got, "the stream loses no byte")
	entries, _, err := client.List(ctx)
	require.NoError(t, err)
	require.Len(t, entries, 1)
	assert.Equal(t, 2, entries[0].Open, "the shim's two connections, never cut")

	// The relay's own shutdown closes the sockets and exits 0.
	require.NoError(t, relayCmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, relayCmd.Wait(), relayLog.String())
	_, err = os.Stat(sock)
	assert.ErrorIs(t, err, os.ErrNotExist)
}

func TestRelayFlagsNameTheFix(t *testing.T) {
	r := caa(t, "relay", "--socket", "relay.sock", "--agent-ca-dir", "")
	assert.Equal(t, exitUsage, r.code)
	assert.Contains(t, r.stderr, `--socket "relay.sock"`)
	assert.Contains(t, r.stderr, "--agent-ca-dir is empty")

	r = caa(t, "relay", "--allow-uid", "0,4294967296")
	assert.Equal(t, exitUsage, r.code)
	assert.Contains(t, r.stderr, "--allow-uid 4294967296: not a uid")
}

// The allow list from the environment: a bad value names the variable and
// the fix; --allow-uid replaces it, bad or not.
func TestRelayAllowUIDsFromTheEnvironment(t *testing.T) {
	t.Setenv("CAA_RELAY_ALLOW_UIDS", "0,root")
	r := caa(t, "relay", "--agent-ca-dir", "")
	assert.Equal(t, exitUsage, r.code)
	assert.Contains(t, r.stderr, `CAA_RELAY_ALLOW_UIDS="0,root": "root" is not a uid`)

	r = caa(t, "relay", "--agent-ca-dir", "", "--allow-uid", "0")
	assert.Equal(t, exitUsage, r.code)
	assert.NotContains(t, r.stderr, "CAA_RELAY_ALLOW_UIDS", "the flag replaces the variable")
}
