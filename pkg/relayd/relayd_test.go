package relayd_test

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/ttrpc"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/internal/agentproto"
	"github.com/caa-project/caa/internal/unixsock"
	"github.com/caa-project/caa/pkg/pki"
	"github.com/caa-project/caa/pkg/relay"
	"github.com/caa-project/caa/pkg/relayd"
	"github.com/caa-project/caa/pkg/relayd/relaydtest"
)

type daemon struct {
	caDir  string
	ca     *pki.CA
	srv    *relayd.Server
	client *relayd.Client
	dir    string // short: unix socket paths are capped at 108 bytes
	stop   context.CancelFunc
	done   chan struct{}
}

func startDaemon(t *testing.T) *daemon {
	t.Helper()
	d := &daemon{caDir: t.TempDir()}
	var err error
	d.ca, err = pki.LoadOrCreateCA(d.caDir)
	require.NoError(t, err)
	require.NoError(t, relayd.WriteClientFile(d.caDir, d.ca))
	d.dir, err = os.MkdirTemp("", "rd")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(d.dir) })
	d.srv, err = relayd.NewServer(relayd.Config{ClientFile: filepath.Join(d.caDir, relayd.ClientFile), Refresh: time.Hour, DialTimeout: 2 * time.Second})
	require.NoError(t, err)
	ctl := filepath.Join(d.dir, "relay.sock")
	ln, err := relayd.Listen(ctl)
	require.NoError(t, err)
	ctx, stop := context.WithCancel(context.Background())
	d.stop, d.done = stop, make(chan struct{})
	go func() {
		defer close(d.done)
		_ = d.srv.Serve(ctx, ln)
	}()
	t.Cleanup(func() { stop(); <-d.done })
	d.client = &relayd.Client{Socket: ctl}
	return d
}

func (d *daemon) sock(id string) string { return filepath.Join(d.dir, "pods", id, "agent.ttrpc") }

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func shim(t *testing.T, sock string) *ttrpc.Client {
	t.Helper()
	c, err := net.Dial("unix", sock)
	require.NoError(t, err)
	cl := ttrpc.NewClient(c)
	t.Cleanup(func() { cl.Close() })
	return cl
}

func TestControlSocketIsPrivate(t *testing.T) {
	d := startDaemon(t)
	fi, err := os.Stat(d.client.Socket)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	fi, err = os.Stat(filepath.Join(d.caDir, relayd.ClientFile))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm(), "the client file holds private keys")
	data, err := os.ReadFile(filepath.Join(d.caDir, relayd.ClientFile))
	require.NoError(t, err)
	ca, err := os.ReadFile(filepath.Join(d.caDir, pki.CurrentFile))
	require.NoError(t, err)
	assert.NotContains(t, string(data), string(ca[len(d.ca.CertPEM()):]), "the CA's key never goes to the relay daemon")
}

