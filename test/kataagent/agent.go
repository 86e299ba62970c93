package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/kata-containers/kata-containers/src/runtime/virtcontainers/pkg/agent/protocols"
	pb "github.com/kata-containers/kata-containers/src/runtime/virtcontainers/pkg/agent/protocols/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"
)

// agent is the stand-in's state: the sandbox and its containers, in memory
// of the VM's process, so it outlives any connection to it.
type agent struct {
	log   *slog.Logger
	self  string // this binary, run as the sandbox's pause process
	root  string // the VM's root for CopyFile
	calls *counter

	mu         sync.Mutex
	sandboxID  string
	containers map[string]*container
	stopping   chan struct{}
}

type container struct {
	id    string
	spec  *pb.Spec
	init  *proc
	execs map[string]*proc
}

func newAgent(log *slog.Logger, self, root string, calls *counter) *agent {
	return &agent{log: log, self: self, root: root, calls: calls, containers: map[string]*container{}, stopping: make(chan struct{})}
}

var empty = &emptypb.Empty{}

func notFound(what, id string) error {
	return status.Errorf(codes.NotFound, "%s %s not found", what, id)
}

// process finds a container's process: the init process for an empty exec
// id or the container's own, else the exec.
func (a *agent) process(cid, execID string) (*container, *proc, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	c, ok := a.containers[cid]
	if !ok {
		return nil, nil, notFound("container", cid)
	}
	if execID == "" || execID == c.init.execID {
		return c, c.init, nil
	}
	p, ok := c.execs[execID]
	if !ok {
		return nil, nil, notFound("process", execID)
	}
	return c, p, nil
}

func (a *agent) CreateSandbox(_ context.Context, r *pb.CreateSandboxRequest) (*emptypb.Empty, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.sandboxID != "" {
		return nil, status.Errorf(codes.AlreadyExists, "sandbox %s already created", a.sandboxID)
	}
	a.sandboxID = r.SandboxId
	a.log.Info("CreateSandbox", "sandbox", r.SandboxId, "hostname", r.Hostname, "storages", len(r.Storages))
	return empty, nil
}

func (a *agent) DestroySandbox(context.Context, *pb.DestroySandboxRequest) (*emptypb.Empty, error) {
	a.killAll()
	a.mu.Lock()
	a.log.Info("DestroySandbox", "sandbox", a.sandboxID)
	a.sandboxID = ""
	a.containers = map[string]*container{}
	a.mu.Unlock()
	return empty, nil
}

// isSandbox says whether the spec is the pod's sandbox (pause) container,
// by the annotations containerd's and CRI-O's CRI put on it.
func isSandbox(spec *pb.Spec) bool {
	ann := spec.GetAnnotations()
	return ann["io.kubernetes.cri.container-type"] == "sandbox" || ann["io.kubernetes.cri-o.ContainerType"] == "sandbox"
}

