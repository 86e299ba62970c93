package hypervisor

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/containerd/ttrpc"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/caa-project/caa/pkg/hypervisor/hypervisorpb"
	"github.com/caa-project/caa/pkg/sandbox"
)

type fakeLifecycle struct {
	mu    sync.Mutex
	calls []string
	ann   map[string]string
	netns string
	err   error
}

func (f *fakeLifecycle) CreateVM(_ context.Context, id string, ann map[string]string, netns string) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, "CreateVM "+id)
	f.ann, f.netns = ann, netns
	return "/run/peerpod/pods/" + id + "/agent.ttrpc", f.err
}

func (f *fakeLifecycle) StartVM(_ context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, "StartVM "+id)
	return f.err
}

func (f *fakeLifecycle) StopVM(_ context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, "StopVM "+id)
	return f.err
}

// serve starts the service on a socket in a short temporary directory (a
// unix socket path has ~108 bytes) and returns its path.
func serve(t *testing.T, lc Lifecycle) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "hv")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	path := filepath.Join(dir, "hypervisor.sock")
	sock, err := ListenSocket(path)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sock.Serve(ctx, &Service{Sandboxes: lc, CaaVersion: "caa-test"}, time.Second) }()
	t.Cleanup(func() {
		cancel()
		assert.NoError(t, <-done)
		assert.NoError(t, sock.Close())
	})
	return path
}

// shim is a fake kata shim: a ttrpc client of the remote hypervisor API,
// built from caa's hypervisor.proto. That file's package ("hypervisor"),
// service name ("Hypervisor"), method names and field numbers were read
// against kata-containers' src/runtime/protocols/hypervisor/hypervisor.proto
// (the Go shim) and src/libs/protocols/protos/remote.proto (runtime-rs) at
// commit 7c6ba40c: both declare the same package and service, so both shims
// call "hypervisor.Hypervisor"; TestWireFieldNumbers pins the numbers. Like
// the Go shim (virtcontainers/remote.go) it opens a connection per call.
type shim struct{ path string }

func (s shim) client(t *testing.T) (hypervisorpb.HypervisorService, func()) {
	t.Helper()
	c, err := net.DialTimeout("unix", s.path, time.Second)
	require.NoError(t, err)
	cl := ttrpc.NewClient(c)
	return hypervisorpb.NewHypervisorClient(cl), func() { _ = cl.Close() }
}

func TestShimDrivesTheLifecycle(t *testing.T) {
	lc := &fakeLifecycle{}
	sh := shim{serve(t, lc)}
	ctx := context.Background()
	id := fmt.Sprintf("%064x", 42)
	ann := map[string]string{"io.kubernetes.cri.sandbox-name": "web", "io.kubernetes.cri.sandbox-namespace": "team"}

	c, done := sh.client(t)
	v, err := c.Version(ctx, &hypervisorpb.VersionRequest{Version: "0.0.1"})
	require.NoError(t, err)
	assert.Equal(t, "caa-test", v.GetVersion())
	done()

	c, done = sh.client(t)
	res, err := c.CreateVM(ctx, &hypervisorpb.CreateVMRequest{Id: id, Annotations: ann, NetworkNamespacePath: "/var/run/netns/cni-1"})
	require.NoError(t, err)
	done()
	assert.Equal(t, "/run/peerpod/pods/"+id+"/agent.ttrpc", res.GetAgentSocketPath())
	assert.Equal(t, ann, lc.ann)
	assert.Equal(t, "/var/run/netns/cni-1", lc.netns)

	c, done = sh.client(t)
	_, err = c.StartVM(ctx, &hypervisorpb.StartVMRequest{Id: id})
	require.NoError(t, err)
	done()
	c, done = sh.client(t)
	_, err = c.StopVM(ctx, &hypervisorpb.StopVMRequest{Id: id})
	require.NoError(t, err)
	done()
	assert.Equal(t, []string{"CreateVM " + id, "StartVM " + id, "StopVM " + id}, lc.calls)
}

func TestRefusalsCarryAStatusCodeAndTheReason(t *testing.T) {
	for _, c := range []struct {
		err  error
		code codes.Code
	}{
		{fmt.Errorf("%w: annotation x not allowed", sandbox.ErrInvalid), codes.InvalidArgument},
		{fmt.Errorf("%w: sandbox 12", sandbox.ErrUnknownSandbox), codes.NotFound},
		{fmt.Errorf("%w: lost", sandbox.ErrNotStartable), codes.FailedPrecondition},
		{sandbox.ErrStopping, codes.Unavailable},
		{fmt.Errorf("wait: %w", context.DeadlineExceeded), codes.DeadlineExceeded},
		{errors.New("disk on fire"), codes.Internal},
	} {
		lc := &fakeLifecycle{err: c.err}
		cl, done := shim{serve(t, lc)}.client(t)
		_, err := cl.StartVM(context.Background(), &hypervisorpb.StartVMRequest{Id: "x"})
		done()
		st, ok := status.FromError(err)
		require.True(t, ok, "%v", err)
		assert.Equal(t, c.code, st.Code(), "%v", c.err)
		assert.Equal(t, c.err.Error(), st.Message())
	}
}