// Serve again with the same arguments (caa's restart) keeps the listener
// and the shim's connection; Stop closes both.
func TestServeIsIdempotentAndStopCloses(t *testing.T) {
	d := startDaemon(t)
	fw := relaydtest.StartForwarder(t, d.ca, "podvm-a")
	ctx := ctxT(t)
	sock := d.sock("sb1")
	resp, err := d.client.Serve(ctx, "sb1", sock, fw.Addr(), "podvm-a")
	require.NoError(t, err)
	assert.False(t, resp.Kept)
	require.NoError(t, d.client.Reach(ctx, "sb1"))

	cl := shim(t, sock)
	waited := make(chan error, 1)
	go func() {
		st, err := agentproto.WaitProcess(ctx, cl, "c1", "")
		if err == nil && st != 7 {
			err = assert.AnError
		}
		waited <- err
	}()
	require.NoError(t, fw.Agent.AwaitWaiting(ctx, "c1"))
	accepted := fw.Accepted()

	resp, err = d.client.Serve(ctx, "sb1", sock, fw.Addr(), "podvm-a")
	require.NoError(t, err)
	assert.True(t, resp.Kept, "the same arguments keep the relay")
	assert.Zero(t, resp.HeardAgo, "a call in flight is no word from the VM yet")
	_, err = agentproto.Check(ctx, cl)
	require.NoError(t, err, "the shim's connection survives a repeated Serve")
	assert.Equal(t, accepted, fw.Accepted(), "no new connection to the VM")
	entries, boot, err := d.client.List(ctx)
	require.NoError(t, err)
	assert.Equal(t, d.srv.Boot(), boot)
	require.Len(t, entries, 1)
	heard := entries[0].HeardAgo
	assert.Positive(t, heard, "the health check's answer came from the VM")
	assert.Less(t, heard, 10*time.Second)
	entries[0].HeardAgo = 0
	assert.Equal(t, relayd.Entry{Sandbox: "sb1", Socket: sock, Addr: fw.Addr(), ServerName: "podvm-a", Open: 1}, entries[0])
	resp, err = d.client.Serve(ctx, "sb1", sock, fw.Addr(), "podvm-a")
	require.NoError(t, err)
	assert.True(t, resp.Kept)
	assert.GreaterOrEqual(t, resp.HeardAgo, heard, "a kept Serve answers the age of the VM's last word")

	require.True(t, fw.Agent.Release("c1", 7))
	require.NoError(t, <-waited)

	go func() {
		_, err := agentproto.WaitProcess(ctx, cl, "c2", "")
		waited <- err
	}()
	require.NoError(t, fw.Agent.AwaitWaiting(ctx, "c2"))
	require.NoError(t, d.client.Stop(ctx, "sb1"))
	require.Error(t, <-waited, "Stop ends the shim's calls")
	_, err = os.Stat(sock)
	assert.ErrorIs(t, err, os.ErrNotExist)
	require.NoError(t, d.client.Stop(ctx, "sb1"), "Stop is idempotent")
	entries, _, err = d.client.List(ctx)
	require.NoError(t, err)
	assert.Empty(t, entries)
}

// Other arguments for the same sandbox replace its relay.
func TestServeWithNewArgumentsReplaces(t *testing.T) {
	d := startDaemon(t)
	a := relaydtest.StartForwarder(t, d.ca, "podvm-a")
	b := relaydtest.StartForwarder(t, d.ca, "podvm-b")
	ctx := ctxT(t)
	sock := d.sock("sb1")
	_, err := d.client.Serve(ctx, "sb1", sock, a.Addr(), "podvm-a")
	require.NoError(t, err)
	resp, err := d.client.Serve(ctx, "sb1", sock, b.Addr(), "podvm-b")
	require.NoError(t, err)
	assert.False(t, resp.Kept)
	require.NoError(t, d.client.Reach(ctx, "sb1"))
	_, err = agentproto.Check(ctx, shim(t, sock))
	require.NoError(t, err)
	assert.Equal(t, 2, b.Agent.Checks(), "Reach's check and the shim's went to the new VM")
	assert.Zero(t, a.Agent.Checks())
}

func TestBadRequestsNameTheField(t *testing.T) {
	d := startDaemon(t)
	ctx := ctxT(t)
	for _, tc := range []struct {
		req  relayd.Request
		want string
	}{
		{relayd.Request{Op: "serve", Sandbox: "../x", Socket: d.sock("x"), Addr: "127.0.0.1:1"}, "sandbox"},
		{relayd.Request{Op: "serve", Sandbox: "sb1", Socket: "rel/agent.ttrpc", Addr: "127.0.0.1:1"}, "socket"},
		{relayd.Request{Op: "serve", Sandbox: "sb1", Socket: d.sock("sb1")}, "addr is empty"},
		{relayd.Request{Op: "serve", Sandbox: "sb1", Socket: d.sock("sb1"), Addr: "10.0.0.1"}, "addr"},
		{relayd.Request{Op: "reach", Sandbox: "nope"}, "not served"},
		{relayd.Request{Op: "frobnicate"}, "unknown op"},
	} {
		_, err := d.client.Do(ctx, tc.req)
		require.Error(t, err, "%+v", tc.req)
		assert.Contains(t, err.Error(), tc.want)
	}
	_, err := d.client.Serve(ctx, "sb1", d.sock("sb1"), "127.0.0.1:1", "")
	require.NoError(t, err)
	_, err = d.client.Serve(ctx, "sb2", d.sock("sb1"), "127.0.0.1:1", "")
	require.ErrorContains(t, err, "served for sandbox sb1")

	_, _, err = (&relayd.Client{Socket: filepath.Join(d.dir, "none.sock")}).List(ctx)
	require.ErrorIs(t, err, relayd.ErrUnavailable)
}

