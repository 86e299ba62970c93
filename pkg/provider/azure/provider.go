package azure

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/arm"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/runtime"
	"github.com/Azure/azure-sdk-for-go/sdk/azidentity"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/compute/armcompute/v8"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/network/armnetwork/v9"

	"github.com/caa-project/caa/pkg/provider"
)

// ProviderName is the provider's name in the ledger and in errors.
const ProviderName = "azure"

// The SDK's retry policy: 5xx and timeouts only (never 429, see the
// package comment), each try bounded.
var retriedStatuses = []int{http.StatusRequestTimeout, http.StatusInternalServerError,
	http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout}

const (
	maxRetryDelay = 8 * time.Second
	tryTimeout    = time.Minute
)

// Provider creates, finds and deletes peer-pod VMs in one resource group.
// It is safe for concurrent use.
type Provider struct {
	cfg  Config
	vms  vmAPI
	nics nicAPI
	// graph is the ARM pipeline Resource Graph's queries go through
	// (graphquery.go), set up as the generated client's.
	graph *arm.Client
	// arm is the bare ARM pipeline, for the preflight's reads that no SDK
	// module of caa's covers.
	arm *arm.Client
	log *slog.Logger
	now func() time.Time
	// quota is Resource Graph's per-user quota as its last answer left it.
	quota quotaGate
	// leftovers are the leftover NICs of the last listing per selector.
	leftMu    sync.Mutex
	leftovers map[provider.Selector][]provider.VM
}

var _ provider.Provider = (*Provider)(nil)

// Option configures New.
type Option func(*options)

type options struct {
	cred   azcore.TokenCredential
	logger *slog.Logger
	now    func() time.Time
}

// WithCredential replaces the default credential chain, e.g. with a static
// token in tests. The credential's tokens are never logged or stored.
func WithCredential(c azcore.TokenCredential) Option { return func(o *options) { o.cred = c } }

// WithLogger sets where the provider logs (default slog.Default()). It
// logs only failures of best-effort cleanup.
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.logger = l } }

// WithClock sets the clock on which List counts down Resource Graph's
// quota window (default time.Now).
func WithClock(now func() time.Time) Option { return func(o *options) { o.now = now } }

// New returns a provider for cfg. It validates cfg and builds the SDK
// clients; it makes no call, so bad credentials show on the first
// operation, as ErrAuth.
func New(ctx context.Context, cfg Config, opts ...Option) (*Provider, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	o := options{logger: slog.Default(), now: time.Now}
	for _, opt := range opts {
		opt(&o)
	}
	if cfg.SSHPublicKey == "" {
		key, err := throwawaySSHKey()
		if err != nil {
			return nil, err
		}
		cfg.SSHPublicKey = key
		o.logger.InfoContext(ctx, "azure: no --azure-ssh-public-key: the VMs get a throwaway RSA key made in memory, its private half dropped (nobody can log in)")
	}
	cc, err := cfg.cloudConfig()
	if err != nil {
		return nil, fmt.Errorf("azure: %w", err)
	}
	cred := o.cred
	if cred == nil {
		dac, err := azidentity.NewDefaultAzureCredential(&azidentity.DefaultAzureCredentialOptions{
			ClientOptions: azcore.ClientOptions{Cloud: cc}, DisableInstanceDiscovery: cfg.DisableInstanceDiscovery})
		if err != nil {
			return nil, fmt.Errorf("azure: default credential chain: %w", err)
		}
		cred = dac
	}
	retries := int32(cfg.MaxRetries)
	if cfg.MaxRetries < 0 {
		retries = -1
	}
	clientOpts := &arm.ClientOptions{
		ClientOptions: policy.ClientOptions{
			Cloud: cc,
			// Bearer tokens go over plain http only to a loopback endpoint
			// (Validate refuses any other), i.e. a fake in tests.
			InsecureAllowCredentialWithHTTP: strings.HasPrefix(strings.ToLower(cfg.Endpoint), "http://"),
			Retry: policy.RetryOptions{
				MaxRetries: retries, RetryDelay: cfg.RetryDelay, MaxRetryDelay: maxRetryDelay,
				TryTimeout: tryTimeout, StatusCodes: retriedStatuses,
			},
			Telemetry: policy.TelemetryOptions{ApplicationID: "caa"},
		},
		// Registering resource providers is a one-time subscription write
		// for the operator, not a side effect of a VM call.
		DisableRPRegistration: true,
	}
	vms, err := armcompute.NewVirtualMachinesClient(cfg.SubscriptionID, credential{cred}, clientOpts)
	if err != nil {
		return nil, fmt.Errorf("azure: compute client: %w", err)
	}
	nics, err := armnetwork.NewInterfacesClient(cfg.SubscriptionID, credential{cred}, clientOpts)
	if err != nil {
		return nil, fmt.Errorf("azure: network client: %w", err)
	}
	graph, err := arm.NewClient(graphModule, graphModuleVersion, credential{cred}, clientOpts)
	if err != nil {
		return nil, fmt.Errorf("azure: resource graph client: %w", err)
	}
	plain, err := arm.NewClient("caa/azure", "v1.0.0", credential{cred}, clientOpts)
	if err != nil {
		return nil, fmt.Errorf("azure: resource manager client: %w", err)
	}
	return &Provider{cfg: cfg, vms: vms, nics: nics, graph: graph, arm: plain, log: o.logger, now: o.now}, nil
}

