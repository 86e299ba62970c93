// Command kata-agent is a test stand-in for kata's agent in the fake pod VM
// (test/mocks/podvm): it serves kata's real agent API over ttrpc, compiled
// from kata's own generated protocol code (kata 4.1.0's
// src/runtime/virtcontainers/pkg/agent/protocols/grpc, taken from
// $UPSTREAM_SRC at build time by test/e2e/upstream; never copied here).
//
// Each container's process is a real process of the VM: its OCI command,
// environment and working directory, in the namespaces the agent runs in
// (the pod network namespace), with its real exit status and output. The
// sandbox (pause) container runs this binary in its pause mode. Calls the
// stand-in does not serve answer Unimplemented, as kata's agent does for
// what it lacks, and every call is counted by method and outcome in the
// file -calls names (JSON, rewritten after each call) so tests can show what
// the shim called and assert that nothing went unserved.
//
//	kata-agent -socket /run/kata-containers/agent.sock -calls calls.json -root DIR
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"syscall"

	"github.com/containerd/ttrpc"
	pb "github.com/kata-containers/kata-containers/src/runtime/virtcontainers/pkg/agent/protocols/grpc"
)

func main() {
	socket := flag.String("socket", "/run/kata-containers/agent.sock", "unix socket to serve the agent API on")
	calls := flag.String("calls", "", "file the call counts are written to (JSON), after each call")
	root := flag.String("root", "", "directory standing for the VM's root in CopyFile (default: a temporary directory)")
	pause := flag.Bool("pause", false, "be a sandbox's pause process: wait for SIGTERM or SIGINT, then exit 0")
	flag.Parse()
	if *pause {
		ch := make(chan os.Signal, 1)
		signal.Notify(ch, syscall.SIGTERM, syscall.SIGINT)
		<-ch
		return
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := run(log, *socket, *calls, *root); err != nil {
		log.Error("kata-agent", "err", err)
		os.Exit(1)
	}
}

func run(log *slog.Logger, socket, calls, root string) error {
	if root == "" {
		dir, err := os.MkdirTemp("", "kata-agent-root-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		root = dir
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("locate own binary (the pause process): %w", err)
	}
	a := newAgent(log, self, root, newCounter(calls))
	srv, err := ttrpc.NewServer(ttrpc.WithUnaryServerInterceptor(a.calls.intercept))
	if err != nil {
		return err
	}
	pb.RegisterAgentServiceService(srv, a)
	pb.RegisterHealthService(srv, health{})
	_ = os.Remove(socket)
	ln, err := net.Listen("unix", socket)
	if err != nil {
		return fmt.Errorf("listen on -socket %s: %w", socket, err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	go func() {
		<-ctx.Done()
		a.killAll()
		_ = srv.Close()
	}()
	log.Info("kata agent stand-in serving", "socket", socket, "calls", calls)
	if err := srv.Serve(ctx, ln); err != nil && !errors.Is(err, ttrpc.ErrServerClosed) {
		return err
	}
	return nil
}

// health is kata's health service: the shim's liveness check every few
// seconds, and the version.
type health struct{}

func (health) Check(context.Context, *pb.CheckRequest) (*pb.HealthCheckResponse, error) {
	return &pb.HealthCheckResponse{Status: pb.HealthCheckResponse_SERVING}, nil
}

func (health) Version(context.Context, *pb.CheckRequest) (*pb.VersionCheckResponse, error) {
	return &pb.VersionCheckResponse{GrpcVersion: pb.APIVersion, AgentVersion: agentVersion}, nil
}

// agentVersion is what GetGuestDetails and Version report.
const agentVersion = "4.1.0-caa-test-stand-in"
