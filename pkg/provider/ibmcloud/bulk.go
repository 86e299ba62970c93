package ibmcloud

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/IBM/go-sdk-core/v5/core"
	"github.com/IBM/vpc-go-sdk/vpcv1"

	"github.com/caa-project/caa/pkg/provider"
)

const (
	// pageLimit is the largest page the VPC API serves.
	pageLimit = 100
	// bulkAbove is how many of its own VMs a node may have before List
	// considers VPC's listings instead of two reads per VM: up to it, a
	// listing's cost never depends on other nodes' VMs.
	bulkAbove = 50
)

// bulkIsCheaper reports, for a node with n VMs, whether listing the VPC's
// instances costs fewer calls than reading the n VMs by id. It asks VPC
// for the instance count (one call, one instance).
func (p *Provider) bulkIsCheaper(ctx context.Context, n int) (bool, error) {
	opts := p.instanceListOptions()
	opts.Limit = ptr(int64(1))
	coll, resp, err := call(ctx, p.cfg.ReadTimeout, provider.DefaultReadTimeout, func(ctx context.Context) (*vpcv1.InstanceCollection, *core.DetailedResponse, error) {
		return p.api.ListInstancesWithContext(ctx, opts)
	})
	if err != nil {
		return false, classify(opList, resp, fmt.Errorf("count the instances: %w", err))
	}
	total := int64(0)
	if coll.TotalCount != nil {
		total = *coll.TotalCount
	}
	pagesOfInstances := (total + pageLimit - 1) / pageLimit
	pagesOfVolumes := int64(n+pageLimit-1) / pageLimit
	return pagesOfInstances+pagesOfVolumes < int64(2*n), nil
}

// listFromVPC is List from VPC's listings alone, for a node whose own VMs
// outnumber what listing the VPC costs: it lists, side by side, the boot
// volumes carrying sel's node tag (whose tags say whose VM it is) and the
// instances (for state, addresses and shape), each to its last page, and
// joins them on the volume's attachment.
func (p *Provider) listFromVPC(ctx context.Context, sel provider.Selector) ([]provider.VM, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		once  sync.Once
		first error
		owned map[string]map[string]string
		all   []vpcv1.Instance
		wg    sync.WaitGroup
	)
	fail := func(err error) {
		once.Do(func() { first = err; cancel() })
	}
	wg.Go(func() {
		var err error
		if owned, err = p.taggedInstances(ctx, sel); err != nil {
			fail(err)
		}
	})
	wg.Go(func() {
		var err error
		if all, err = p.instances(ctx); err != nil {
			fail(err)
		}
	})
	wg.Wait()
	if first != nil {
		return nil, first
	}
	var out []provider.VM
	for i := range all {
		if tags, ok := owned[str(all[i].ID)]; ok {
			out = append(out, vmOf(&all[i], tags))
		}
	}
	return out, nil
}

// taggedInstances maps instance id to tags for every boot volume tagged
// for sel.
func (p *Provider) taggedInstances(ctx context.Context, sel provider.Selector) (map[string]map[string]string, error) {
	pager, err := p.api.NewVolumesPager(&vpcv1.ListVolumesOptions{Tag: ptr(firstTag(provider.TagNode, sel.Node)), Limit: ptr(int64(pageLimit))})
	if err != nil {
		return nil, classify(opList, nil, err)
	}
	out := map[string]map[string]string{}
	err = pages(ctx, p.cfg.ReadTimeout, pager.HasNext, pager.GetNextWithContext, func(v vpcv1.Volume) string {
		tags := decodeUserTags(v.UserTags)
		if sel.Matches(tags) {
			for _, a := range v.VolumeAttachments {
				if str(a.Type) == "boot" && a.Instance != nil {
					out[str(a.Instance.ID)] = tags
				}
			}
		}
		return str(v.ID)
	})
	return out, err
}

// instances lists every instance in the configured VPC and resource group.
func (p *Provider) instances(ctx context.Context) ([]vpcv1.Instance, error) {
	opts := p.instanceListOptions()
	opts.Limit = ptr(int64(pageLimit))
	pager, err := p.api.NewInstancesPager(opts)
	if err != nil {
		return nil, classify(opList, nil, err)
	}
	var out []vpcv1.Instance
	err = pages(ctx, p.cfg.ReadTimeout, pager.HasNext, pager.GetNextWithContext, func(in vpcv1.Instance) string {
		out = append(out, in)
		return str(in.ID)
	})
	return out, err
}

// pages drives one of the SDK's pagers to the last page: each page under
// its own deadline (timeout), with the transient-failure retry (a failed page leaves the pager where it was, so
// the retry asks for the same page), and each item handed to take, which
// returns its id. An id seen twice means the cloud handed back a page it
// already gave, which would loop forever: that is an error.
func pages[T any](ctx context.Context, timeout time.Duration, hasNext func() bool, next func(context.Context) ([]T, error), take func(T) string) error {
	seen := map[string]bool{}
	for hasNext() {
		page, resp, err := call(ctx, timeout, provider.DefaultReadTimeout, func(ctx context.Context) ([]T, *core.DetailedResponse, error) {
			page, err := next(ctx)
			return page, responseOf(err), err
		})
		if err != nil {
			return classify(opList, resp, err)
		}
		for _, item := range page {
			id := take(item)
			if seen[id] {
				return &provider.Error{Provider: providerName, Op: opList, Code: "pagination_loop",
					Message: fmt.Sprintf("%s came back on a later page", id)}
			}
			seen[id] = true
		}
	}
	return nil
}

// instanceListOptions scope an instance listing to the configured VPC and
// resource group.
func (p *Provider) instanceListOptions() *vpcv1.ListInstancesOptions {
	opts := &vpcv1.ListInstancesOptions{}
	if p.cfg.VPCID != "" {
		opts.VPCID = ptr(p.cfg.VPCID)
	}
	if p.cfg.ResourceGroupID != "" {
		opts.ResourceGroupID = ptr(p.cfg.ResourceGroupID)
	}
	return opts
}