// Name is "azure".

// readCtx bounds one read call, writeCtx one PUT or DELETE with the wait
// for its operation (see Config.ReadTimeout).
func (p *Provider) readCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return provider.CallContext(ctx, p.cfg.ReadTimeout, provider.DefaultReadTimeout)
}

func (p *Provider) writeCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return provider.CallContext(ctx, p.cfg.WriteTimeout, provider.DefaultWriteTimeout)
}

// getVM reads one VM with its instance view, under a read deadline.
func (p *Provider) getVM(ctx context.Context, name string) (armcompute.VirtualMachinesClientGetResponse, error) {
	ctx, cancel := p.readCtx(ctx)
	defer cancel()
	return p.vms.Get(ctx, p.cfg.ResourceGroup, name, expandInstanceView)
}
func (p *Provider) Name() string { return ProviderName }

var expandInstanceView = &armcompute.VirtualMachinesClientGetOptions{Expand: new(armcompute.InstanceViewTypesInstanceView)}

// Create makes the VM for spec, or returns the one its key already names:
// a GET of the key's VM name first, then the NIC (an idempotent PUT), then
// the VM with If-None-Match: *, so that of two racing creates one wins and
// the other gets ErrConflict. It waits for the operations to finish.
func (p *Provider) Create(ctx context.Context, spec provider.Spec) (provider.VM, error) {
	if err := spec.Validate(); err != nil {
		return provider.VM{}, fmt.Errorf("%s %s: %w", ProviderName, opCreate, err)
	}
	if n := len(spec.UserData); n > maxUserData {
		return provider.VM{}, fmt.Errorf("%s %s: %w: user data is %d bytes, Azure's properties.userData takes at most %d (64 KB in base64)", ProviderName, opCreate, provider.ErrInvalidSpec, n, maxUserData)
	}
	tags, err := p.vmTags(spec)
	if err != nil {
		return provider.VM{}, fmt.Errorf("%s %s: %w", ProviderName, opCreate, err)
	}
	name := vmName(spec.Key)

	got, err := p.getVM(ctx, name)
	switch {
	case err == nil:
		return p.existing(ctx, spec, got.VirtualMachine)
	case !missing(err):
		return provider.VM{}, classify(opCreate, err)
	}

	nic, err := p.putNIC(ctx, name, tags)
	if err != nil {
		return provider.VM{}, err
	}
	vm, accepted, err := p.putVM(ctx, name, deref(nic.ID), spec, tags)
	if err != nil {
		if errors.Is(err, provider.ErrInvalidSpec) || errors.Is(err, provider.ErrQuota) || errors.Is(err, provider.ErrCapacity) {
			p.cleanup(ctx, name, accepted)
		}
		return provider.VM{}, err
	}
	out := toVM(vm, privateIPs(nic))
	if out.State == provider.StateRunning && powerState(vm) == "" {
		// Provisioning is done; the guest may still be booting. Get reads
		// the power state.
		out.State = provider.StatePending
	}
	return out, nil
}