func (a *agent) CreateContainer(_ context.Context, r *pb.CreateContainerRequest) (*emptypb.Empty, error) {
	if r.OCI == nil || r.OCI.Process == nil {
		return nil, status.Errorf(codes.InvalidArgument, "container %s: no OCI process", r.ContainerId)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, ok := a.containers[r.ContainerId]; ok {
		return nil, status.Errorf(codes.AlreadyExists, "container %s already exists", r.ContainerId)
	}
	args := r.OCI.Process.Args
	if isSandbox(r.OCI) {
		// The pause image is not on the fake VM's filesystem; this
		// binary's pause mode does what pause does.
		args = []string{a.self, "-pause"}
	}
	if len(args) == 0 {
		return nil, status.Errorf(codes.InvalidArgument, "container %s: no command", r.ContainerId)
	}
	p := newProc(r.ContainerId, r.ExecId, args, r.OCI.Process.Env, r.OCI.Process.Cwd, r.OCI.Process.Terminal)
	a.containers[r.ContainerId] = &container{id: r.ContainerId, spec: r.OCI, init: p, execs: map[string]*proc{}}
	a.log.Info("CreateContainer", "container", r.ContainerId, "exec", r.ExecId, "args", args, "sandbox", isSandbox(r.OCI))
	return empty, nil
}

func (a *agent) StartContainer(_ context.Context, r *pb.StartContainerRequest) (*emptypb.Empty, error) {
	c, p, err := a.process(r.ContainerId, "")
	if err != nil {
		return nil, err
	}
	if err := p.start(); err != nil {
		return nil, status.Errorf(codes.Internal, "start container %s: %v", c.id, err)
	}
	a.log.Info("StartContainer", "container", c.id, "pid", p.pid())
	return empty, nil
}

func (a *agent) ExecProcess(_ context.Context, r *pb.ExecProcessRequest) (*emptypb.Empty, error) {
	if r.Process == nil || len(r.Process.Args) == 0 {
		return nil, status.Errorf(codes.InvalidArgument, "exec %s in %s: no command", r.ExecId, r.ContainerId)
	}
	a.mu.Lock()
	c, ok := a.containers[r.ContainerId]
	if !ok {
		a.mu.Unlock()
		return nil, notFound("container", r.ContainerId)
	}
	if _, ok := c.execs[r.ExecId]; ok {
		a.mu.Unlock()
		return nil, status.Errorf(codes.AlreadyExists, "exec %s already exists", r.ExecId)
	}
	p := newProc(r.ContainerId, r.ExecId, r.Process.Args, r.Process.Env, r.Process.Cwd, r.Process.Terminal)
	c.execs[r.ExecId] = p
	a.mu.Unlock()
	if err := p.start(); err != nil {
		return nil, status.Errorf(codes.Internal, "exec %s in %s: %v", r.ExecId, r.ContainerId, err)
	}
	a.log.Info("ExecProcess", "container", r.ContainerId, "exec", r.ExecId, "args", r.Process.Args)
	return empty, nil
}

func (a *agent) SignalProcess(_ context.Context, r *pb.SignalProcessRequest) (*emptypb.Empty, error) {
	_, p, err := a.process(r.ContainerId, r.ExecId)
	if err != nil {
		return nil, err
	}
	if err := p.signal(syscall.Signal(r.Signal)); err != nil {
		return nil, status.Errorf(codes.Internal, "signal %d to %s/%s: %v", r.Signal, r.ContainerId, r.ExecId, err)
	}
	return empty, nil
}

func (a *agent) WaitProcess(ctx context.Context, r *pb.WaitProcessRequest) (*pb.WaitProcessResponse, error) {
	_, p, err := a.process(r.ContainerId, r.ExecId)
	if err != nil {
		return nil, err
	}
	select {
	case <-p.done:
		return &pb.WaitProcessResponse{Status: p.status}, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (a *agent) RemoveContainer(_ context.Context, r *pb.RemoveContainerRequest) (*emptypb.Empty, error) {
	a.mu.Lock()
	c, ok := a.containers[r.ContainerId]
	delete(a.containers, r.ContainerId)
	a.mu.Unlock()
	if !ok {
		return nil, notFound("container", r.ContainerId)
	}
	c.kill()
	a.log.Info("RemoveContainer", "container", r.ContainerId)
	return empty, nil
}

func (a *agent) killAll() {
	a.mu.Lock()
	cs := make([]*container, 0, len(a.containers))
	for _, c := range a.containers {
		cs = append(cs, c)
	}
	a.mu.Unlock()
	for _, c := range cs {
		c.kill()
	}
}

func (c *container) kill() {
	for _, p := range c.execs {
		p.killWait()
	}
	c.init.killWait()
}

func (a *agent) readStream(ctx context.Context, r *pb.ReadStreamRequest, stderr bool) (*pb.ReadStreamResponse, error) {
	_, p, err := a.process(r.ContainerId, r.ExecId)
	if err != nil {
		return nil, err
	}
	s := p.stdout
	if stderr {
		s = p.stderr
	}
	data, err := s.read(ctx, int(r.Len))
	if err != nil {
		return nil, err
	}
	return &pb.ReadStreamResponse{Data: data}, nil
}

func (a *agent) ReadStdout(ctx context.Context, r *pb.ReadStreamRequest) (*pb.ReadStreamResponse, error) {
	return a.readStream(ctx, r, false)
}

func (a *agent) ReadStderr(ctx context.Context, r *pb.ReadStreamRequest) (*pb.ReadStreamResponse, error) {
	return a.readStream(ctx, r, true)
}

func (a *agent) WriteStdin(_ context.Context, r *pb.WriteStreamRequest) (*pb.WriteStreamResponse, error) {
	_, p, err := a.process(r.ContainerId, r.ExecId)
	if err != nil {
		return nil, err
	}
	n, err := p.writeStdin(r.Data)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "stdin of %s/%s: %v", r.ContainerId, r.ExecId, err)
	}
	return &pb.WriteStreamResponse{Len: uint32(n)}, nil
}

func (a *agent) CloseStdin(_ context.Context, r *pb.CloseStdinRequest) (*emptypb.Empty, error) {
	_, p, err := a.process(r.ContainerId, r.ExecId)
	if err != nil {
		return nil, err
	}
	p.closeStdin()
	return empty, nil
}

func (a *agent) TtyWinResize(_ context.Context, r *pb.TtyWinResizeRequest) (*emptypb.Empty, error) {
	if _, _, err := a.process(r.ContainerId, r.ExecId); err != nil {
		return nil, err
	}
	return empty, nil
}

func (a *agent) StatsContainer(_ context.Context, r *pb.StatsContainerRequest) (*pb.StatsContainerResponse, error) {
	_, p, err := a.process(r.ContainerId, "")
	if err != nil {
		return nil, err
	}
	cpu, rss := procUsage(p.pid())
	return &pb.StatsContainerResponse{CgroupStats: &pb.CgroupStats{
		CpuStats:    &pb.CpuStats{CpuUsage: &pb.CpuUsage{TotalUsage: cpu}},
		MemoryStats: &pb.MemoryStats{Usage: &pb.MemoryData{Usage: rss}},
		PidsStats:   &pb.PidsStats{Current: 1},
	}}, nil
}

// procUsage reads a process's CPU time (ns) and resident memory (bytes).
func procUsage(pid int) (cpu, rss uint64) {
	if pid <= 0 {
		return 0, 0
	}
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil {
		if i := strings.LastIndexByte(string(b), ')'); i > 0 {
			f := strings.Fields(string(b[i+1:]))
			if len(f) > 12 {
				ut, _ := strconv.ParseUint(f[11], 10, 64)
				st, _ := strconv.ParseUint(f[12], 10, 64)
				cpu = (ut + st) * 10_000_000 // clock ticks of 10 ms
			}
		}
	}
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/statm", pid)); err == nil {
		if f := strings.Fields(string(b)); len(f) > 1 {
			pages, _ := strconv.ParseUint(f[1], 10, 64)
			rss = pages * uint64(os.Getpagesize())
		}
	}
	return cpu, rss
}

