package sandbox

import (
	"context"
	crand "crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/caa-project/caa/pkg/ledger"
	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/pkg/reconcile"
)

// CreateVM records sandbox id of the pod the annotations name and returns
// the agent socket path it will be served on. It makes no cloud call. A
// repeated CreateVM for the same sandbox and pod answers the same path.
func (m *Manager) CreateVM(ctx context.Context, id string, annotations map[string]string, netns string) (string, error) {
	if m.stopping() {
		return "", ErrStopping
	}
	if err := checkID(id); err != nil {
		return "", err
	}
	if err := checkAnnotations(id, annotations); err != nil {
		return "", err
	}
	netns, err := CheckNetNS(netns)
	if err != nil {
		return "", fmt.Errorf("sandbox %s: %w", id, err)
	}
	who, err := ReadPodIdentity(annotations)
	if err != nil {
		return "", fmt.Errorf("sandbox %s: %w", id, err)
	}
	ns, name := who.Namespace, who.Name
	initData := annotations[AnnotationInitData]
	sel, err := m.cfg.Spec.Select(annotations)
	if err != nil {
		return "", fmt.Errorf("%w: sandbox %s of pod %s/%s: %w", ErrInvalid, id, ns, name, err)
	}
	if old, err := m.cfg.Ledger.GetSandbox(id); err == nil {
		if old.Namespace != ns || old.Name != name || who.UID != "" && old.PodUID != who.UID {
			return "", fmt.Errorf("%w: sandbox %s is recorded for pod %s (UID %s), not %s", ErrInvalid, id, old.PodRef(), old.PodUID, who)
		}
		m.keep(id, initData)
		return old.AgentSocket, nil
	} else if !errors.Is(err, ledger.ErrNotFound) {
		return "", fmt.Errorf("read sandbox %s: %w", id, err)
	}
	pod, err := m.waitPod(ctx, who)
	if err != nil {
		return "", fmt.Errorf("sandbox %s: %w", id, err)
	}
	// The TEE the VM is to be (none with --confidential=false), recorded
	// with the sandbox so StartVM asks for it and checks what the cloud
	// reports, across restarts too. The pod's own caa.dev/tee annotation
	// picks among several: kata's shims forward only their hypervisor
	// annotations, so it is read from the pod.
	teeAnn := map[string]string{provider.AnnotationTEE: annotations[provider.AnnotationTEE]}
	if v, ok := pod.Annotations[provider.AnnotationTEE]; ok {
		teeAnn[provider.AnnotationTEE] = v
	}
	tee, err := m.cfg.Spec.SelectTEE(teeAnn, sel.InstanceType)
	if err != nil {
		return "", fmt.Errorf("%w: sandbox %s of pod %s/%s: %w", ErrInvalid, id, ns, name, err)
	}
	if pod.NotPeer {
		// The same test as the informer mode's (the pod cache's NotPeer),
		// so both modes serve the same pods.
		return "", fmt.Errorf("%w: sandbox %s: pod %s has runtime class %q, which this caa does not serve (--runtime-class %s); "+
			"add the class to --runtime-class if its pods are peer pods, or point that class's kata configuration at another "+
			"hypervisor", ErrInvalid, id, who, pod.RuntimeClass, strings.Join(m.cfg.RuntimeClasses, ","))
	}

	m.mu.Lock() // one VXLAN id per live sandbox on this node
	defer m.mu.Unlock()
	vxlan, err := m.freeVXLAN()
	if err != nil {
		return "", err
	}
	s := ledger.Sandbox{
		ID: id, PodUID: pod.UID, Namespace: ns, Name: name, NetNS: netns,
		Provider: m.cfg.Provider.Name(), InstanceType: sel.InstanceType, Image: sel.Image,
		AgentSocket: m.SocketPath(id), Phase: ledger.SandboxCreated, Reason: "CreateVM",
		Tunnel:       ledger.Tunnel{VXLANID: vxlan, Port: VXLANPort, LocalIP: ipString(m.cfg.NodeIP)},
		Confidential: string(tee),
	}
	if _, err := m.cfg.Ledger.PutSandbox(s); err != nil {
		return "", fmt.Errorf("record sandbox %s: %w", id, err)
	}
	m.keepLocked(id, initData)
	m.cfg.Log.Info("sandbox recorded", "sandbox", id, "pod", s.PodRef(), "podUID", pod.UID, "type", sel.InstanceType, "image", sel.Image,
		"confidential", m.mode(tee))
	if sel.Notice != "" {
		m.cfg.Log.Warn("sandbox's VM is smaller than its pod asks", "sandbox", id, "pod", s.PodRef(), "notice", sel.Notice)
		m.event(s, true, EventSmallerThanAsked, fmt.Sprintf("sandbox %s: %s", short(id), sel.Notice))
	}
	return s.AgentSocket, nil
}