// existing answers Create for a VM that is already there: the key's own
// VM is returned; a VM of that name with another key or shape is a
// conflict, never silently adopted. The key is caa's tag value and compares
// exactly; the size and the image compare as Azure defines them, without
// regard to case (sameShape).
func (p *Provider) existing(ctx context.Context, spec provider.Spec, vm armcompute.VirtualMachine) (provider.VM, error) {
	out := toVM(vm, nil)
	if k := out.Tags[provider.TagKey]; k != spec.Key {
		return provider.VM{}, fmt.Errorf("%s %s: %w: VM %s exists with key %q, not %q", ProviderName, opCreate, provider.ErrConflict, out.Name, k, spec.Key)
	}
	if !sameShape(out.InstanceType, spec.InstanceType) || !sameShape(out.Image, spec.Image) {
		return provider.VM{}, fmt.Errorf("%s %s: %w: VM %s for key %s has size %s and image %s, the spec asks for %s and %s",
			ProviderName, opCreate, provider.ErrConflict, out.Name, spec.Key, out.InstanceType, out.Image, spec.InstanceType, spec.Image)
	}
	ips, err := p.ipsOf(ctx, opCreate, vm)
	if err != nil {
		return provider.VM{}, err
	}
	out.IPs = ips
	return out, nil
}

func (p *Provider) putNIC(ctx context.Context, vm string, tags map[string]*string) (armnetwork.Interface, error) {
	ctx, cancel := p.writeCtx(ctx)
	defer cancel()
	poller, err := p.nics.BeginCreateOrUpdate(ctx, p.cfg.ResourceGroup, nicName(vm), p.nicModel(tags), nil)
	if err != nil {
		return armnetwork.Interface{}, classify(opCreate, err)
	}
	res, err := poller.PollUntilDone(ctx, p.pollOptions())
	if err != nil {
		return armnetwork.Interface{}, classify(opCreate, err)
	}
	return res.Interface, nil
}

// pollOptions has the SDK's PollUntilDone poll a long-running operation
// every PollInterval, or after the wait ARM asks for (Retry-After and its
// millisecond forms) when it asks. Outside tests the SDK refuses intervals
// under a second, so a shorter PollInterval polls every second; the
// operation's first poll is never delayed.
func (p *Provider) pollOptions() *runtime.PollUntilDoneOptions {
	return &runtime.PollUntilDoneOptions{Frequency: max(p.cfg.PollInterval, time.Second)}
}

