package ibmcloud

import (
	"context"
	"strings"

	"github.com/IBM/go-sdk-core/v5/core"
	"github.com/IBM/vpc-go-sdk/vpcv1"

	"github.com/caa-project/caa/pkg/provider"
)

var _ provider.AdaptorLister = (*Provider)(nil)

// ListAdaptorVMs returns the instances of the configured VPC (and resource
// group) named podvm-…: the adaptor names its instances so and tags them
// (through Global Tagging, on the instance) with coco-pod-vm:<cluster id>
// and the configured tags, none of caa's. VPC filters instances by exact
// name only, so this pages through the VPC's instances, 100 a page, and
// keeps the names; caa's own are named caa-…, and carry their tags on the
// boot volume, which this listing does not read.
func (p *Provider) ListAdaptorVMs(ctx context.Context) ([]provider.VM, error) {
	opts := p.instanceListOptions()
	opts.Limit = ptr(int64(pageLimit))
	first, resp, err := call(ctx, p.cfg.ReadTimeout, provider.DefaultReadTimeout, func(ctx context.Context) (*vpcv1.InstanceCollection, *core.DetailedResponse, error) {
		return p.api.ListInstancesWithContext(ctx, opts)
	})
	if err != nil {
		return nil, classify(opList, resp, err)
	}
	all, err := p.restOfInstances(ctx, opts, first)
	if err != nil {
		return nil, err
	}
	var out []provider.VM
	for i := range all {
		if !strings.HasPrefix(str(all[i].Name), "podvm-") {
			continue
		}
		if vm := vmOf(&all[i], nil); !vm.State.Gone() {
			out = append(out, vm)
		}
	}
	return out, nil
}
