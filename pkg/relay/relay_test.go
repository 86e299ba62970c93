package relay_test

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/containerd/ttrpc"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/internal/agentproto"
	"github.com/caa-project/caa/pkg/pki"
	"github.com/caa-project/caa/pkg/podvm"
	"github.com/caa-project/caa/pkg/relay"
	podvmfake "github.com/caa-project/caa/test/mocks/podvm"
)

type fixture struct {
	ca       *pki.CA
	userData []byte
}

func newFixture(t testing.TB) fixture {
	t.Helper()
	ca, err := pki.LoadOrCreateCA(t.TempDir())
	require.NoError(t, err)
	return fixture{ca: ca, userData: userDataFor(t, ca)}
}

func boot(t testing.TB, f fixture, addr string) *podvmfake.VM {
	t.Helper()
	vm, err := podvmfake.Boot(context.Background(), podvmfake.Options{UserData: f.userData, ListenAddr: addr})
	require.NoError(t, err)
	t.Cleanup(func() { vm.Close() })
	return vm
}

func startRelay(t *testing.T, addr string, tc *tls.Config) (*relay.Relay, string) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "sb1", "agent.ttrpc")
	r, err := relay.Start(context.Background(), relay.Config{SocketPath: sock, Addr: addr, TLS: tc, DialTimeout: 2 * time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { r.Close() })
	return r, sock
}