// TestWireFieldNumbers pins the field numbers kata's shims encode: if the
// .proto drifted, a shim's CreateVM would lose its annotations or netns.
func TestWireFieldNumbers(t *testing.T) {
	b, err := proto.Marshal(&hypervisorpb.CreateVMRequest{Id: "a", Annotations: map[string]string{"k": "v"}, NetworkNamespacePath: "n"})
	require.NoError(t, err)
	var nums []protowire.Number
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		require.Positive(t, n)
		nums = append(nums, num)
		b = b[n:]
		m := protowire.ConsumeFieldValue(num, typ, b)
		require.Positive(t, m)
		b = b[m:]
	}
	assert.Equal(t, []protowire.Number{1, 2, 3}, nums, "id=1, annotations=2, networkNamespacePath=3")
	out, err := proto.Marshal(&hypervisorpb.CreateVMResponse{AgentSocketPath: "p"})
	require.NoError(t, err)
	assert.Equal(t, []byte{0x0a, 1, 'p'}, out, "agentSocketPath=1")
	assert.Equal(t, "hypervisor.Hypervisor", string(hypervisorpb.File_hypervisor_proto.Services().Get(0).FullName()))
}

func TestListenReplacesAStaleSocketButNotALiveOne(t *testing.T) {
	path := serve(t, &fakeLifecycle{})
	_, err := ListenSocket(path)
	require.ErrorContains(t, err, "another process serves it")

	dir, err := os.MkdirTemp("", "hv")
	require.NoError(t, err)
	defer os.RemoveAll(dir)
	stale := filepath.Join(dir, "h.sock")
	ln, err := net.Listen("unix", stale)
	require.NoError(t, err)
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	require.NoError(t, ln.Close()) // the file stays, as after SIGKILL
	sock, err := ListenSocket(stale)
	require.NoError(t, err)
	_ = sock.Close()
	info, err := os.Stat(filepath.Dir(stale))
	require.NoError(t, err)
	assert.True(t, info.IsDir())
}

// TestRuntimeRsRemotePackageIsServed calls the service the way runtime-rs
// 3.11.0 to 3.22.0 does: its remote.proto declared `package remote` (read
// at kata's tags 3.11.0 and 3.22.0; 3.23.0 changed it to `hypervisor`), so
// its ttrpc method paths are /remote.Hypervisor/<Method>. The calls go
// through a real ttrpc client by service name, every method, a refusal's
// status code included; a name neither shim uses stays Unimplemented.
func TestRuntimeRsRemotePackageIsServed(t *testing.T) {
	lc := &fakeLifecycle{}
	path := serve(t, lc)
	ctx := context.Background()
	id := fmt.Sprintf("%064x", 7)
	call := func(service, method string, req, res any) error {
		t.Helper()
		c, err := net.DialTimeout("unix", path, time.Second)
		require.NoError(t, err)
		cl := ttrpc.NewClient(c)
		defer cl.Close()
		return cl.Call(ctx, service, method, req, res)
	}

	var v hypervisorpb.VersionResponse
	require.NoError(t, call("remote.Hypervisor", "Version", &hypervisorpb.VersionRequest{Version: "0.0.1"}, &v))
	assert.Equal(t, "caa-test", v.GetVersion())
	var cr hypervisorpb.CreateVMResponse
	ann := map[string]string{"io.kubernetes.cri.sandbox-name": "web", "io.kubernetes.cri.sandbox-namespace": "team"}
	require.NoError(t, call("remote.Hypervisor", "CreateVM",
		&hypervisorpb.CreateVMRequest{Id: id, Annotations: ann, NetworkNamespacePath: "/run/netns/cni-2"}, &cr))
	assert.Equal(t, "/run/peerpod/pods/"+id+"/agent.ttrpc", cr.GetAgentSocketPath())
	assert.Equal(t, ann, lc.ann)
	require.NoError(t, call("remote.Hypervisor", "StartVM", &hypervisorpb.StartVMRequest{Id: id}, &hypervisorpb.StartVMResponse{}))
	require.NoError(t, call("remote.Hypervisor", "StopVM", &hypervisorpb.StopVMRequest{Id: id}, &hypervisorpb.StopVMResponse{}))
	assert.Equal(t, []string{"CreateVM " + id, "StartVM " + id, "StopVM " + id}, lc.calls)

	lc.mu.Lock()
	lc.err = fmt.Errorf("%w: no such pod", sandbox.ErrInvalid)
	lc.mu.Unlock()
	err := call("remote.Hypervisor", "CreateVM", &hypervisorpb.CreateVMRequest{Id: id}, &cr)
	assert.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
	assert.Contains(t, status.Convert(err).Message(), "no such pod")

	err = call("other.Hypervisor", "CreateVM", &hypervisorpb.CreateVMRequest{Id: id}, &cr)
	assert.Equal(t, codes.Unimplemented, status.Code(err), "%v", err)
}