func (a *agent) PauseContainer(_ context.Context, r *pb.PauseContainerRequest) (*emptypb.Empty, error) {
	_, p, err := a.process(r.ContainerId, "")
	if err != nil {
		return nil, err
	}
	return empty, p.signal(syscall.SIGSTOP)
}

func (a *agent) ResumeContainer(_ context.Context, r *pb.ResumeContainerRequest) (*emptypb.Empty, error) {
	_, p, err := a.process(r.ContainerId, "")
	if err != nil {
		return nil, err
	}
	return empty, p.signal(syscall.SIGCONT)
}

func (a *agent) UpdateContainer(_ context.Context, r *pb.UpdateContainerRequest) (*emptypb.Empty, error) {
	if _, _, err := a.process(r.ContainerId, ""); err != nil {
		return nil, err
	}
	return empty, nil
}

// The pod's network in a peer pod VM is the forwarder's; what the shim
// sends is taken as it is and answered with itself, as the agent answers
// with what it applied.
func (a *agent) UpdateInterface(_ context.Context, r *pb.UpdateInterfaceRequest) (*protocols.Interface, error) {
	if r.Interface == nil {
		return &protocols.Interface{}, nil
	}
	return r.Interface, nil
}

func (a *agent) UpdateRoutes(_ context.Context, r *pb.UpdateRoutesRequest) (*pb.Routes, error) {
	if r.Routes == nil {
		return &pb.Routes{}, nil
	}
	return r.Routes, nil
}

func (a *agent) ListInterfaces(context.Context, *pb.ListInterfacesRequest) (*pb.Interfaces, error) {
	return &pb.Interfaces{}, nil
}

func (a *agent) ListRoutes(context.Context, *pb.ListRoutesRequest) (*pb.Routes, error) {
	return &pb.Routes{}, nil
}

func (a *agent) AddARPNeighbors(context.Context, *pb.AddARPNeighborsRequest) (*emptypb.Empty, error) {
	return empty, nil
}

func (a *agent) UpdateEphemeralMounts(context.Context, *pb.UpdateEphemeralMountsRequest) (*emptypb.Empty, error) {
	return empty, nil
}

func (a *agent) RemoveStaleVirtiofsShareMounts(context.Context, *pb.RemoveStaleVirtiofsShareMountsRequest) (*emptypb.Empty, error) {
	return empty, nil
}

func (a *agent) GetGuestDetails(context.Context, *pb.GuestDetailsRequest) (*pb.GuestDetailsResponse, error) {
	return &pb.GuestDetailsResponse{AgentDetails: &pb.AgentDetails{Version: agentVersion, InitDaemon: true}}, nil
}

