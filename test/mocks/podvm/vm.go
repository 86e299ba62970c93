package podvmfake

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/caa-project/caa/pkg/podvm"
)

// Options says how to boot a fake pod VM.
type Options struct {
	// UserData is what caa gave the VM.
	UserData []byte
	// NetNS, if set, is the VM's network namespace: the forwarder listens
	// there and the VM's end of the pod network's tunnel is built there.
	NetNS string
	// ListenAddr is the forwarder's address: default ":15150" in NetNS,
	// "127.0.0.1:0" without one (so parallel tests do not collide).
	ListenAddr string
	Log        *slog.Logger
	// InstanceID is the cloud's id of the VM (the fleet's), for a VM that
	// asks the cloud's metadata service about itself.
	InstanceID string
}

// VM is a booted fake pod VM.
type VM struct {
	// Files is the user data as the image read it.
	Files podvm.Files
	// Agent is the fake kata agent behind the forwarder; KataAgent
	// instead when the VM runs the test kata agent (Upstream.KataAgent).
	Agent     *Agent
	KataAgent *KataAgent
	// RunDir is the VM's /run/peerpod as upstream's process-user-data
	// wrote it, and PodNS the namespace where upstream's forwarder built
	// the pod network; both empty for the fake forwarder (Upstream).
	RunDir, PodNS string

	closer func()

	ln   net.Listener
	log  *slog.Logger
	wg   sync.WaitGroup
	once sync.Once

	mu       sync.Mutex
	conns    map[net.Conn]struct{}
	accepted int
	rejected []error
	relayed  int
	echoed   int
	metadata []string
}

// StreamMagic opens a connection the fake forwarder echoes instead of
// relaying it to the agent (the same bytes as relaydtest.StreamMagic).
var StreamMagic = []byte("STREAM!!")

// Boot reads the user data as the pod VM's provisioning does, builds the VM's
// end of the tunnel when it has a namespace, starts the fake agent and serves
// the forwarder: mutual TLS with the server certificate, key and client CA
// from apf.json (TLS 1.2 at least, client certificates required and verified,
// as the forwarder's tlsutil does), relaying each connection to the agent.
func Boot(ctx context.Context, o Options) (*VM, error) {
	files, err := podvm.Parse(o.UserData)
	// The image logs and skips a path outside its allow-list; the fake
	// refuses it, so that caa sending a file the VM would drop fails a test.
	if len(files.Skipped) > 0 {
		return nil, fmt.Errorf("fake pod VM: user data writes %v, outside the image's allow-list %v", files.Skipped, podvm.AllowedPaths())
	}
	if err != nil {
		return nil, fmt.Errorf("fake pod VM: %w", err)
	}
	cfg := files.Config
	cert, err := tls.X509KeyPair(cfg.TLSServerCertPEM, cfg.TLSServerKeyPEM)
	if err != nil {
		return nil, fmt.Errorf("fake pod VM: apf.json server certificate: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(cfg.TLSClientCAPEM) {
		return nil, errors.New("fake pod VM: apf.json tls-client-ca holds no certificate")
	}
	tc := &tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{cert},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    pool,
	}
	addr := o.ListenAddr
	if addr == "" {
		addr = "127.0.0.1:0"
		if o.NetNS != "" {
			addr = fmt.Sprintf(":%d", podvm.ForwarderPort)
		}
	}
	log := o.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	vm := &VM{Files: files, log: log, conns: map[net.Conn]struct{}{}}
	listen := func() error {
		vm.ln, err = net.Listen("tcp", addr)
		return err
	}
	if o.NetNS != "" {
		if err := BuildVMEnd(o.NetNS, cfg.Network); err != nil {
			return nil, fmt.Errorf("fake pod VM: pod network: %w", err)
		}
		err = InNetNS(o.NetNS, listen)
	} else {
		err = listen()
	}
	if err != nil {
		return nil, fmt.Errorf("fake pod VM: forwarder listen on %s: %w", addr, err)
	}
	if vm.Agent, err = StartAgent(); err != nil {
		vm.ln.Close()
		return nil, fmt.Errorf("fake pod VM: agent: %w", err)
	}
	vm.wg.Add(1)
	go vm.serve(tc)
	context.AfterFunc(ctx, func() { _ = vm.Close() })
	return vm, nil
}

// Addr is the fake forwarder's listening address.
func (vm *VM) Addr() net.Addr { return vm.ln.Addr() }

func (vm *VM) serve(tc *tls.Config) {
	defer vm.wg.Done()
	for {
		c, err := vm.ln.Accept()
		if err != nil {
			return
		}
		vm.mu.Lock()
		vm.accepted++
		vm.conns[c] = struct{}{}
		vm.mu.Unlock()
		vm.wg.Add(1)
		go vm.forward(tls.Server(c, tc))
	}
}