// EventSmallerThanAsked is the pod event of a sandbox whose VM gets the
// default instance type although the pod asks for more (no
// --instance-types list to fit it to).
const EventSmallerThanAsked = reconcile.EventSmallerThanAsked

func (m *Manager) keep(id, initData string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.keepLocked(id, initData)
}

func (m *Manager) keepLocked(id, initData string) {
	l := m.live[id]
	if l == nil {
		l = &live{id: id}
		m.live[id] = l
	}
	l.initData = initData
}

// freeVXLAN is a VXLAN id no recorded sandbox uses, drawn at random
// (VXLANIDBase): a pod VM, or a host on the node's network, cannot tell
// another sandbox's id from its own, which the node's guard (package tunnel)
// backs by the VM's address. A record keeps the id it has (an earlier caa's
// count from VXLANIDBase included). Caller holds mu.
func (m *Manager) freeVXLAN() (int, error) {
	all, err := m.cfg.Ledger.ListSandboxes()
	if err != nil {
		return 0, fmt.Errorf("read sandboxes: %w", err)
	}
	used := map[int]bool{}
	for _, s := range all {
		used[s.Tunnel.VXLANID] = true
	}
	// With n ids in use a draw collides with chance n/16.2M: a few draws
	// always do; the count up is for a node no draw serves.
	for range 16 {
		id, err := m.drawVXLAN()
		if err != nil {
			return 0, fmt.Errorf("draw a VXLAN id: %w", err)
		}
		if id < VXLANIDBase || id > VXLANIDMax {
			return 0, fmt.Errorf("draw a VXLAN id: %d is outside %d..%d", id, VXLANIDBase, VXLANIDMax)
		}
		if !used[id] {
			return id, nil
		}
	}
	for id := VXLANIDBase; id <= VXLANIDMax; id++ {
		if !used[id] {
			return id, nil
		}
	}
	return 0, fmt.Errorf("no VXLAN id left in %d..%d", VXLANIDBase, VXLANIDMax)
}

// drawVXLAN is a VXLAN id in VXLANIDBase..VXLANIDMax from the system's
// random source.
func drawVXLAN() (int, error) {
	n, err := crand.Int(crand.Reader, big.NewInt(VXLANIDMax-VXLANIDBase+1))
	if err != nil {
		return 0, err
	}
	return VXLANIDBase + int(n.Int64()), nil
}

// waitPod finds the pod in the node's pod cache, waiting up to PodWait for
// an informer that has not seen it yet. With a UID (CRI-O's name) the pod
// is found by it, or, for a static pod, by its mirror pod's config hash,
// and its namespace and name must agree.
func (m *Manager) waitPod(ctx context.Context, who PodIdentity) (*reconcile.Pod, error) {
	ctx, cancel := context.WithTimeout(ctx, m.cfg.PodWait)
	defer cancel()
	poll := min(m.cfg.Poll, 100*time.Millisecond)
	for {
		for _, p := range m.cfg.Pods.Pods() {
			if p.Terminal {
				continue
			}
			if who.UID == "" {
				if p.Namespace == who.Namespace && p.Name == who.Name {
					return p, nil
				}
				continue
			}
			if p.UID != who.UID && p.Annotations[mirrorAnnotation] != who.UID {
				continue
			}
			if p.Namespace != who.Namespace || p.Name != who.Name {
				return nil, fmt.Errorf("%w: the sandbox names pod %s but the pod of that UID is %s/%s", ErrInvalid, who, p.Namespace, p.Name)
			}
			return p, nil
		}
		if err := sleep(ctx, poll); err != nil {
			return nil, fmt.Errorf("%w: pod %s is not a live pod of node %s (waited %s for the pod cache)",
				ErrInvalid, who, m.cfg.Node, m.cfg.PodWait)
		}
	}
}

// mirrorAnnotation holds a static pod's config hash on its mirror pod: the
// kubelet's UID for the pod, which CRI-O's name carries, while the API
// server gives the mirror pod a UID of its own.
const mirrorAnnotation = "kubernetes.io/config.mirror"

