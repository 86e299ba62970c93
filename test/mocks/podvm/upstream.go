package podvmfake

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/caa-project/caa/pkg/podvm"
)

// UpstreamBinEnv names the directory holding upstream peer-pods' pod-VM
// programs (process-user-data and agent-protocol-forwarder). Tests that
// find it set boot their VMs with Upstream instead of the fake forwarder.
const UpstreamBinEnv = "CAA_UPSTREAM_PODVM_BIN"

// Upstream boots a pod VM with the stock image's own programs instead of
// the fake forwarder: process-user-data reads the user data from a cidata
// volume and writes /run/peerpod, then agent-protocol-forwarder serves
// mutual TLS on :15150 in the VM's namespace, builds the pod network in a
// pod namespace of its own and relays to the fake kata agent. Each VM runs
// in a private mount namespace, so its /run/peerpod and /media/cidata are
// directories of the test; the host's are only mount points.
type Upstream struct {
	// Dir holds process-user-data and agent-protocol-forwarder.
	Dir string
	// Ready bounds how long a VM may take to listen (default 60 s).
	Ready time.Duration
	// EC2IMDS, when set, makes each VM an EC2 instance to the programs:
	// no cidata volume, SMBIOS naming "Amazon EC2", and this instance
	// metadata service at 169.254.169.254 in the VM's namespace, so
	// process-user-data fetches the user data itself (IMDSv2 token, then
	// user-data). Otherwise the user data is on a cidata volume.
	EC2IMDS func(instanceID string) http.Handler
	// KataAgent, when set, is the test kata agent's binary
	// (test/kataagent): each VM runs it as its agent, in the pod
	// namespace, instead of the in-process fake (VM.KataAgent, not
	// VM.Agent).
	KataAgent string
}

// CheckUpstream says what is missing for Upstream to run: the programs in
// dir, iptables (the forwarder's network setup runs it) and root.
func CheckUpstream(dir string) error {
	var errs []error
	if dir == "" {
		errs = append(errs, fmt.Errorf("%s is not set: build upstream's pod-VM programs and point it at their directory", UpstreamBinEnv))
	}
	for _, p := range []string{"process-user-data", "agent-protocol-forwarder"} {
		if _, err := os.Stat(filepath.Join(dir, p)); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", p, err))
		}
	}
	if _, err := exec.LookPath("iptables"); err != nil {
		errs = append(errs, fmt.Errorf("the forwarder's network setup needs iptables (apt-get install iptables): %w", err))
	}
	if os.Geteuid() != 0 {
		errs = append(errs, errors.New("the VMs need root: mount and network namespaces"))
	}
	return errors.Join(errs...)
}

// upstreamScript runs in the VM's network namespace and a private mount
// namespace: the volume and the VM's /run/peerpod mounted where the image
// has them, the provisioning, then the forwarder in the shell's place.
const upstreamScript = `set -e
mount --bind "$VMDIR/cidata" /media/cidata
if [ -d "$VMDIR/dmi" ]; then
  mount -t tmpfs caa-fake-firmware /sys/firmware
  mkdir -p /sys/firmware/dmi/tables
  cp "$VMDIR/dmi/smbios_entry_point" "$VMDIR/dmi/DMI" /sys/firmware/dmi/tables/
fi
mount --bind "$VMDIR/peerpod" /run/peerpod
"$BIN/process-user-data" provision-files --user-data-fetch-timeout 10
exec "$BIN/agent-protocol-forwarder" -kata-agent-socket "$AGENT" -pod-namespace "$PODNS" -host-interface eth0
`

