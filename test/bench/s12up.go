package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"syscall"
	"time"

	"github.com/containerd/ttrpc"

	"github.com/caa-project/caa/pkg/hypervisor/hypervisorpb"
	podvmfake "github.com/caa-project/caa/test/mocks/podvm"
)

// upProc is one run of upstream's cloud-api-adaptor on a rig's node.
type upProc struct {
	cmd     *exec.Cmd
	done    chan error
	logPath string
	started time.Time
}

// upstreamEnv is the configuration a user gives upstream's adaptor on AWS:
// the peer-pods-cm keys (which its flags read from the environment) and
// peer-pods-secret's keys, the fake EC2 named by the SDK's own
// AWS_ENDPOINT_URL_EC2, and the node's paths of the rig.
func upstreamEnv(r *kataRig) []string {
	return hermeticEnv(append([]string{
		"CLOUD_PROVIDER=aws",
		"PODVM_AMI_ID=" + s12Image,
		"AWS_REGION=us-east-1",
		"AWS_SUBNET_ID=subnet-0123456789abcdef0",
		"AWS_SG_IDS=sg-0123456789abcdef0",
		"PODVM_INSTANCE_TYPE=m6a.large",
		"REMOTE_HYPERVISOR_ENDPOINT=" + r.socket,
		"PODS_DIR=" + r.agents,
		"AWS_ENDPOINT_URL_EC2=" + cloudURL(r.f),
	}, r.f.env...)...)
}

// s12Image is the AMI both programs launch (the bench's caa flags name it).
const s12Image = "ami-0123456789abcdef0"

// startUpstream runs `cloud-api-adaptor aws` in the rig's node namespace
// and waits until its hypervisor socket answers Version.
func startUpstream(ctx context.Context, bin string, r *kataRig, logPath string) (*upProc, error) {
	out, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "aws")
	cmd.Env = upstreamEnv(r)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	p := &upProc{cmd: cmd, done: make(chan error, 1), logPath: logPath, started: time.Now()}
	if err := podvmfake.InNetNS(r.cn.NodeNS, cmd.Start); err != nil {
		_ = out.Close()
		return nil, fmt.Errorf("start upstream's cloud-api-adaptor: %w", err)
	}
	go func() { p.done <- cmd.Wait(); _ = out.Close() }()
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	for {
		if upstreamVersion(wctx, r.socket) == nil {
			return p, nil
		}
		select {
		case err := <-p.done:
			p.done <- err
			return nil, fmt.Errorf("upstream's cloud-api-adaptor exited (%v); last lines of %s:\n%s", err, logPath, tail(logPath, 15))
		case <-wctx.Done():
			_ = p.kill()
			return nil, fmt.Errorf("upstream's cloud-api-adaptor never answered on %s; last lines of %s:\n%s", r.socket, logPath, tail(logPath, 15))
		case <-time.After(readyPoll):
		}
	}
}

// upstreamVersion is the shim's Version call on the hypervisor socket.
func upstreamVersion(ctx context.Context, socket string) error {
	conn, err := (&net.Dialer{}).DialContext(ctx, "unix", socket)
	if err != nil {
		return err
	}
	c := ttrpc.NewClient(conn)
	defer c.Close()
	cctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	_, err = hypervisorpb.NewHypervisorClient(c).Version(cctx, &hypervisorpb.VersionRequest{})
	return err
}

func (p *upProc) kill() error {
	if err := p.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	err := <-p.done
	p.done <- err
	return nil
}

// stop is SIGTERM, as the kubelet stops the pod, and the wait (SIGKILL
// after 30 s, its default grace period).
func (p *upProc) stop() error {
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	select {
	case err := <-p.done:
		p.done <- err
		return nil
	case <-time.After(30 * time.Second):
		return p.kill()
	}
}
