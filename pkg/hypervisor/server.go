// Package hypervisor serves kata's remote hypervisor API (ttrpc on a unix
// socket) and hands each call to the sandbox lifecycle.
//
// The ttrpc method path is "/<proto package>.Hypervisor/<Method>". The Go
// shim's hypervisor.proto declares package "hypervisor"; runtime-rs's
// remote.proto declared package "remote" from kata 3.11.0 to 3.22.0 and
// "hypervisor" from 3.23.0 (kata commit 80ef102a). The messages and their
// field numbers are the same in both, so the one service is registered
// under both names (ServiceNames). The Go shim opens a new connection per call;
// it waits for StartVM up to remote_hypervisor_timeout (600 s by default),
// and runtime-rs gives StopVM about one second.
package hypervisor

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/containerd/ttrpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/caa-project/caa/pkg/hypervisor/hypervisorpb"
	"github.com/caa-project/caa/pkg/sandbox"
)

// DefaultSocket is kata's default remote_hypervisor_socket.
const DefaultSocket = "/run/peerpod/hypervisor.sock"

// ServiceNames are the ttrpc service names the API is served under:
// "hypervisor.Hypervisor" (the Go shim; runtime-rs from kata 3.23.0) and
// "remote.Hypervisor" (runtime-rs 3.11.0 to 3.22.0).
var ServiceNames = [...]string{"hypervisor.Hypervisor", "remote.Hypervisor"}

// Lifecycle is what the service asks of the sandboxes (sandbox.Manager).
type Lifecycle interface {
	CreateVM(ctx context.Context, id string, annotations map[string]string, netns string) (string, error)
	StartVM(ctx context.Context, id string) error
	StopVM(ctx context.Context, id string) error
}

// Calls observes every answered call: its method, its status code's name
// and how long caa took (health.Metrics.ObserveHypervisorCall).
type Calls interface {
	ObserveHypervisorCall(method, code string, took time.Duration)
}

// Service implements hypervisorpb.HypervisorService.
type Service struct {
	Sandboxes Lifecycle
	// CaaVersion answers the Version call.
	CaaVersion string
	Log        *slog.Logger
	// Calls, when set, is told of every call answered.
	Calls Calls
}

var _ hypervisorpb.HypervisorService = (*Service)(nil)

// CreateVM records the sandbox and returns its agent socket path.
func (s *Service) CreateVM(ctx context.Context, req *hypervisorpb.CreateVMRequest) (_ *hypervisorpb.CreateVMResponse, err error) {
	defer s.observe("CreateVM", time.Now(), &err)
	path, err := s.Sandboxes.CreateVM(ctx, req.GetId(), req.GetAnnotations(), req.GetNetworkNamespacePath())
	if err != nil {
		return nil, s.fail("CreateVM", req.GetId(), err)
	}
	return &hypervisorpb.CreateVMResponse{AgentSocketPath: path}, nil
}

// StartVM boots the sandbox's VM and returns once its agent is reachable.
func (s *Service) StartVM(ctx context.Context, req *hypervisorpb.StartVMRequest) (_ *hypervisorpb.StartVMResponse, err error) {
	t0 := time.Now()
	defer s.observe("StartVM", t0, &err)
	if err := s.Sandboxes.StartVM(ctx, req.GetId()); err != nil {
		return nil, s.fail("StartVM", req.GetId(), err)
	}
	s.log().Info("StartVM done", "sandbox", req.GetId(), "took", time.Since(t0).Round(time.Millisecond))
	return &hypervisorpb.StartVMResponse{}, nil
}

// StopVM stops the sandbox; its VM is deleted in the background.
func (s *Service) StopVM(ctx context.Context, req *hypervisorpb.StopVMRequest) (_ *hypervisorpb.StopVMResponse, err error) {
	defer s.observe("StopVM", time.Now(), &err)
	if err := s.Sandboxes.StopVM(ctx, req.GetId()); err != nil {
		return nil, s.fail("StopVM", req.GetId(), err)
	}
	return &hypervisorpb.StopVMResponse{}, nil
}

// Version answers with caa's version.
func (s *Service) Version(context.Context, *hypervisorpb.VersionRequest) (*hypervisorpb.VersionResponse, error) {
	s.observe("Version", time.Now(), new(error))
	return &hypervisorpb.VersionResponse{Version: s.CaaVersion}, nil
}

// observe tells s.Calls of one answered call; *err is what it returned
// (a status error from fail, or nil).
func (s *Service) observe(method string, t0 time.Time, err *error) {
	if s.Calls == nil {
		return
	}
	s.Calls.ObserveHypervisorCall(method, status.Code(*err).String(), time.Since(t0))
}

// fail logs a refused call and turns err into a ttrpc status whose code
// says what the shim can do about it.
func (s *Service) fail(call, id string, err error) error {
	code := Code(err)
	s.log().Warn(call+" refused", "sandbox", id, "code", code.String(), "err", err)
	return status.Error(code, err.Error())
}

// Code maps a lifecycle error to a status code.
func Code(err error) codes.Code {
	switch {
	case errors.Is(err, sandbox.ErrInvalid):
		return codes.InvalidArgument
	case errors.Is(err, sandbox.ErrUnknownSandbox):
		return codes.NotFound
	case errors.Is(err, sandbox.ErrNotStartable):
		return codes.FailedPrecondition
	case errors.Is(err, sandbox.ErrStopping):
		return codes.Unavailable
	case errors.Is(err, context.DeadlineExceeded):
		return codes.DeadlineExceeded
	case errors.Is(err, context.Canceled):
		return codes.Canceled
	}
	return codes.Internal
}

func (s *Service) log() *slog.Logger {
	if s.Log != nil {
		return s.Log
	}
	return slog.New(slog.DiscardHandler)
}

// register adds svc to srv under every name in ServiceNames. The generated
// RegisterHypervisorService knows only the name of caa's own .proto, so
// the method table is built here, once, and handed to each name.
func register(srv *ttrpc.Server, svc hypervisorpb.HypervisorService) {
	methods := map[string]ttrpc.Method{
		"CreateVM": method(svc.CreateVM),
		"StartVM":  method(svc.StartVM),
		"StopVM":   method(svc.StopVM),
		"Version":  method(svc.Version),
	}
	for _, name := range ServiceNames {
		srv.RegisterService(name, &ttrpc.ServiceDesc{Methods: methods})
	}
}

// method adapts one typed call to ttrpc's untyped method signature.
func method[Req, Res any](call func(context.Context, *Req) (*Res, error)) ttrpc.Method {
	return func(ctx context.Context, unmarshal func(any) error) (any, error) {
		req := new(Req)
		if err := unmarshal(req); err != nil {
			return nil, err
		}
		return call(ctx, req)
	}
}