// A rotation (caa restarted with a new CA and the old one as previous)
// reaches the daemon through the client file: new connections use it.
func TestClientFileIsReadAgainOnChange(t *testing.T) {
	d := startDaemon(t)
	ctx := ctxT(t)
	// A VM of a CA the daemon does not know yet.
	other, err := pki.LoadOrCreateCA(t.TempDir())
	require.NoError(t, err)
	fw := relaydtest.StartForwarder(t, other, "podvm-new")
	_, err = d.client.Serve(ctx, "sb1", d.sock("sb1"), fw.Addr(), "podvm-new")
	require.NoError(t, err)
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	err = d.client.Reach(short, "sb1")
	cancel()
	require.Error(t, err, "a VM of an unknown CA is refused")

	require.NoError(t, relayd.WriteClientFile(d.caDir, other))
	// Any Serve reads the file again (and so does the periodic refresh).
	_, err = d.client.Serve(ctx, "sb2", d.sock("sb2"), fw.Addr(), "podvm-new")
	require.NoError(t, err)
	require.NoError(t, d.client.Reach(ctx, "sb1"), "the relay served before the change uses the new certificates")
}

func TestBadClientFileIsRefused(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, relayd.ClientFile)
	_, err := relayd.NewServer(relayd.Config{ClientFile: path})
	require.ErrorContains(t, err, "--relay-socket")
	require.NoError(t, os.WriteFile(path, []byte("junk"), 0o644))
	_, err = relayd.NewServer(relayd.Config{ClientFile: path})
	require.ErrorContains(t, err, "0600")
	require.NoError(t, os.Chmod(path, 0o600))
	_, err = relayd.NewServer(relayd.Config{ClientFile: path})
	require.ErrorContains(t, err, "want at least one of each")
}

// The daemon's own shutdown closes its sockets: that is what its rare
// upgrades cost (caa's do not reach it).
func TestDaemonShutdownClosesSockets(t *testing.T) {
	d := startDaemon(t)
	fw := relaydtest.StartForwarder(t, d.ca, "podvm-a")
	ctx := ctxT(t)
	_, err := d.client.Serve(ctx, "sb1", d.sock("sb1"), fw.Addr(), "podvm-a")
	require.NoError(t, err)
	d.stop()
	<-d.done
	_, err = os.Stat(d.sock("sb1"))
	assert.ErrorIs(t, err, os.ErrNotExist)
}

// TestSecondDaemonIsRefusedTheControlSocket: while a relay daemon serves
// its control socket another cannot take it (it would take the node's
// agent sockets over); once the first is gone its socket file is stale and
// a new daemon takes it.
func TestSecondDaemonIsRefusedTheControlSocket(t *testing.T) {
	d := startDaemon(t)
	_, err := relayd.Listen(d.client.Socket)
	require.ErrorIs(t, err, unixsock.ErrServed)
	assert.ErrorContains(t, err, "another caa relay runs on this node")
	_, _, err = d.client.List(ctxT(t))
	require.NoError(t, err, "the first daemon still serves")

	d.stop()
	<-d.done
	ln, err := relayd.Listen(d.client.Socket)
	require.NoError(t, err, "a stale socket file is replaced")
	require.NoError(t, ln.Close())
}

// The forwarder must show a certificate issued for the VM the relay serves,
// also when no name is given and the address is an IP (Go then sends no
// SNI and leaves the connection's ServerName empty): a certificate of the
// same CA issued for another sandbox's VM is refused either way.
func TestForwarderOfAnotherVMIsRefused(t *testing.T) {
	d := startDaemon(t)
	other := relaydtest.StartForwarder(t, d.ca, "podvm-other-sandbox")
	ctx := ctxT(t)
	for _, name := range []string{"", "podvm-a"} {
		_, err := d.client.Serve(ctx, "sb1", d.sock("sb1"), other.Addr(), name)
		require.NoError(t, err)
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err = d.client.Reach(rctx, "sb1")
		cancel()
		require.Error(t, err, "server name %q: another VM's certificate must not pass", name)
		require.NoError(t, d.client.Stop(ctx, "sb1"))
	}
}