// StartVM gives sandbox id its VM: the durable intent, the cloud create,
// the wait for a running VM with an IP, the tunnel and the relay. It
// returns once the relay reaches the VM's forwarder, or an error naming
// what failed within StartTimeout.
func (m *Manager) StartVM(ctx context.Context, id string) error {
	if m.stopping() {
		return ErrStopping
	}
	if err := checkID(id); err != nil {
		return err
	}
	l, err := m.enter(ctx, id)
	if err != nil {
		return err
	}
	defer m.leave(l)
	ctx, cancel := context.WithTimeout(ctx, m.cfg.StartTimeout)
	defer cancel()
	m.mu.Lock()
	l.cancel = cancel
	m.mu.Unlock()

	s, err := m.cfg.Ledger.GetSandbox(id)
	if errors.Is(err, ledger.ErrNotFound) {
		return fmt.Errorf("%w: sandbox %s: StartVM needs a CreateVM first", ErrUnknownSandbox, id)
	} else if err != nil {
		return fmt.Errorf("read sandbox %s: %w", id, err)
	}
	switch s.Phase {
	case ledger.SandboxRunning:
		return m.serve(ctx, l, s) // a repeated StartVM: serve again if needed
	case ledger.SandboxLost, ledger.SandboxFailed, ledger.SandboxDeleting:
		return fmt.Errorf("%w: sandbox %s is %s (%s: %s)", ErrNotStartable, id, s.Phase, s.Reason, s.Message)
	}
	if pod := m.cfg.Pods.Pod(s.PodUID); pod == nil || pod.Terminal {
		return fmt.Errorf("%w: sandbox %s: pod %s (%s) is gone or finished", ErrNotStartable, id, s.PodRef(), s.PodUID)
	}
	// A Created sandbox takes a new key for this StartVM, which nothing
	// can have sent yet; a Creating one was cut short after its intent.
	maybeSent := s.Phase != ledger.SandboxCreated
	if s, err = m.intend(ctx, l, s); err != nil {
		return err
	}
	if s, err = m.createVM(ctx, s, maybeSent); err != nil {
		return err
	}
	if s, err = m.waitRunning(ctx, s); err != nil {
		return err
	}
	if err := m.serve(ctx, l, s); err != nil {
		m.note(s.ID, "AgentUnreachable", err.Error())
		return err
	}
	s, err = m.update(id, func(s *ledger.Sandbox) error {
		if s.Phase != ledger.SandboxCreating {
			return fmt.Errorf("%w: sandbox %s turned %s during StartVM", ErrNotStartable, id, s.Phase)
		}
		s.Phase, s.Reason, s.Message = ledger.SandboxRunning, "Started", "VM running, agent reachable"
		return nil
	})
	if err != nil {
		m.closeRelay(id)
		if err := m.teardownTunnel(s); err != nil {
			m.cfg.Log.Warn("tearing the tunnel down failed", "sandbox", id, "err", err)
		}
		return err
	}
	m.event(s, false, reconcile.EventVMCreated, fmt.Sprintf("VM %s of sandbox %s runs at %s; the agent answers", s.VMID, short(id), s.RelayAddr))
	m.cfg.Log.Info("sandbox started", "sandbox", id, "pod", s.PodRef(), "vm", s.VMID, "ip", s.RelayAddr,
		"confidential", m.mode(provider.TEE(s.Confidential)))
	m.supersede(s)
	return nil
}

// intend writes the durable intent (Creating, with the attempt's key and
// the serial of the certificate the user data carries) and returns the
// record; the user data itself stays in memory (I7).
func (m *Manager) intend(ctx context.Context, l *live, s ledger.Sandbox) (ledger.Sandbox, error) {
	if s.Phase == ledger.SandboxCreated {
		s.Attempt++
		s.Key = Key(s.ID, s.Attempt)
		s.VMName = VMName(s.Name, s.ID)
	}
	// A Creating record is a StartVM cut short (a crash, a shim's retry):
	// the same key makes the cloud return the VM already made, if any.
	initData, err := m.initData(l, s)
	if err != nil {
		m.fail(s.ID, "InitData", err)
		return s, fmt.Errorf("%w: sandbox %s: %w", ErrNotStartable, s.ID, err)
	}
	authJSON := m.authJSON(ctx, s)
	// The user data reads the pod network from its namespace (netlink): a
	// tunnel operation.
	var data []byte
	var serial string
	build := func(auth []byte) error {
		return m.tunnelOp(ctx, func() (err error) {
			data, serial, err = m.cfg.Side.UserData(ctx, UserDataInput{Sandbox: s, Tunnel: s.Tunnel, InitData: initData, AuthJSON: auth})
			return err
		})
	}
	err = build(authJSON)
	if limit := m.cfg.Spec.UserDataLimit; err == nil && limit > 0 && len(data) > limit && len(authJSON) > 0 {
		// The cloud's cap on user data: the image-pull credentials are
		// the part a VM can start without (a public image still pulls).
		full := len(data)
		clear(data)
		m.cfg.Log.Warn("the VM's user data is over the cloud's cap with the pod's image-pull credentials; its VM gets none",
			"sandbox", s.ID, "pod", s.PodRef(), "bytes", full, "cap", limit)
		m.event(s, true, EventPullSecrets, fmt.Sprintf("sandbox %s: its VM gets no image-pull credentials: with them (%d bytes as auth.json) its user data is %d bytes, over the cloud's %d-byte cap; name fewer or smaller imagePullSecrets on the pod and its service account, or make its initdata smaller",
			short(s.ID), len(authJSON), full, limit))
		err = build(nil)
	}
	clear(authJSON)
	if err == nil {
		if limit := m.cfg.Spec.UserDataLimit; limit > 0 && len(data) > limit {
			clear(data)
			err = fmt.Errorf("the VM's user data is %d bytes (its initdata %d bytes), over the cloud's %d-byte cap, even without image-pull credentials: make the pod's initdata smaller",
				len(data), len(initData), limit)
		}
	}
	if errors.Is(err, errNoTurn) {
		return s, m.startErr(s, "build the VM's user data", err)
	}
	if err != nil {
		m.fail(s.ID, "UserData", err)
		return s, fmt.Errorf("%w: sandbox %s: build the VM's user data: %w", ErrNotStartable, s.ID, err)
	}
	l.pendingUserData(data)
	s.Phase, s.Reason, s.Message = ledger.SandboxCreating, "StartVM", "creating the VM"
	s.CertSerials = append(s.CertSerials, serial)
	stored, err := m.cfg.Ledger.PutSandbox(s)
	if err != nil {
		return s, fmt.Errorf("record the intent of sandbox %s: %w", s.ID, err)
	}
	return stored, nil
}

