package health

import (
	"context"
	"errors"
	"time"

	"github.com/caa-project/caa/pkg/provider"
)

// Cloud operations, the values of the op label: the provider's methods.
const (
	OpCreate = "create"
	OpGet    = "get"
	OpList   = "list"
	OpDelete = "delete"
)

// Cloud call results, the values of the result label.
const (
	CallOK          = "ok"
	CallNotFound    = "not_found"
	CallThrottled   = "throttled"
	CallQuota       = "quota"
	CallCapacity    = "capacity"
	CallInvalidSpec = "invalid_spec"
	CallNodeConfig  = "node_config"
	CallKeySpent    = "key_spent"
	CallAuth        = "auth"
	CallConflict    = "conflict"
	CallCanceled    = "canceled"
	CallTimeout     = "timeout"
	CallError       = "error" // transient, unclassified
)

// CloudResult names the outcome of a cloud call by the provider's error
// kinds, so the result label has a fixed, small set of values.
func CloudResult(err error) string {
	kinds := []struct {
		kind   error
		result string
	}{
		{provider.ErrThrottled, CallThrottled},
		{provider.ErrNotFound, CallNotFound},
		{provider.ErrAuth, CallAuth},
		{provider.ErrInvalidSpec, CallInvalidSpec},
		{provider.ErrNodeConfig, CallNodeConfig},
		{provider.ErrKeySpent, CallKeySpent},
		{provider.ErrQuota, CallQuota},
		{provider.ErrCapacity, CallCapacity},
		{provider.ErrConflict, CallConflict},
		{context.Canceled, CallCanceled},
		{context.DeadlineExceeded, CallTimeout},
	}
	if err == nil {
		return CallOK
	}
	for _, k := range kinds {
		if errors.Is(err, k.kind) {
			return k.result
		}
	}
	return CallError
}

// InstrumentProvider returns p with every call counted and timed in m
// (p itself when m is nil). Errors and values pass through unchanged.
func InstrumentProvider(p provider.Provider, m *Metrics) provider.Provider {
	if m == nil {
		return p
	}
	return instrumented{p: p, m: m}
}

// instrumented spells out every method rather than embedding the
// interface, so a method added to provider.Provider fails to compile here
// instead of going uncounted.
type instrumented struct {
	p provider.Provider
	m *Metrics
}

var _ provider.Provider = instrumented{}

func (i instrumented) Name() string { return i.p.Name() }

func (i instrumented) Create(ctx context.Context, spec provider.Spec) (provider.VM, error) {
	start := time.Now()
	vm, err := i.p.Create(ctx, spec)
	i.m.ObserveCloudCall(OpCreate, CloudResult(err), time.Since(start))
	return vm, err
}

func (i instrumented) Get(ctx context.Context, id string) (provider.VM, error) {
	start := time.Now()
	vm, err := i.p.Get(ctx, id)
	i.m.ObserveCloudCall(OpGet, CloudResult(err), time.Since(start))
	return vm, err
}

func (i instrumented) List(ctx context.Context, sel provider.Selector) ([]provider.VM, error) {
	start := time.Now()
	vms, err := i.p.List(ctx, sel)
	i.m.ObserveCloudCall(OpList, CloudResult(err), time.Since(start))
	return vms, err
}

// Leftovers passes through to a provider that finds leftovers; it makes no
// call, so there is nothing to count.
func (i instrumented) Leftovers(sel provider.Selector) []provider.VM {
	if lf, ok := i.p.(provider.LeftoverFinder); ok {
		return lf.Leftovers(sel)
	}
	return nil
}

func (i instrumented) Delete(ctx context.Context, id string) error {
	start := time.Now()
	err := i.p.Delete(ctx, id)
	i.m.ObserveCloudCall(OpDelete, CloudResult(err), time.Since(start))
	return err
}

// NodeConfig passes the provider's node configuration through, so the
// reconciler still sees it behind the instrumentation.
func (i instrumented) NodeConfig() string { return provider.NodeConfigOf(i.p) }