// An agent socket the daemon serves is never taken over by another relay
// (caa serving it itself: a relay mode switch while the daemon still
// runs): the start is refused, and the shim's connections still reach the
// daemon. A daemon that exits after the file was unlinked behind it and
// bound again by caa must not delete caa's socket file: new shim
// connections still reach caa's relay.
func TestDaemonExitLeavesTheSocketCaaTook(t *testing.T) {
	d := startDaemon(t)
	fw := relaydtest.StartForwarder(t, d.ca, "podvm-a")
	ctx := ctxT(t)
	sock := d.sock("sb1")
	_, err := d.client.Serve(ctx, "sb1", sock, fw.Addr(), "podvm-a")
	require.NoError(t, err)

	tc, err := d.ca.ClientTLS()
	require.NoError(t, err)
	_, err = relay.Start(ctx, relay.Config{SocketPath: sock, Addr: fw.Addr(), TLS: tc, ServerName: "podvm-a"})
	require.ErrorIs(t, err, unixsock.ErrServed, "a served agent socket is not replaced")
	_, err = agentproto.Check(ctx, shim(t, sock))
	require.NoError(t, err, "the daemon still serves the shim")

	require.NoError(t, os.Remove(sock))
	caa, err := relay.Start(ctx, relay.Config{SocketPath: sock, Addr: fw.Addr(), TLS: tc, ServerName: "podvm-a"})
	require.NoError(t, err)
	defer caa.Close()
	d.stop()
	<-d.done

	_, err = os.Stat(sock)
	require.NoError(t, err, "caa's socket file is still there")
	_, err = agentproto.Check(ctx, shim(t, sock))
	require.NoError(t, err, "a new shim connection reaches the agent through caa's relay")
	assert.Equal(t, 1, caa.Stats().Accepted)
}

// The relay daemon reads caa's client file and nothing else of caa's: run
// in a directory that also holds the agent CA's key file and a ledger (the
// layout before the relay had its own directory), each a FIFO as a
// tripwire (opening a FIFO to read blocks until a writer comes, so an
// open leaves a reader the test can see), a daemon that serves, reaches,
// refreshes its certificates and stops never opens either.
func TestDaemonNeverOpensTheCAKeyOrTheLedger(t *testing.T) {
	dir, err := os.MkdirTemp("", "rt")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	caDir := t.TempDir()
	ca, err := pki.LoadOrCreateCA(caDir)
	require.NoError(t, err)
	require.NoError(t, relayd.WriteClientFile(dir, ca))
	wires := []string{filepath.Join(dir, pki.CurrentFile), filepath.Join(dir, pki.PreviousFile), filepath.Join(dir, "ledger.db")}
	for _, w := range wires {
		require.NoError(t, syscall.Mkfifo(w, 0o600))
	}
	tripped := func() []string {
		var out []string
		for _, w := range wires {
			fd, err := syscall.Open(w, syscall.O_WRONLY|syscall.O_NONBLOCK, 0)
			if err == nil { // a reader has it open
				syscall.Close(fd)
				out = append(out, filepath.Base(w))
				continue
			}
			require.ErrorIs(t, err, syscall.ENXIO, "no reader: %s", w)
		}
		return out
	}

	srv, err := relayd.NewServer(relayd.Config{ClientFile: filepath.Join(dir, relayd.ClientFile), Refresh: time.Millisecond, DialTimeout: 2 * time.Second})
	require.NoError(t, err)
	ln, err := relayd.Listen(filepath.Join(dir, "relay.sock"))
	require.NoError(t, err)
	ctx, stop := context.WithCancel(ctxT(t))
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ctx, ln) }()
	client := &relayd.Client{Socket: filepath.Join(dir, "relay.sock")}
	fw := relaydtest.StartForwarder(t, ca, "podvm-a")
	sock := filepath.Join(dir, "pods", "sb1", "agent.ttrpc")
	_, err = client.Serve(ctx, "sb1", sock, fw.Addr(), "podvm-a")
	require.NoError(t, err)
	require.NoError(t, client.Reach(ctx, "sb1"))
	_, err = agentproto.Check(ctx, shim(t, sock))
	require.NoError(t, err)
	require.NoError(t, relayd.WriteClientFile(dir, ca)) // a new caa's file: read again
	_, err = client.Serve(ctx, "sb2", filepath.Join(dir, "pods", "sb2", "agent.ttrpc"), fw.Addr(), "podvm-a")
	require.NoError(t, err)
	require.NoError(t, client.Stop(ctx, "sb1"))
	stop()
	<-done
	assert.Empty(t, tripped(), "the relay daemon opened caa's CA key or ledger")
}