func (l *live) pendingUserData(b []byte) { l.userData = b }

// createVM sends the create (idempotent by the record's key) and records
// the VM. The call runs on its own context, bounded by CallTimeout: a
// StopVM that cancels the StartVM must still learn which VM was made.
// maybeSent says the key may have reached the cloud before this StartVM.
func (m *Manager) createVM(ctx context.Context, s ledger.Sandbox, maybeSent bool) (ledger.Sandbox, error) {
	l := m.liveOf(s.ID)
	spec := provider.Spec{
		Key: s.Key, Cluster: m.cfg.Cluster, Node: m.cfg.Node, PodUID: s.PodUID, PodNamespace: s.Namespace, PodName: s.Name,
		InstanceType: s.InstanceType, Image: s.Image, UserData: l.userData, TEE: provider.TEE(s.Confidential),
		ExtraTags: map[string]string{TagSandbox: s.ID}, MaybeSent: maybeSent,
	}
	var vm provider.VM
	var err error
	// Throttling is caa's to absorb, not kata's to see (as in the informer
	// mode): a refused create waits and goes again with the same key, each
	// try taking a token of the write budget, until the StartVM's deadline.
	for try := 0; ; try++ {
		if err := m.take(ctx, m.cfg.Writes); err != nil {
			l.userData = nil
			return s, err
		}
		callCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.cfg.CallTimeout)
		vm, err = m.cfg.Provider.Create(callCtx, spec)
		cancel()
		if !errors.Is(err, provider.ErrThrottled) {
			break
		}
		wait := throttleWait(err, try)
		m.cfg.Log.Debug("cloud throttled a create; trying again", "sandbox", s.ID, "try", try+1, "retryIn", wait)
		if serr := sleep(ctx, wait); serr != nil {
			l.userData = nil
			m.note(s.ID, "CreateThrottled", err.Error())
			return s, m.startErr(s, "create its VM", fmt.Errorf("%w (the cloud throttled every try: %w)", serr, err))
		}
	}
	l.userData = nil
	if err != nil {
		if errors.Is(err, provider.ErrInvalidSpec) || errors.Is(err, provider.ErrAuth) {
			m.fail(s.ID, "CreateFailed", err)
			return s, fmt.Errorf("%w: sandbox %s: the cloud refused its VM: %w", ErrNotStartable, s.ID, err)
		}
		m.note(s.ID, "CreateFailed", err.Error())
		return s, fmt.Errorf("sandbox %s: create its VM: %w", s.ID, err)
	}
	s, err = m.update(s.ID, func(r *ledger.Sandbox) error {
		r.VMID, r.IPs = vm.ID, vm.IPs
		if r.Phase == ledger.SandboxCreating {
			r.Message = "VM created, waiting for it to run"
		}
		return nil
	})
	if err != nil {
		return s, fmt.Errorf("record VM %s of sandbox %s: %w", vm.ID, s.ID, err)
	}
	if s.Phase != ledger.SandboxCreating {
		return s, fmt.Errorf("%w: sandbox %s turned %s during StartVM", ErrNotStartable, s.ID, s.Phase)
	}
	m.cfg.Log.Info("sandbox VM created", "sandbox", s.ID, "pod", s.PodRef(), "vm", vm.ID, "key", s.Key,
		"confidential", m.mode(provider.TEE(s.Confidential)))
	return s, nil
}