// Boot starts the programs for one VM. It returns once the forwarder
// listens, or with the programs' output when they exit first.
func (u Upstream) Boot(ctx context.Context, o Options) (*VM, error) {
	if o.NetNS == "" {
		return nil, errors.New("upstream pod VM: needs a network namespace")
	}
	// The host-side copy of what the image parses: for the tests' checks
	// only. Whether the VM boots is the real program's word.
	files, _ := podvm.Parse(o.UserData)
	log := o.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	for _, mp := range []string{"/media/cidata", "/run/peerpod"} {
		if err := os.MkdirAll(mp, 0o755); err != nil {
			return nil, fmt.Errorf("upstream pod VM: mount point %s: %w", mp, err)
		}
	}
	dir, err := os.MkdirTemp("", "caa-upvm-")
	if err != nil {
		return nil, err
	}
	vm := &VM{Files: files, log: log, conns: map[net.Conn]struct{}{}, RunDir: filepath.Join(dir, "peerpod")}
	var cleanups []func()
	undo := func() {
		for i := len(cleanups) - 1; i >= 0; i-- {
			cleanups[i]()
		}
	}
	cleanups = append(cleanups, func() { _ = os.RemoveAll(dir) })
	for _, d := range []string{"cidata", "peerpod"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o700); err != nil {
			undo()
			return nil, err
		}
	}
	if u.EC2IMDS == nil {
		if err := os.WriteFile(filepath.Join(dir, "cidata", "user-data"), o.UserData, 0o600); err != nil {
			undo()
			return nil, err
		}
	} else {
		stop, err := u.serveEC2(vm, dir, o)
		if err != nil {
			undo()
			return nil, fmt.Errorf("upstream pod VM: EC2 metadata: %w", err)
		}
		cleanups = append(cleanups, stop)
	}
	podNS := "caapod" + strings.TrimPrefix(randomName(), "caa")
	if vm.PodNS, err = newNamed(podNS); err != nil {
		undo()
		return nil, fmt.Errorf("upstream pod VM: pod namespace: %w", err)
	}
	cleanups = append(cleanups, func() { _ = netns.DeleteNamed(podNS) })
	var agentSocket string
	if u.KataAgent != "" {
		if vm.KataAgent, err = startKataAgent(ctx, u.KataAgent, filepath.Join(dir, "agent"), vm.PodNS); err != nil {
			undo()
			return nil, fmt.Errorf("upstream pod VM: %w", err)
		}
		cleanups = append(cleanups, vm.KataAgent.stop)
		agentSocket = vm.KataAgent.Socket
	} else {
		if vm.Agent, err = StartAgent(); err != nil {
			undo()
			return nil, fmt.Errorf("upstream pod VM: agent: %w", err)
		}
		cleanups = append(cleanups, func() { _ = vm.Agent.Close() })
		agentSocket = vm.Agent.Socket()
	}

	out := &syncBuffer{}
	cmd := exec.Command("sh", "-c", upstreamScript)
	cmd.Env = append(os.Environ(), "VMDIR="+dir, "BIN="+u.Dir, "AGENT="+agentSocket, "PODNS="+vm.PodNS)
	cmd.Stdout, cmd.Stderr = out, out
	// A private mount namespace of its own (Go makes its mounts private),
	// and a process group, so Close ends the forwarder with the shell.
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS, Setpgid: true}
	if err := InNetNS(o.NetNS, cmd.Start); err != nil {
		undo()
		return nil, fmt.Errorf("upstream pod VM: start: %w", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	cleanups = append(cleanups, func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-exited
		}
		if out.Len() > 0 {
			log.Debug("upstream pod VM output", "out", out.String())
		}
	})
	ready := u.Ready
	if ready <= 0 {
		ready = 60 * time.Second
	}
	deadline := time.Now().Add(ready)
	dial := DialIn(o.NetNS)
	for {
		c, err := dial(ctx, "tcp", fmt.Sprintf("127.0.0.1:%d", podvm.ForwarderPort))
		if err == nil {
			c.Close()
			break
		}
		select {
		case <-exited:
			undo()
			return nil, fmt.Errorf("upstream pod VM exited before its forwarder listened:\n%s", out.String())
		case <-ctx.Done():
			undo()
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			undo()
			return nil, fmt.Errorf("upstream pod VM: no forwarder on :%d after %s:\n%s", podvm.ForwarderPort, ready, out.String())
		}
	}
	vm.closer = undo
	context.AfterFunc(ctx, func() { _ = vm.Close() })
	return vm, nil
}

// serveEC2 writes the VM's SMBIOS tables into dir/dmi and serves the
// instance's metadata at 169.254.169.254:80 in the VM's namespace.
func (u Upstream) serveEC2(vm *VM, dir string, o Options) (stop func(), err error) {
	if o.InstanceID == "" {
		return nil, errors.New("no instance id to serve metadata for")
	}
	ep, table := smbiosTables("Amazon EC2", "m6a.large")
	if err := os.Mkdir(filepath.Join(dir, "dmi"), 0o700); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "dmi", "smbios_entry_point"), ep, 0o400); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "dmi", "DMI"), table, 0o400); err != nil {
		return nil, err
	}
	h, err := handleAt(o.NetNS)
	if err != nil {
		return nil, err
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err != nil {
		return nil, err
	}
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: net.IPv4(169, 254, 169, 254), Mask: net.CIDRMask(32, 32)}}
	if err := h.AddrAdd(lo, addr); err != nil && !errors.Is(err, syscall.EEXIST) {
		return nil, fmt.Errorf("169.254.169.254 on the VM's lo: %w", err)
	}
	var ln net.Listener
	if err := InNetNS(o.NetNS, func() (err error) {
		ln, err = net.Listen("tcp", "169.254.169.254:80")
		return err
	}); err != nil {
		return nil, err
	}
	imds := u.EC2IMDS(o.InstanceID)
	served := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		vm.mu.Lock()
		vm.metadata = append(vm.metadata, r.Method+" "+r.URL.Path)
		vm.mu.Unlock()
		imds.ServeHTTP(w, r)
	})
	srv := &http.Server{Handler: served, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	return func() { _ = srv.Close() }, nil
}

// MetadataRequests lists the requests the VM's programs made to its
// instance metadata service ("PUT /latest/api/token", ...), in order.
func (vm *VM) MetadataRequests() []string {
	vm.mu.Lock()
	defer vm.mu.Unlock()
	return append([]string(nil), vm.metadata...)
}

// syncBuffer is a buffer two goroutines may write and read.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func (s *syncBuffer) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Len()
}