// putVM creates the VM and waits for the operation. accepted reports
// whether ARM took the request, i.e. whether a VM may exist after a failure.
func (p *Provider) putVM(ctx context.Context, name, nicID string, spec provider.Spec, tags map[string]*string) (vm armcompute.VirtualMachine, accepted bool, err error) {
	parent := ctx
	ctx, cancel := p.writeCtx(ctx)
	defer cancel()
	var initial *http.Response
	poller, err := p.vms.BeginCreateOrUpdate(policy.WithCaptureResponse(ctx, &initial), p.cfg.ResourceGroup, name,
		p.vmModel(name, nicID, spec, tags), &armcompute.VirtualMachinesClientBeginCreateOrUpdateOptions{IfNoneMatch: new("*")})
	if err != nil {
		return vm, false, classify(opCreate, err)
	}
	res, err := poller.PollUntilDone(ctx, p.pollOptions())
	if err == nil {
		return res.VirtualMachine, true, nil
	}
	if !poller.Done() && errors.Is(err, context.DeadlineExceeded) && parent.Err() == nil && initial != nil {
		// The write timeout ran out, not the caller's time, while ARM is
		// still at a create it took: a VM create with OS provisioning takes
		// minutes. The VM exists from the accepted PUT on; report it as
		// still being created (Pending) rather than a failure of a create
		// that may well succeed. Get and List follow it from here, and a
		// create that fails later shows in the VM's own state.
		if raw, perr := runtime.Payload(initial); perr == nil && json.Unmarshal(raw, &vm) == nil && vm.ID != nil {
			if vm.Properties == nil {
				vm.Properties = &armcompute.VirtualMachineProperties{}
			}
			vm.Properties.ProvisioningState = new("Creating")
			p.log.InfoContext(parent, "azure: VM create still running at the write timeout; following it as Pending", "vm", name,
				"writeTimeout", p.cfg.WriteTimeout)
			return vm, true, nil
		}
	}
	if poller.Done() && missing(err) && initial != nil {
		// The operation succeeded but the VM cannot be read back yet (ARM
		// reads are eventually consistent): the accepted PUT's reply
		// describes it.
		if raw, perr := runtime.Payload(initial); perr == nil && json.Unmarshal(raw, &vm) == nil && vm.ID != nil {
			return vm, true, nil
		}
	}
	return vm, true, classify(opCreate, err)
}

// cleanup removes what a refused create left behind: the VM when Azure kept
// it in the Failed state, and the NIC. It is best effort: a failure is
// logged, and a later Create with the same key reuses the NIC anyway.
func (p *Provider) cleanup(ctx context.Context, name string, accepted bool) {
	if accepted {
		got, err := p.getVM(ctx, name)
		switch {
		// The create was refused, so no pod runs on this VM, whatever its
		// power state says.
		case err == nil && got.Properties != nil && failedProvisioning(deref(got.Properties.ProvisioningState)):
			if err := p.deleteVM(ctx, opCreate, name); err != nil {
				p.log.WarnContext(ctx, "azure: could not delete the VM of a failed create", "vm", name, "err", err)
			}
		case err != nil && !missing(err):
			p.log.WarnContext(ctx, "azure: could not read the VM of a failed create", "vm", name, "err", classify(opCreate, err))
		}
	}
	if err := p.deleteNIC(ctx, opCreate, name); err != nil {
		p.log.WarnContext(ctx, "azure: could not delete the NIC of a failed create", "nic", nicName(name), "err", err)
	}
}

// Get returns the VM with its power state (instance view) and the private
// IP of its primary NIC: two calls. A missing VM is ErrNotFound at once.
func (p *Provider) Get(ctx context.Context, id string) (provider.VM, error) {
	name, err := p.nameOf(opGet, id)
	if err != nil {
		return provider.VM{}, err
	}
	got, err := p.getVM(ctx, name)
	if err != nil {
		return provider.VM{}, classify(opGet, err)
	}
	ips, err := p.ipsOf(ctx, opGet, got.VirtualMachine)
	if err != nil {
		return provider.VM{}, err
	}
	return toVM(got.VirtualMachine, ips), nil
}

// ipsOf reads the private IPs of a VM's primary NIC; a NIC that is gone
// has none.
func (p *Provider) ipsOf(ctx context.Context, op string, vm armcompute.VirtualMachine) ([]string, error) {
	ids := nicIDs(vm)
	if len(ids) == 0 {
		return nil, nil
	}
	rid, err := arm.ParseResourceID(ids[0])
	if err != nil {
		return nil, nil
	}
	rctx, cancel := p.readCtx(ctx)
	defer cancel()
	nic, err := p.nics.Get(rctx, rid.ResourceGroupName, rid.Name, nil)
	switch {
	case missing(err):
		return nil, nil
	case err != nil:
		return nil, classify(op, err)
	}
	return privateIPs(nic.Interface), nil
}