// throttleWait is how long a create throttled for the (try+1)-th time in a
// row waits: from 1 s, doubling to at most 10 s (kata's shim waits minutes
// for StartVM; a node's burst should follow the account's refill closely),
// drawn from the upper half so that a burst's retries spread out, and never
// less than the cloud's Retry-After.
func throttleWait(err error, try int) time.Duration {
	d := time.Second << min(try, 4)
	d = min(d, 10*time.Second)
	d = d/2 + rand.N(d/2+1)
	if ra, ok := provider.RetryAfter(err); ok && ra > d {
		d = ra
	}
	return d
}

// waitRunning polls the VM until it runs with an IP.
func (m *Manager) waitRunning(ctx context.Context, s ledger.Sandbox) (ledger.Sandbox, error) {
	for {
		if err := m.take(ctx, m.cfg.Reads); err != nil {
			return s, m.startErr(s, "wait for the VM to run", err)
		}
		callCtx, cancel := context.WithTimeout(ctx, m.cfg.CallTimeout)
		vm, err := m.cfg.Provider.Get(callCtx, s.VMID)
		cancel()
		switch {
		case err == nil && vm.State.Alive() && vm.Downgraded(provider.TEE(s.Confidential)) != "":
			return s, m.refuseDowngraded(s, vm)
		case err == nil && vm.State == provider.StateRunning && len(vm.IPs) > 0:
			ip := vm.IPs[0]
			return m.update(s.ID, func(r *ledger.Sandbox) error {
				if r.Phase != ledger.SandboxCreating {
					return fmt.Errorf("%w: sandbox %s turned %s during StartVM", ErrNotStartable, s.ID, r.Phase)
				}
				r.IPs = vm.IPs
				r.RelayAddr = net.JoinHostPort(ip, strconv.Itoa(ForwarderPort))
				r.Tunnel.RemoteIP = ip
				r.Message = "VM running, connecting to its agent"
				return nil
			})
		case err == nil && (vm.State.Dead() || vm.State.Gone()):
			m.note(s.ID, "VMDied", fmt.Sprintf("VM %s went %s while booting", s.VMID, vm.State))
			return s, fmt.Errorf("%w: sandbox %s: VM %s went %s while booting", ErrNotStartable, s.ID, s.VMID, vm.State)
		case err != nil && !errors.Is(err, provider.ErrNotFound):
			m.cfg.Log.Warn("reading a booting VM failed; trying again", "sandbox", s.ID, "vm", s.VMID, "err", err)
		}
		if err := sleep(ctx, m.cfg.Poll); err != nil {
			return s, m.startErr(s, "wait for the VM to run", err)
		}
	}
}

// refuseDowngraded never serves a sandbox whose VM the cloud reports as
// not the confidential VM it was asked to be: the report is positive
// evidence, so the sandbox turns Deleting and its VM is deleted (in the
// background, as StopVM's), with a warning event on the pod. The error
// fails the StartVM (or, after a restart, the sandbox is not served).
func (m *Manager) refuseDowngraded(s ledger.Sandbox, vm provider.VM) error {
	why := vm.Downgraded(provider.TEE(s.Confidential))
	m.cfg.Log.Error("sandbox's VM is not confidential as asked: not served, VM deleted", "sandbox", s.ID, "pod", s.PodRef(),
		"vm", vm.ID, "asked", provider.TEE(s.Confidential).String(), "reported", vm.TEE.String())
	stored, err := m.retire(s.ID, reconcile.ReasonNotConfidential, why)
	if err != nil {
		m.cfg.Log.Error("recording a sandbox refused as not confidential failed", "sandbox", s.ID, "err", err)
		stored = s
	}
	m.event(stored, true, reconcile.ReasonNotConfidential, fmt.Sprintf("sandbox %s: %s; it is never served: the VM is deleted and kata "+
		"will start a new sandbox", short(s.ID), why))
	return fmt.Errorf("%w: sandbox %s: %s", ErrNotStartable, s.ID, why)
}

// mode names a sandbox's TEE for logs: the TEE, or the opt-out.
func (m *Manager) mode(t provider.TEE) string { return provider.Mode(m.cfg.Spec.Confidential, t) }

