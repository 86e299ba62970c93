package azure

import (
	"context"
	"strings"

	"github.com/caa-project/caa/pkg/provider"
)

var _ provider.AdaptorLister = (*Provider)(nil)

// opListAdaptor names the listing of the adaptor's VMs in errors.
const opListAdaptor = "list adaptor VMs"

// ListAdaptorVMs returns the resource group's VMs named podvm-… that carry
// none of caa's tags: the adaptor names its VMs so (its disk
// <name>-disk and NIC <name>-net go with the VM on delete) and tags them
// with the configured tags only. ARM lists a resource group's VMs with no
// name filter, and without their power state (its instance view may be
// asked of a list only under a scale-set filter), so each podvm- VM is
// read once more by name with its instance view; the adaptor's VMs are
// few.
func (p *Provider) ListAdaptorVMs(ctx context.Context) ([]provider.VM, error) {
	pager := p.vms.NewListPager(p.cfg.ResourceGroup, nil)
	var names []string
	for pager.More() {
		rctx, cancel := p.readCtx(ctx)
		page, err := pager.NextPage(rctx)
		cancel()
		if err != nil {
			return nil, classify(opListAdaptor, err)
		}
		for _, vm := range page.Value {
			if vm == nil || !strings.HasPrefix(deref(vm.Name), "podvm-") {
				continue
			}
			if v := toVM(*vm, nil); v.Owner().Managed || v.Tags[provider.TagPodUID] != "" {
				continue
			}
			names = append(names, deref(vm.Name))
		}
	}
	var out []provider.VM
	for _, name := range names {
		got, err := p.getVM(ctx, name)
		if missing(err) {
			continue
		}
		if err != nil {
			return nil, classify(opListAdaptor, err)
		}
		if vm := toVM(got.VirtualMachine, nil); !vm.State.Gone() {
			out = append(out, vm)
		}
	}
	return out, nil
}