func shim(t *testing.T, sock string) *ttrpc.Client {
	t.Helper()
	c, err := net.Dial("unix", sock)
	require.NoError(t, err)
	cl := ttrpc.NewClient(c)
	t.Cleanup(func() { cl.Close() })
	return cl
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestRelaysHealthCheckAndLongWait(t *testing.T) {
	f := newFixture(t)
	vm := boot(t, f, "")
	tc, err := f.ca.ClientTLS()
	require.NoError(t, err)
	r, sock := startRelay(t, vm.Addr().String(), tc)
	ctx := ctxT(t)
	require.NoError(t, r.WaitReachable(ctx))

	cl := shim(t, sock)
	st, err := agentproto.Check(ctx, cl)
	require.NoError(t, err)
	require.EqualValues(t, agentproto.Serving, st)

	got := make(chan int32, 1)
	go func() {
		st, err := agentproto.WaitProcess(ctx, cl, "c1", "")
		if err != nil {
			st = -1
		}
		got <- st
	}()
	require.NoError(t, vm.Agent.AwaitWaiting(ctx, "c1"))
	// The same connection keeps serving while the wait is in flight.
	_, err = agentproto.Check(ctx, cl)
	require.NoError(t, err)
	require.True(t, vm.Agent.Release("c1", 137))
	require.EqualValues(t, 137, <-got)
	require.Equal(t, 3, vm.Agent.Checks()) // WaitReachable's, and two from the shim
	require.Equal(t, 1, vm.Agent.Waits())
	s := r.Stats()
	require.Equal(t, 1, s.Accepted)
	require.Equal(t, 1, s.Relayed)
	require.Equal(t, 1, s.Open)
}

func TestCloseEndsTheShimsConnection(t *testing.T) {
	f := newFixture(t)
	vm := boot(t, f, "")
	tc, err := f.ca.ClientTLS()
	require.NoError(t, err)
	r, sock := startRelay(t, vm.Addr().String(), tc)
	ctx := ctxT(t)
	cl := shim(t, sock)
	errc := make(chan error, 1)
	go func() {
		_, err := agentproto.WaitProcess(ctx, cl, "c1", "")
		errc <- err
	}()
	require.NoError(t, vm.Agent.AwaitWaiting(ctx, "c1"))
	require.NoError(t, r.Close())
	select {
	case err := <-errc:
		require.Error(t, err, "the shim's call must fail once its agent socket is closed")
	case <-ctx.Done():
		t.Fatal("the shim's long call outlived the relay's Close")
	}
	_, err = os.Stat(sock)
	require.ErrorIs(t, err, os.ErrNotExist)
	_, err = net.Dial("unix", sock)
	require.Error(t, err)
	require.NoError(t, r.Close(), "Close is idempotent")
	<-r.Done()
}

func TestVMGoneEndsTheShimsConnection(t *testing.T) {
	f := newFixture(t)
	vm := boot(t, f, "")
	tc, err := f.ca.ClientTLS()
	require.NoError(t, err)
	r, sock := startRelay(t, vm.Addr().String(), tc)
	ctx := ctxT(t)
	cl := shim(t, sock)
	errc := make(chan error, 1)
	go func() {
		_, err := agentproto.WaitProcess(ctx, cl, "c1", "")
		errc <- err
	}()
	require.NoError(t, vm.Agent.AwaitWaiting(ctx, "c1"))
	require.NoError(t, r.Probe(ctx))
	vm.Close()
	select {
	case err := <-errc:
		require.Error(t, err)
	case <-ctx.Done():
		t.Fatal("the shim did not see its VM go")
	}
	require.Error(t, r.Probe(ctx), "a probe must see the VM gone")
}

func TestWaitReachableRetriesUntilTheVMBoots(t *testing.T) {
	f := newFixture(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	ln.Close()
	tc, err := f.ca.ClientTLS()
	require.NoError(t, err)
	r, _ := startRelay(t, addr, tc)
	ctx := ctxT(t)
	done := make(chan error, 1)
	go func() { done <- r.WaitReachable(ctx) }()
	select {
	case err := <-done:
		t.Fatalf("reachable before the VM booted: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	vm := boot(t, f, addr)
	require.NoError(t, <-done)
	require.GreaterOrEqual(t, vm.Agent.Checks(), 1)
}

func TestWaitReachableWantsAServingAgent(t *testing.T) {
	f := newFixture(t)
	vm := boot(t, f, "")
	vm.Agent.SetServing(false)
	tc, err := f.ca.ClientTLS()
	require.NoError(t, err)
	r, _ := startRelay(t, vm.Addr().String(), tc)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	err = r.WaitReachable(ctx)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorContains(t, err, "not SERVING")
}

func TestClientFromAnotherCAIsRefused(t *testing.T) {
	f := newFixture(t)
	vm := boot(t, f, "")
	other, err := pki.LoadOrCreateCA(t.TempDir())
	require.NoError(t, err)
	tc, err := other.ClientTLS()
	require.NoError(t, err)
	tc.RootCAs.AppendCertsFromPEM(f.ca.CertPEM()) // it trusts the VM; the VM must not trust it
	r, sock := startRelay(t, vm.Addr().String(), tc)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	require.Error(t, r.WaitReachable(ctx))
	require.NotEmpty(t, vm.Stats().Rejected, "the forwarder must have refused the handshake")
	require.Zero(t, vm.Stats().Relayed)
	require.Zero(t, vm.Agent.Checks(), "nothing may reach the agent")

	// A shim connection through this relay gets nothing either.
	cl := shim(t, sock)
	cctx, ccancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer ccancel()
	_, err = agentproto.Check(cctx, cl)
	require.Error(t, err)
	require.Zero(t, vm.Agent.Checks())
}

func TestStartReplacesAStaleSocketOnly(t *testing.T) {
	f := newFixture(t)
	tc, err := f.ca.ClientTLS()
	require.NoError(t, err)
	dir := t.TempDir()

	sock := filepath.Join(dir, "agent.ttrpc")
	ln, err := net.Listen("unix", sock)
	require.NoError(t, err)
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	ln.Close() // a crashed caa leaves its socket file behind
	_, err = os.Stat(sock)
	require.NoError(t, err)
	r, err := relay.Start(context.Background(), relay.Config{SocketPath: sock, Addr: "127.0.0.1:1", TLS: tc})
	require.NoError(t, err, "a restart must serve the same path again")
	require.NoError(t, r.Close())

	file := filepath.Join(dir, "not-a-socket")
	require.NoError(t, os.WriteFile(file, []byte("x"), 0o600))
	_, err = relay.Start(context.Background(), relay.Config{SocketPath: file, Addr: "127.0.0.1:1", TLS: tc})
	require.ErrorContains(t, err, "not a socket")
}

func TestStartRejectsBadConfig(t *testing.T) {
	f := newFixture(t)
	tc, err := f.ca.ClientTLS()
	require.NoError(t, err)
	sock := filepath.Join(t.TempDir(), "a.sock")
	for name, cfg := range map[string]relay.Config{
		"SocketPath": {Addr: "1.2.3.4:15150", TLS: tc},
		"Addr":       {SocketPath: sock, TLS: tc},
		"TLS":        {SocketPath: sock, Addr: "1.2.3.4:15150"},
		"Addr ":      {SocketPath: sock, Addr: "1.2.3.4", TLS: tc},
	} {
		_, err := relay.Start(context.Background(), cfg)
		require.Error(t, err, name)
	}
}

func TestUnreachableForwarderClosesTheShimConnection(t *testing.T) {
	f := newFixture(t)
	tc, err := f.ca.ClientTLS()
	require.NoError(t, err)
	sock := filepath.Join(t.TempDir(), "agent.ttrpc")
	r, err := relay.Start(context.Background(), relay.Config{SocketPath: sock, Addr: "127.0.0.1:1", TLS: tc, DialTimeout: 300 * time.Millisecond})
	require.NoError(t, err)
	defer r.Close()
	c, err := net.Dial("unix", sock)
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.SetReadDeadline(time.Now().Add(10*time.Second)))
	_, err = c.Read(make([]byte, 1))
	var ne net.Error
	require.False(t, errors.As(err, &ne) && ne.Timeout(), "the relay must close, not hang, a connection it cannot relay")
	require.Equal(t, 1, r.Stats().Failed)
}

// TestRestartServesTheSamePathAgain plays caa's restart under a live sandbox:
// the old relay is gone (its connections with it, as stock kata sees it), a
// new one on the same path reaches the same VM with the CA from disk.
func TestRestartServesTheSamePathAgain(t *testing.T) {
	dir := t.TempDir()
	ca, err := pki.LoadOrCreateCA(dir)
	require.NoError(t, err)
	f := fixture{ca: ca, userData: userDataFor(t, ca)}
	vm := boot(t, f, "")
	ctx := ctxT(t)
	sock := filepath.Join(t.TempDir(), "agent.ttrpc")

	tc, err := ca.ClientTLS()
	require.NoError(t, err)
	r1, err := relay.Start(ctx, relay.Config{SocketPath: sock, Addr: vm.Addr().String(), TLS: tc})
	require.NoError(t, err)
	old := shim(t, sock)
	_, err = agentproto.Check(ctx, old)
	require.NoError(t, err)
	require.NoError(t, r1.Close())

	// The restarted caa: a new CA object loaded from the same directory.
	ca2, err := pki.LoadOrCreateCA(dir)
	require.NoError(t, err)
	tc2, err := ca2.ClientTLS()
	require.NoError(t, err)
	r2, err := relay.Start(ctx, relay.Config{SocketPath: sock, Addr: vm.Addr().String(), TLS: tc2})
	require.NoError(t, err)
	defer r2.Close()
	require.NoError(t, r2.WaitReachable(ctx))
	_, err = agentproto.Check(ctx, old)
	require.Error(t, err, "stock kata's connection does not survive the relay's restart")
	_, err = agentproto.Check(ctx, shim(t, sock))
	require.NoError(t, err, "a new connection after the restart reaches the same VM")
}

func userDataFor(t testing.TB, ca *pki.CA) []byte {
	t.Helper()
	certPEM, keyPEM, _, err := ca.IssueServer([]net.IP{net.ParseIP("127.0.0.1")}, nil, time.Hour)
	require.NoError(t, err)
	ud, err := podvm.UserData(podvm.Config{
		PodName: "p", PodNamespace: "ns", SandboxID: "sb1",
		Network: podvm.Network{
			VXLANID: 555000, VXLANPort: 4789, WorkerIP: netip.MustParsePrefix("127.0.0.1/8"),
			Interface: "eth0", PodIP: netip.MustParsePrefix("10.244.0.9/24"), PodMAC: "02:00:00:00:00:09", MTU: 1450,
		},
		TLSServerCertPEM: certPEM, TLSServerKeyPEM: keyPEM, TLSClientCAPEM: ca.CertPEM(),
	})
	require.NoError(t, err)
	return ud
}

// TestShimConnectionWaitsForTheBootingVM: a connection accepted before the
// forwarder listens is held (within DialTimeout) and relayed once it does.
func TestShimConnectionWaitsForTheBootingVM(t *testing.T) {
	f := newFixture(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	ln.Close()
	tc, err := f.ca.ClientTLS()
	require.NoError(t, err)
	sock := filepath.Join(t.TempDir(), "agent.ttrpc")
	r, err := relay.Start(context.Background(), relay.Config{SocketPath: sock, Addr: addr, TLS: tc, DialTimeout: 20 * time.Second})
	require.NoError(t, err)
	defer r.Close()
	ctx := ctxT(t)
	cl := shim(t, sock)
	got := make(chan error, 1)
	go func() {
		_, err := agentproto.Check(ctx, cl)
		got <- err
	}()
	select {
	case err := <-got:
		t.Fatalf("answered before the VM booted: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	vm := boot(t, f, addr)
	require.NoError(t, <-got)
	require.Equal(t, 1, vm.Agent.Checks())
}

// Heard reports the age of the VM's last bytes on an open relayed
// connection: bytes the shim sends prove nothing about the VM, the age grows
// while the VM is silent, and a connection the VM cut is no evidence.
func TestHeardCountsOnlyTheVMsBytesOnOpenConnections(t *testing.T) {
	f := newFixture(t)
	vm := boot(t, f, "")
	tc, err := f.ca.ClientTLS()
	require.NoError(t, err)
	r, sock := startRelay(t, vm.Addr().String(), tc)
	ctx := ctxT(t)
	require.NoError(t, r.WaitReachable(ctx)) // a probe is not a relayed connection
	_, ok := r.Heard()
	require.False(t, ok, "nothing relayed yet")

	// A shim that sent half a ttrpc frame: the agent waits for the rest and
	// answers nothing.
	quiet, err := net.Dial("unix", sock)
	require.NoError(t, err)
	defer quiet.Close()
	_, err = quiet.Write([]byte{0, 0, 0, 40, 0, 0})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return r.Stats().Open == 1 }, 10*time.Second, time.Millisecond)
	_, ok = r.Heard()
	require.False(t, ok, "the shim's bytes are not the VM's")

	cl := shim(t, sock)
	_, err = agentproto.Check(ctx, cl)
	require.NoError(t, err)
	age, ok := r.Heard()
	require.True(t, ok, "the agent's answer came back from the VM")
	require.Less(t, age, 5*time.Second)
	require.Eventually(t, func() bool { a, ok := r.Heard(); return ok && a > age+20*time.Millisecond }, 10*time.Second, time.Millisecond,
		"the age grows while the VM says nothing")

	vm.Close()
	require.Eventually(t, func() bool { return r.Stats().Open == 0 }, 10*time.Second, time.Millisecond)
	_, ok = r.Heard()
	require.False(t, ok, "the VM's cut connections are no evidence")
}
