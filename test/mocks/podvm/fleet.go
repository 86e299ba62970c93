package podvmfake

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/test/mocks/cloud"
)

// Fleet plays the pod VMs of a fake cloud: every instance that is Running
// with an IP gets a fake pod VM booted from the instance's user data, in its
// own namespace at the instance's IP on the cloud network; an instance that
// stops running (deleted, killed, stopped, failed) loses its VM and its place
// on the network, as a real VM would.
type Fleet struct {
	cn     *CloudNetwork
	cloud  *cloud.Cloud
	src    UserDataSource
	booter func(context.Context, Options) (*VM, error)
	log    *slog.Logger

	mu     sync.Mutex
	vms    map[string]*FleetVM
	failed map[string]error
	boots  int
}

// FleetVM is one instance's fake pod VM.
type FleetVM struct {
	*VM
	InstanceID string
	Host       VMHost
}

// PodNamespace is where the pod's address lives in the VM: the VM's own
// namespace for the fake forwarder, the pod namespace upstream's forwarder
// built its end of the tunnel in.
func (v *FleetVM) PodNamespace() string {
	if v.PodNS != "" {
		return v.PodNS
	}
	return v.Host.NS
}

// NewFleet plays c's instances on cn. Each VM reads its user data from the
// core as it was created (CoreUserData); ReadingFrom picks a cloud's path.
func NewFleet(cn *CloudNetwork, c *cloud.Cloud, log *slog.Logger) *Fleet {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Fleet{cn: cn, cloud: c, src: CoreUserData{Cloud: c}, booter: Boot, log: log, vms: map[string]*FleetVM{}, failed: map[string]error{}}
}

// ReadingFrom makes the fleet's VMs read their user data from src, as the
// stock image does on that cloud (EC2IMDS, AzureIMDS, CIDataVolume). Call
// it before the fleet runs.
func (f *Fleet) ReadingFrom(src UserDataSource) *Fleet {
	f.src = src
	return f
}

// Booting makes the fleet boot its VMs with boot (e.g. Upstream.Boot)
// instead of the fake forwarder. Call it before the fleet runs.
func (f *Fleet) Booting(boot func(context.Context, Options) (*VM, error)) *Fleet {
	f.booter = boot
	return f
}

// Sync boots and removes VMs to match the cloud now. An instance whose user
// data the pod VM would refuse is remembered in Failed (a real VM would sit
// there without a forwarder) and not tried again, as is one the cloud marked
// Unreachable.
func (f *Fleet) Sync(ctx context.Context) {
	running := map[string]cloud.Instance{}
	for _, in := range f.cloud.Instances() {
		if in.State == provider.StateRunning && len(in.IPs) > 0 {
			running[in.ID] = in
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for id, vm := range f.vms {
		if _, ok := running[id]; !ok {
			vm.Close()
			if err := f.cn.RemoveVM(vm.Host); err != nil {
				f.log.Warn("fake fleet: remove VM", "instance", id, "err", err)
			}
			delete(f.vms, id)
		}
	}
	for id, in := range running {
		if f.vms[id] != nil || f.failed[id] != nil {
			continue
		}
		if in.Unreachable != "" {
			// The real VM would run, but nothing of it reaches the worker.
			f.failed[id] = fmt.Errorf("instance %s never answers: %s", id, in.Unreachable)
			f.log.Warn("fake fleet: VM unreachable", "instance", id, "why", in.Unreachable)
			continue
		}
		if err := f.boot(ctx, in); err != nil {
			f.failed[id] = err
			f.log.Warn("fake fleet: VM did not boot", "instance", id, "err", err)
		}
	}
}

func (f *Fleet) boot(ctx context.Context, in cloud.Instance) error {
	ip, err := netip.ParseAddr(in.IPs[0])
	if err != nil {
		return fmt.Errorf("instance %s IP %q: %w", in.ID, in.IPs[0], err)
	}
	host, err := f.cn.addVMAt(ip)
	if err != nil {
		return err
	}
	ud, err := f.src.UserData(ctx, in.ID)
	if err != nil {
		_ = f.cn.RemoveVM(host)
		return fmt.Errorf("instance %s: user data from %s: %w", in.ID, f.src.Name(), err)
	}
	vm, err := f.booter(ctx, Options{UserData: ud, NetNS: host.NS, Log: f.log, InstanceID: in.ID})
	if err != nil {
		_ = f.cn.RemoveVM(host)
		return err
	}
	f.vms[in.ID] = &FleetVM{VM: vm, InstanceID: in.ID, Host: host}
	f.boots++
	return nil
}

// Boots counts the VMs booted so far.
func (f *Fleet) Boots() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.boots
}

// Run calls Sync every interval until ctx ends.
func (f *Fleet) Run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		f.Sync(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// VM returns the instance's fake VM, nil if it has none (yet).
func (f *Fleet) VM(instanceID string) *FleetVM {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.vms[instanceID]
}

// Failed returns why instances' VMs did not boot, by instance id.
func (f *Fleet) Failed() map[string]error {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make(map[string]error, len(f.failed))
	for k, v := range f.failed {
		out[k] = v
	}
	return out
}

// Close stops every VM.
func (f *Fleet) Close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for id, vm := range f.vms {
		vm.Close()
		_ = f.cn.RemoveVM(vm.Host)
		delete(f.vms, id)
	}
}

// PodRoutes lists the routes the VM installed for the pod: the fake's
// own table in the VM's namespace, or the main table of the pod namespace
// upstream's forwarder built.
func (v *FleetVM) PodRoutes() ([]netlink.Route, error) {
	if v.PodNS == "" {
		return PodRoutes(v.Host.NS)
	}
	h, err := handleAt(v.PodNS)
	if err != nil {
		return nil, err
	}
	defer h.Close()
	return h.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
}