func (a *agent) SetGuestDateTime(context.Context, *pb.SetGuestDateTimeRequest) (*emptypb.Empty, error) {
	return empty, nil
}

func (a *agent) ReseedRandomDev(context.Context, *pb.ReseedRandomDevRequest) (*emptypb.Empty, error) {
	return empty, nil
}

func (a *agent) OnlineCPUMem(context.Context, *pb.OnlineCPUMemRequest) (*emptypb.Empty, error) {
	return empty, nil
}

func (a *agent) MemHotplugByProbe(context.Context, *pb.MemHotplugByProbeRequest) (*emptypb.Empty, error) {
	return empty, nil
}

func (a *agent) SetPolicy(context.Context, *pb.SetPolicyRequest) (*emptypb.Empty, error) {
	return empty, nil
}

// GetOOMEvent blocks, as the agent's does, until a container is killed for
// memory: never here, so until the shim gives up the call.
func (a *agent) GetOOMEvent(ctx context.Context, _ *pb.GetOOMEventRequest) (*pb.OOMEvent, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// CopyFile writes the shim's file (a container's resolv.conf, hosts, a
// secret) under the stand-in's root, in place of the VM's path.
func (a *agent) CopyFile(_ context.Context, r *pb.CopyFileRequest) (*emptypb.Empty, error) {
	if r.Path == "" || !filepath.IsAbs(r.Path) {
		return nil, status.Errorf(codes.InvalidArgument, "copy file: path %q is not absolute", r.Path)
	}
	dst := filepath.Join(a.root, filepath.Clean(r.Path))
	mode := os.FileMode(r.FileMode)
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return nil, status.Errorf(codes.Internal, "copy file %s: %v", r.Path, err)
	}
	switch r.FileMode & syscall.S_IFMT {
	case syscall.S_IFDIR:
		if err := os.MkdirAll(dst, mode.Perm()|0o700); err != nil {
			return nil, status.Errorf(codes.Internal, "copy dir %s: %v", r.Path, err)
		}
	case syscall.S_IFLNK:
		_ = os.Remove(dst)
		if err := os.Symlink(string(r.Data), dst); err != nil {
			return nil, status.Errorf(codes.Internal, "copy link %s: %v", r.Path, err)
		}
	default:
		f, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY, mode.Perm()|0o600)
		if err != nil {
			return nil, status.Errorf(codes.Internal, "copy file %s: %v", r.Path, err)
		}
		_, err = f.WriteAt(r.Data, r.Offset)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return nil, status.Errorf(codes.Internal, "copy file %s: %v", r.Path, err)
		}
	}
	return empty, nil
}

// What the stand-in does not serve: kata's answer for a missing feature.

func (a *agent) GetDiagnosticData(context.Context, *pb.GetDiagnosticDataRequest) (*pb.GetDiagnosticDataResponse, error) {
	return nil, unimplemented("GetDiagnosticData")
}

func (a *agent) GetIPTables(context.Context, *pb.GetIPTablesRequest) (*pb.GetIPTablesResponse, error) {
	return nil, unimplemented("GetIPTables")
}

func (a *agent) SetIPTables(context.Context, *pb.SetIPTablesRequest) (*pb.SetIPTablesResponse, error) {
	return nil, unimplemented("SetIPTables")
}

func (a *agent) GetMetrics(context.Context, *pb.GetMetricsRequest) (*pb.Metrics, error) {
	return nil, unimplemented("GetMetrics")
}

func (a *agent) MemAgentMemcgSet(context.Context, *pb.MemAgentMemcgConfig) (*emptypb.Empty, error) {
	return nil, unimplemented("MemAgentMemcgSet")
}

func (a *agent) MemAgentCompactSet(context.Context, *pb.MemAgentCompactConfig) (*emptypb.Empty, error) {
	return nil, unimplemented("MemAgentCompactSet")
}

func (a *agent) AddSwap(context.Context, *pb.AddSwapRequest) (*emptypb.Empty, error) {
	return nil, unimplemented("AddSwap")
}

func (a *agent) AddSwapPath(context.Context, *pb.AddSwapPathRequest) (*emptypb.Empty, error) {
	return nil, unimplemented("AddSwapPath")
}

func (a *agent) GetVolumeStats(context.Context, *pb.VolumeStatsRequest) (*pb.VolumeStatsResponse, error) {
	return nil, unimplemented("GetVolumeStats")
}

func (a *agent) ResizeVolume(context.Context, *pb.ResizeVolumeRequest) (*emptypb.Empty, error) {
	return nil, unimplemented("ResizeVolume")
}
