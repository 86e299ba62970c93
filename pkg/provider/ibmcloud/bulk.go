package ibmcloud

import (
	"context"
	"fmt"
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

// cheaperInBulk reports, for a node with n VMs in a VPC of total
// instances, whether listing the VPC's instances and the node's boot
// volumes costs fewer calls than reading the n VMs by id (two reads each).
func cheaperInBulk(total int64, n int) bool {
	pagesOfInstances := (total + pageLimit - 1) / pageLimit
	pagesOfVolumes := int64(n+pageLimit-1) / pageLimit
	return pagesOfInstances+pagesOfVolumes < int64(2*n)
}

// listBig is List for a node whose search found more than bulkAbove
// volumes (ids). Two things go out at once: the first page of the VPC's
// instances, whose total_count says whether VPC's listings are cheaper
// than two reads per VM, and the node's boot volumes by tag, which the
// listings need. When the listings are cheaper, the instance pages go on
// from the first while the volumes arrive, and the two are joined on the
// boot volume's attachment; the answer costs no separate count and one
// round trip less than asking first. Otherwise the volume listing is
// cancelled (at most its first page spent) and the VMs are read by id.
func (p *Provider) listBig(ctx context.Context, sel provider.Selector, ids []string) ([]readVM, error) {
	type tagged struct {
		owned map[string]map[string]string
		err   error
	}
	vctx, vcancel := context.WithCancel(ctx)
	defer vcancel()
	volumes := make(chan tagged, 1)
	go func() {
		owned, err := p.taggedInstances(vctx, sel)
		volumes <- tagged{owned, err}
	}()
	stopVolumes := func() { vcancel(); <-volumes }

	opts := p.instanceListOptions()
	opts.Limit = ptr(int64(pageLimit))
	first, resp, err := call(ctx, p.cfg.ReadTimeout, provider.DefaultReadTimeout, func(ctx context.Context) (*vpcv1.InstanceCollection, *core.DetailedResponse, error) {
		return p.api.ListInstancesWithContext(ctx, opts)
	})
	if err != nil {
		stopVolumes()
		return nil, classify(opList, resp, fmt.Errorf("list the instances: %w", err))
	}
	total := int64(len(first.Instances))
	if first.TotalCount != nil {
		total = *first.TotalCount
	}
	if !cheaperInBulk(total, len(ids)) {
		stopVolumes()
		return p.readVMs(ctx, sel, ids)
	}
	all, err := p.restOfInstances(ctx, opts, first)
	if err != nil {
		stopVolumes()
		return nil, err
	}
	v := <-volumes
	if v.err != nil {
		return nil, v.err
	}
	var out []readVM
	for i := range all {
		if tags, ok := v.owned[str(all[i].ID)]; ok {
			out = append(out, readVM{vmOf(&all[i], tags), str(all[i].CRN)})
		}
	}
	return out, nil
}

// restOfInstances follows the instance listing opts from its first page
// to the last, each page under its own deadline; an instance on two
// pages is a pagination loop.
func (p *Provider) restOfInstances(ctx context.Context, opts *vpcv1.ListInstancesOptions, first *vpcv1.InstanceCollection) ([]vpcv1.Instance, error) {
	seen := map[string]bool{}
	var all []vpcv1.Instance
	page := first
	for {
		for _, in := range page.Instances {
			if seen[str(in.ID)] {
				return nil, &provider.Error{Provider: providerName, Op: opList, Code: "pagination_loop",
					Message: fmt.Sprintf("%s came back on a later page", str(in.ID))}
			}
			seen[str(in.ID)] = true
			all = append(all, in)
		}
		start, err := page.GetNextStart()
		if err != nil {
			return nil, classify(opList, nil, fmt.Errorf("the next page of instances: %w", err))
		}
		if start == nil {
			return all, nil
		}
		next := *opts
		next.Start = start
		var resp *core.DetailedResponse
		page, resp, err = call(ctx, p.cfg.ReadTimeout, provider.DefaultReadTimeout, func(ctx context.Context) (*vpcv1.InstanceCollection, *core.DetailedResponse, error) {
			return p.api.ListInstancesWithContext(ctx, &next)
		})
		if err != nil {
			return nil, classify(opList, resp, fmt.Errorf("list the instances: %w", err))
		}
	}
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
		if matches(sel, tags) {
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