// serve starts the sandbox's tunnel and relay (again, after a restart) and
// waits for the forwarder to answer.
//
// StopVM takes no turn (kata gives it about a second), so it may land while
// serve sets up the tunnel or starts the relay: its closeRelay then finds no
// relay yet, and its teardown may run before the setup. So once both are
// made, serve reads the record again and undoes them if the sandbox was
// retired meanwhile. Either StopVM's close comes after l.relay is set and
// closes it, or its Deleting write came before this read. A serve cut short
// before its setup had a turn (TunnelOps) made no tunnel: StopVM's own
// teardown is all there is to do, and the cancelled StartVM answers at once.
func (m *Manager) serve(ctx context.Context, l *live, s ledger.Sandbox) (err error) {
	var setUp bool // a tunnel setup ran (or was cut short inside the kernel)
	defer func() {
		if !m.retired(s.ID) {
			return
		}
		m.closeRelay(s.ID)
		if setUp {
			if terr := m.teardownTunnel(s); terr != nil {
				m.cfg.Log.Warn("tearing the tunnel down failed", "sandbox", s.ID, "err", terr)
			}
		}
		m.removeSocketDir(s.ID)
		if err == nil {
			err = fmt.Errorf("%w: sandbox %s was stopped while its agent socket was being served", ErrNotStartable, s.ID)
		}
	}()
	if err := m.tunnelTurn(ctx, s.NetNS); err != nil {
		return fmt.Errorf("sandbox %s: %w", s.ID, err)
	}
	if err := m.tunnelOp(ctx, func() error { setUp = true; return m.cfg.Side.SetupTunnel(s.NetNS, s.Tunnel) }); err != nil {
		return fmt.Errorf("sandbox %s: set up the pod network tunnel: %w", s.ID, err)
	}
	m.mu.Lock()
	r := l.relay
	m.mu.Unlock()
	if r == nil {
		var err error
		if r, err = m.cfg.Side.StartRelay(context.WithoutCancel(ctx), s.AgentSocket, s.RelayAddr, s.VMName); err != nil {
			return fmt.Errorf("sandbox %s: serve the agent socket %s: %w", s.ID, s.AgentSocket, err)
		}
		m.mu.Lock()
		l.relay = r
		m.mu.Unlock()
	}
	if err := r.WaitReachable(ctx); err != nil {
		return m.startErr(s, "reach the agent's forwarder at "+s.RelayAddr, err)
	}
	m.mu.Lock()
	l.reachable = l.relay == r
	m.mu.Unlock()
	return nil
}

// retired reports positive evidence that sandbox id must not be served:
// its record is gone or Deleting, Lost or Failed. A ledger that cannot be
// read is no evidence.
func (m *Manager) retired(id string) bool {
	s, err := m.cfg.Ledger.GetSandbox(id)
	if errors.Is(err, ledger.ErrNotFound) {
		return true
	}
	if err != nil {
		m.cfg.Log.Warn("reading a sandbox after serving it failed", "sandbox", id, "err", err)
		return false
	}
	return s.Phase == ledger.SandboxDeleting || s.Phase == ledger.SandboxLost || s.Phase == ledger.SandboxFailed
}

// removeSocketDir removes the sandbox's agent socket directory once it is
// empty (the relay's Close removed the socket); a directory still holding
// a file (a relay daemon that did not stop it yet) stays.
func (m *Manager) removeSocketDir(id string) {
	dir := filepath.Dir(m.SocketPath(id))
	if err := os.Remove(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		m.cfg.Log.Debug("agent socket directory not removed", "sandbox", id, "dir", dir, "err", err)
	}
}

func (m *Manager) startErr(s ledger.Sandbox, what string, err error) error {
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("sandbox %s: %s: not done within %s: %w", s.ID, what, m.cfg.StartTimeout, err)
	}
	return fmt.Errorf("sandbox %s: %s: %w", s.ID, what, err)
}

// fail marks a sandbox that has no VM as Failed, for good.
func (m *Manager) fail(id, reason string, cause error) {
	s, err := m.update(id, func(s *ledger.Sandbox) error {
		if s.Phase != ledger.SandboxCreated && s.Phase != ledger.SandboxCreating {
			return errSkip
		}
		if s.VMID == "" {
			s.Phase = ledger.SandboxFailed
		}
		s.Reason, s.Message = reason, cause.Error()
		return nil
	})
	if err == nil {
		m.event(s, true, reconcile.EventCreateFailed, fmt.Sprintf("sandbox %s: %s", short(id), cause))
	}
}

// note records why a StartVM stopped short, the phase unchanged.
func (m *Manager) note(id, reason, msg string) {
	_, _ = m.update(id, func(s *ledger.Sandbox) error {
		if s.Phase != ledger.SandboxCreating {
			return errSkip
		}
		s.Reason, s.Message = reason, msg
		return nil
	})
}

var errSkip = errors.New("nothing to change")

func (m *Manager) liveOf(id string) *live {
	m.mu.Lock()
	defer m.mu.Unlock()
	l := m.live[id]
	if l == nil {
		l = &live{id: id}
		m.live[id] = l
	}
	return l
}

func (m *Manager) closeRelay(id string) {
	m.mu.Lock()
	l := m.live[id]
	var r Relay
	if l != nil {
		r, l.relay, l.reachable = l.relay, nil, false
	}
	m.mu.Unlock()
	if r != nil {
		if err := r.Close(); err != nil {
			m.cfg.Log.Warn("closing an agent relay failed", "sandbox", id, "err", err)
		}
	}
}