func (vm *VM) forward(c *tls.Conn) {
	defer vm.wg.Done()
	defer func() {
		c.Close()
		vm.mu.Lock()
		delete(vm.conns, c.NetConn())
		vm.mu.Unlock()
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	err := c.HandshakeContext(ctx)
	cancel()
	if err != nil {
		vm.mu.Lock()
		vm.rejected = append(vm.rejected, err)
		vm.mu.Unlock()
		vm.log.Info("fake forwarder refused a connection", "err", err)
		return
	}
	// A connection opening with StreamMagic is echoed back instead (a byte
	// stream through the relay that a test can check for loss); any other
	// is kata's agent protocol, whose client speaks first.
	head := make([]byte, len(StreamMagic))
	if _, err := io.ReadFull(c, head); err != nil {
		return
	}
	if bytes.Equal(head, StreamMagic) {
		vm.mu.Lock()
		vm.echoed++
		vm.mu.Unlock()
		_, _ = io.Copy(c, c)
		return
	}
	agent, err := net.Dial("unix", vm.Agent.Socket())
	if err != nil {
		vm.log.Error("fake forwarder cannot reach the agent", "err", err)
		return
	}
	defer agent.Close()
	if _, err := agent.Write(head); err != nil {
		return
	}
	vm.mu.Lock()
	vm.relayed++
	vm.mu.Unlock()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(agent, c); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, agent); done <- struct{}{} }()
	<-done
	c.Close()
	agent.Close()
	<-done
}

// Stats is what the fake forwarder saw.
type Stats struct {
	// Accepted TCP connections; Relayed passed mutual TLS and reached the
	// agent; Rejected failed the handshake (the reasons in order).
	Accepted, Relayed int
	Rejected          []error
	Open              int
	// Echoed counts the connections that opened with StreamMagic.
	Echoed int
}

// Stats returns the forwarder's counts so far.
func (vm *VM) Stats() Stats {
	if vm.closer != nil {
		// Upstream's forwarder: what reached the agent is all one can see.
		if vm.Agent == nil {
			return Stats{}
		}
		return Stats{Relayed: vm.Agent.Conns()}
	}
	vm.mu.Lock()
	defer vm.mu.Unlock()
	return Stats{Accepted: vm.accepted, Relayed: vm.relayed, Rejected: append([]error(nil), vm.rejected...), Open: len(vm.conns), Echoed: vm.echoed}
}

// Close stops the forwarder and the agent and cuts every connection: the VM
// is gone.
func (vm *VM) Close() error {
	vm.once.Do(func() {
		if vm.closer != nil {
			vm.closer()
			return
		}
		vm.ln.Close()
		vm.mu.Lock()
		for c := range vm.conns {
			c.Close()
		}
		vm.mu.Unlock()
		vm.Agent.Close()
		vm.wg.Wait()
	})
	return nil
}

// BuildVMEnd builds the VM's end of the tunnel as the image's podnode side
// does (pkg/podnetwork/tunneler/vxlan/podnode.go upstream): a VXLAN device to
// the worker with the sandbox's id and port, carrying the pod's MAC, IP and
// MTU (capped at 1450). The fake puts it straight into the VM's namespace,
// then installs the pod's routes on it (installRoutes), failing where the
// image's forwarder would exit.
func BuildVMEnd(nsPath string, n podvm.Network) error {
	h, err := handleAt(nsPath)
	if err != nil {
		return err
	}
	defer h.Close()
	mac, err := net.ParseMAC(n.PodMAC)
	if err != nil {
		return err
	}
	mtu := min(n.MTU, 1450)
	vx := &netlink.Vxlan{
		LinkAttrs: netlink.LinkAttrs{Name: "vxlan0", HardwareAddr: mac, MTU: mtu},
		VxlanId:   n.VXLANID,
		Group:     n.WorkerIP.Addr().AsSlice(),
		Port:      n.VXLANPort,
	}
	if err := h.LinkAdd(vx); err != nil {
		return fmt.Errorf("vxlan0: %w", err)
	}
	l, err := h.LinkByName("vxlan0")
	if err != nil {
		return err
	}
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: n.PodIP.Addr().AsSlice(), Mask: net.CIDRMask(n.PodIP.Bits(), 32)}}
	if err := h.AddrAdd(l, addr); err != nil {
		return fmt.Errorf("pod IP on vxlan0: %w", err)
	}
	if err := h.LinkSetUp(l); err != nil {
		return fmt.Errorf("vxlan0 up: %w", err)
	}
	return installRoutes(h, n, l)
}
