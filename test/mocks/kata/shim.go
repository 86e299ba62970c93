// Package katafake is a fake kata shim: a ttrpc client of kata's remote
// hypervisor API, driving caa as the kubelet and kata would.
//
// It speaks through caa's own generated code (pkg/hypervisor/hypervisorpb),
// whose .proto was written from kata-containers'
// src/runtime/protocols/hypervisor/hypervisor.proto (the Go shim) and
// src/libs/protocols/protos/remote.proto (runtime-rs). Both were read again
// on 2026-12-01 for this package: the Go shim's file and runtime-rs's
// current file declare `package hypervisor; service Hypervisor`, so both
// shims call the ttrpc service "hypervisor.Hypervisor", with CreateVMRequest
// {id = 1, annotations = 2, networkNamespacePath = 3}, CreateVMResponse
// {agentSocketPath = 1}, and {id = 1} in StartVM and StopVM. runtime-rs's
// remote.proto declared `package remote` from kata 3.11.0 to 3.22.0 (read
// at those tags), so those releases call "remote.Hypervisor" with the same
// messages: Shim.Service sends either. pkg/hypervisor's TestWireFieldNumbers
// pins the numbers on caa's side.
package katafake

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/containerd/ttrpc"

	"github.com/caa-project/caa/pkg/hypervisor/hypervisorpb"
)

// Shim calls caa's remote hypervisor socket. Like the Go shim
// (virtcontainers/remote.go) it opens a connection per call.
type Shim struct {
	// Socket is kata's remote_hypervisor_socket.
	Socket string
	// Service is the ttrpc service called: "" or ServiceGo for
	// "hypervisor.Hypervisor", ServiceRuntimeRsRemote for runtime-rs
	// 3.11.0 to 3.22.0.
	Service string
}

// The ttrpc service names kata's shims call.
const (
	ServiceGo              = "hypervisor.Hypervisor"
	ServiceRuntimeRsRemote = "remote.Hypervisor"
)

func (s Shim) call(ctx context.Context, fn func(hypervisorpb.HypervisorService) error) error {
	c, err := (&net.Dialer{Timeout: 5 * time.Second}).DialContext(ctx, "unix", s.Socket)
	if err != nil {
		return fmt.Errorf("dial the remote hypervisor socket %s: %w", s.Socket, err)
	}
	cl := ttrpc.NewClient(c)
	defer cl.Close()
	if s.Service == "" || s.Service == ServiceGo {
		return fn(hypervisorpb.NewHypervisorClient(cl))
	}
	return fn(named{cl, s.Service})
}

// named calls the service under another name, as the generated client
// cannot.
type named struct {
	c       *ttrpc.Client
	service string
}

func (n named) CreateVM(ctx context.Context, req *hypervisorpb.CreateVMRequest) (*hypervisorpb.CreateVMResponse, error) {
	res := &hypervisorpb.CreateVMResponse{}
	return res, n.c.Call(ctx, n.service, "CreateVM", req, res)
}

func (n named) StartVM(ctx context.Context, req *hypervisorpb.StartVMRequest) (*hypervisorpb.StartVMResponse, error) {
	res := &hypervisorpb.StartVMResponse{}
	return res, n.c.Call(ctx, n.service, "StartVM", req, res)
}

func (n named) StopVM(ctx context.Context, req *hypervisorpb.StopVMRequest) (*hypervisorpb.StopVMResponse, error) {
	res := &hypervisorpb.StopVMResponse{}
	return res, n.c.Call(ctx, n.service, "StopVM", req, res)
}

func (n named) Version(ctx context.Context, req *hypervisorpb.VersionRequest) (*hypervisorpb.VersionResponse, error) {
	res := &hypervisorpb.VersionResponse{}
	return res, n.c.Call(ctx, n.service, "Version", req, res)
}

// CRIOSandboxName is the sandbox name CRI-O gives a pod's sandbox,
// k8s_<pod>_<namespace>_<uid>_<attempt>, which kata's Go shim sends as the
// io.kubernetes.cri.sandbox-name annotation under CRI-O.
func CRIOSandboxName(name, namespace, uid string, attempt int) string {
	return fmt.Sprintf("k8s_%s_%s_%s_%d", name, namespace, uid, attempt)
}

// CreateVM sends the sandbox's id, its CRI annotations and its network
// namespace, and returns the agent socket caa will serve.
func (s Shim) CreateVM(ctx context.Context, id string, annotations map[string]string, netns string) (string, error) {
	var path string
	err := s.call(ctx, func(c hypervisorpb.HypervisorService) error {
		res, err := c.CreateVM(ctx, &hypervisorpb.CreateVMRequest{Id: id, Annotations: annotations, NetworkNamespacePath: netns})
		path = res.GetAgentSocketPath()
		return err
	})
	return path, err
}

// StartVM asks for the sandbox's VM and waits, as the shim waits up to
// remote_hypervisor_timeout.
func (s Shim) StartVM(ctx context.Context, id string) error {
	return s.call(ctx, func(c hypervisorpb.HypervisorService) error {
		_, err := c.StartVM(ctx, &hypervisorpb.StartVMRequest{Id: id})
		return err
	})
}

// StopVM stops the sandbox.
func (s Shim) StopVM(ctx context.Context, id string) error {
	return s.call(ctx, func(c hypervisorpb.HypervisorService) error {
		_, err := c.StopVM(ctx, &hypervisorpb.StopVMRequest{Id: id})
		return err
	})
}

// Version sends the shim's protocol version and returns caa's.
func (s Shim) Version(ctx context.Context) (string, error) {
	var v string
	err := s.call(ctx, func(c hypervisorpb.HypervisorService) error {
		res, err := c.Version(ctx, &hypervisorpb.VersionRequest{Version: "0.0.1"})
		v = res.GetVersion()
		return err
	})
	return v, err
}