// StopVM answers fast: it cancels a StartVM in flight and turns the
// sandbox Deleting durably (one ledger write, whose commit is shared with
// the other sandbox writes of the moment), and answers. The tunnel, the
// relay and the agent socket go after the answer, in the background, then
// the VM's delete and the record's removal. A crash after the answer loses
// none of it: the next caa's first sync, before it serves kata, finds the
// record Deleting and does the same.
//
// A tunnel set up in the same network namespace (a new sandbox of the pod)
// waits for the teardown (tunnelTurn): the teardown removes the
// namespace's caa tunnel by name, and would remove the new one.
func (m *Manager) StopVM(ctx context.Context, id string) error {
	if err := checkID(id); err != nil {
		return err
	}
	m.mu.Lock()
	if l := m.live[id]; l != nil && l.cancel != nil {
		l.cancel() // a StartVM in flight gives up its waits
	}
	m.mu.Unlock()
	// No turn is taken: a create in flight may take minutes, and kata gives
	// StopVM about a second. The StartVM sees Deleting at its next write
	// and stops; the background delete waits for it.
	s, err := m.retire(id, "StopVM", "kata stopped the sandbox")
	if errors.Is(err, ledger.ErrNotFound) {
		return fmt.Errorf("%w: sandbox %s (already stopped, or never created on this node)", ErrUnknownSandbox, id)
	}
	if err != nil {
		return err
	}
	m.cfg.Log.Info("sandbox stopping", "sandbox", id, "pod", s.PodRef(), "vm", s.VMID)
	return nil
}

// retire turns a sandbox Deleting (positive evidence: StopVM, its pod gone,
// a newer sandbox) and returns once that is durable. Its tunnel, relay and
// agent socket go and its VM is deleted in the background. The record goes
// once the VM is gone; its history stays.
//
// The relay is closed after the Deleting write, as serve needs (it reads
// the record once its relay is set, and undoes what it made if the sandbox
// was retired meanwhile).
func (m *Manager) retire(id, reason, msg string) (ledger.Sandbox, error) {
	s, err := m.update(id, func(s *ledger.Sandbox) error {
		if s.Phase == ledger.SandboxDeleting {
			return errSkip
		}
		s.Phase, s.Reason, s.Message = ledger.SandboxDeleting, reason, msg
		return nil
	})
	if errors.Is(err, errSkip) {
		err = nil
	}
	if err != nil {
		return s, fmt.Errorf("record that sandbox %s is stopping: %w", id, err)
	}
	// The teardown is registered before the answer, so that a tunnel set up
	// in the namespace after it waits for it (tunnelTurn), and the delete
	// is claimed before it, so that a sync does not tear down again.
	m.mu.Lock()
	prev := m.tearing[s.NetNS]
	done := make(chan struct{})
	m.tearing[s.NetNS] = done
	m.mu.Unlock()
	m.deleteLater(id, func() {
		if prev != nil {
			<-prev
		}
		if err := m.teardownTunnel(s); err != nil {
			m.cfg.Log.Warn("tearing the tunnel down failed", "sandbox", id, "err", err)
		}
		m.mu.Lock()
		if m.tearing[s.NetNS] == done {
			delete(m.tearing, s.NetNS)
		}
		m.mu.Unlock()
		close(done)
		m.closeRelay(id)
		m.removeSocketDir(id)
	})
	return s, nil
}

// tunnelTurn waits until no teardown of a retired sandbox is pending in
// network namespace netns, or ctx is done.
func (m *Manager) tunnelTurn(ctx context.Context, netns string) error {
	for {
		m.mu.Lock()
		done := m.tearing[netns]
		m.mu.Unlock()
		if done == nil {
			return nil
		}
		select {
		case <-done:
		case <-ctx.Done():
			return fmt.Errorf("wait for the tunnel teardown of a stopped sandbox in %s: %w", netns, ctx.Err())
		}
	}
}

// supersede retires the older sandboxes of s's pod: the kubelet started s
// because they are over, and s now runs.
func (m *Manager) supersede(s ledger.Sandbox) {
	all, err := m.cfg.Ledger.ListSandboxes()
	if err != nil {
		m.cfg.Log.Warn("listing sandboxes failed", "err", err)
	}
	for _, o := range all {
		if o.ID == s.ID || o.PodUID != s.PodUID || o.Phase == ledger.SandboxDeleting || !o.CreatedAt.Before(s.CreatedAt) {
			continue
		}
		if _, err := m.retire(o.ID, "Superseded", "sandbox "+short(s.ID)+" of the same pod runs"); err != nil {
			m.cfg.Log.Warn("retiring a superseded sandbox failed", "sandbox", o.ID, "err", err)
		}
	}
}

