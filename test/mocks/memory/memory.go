// Package memory is a provider.Provider over the fake cloud core, with no
// wire protocol in between: the first thing a reconciler unit test reaches
// for. Its faults are the core's (cloud.Faults), set on the Cloud.
package memory

import (
	"context"
	"errors"
	"fmt"

	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/test/mocks/cloud"
)

// Provider is the in-memory provider.
type Provider struct {
	Cloud *cloud.Cloud
}

var _ provider.Provider = (*Provider)(nil)

// New returns a provider over c (a fresh cloud when c is nil).
func New(c *cloud.Cloud) *Provider {
	if c == nil {
		c = cloud.New(cloud.Options{IDPrefix: "mem-"})
	}
	return &Provider{Cloud: c}
}

// Name is "memory".
func (p *Provider) Name() string { return "memory" }

// Create makes the VM for spec, idempotent by spec.Key.
func (p *Provider) Create(ctx context.Context, spec provider.Spec) (provider.VM, error) {
	if err := spec.Validate(); err != nil {
		return provider.VM{}, err
	}
	if err := p.admit(ctx, cloud.OpCreate, true); err != nil {
		return provider.VM{}, err
	}
	in, err := p.Cloud.Create(cloud.CreateRequest{
		Name: "caa-" + spec.Key, Token: spec.Key, Tags: spec.Tags(),
		InstanceType: spec.InstanceType, Image: spec.Image, UserData: spec.UserData, TEE: string(spec.TEE),
	})
	if err != nil {
		return provider.VM{}, p.classify("create", err)
	}
	return toVM(in), nil
}

// Get returns the VM or ErrNotFound.
func (p *Provider) Get(ctx context.Context, id string) (provider.VM, error) {
	if err := p.admit(ctx, cloud.OpGet, false); err != nil {
		return provider.VM{}, err
	}
	in, err := p.Cloud.Get(id)
	if err != nil {
		return provider.VM{}, p.classify("get", err)
	}
	return toVM(in), nil
}

// List returns every VM of sel, page by page.
func (p *Provider) List(ctx context.Context, sel provider.Selector) ([]provider.VM, error) {
	var out []provider.VM
	token := ""
	for {
		if err := p.admit(ctx, cloud.OpList, false); err != nil {
			return nil, err
		}
		page, next, err := p.Cloud.List(func(in cloud.Instance) bool { return sel.Matches(in.Tags) }, token, 0)
		if err != nil {
			return nil, p.classify("list", err)
		}
		for _, in := range page {
			out = append(out, toVM(in))
		}
		if next == "" {
			return out, nil
		}
		token = next
	}
}

// Delete terminates the VM; nil when it is already gone.
func (p *Provider) Delete(ctx context.Context, id string) error {
	if err := p.admit(ctx, cloud.OpDelete, true); err != nil {
		return err
	}
	if err := p.Cloud.Delete(id); err != nil && !errors.Is(err, cloud.ErrNotFound) {
		return p.classify("delete", err)
	}
	return nil
}

func (p *Provider) admit(ctx context.Context, op string, write bool) error {
	f, err := p.Cloud.Admit(ctx, op, write)
	if err != nil {
		return fmt.Errorf("memory %s: %w", op, err)
	}
	e := &provider.Error{Provider: "memory", Op: op}
	switch f.Kind {
	case cloud.FaultNone:
		return nil
	case cloud.FaultThrottle:
		e.Kind, e.Code, e.RetryAfter = provider.ErrThrottled, "Throttled", f.RetryAfter
	case cloud.FaultAuth:
		e.Kind, e.Code = provider.ErrAuth, "Unauthorized"
	case cloud.FaultServerError:
		e.Code, e.Status = "InternalError", 500
	}
	return e
}

func (p *Provider) classify(op string, err error) error {
	e := &provider.Error{Provider: "memory", Op: op, Code: "Error", Message: err.Error(), Err: err}
	switch {
	case errors.Is(err, cloud.ErrNotFound):
		e.Kind, e.Code = provider.ErrNotFound, "NotFound"
	case errors.Is(err, cloud.ErrQuota):
		e.Kind, e.Code = provider.ErrQuota, "QuotaExceeded"
	case errors.Is(err, cloud.ErrCapacity):
		e.Kind, e.Code = provider.ErrCapacity, "InsufficientCapacity"
	case errors.Is(err, cloud.ErrBadImage):
		e.Kind, e.Code, e.Refused = provider.ErrInvalidSpec, "InvalidSpec", provider.RefusedImage
	case errors.Is(err, cloud.ErrBadType):
		e.Kind, e.Code, e.Refused = provider.ErrInvalidSpec, "InvalidSpec", provider.RefusedInstanceType
	case errors.Is(err, cloud.ErrIdempotencyMismatch), errors.Is(err, cloud.ErrNameConflict):
		e.Kind, e.Code = provider.ErrConflict, "Conflict"
	}
	return e
}

func toVM(in cloud.Instance) provider.VM {
	return provider.VM{
		ID: in.ID, Name: in.Name, State: in.State, IPs: in.IPs, Tags: in.Tags, CreatedAt: in.CreatedAt,
		InstanceType: in.InstanceType, Image: in.Image, Zone: in.Zone, TEE: provider.TEE(in.TEE),
	}
}