// Delete deletes the VM (its OS disk and NIC go with it, by their
// deleteOption) and then the NIC if it is still there, waiting for each
// operation. Anything already gone is fine. It also takes the id of a
// leftover NIC of caa's (Leftovers) and deletes just that NIC; Azure
// refuses it while a VM uses the NIC (NicInUse, ErrConflict) or keeps it
// reserved for a VM that failed (NicReservedForAnotherVm, about 180 s,
// transient): the caller tries again at a later pass.
func (p *Provider) Delete(ctx context.Context, id string) error {
	if vm, ok := p.leftoverNIC(id); ok {
		return p.deleteNIC(ctx, opDelete, vm)
	}
	name, err := p.nameOf(opDelete, id)
	if err != nil {
		return err
	}
	if err := p.deleteVM(ctx, opDelete, name); err != nil {
		return err
	}
	return p.deleteNIC(ctx, opDelete, name)
}

func (p *Provider) deleteVM(ctx context.Context, op, name string) error {
	ctx, cancel := p.writeCtx(ctx)
	defer cancel()
	poller, err := p.vms.BeginDelete(ctx, p.cfg.ResourceGroup, name, nil)
	return finishDelete(ctx, op, poller, err, p.pollOptions())
}

func (p *Provider) deleteNIC(ctx context.Context, op, vm string) error {
	ctx, cancel := p.writeCtx(ctx)
	defer cancel()
	poller, err := p.nics.BeginDelete(ctx, p.cfg.ResourceGroup, nicName(vm), nil)
	return finishDelete(ctx, op, poller, err, p.pollOptions())
}

// finishDelete waits out a delete that BeginDelete started (or failed to
// start, with err); a resource already gone is success.
func finishDelete[T any](ctx context.Context, op string, poller *runtime.Poller[T], err error, opts *runtime.PollUntilDoneOptions) error {
	if err == nil {
		_, err = poller.PollUntilDone(ctx, opts)
	}
	if err != nil && !missing(err) {
		return classify(op, err)
	}
	return nil
}

// nameOf reads the VM name from an ARM id, which must be of a VM in this
// provider's subscription and resource group. Anything else is refused as
// ErrInvalidSpec: never ErrNotFound, which would pass for evidence that the
// VM is gone.
func (p *Provider) nameOf(op, id string) (string, error) {
	rid, err := arm.ParseResourceID(id)
	if err != nil || !strings.EqualFold(rid.ResourceType.String(), "Microsoft.Compute/virtualMachines") {
		return "", fmt.Errorf("%s %s: %w: %q is not the ARM id of a virtual machine", ProviderName, op, provider.ErrInvalidSpec, id)
	}
	if !strings.EqualFold(rid.SubscriptionID, p.cfg.SubscriptionID) || !strings.EqualFold(rid.ResourceGroupName, p.cfg.ResourceGroup) {
		return "", fmt.Errorf("%s %s: %w: VM %s is in resource group %s of subscription %s; this provider manages resource group %s of subscription %s",
			ProviderName, op, provider.ErrInvalidSpec, rid.Name, rid.ResourceGroupName, rid.SubscriptionID, p.cfg.ResourceGroup, p.cfg.SubscriptionID)
	}
	return rid.Name, nil
}

// leftoverNIC reads the id of a NIC caa made in this provider's group (its
// name ends in the NIC suffix) and returns the name of the VM it was made
// for.
func (p *Provider) leftoverNIC(id string) (string, bool) {
	rid, err := arm.ParseResourceID(id)
	if err != nil || !strings.EqualFold(rid.ResourceType.String(), nicType) ||
		!strings.EqualFold(rid.SubscriptionID, p.cfg.SubscriptionID) || !strings.EqualFold(rid.ResourceGroupName, p.cfg.ResourceGroup) {
		return "", false
	}
	vm, ok := strings.CutSuffix(rid.Name, nicSuffix)
	return vm, ok && vm != ""
}