// deleteLater deletes a Deleting sandbox's VM and then its record, in the
// background, retrying until it is done or Stop. first, when set, runs
// first in the background (the release of what serves the sandbox), also
// when a delete of the sandbox is already under way. The delete is claimed
// before deleteLater returns.
func (m *Manager) deleteLater(id string, first func()) {
	l := m.liveOf(id)
	m.mu.Lock()
	claimed := !l.deleting
	l.deleting = true
	m.mu.Unlock()
	if !claimed && first == nil {
		return
	}
	m.bg.Add(1)
	go func() {
		defer m.bg.Done()
		if first != nil {
			first()
		}
		if !claimed {
			return
		}
		defer func() {
			m.mu.Lock()
			l.deleting = false
			m.mu.Unlock()
		}()
		backoff := m.cfg.Poll
		for !m.stopping() {
			done, err := m.deleteNow(id)
			if done {
				return
			}
			m.cfg.Log.Warn("deleting a stopped sandbox's VM failed; trying again", "sandbox", id, "retryIn", backoff, "err", err)
			ctx := m.cfg.Stop
			if ctx == nil {
				ctx = context.Background()
			}
			if sleep(ctx, backoff) != nil {
				return
			}
			backoff = min(2*backoff, 5*time.Minute)
		}
	}()
}

func (m *Manager) deleteNow(id string) (bool, error) {
	ctx := context.Background()
	l, err := m.enter(ctx, id)
	if err != nil {
		return false, err
	}
	defer m.leave(l)
	s, err := m.cfg.Ledger.GetSandbox(id)
	if errors.Is(err, ledger.ErrNotFound) {
		return true, nil
	} else if err != nil {
		return false, err
	}
	if s.Phase != ledger.SandboxDeleting {
		return true, nil
	}
	if s.VMID == "" && s.Key != "" {
		// A create may have been sent whose answer was lost: find its VM
		// by key, in two listings ConfirmMissing apart before giving up
		// (a listing can miss a VM just made).
		if s, err = m.findByKey(ctx, s); err != nil {
			return false, err
		}
		if s.VMID == "" {
			m.mu.Lock()
			first, seen := m.missing[id]
			if !seen {
				m.missing[id] = m.cfg.Now()
			}
			m.mu.Unlock()
			if !seen || m.cfg.Now().Sub(first) < m.cfg.ConfirmMissing {
				return false, fmt.Errorf("no VM with key %s listed yet; looking again before forgetting the sandbox", s.Key)
			}
		}
	}
	if s.VMID != "" {
		if err := m.take(ctx, m.cfg.Writes); err != nil {
			return false, err
		}
		callCtx, cancel := context.WithTimeout(ctx, m.cfg.CallTimeout)
		err := m.cfg.Provider.Delete(callCtx, s.VMID)
		cancel()
		if err != nil {
			return false, fmt.Errorf("delete VM %s: %w", s.VMID, err)
		}
		m.event(s, false, reconcile.EventVMDeleted, fmt.Sprintf("VM %s of sandbox %s deleted (%s)", s.VMID, short(id), s.Reason))
	}
	if err := m.cfg.Ledger.DeleteSandbox(id, s.Revision); err != nil {
		return false, fmt.Errorf("remove the record of sandbox %s: %w", id, err)
	}
	m.mu.Lock()
	delete(m.live, id)
	delete(m.missing, id)
	m.mu.Unlock()
	// Again, for a socket a relay daemon still held at StopVM (stopped
	// since by Keep) or a directory a restart left behind.
	m.removeSocketDir(id)
	m.cfg.Log.Info("sandbox deleted", "sandbox", id, "pod", s.PodRef(), "vm", s.VMID, "reason", s.Reason)
	return true, nil
}

// findByKey looks the node's VMs up for the one made with s's key and
// records it.
func (m *Manager) findByKey(ctx context.Context, s ledger.Sandbox) (ledger.Sandbox, error) {
	if err := m.take(ctx, m.cfg.Reads); err != nil {
		return s, err
	}
	callCtx, cancel := context.WithTimeout(ctx, m.cfg.CallTimeout)
	vms, err := m.cfg.Provider.List(callCtx, m.selector())
	cancel()
	if err != nil {
		return s, fmt.Errorf("list this node's VMs: %w", err)
	}
	for _, vm := range vms {
		if vm.Tags[provider.TagKey] == s.Key && !vm.State.Gone() {
			return m.update(s.ID, func(r *ledger.Sandbox) error { r.VMID = vm.ID; return nil })
		}
	}
	return s, nil
}

// TagSandbox is the VM tag that names its sandbox.
const TagSandbox = "caa-sandbox"

func short(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

func ipString(ip net.IP) string {
	if ip == nil {
		return ""
	}
	return ip.String()
}
