package aws

import (
	"context"
	"strings"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"

	"github.com/caa-project/caa/pkg/provider"
)

var _ provider.AdaptorLister = (*Provider)(nil)

// opListAdaptor names the listing of the adaptor's VMs in errors.
const opListAdaptor = "list adaptor VMs"

// adaptorNamePattern selects the adaptor's instances: it tags each with
// Name = podvm-<pod>-<sandbox> and nothing else of its own. EC2's filter
// values take * as a wildcard.
const adaptorNamePattern = "podvm-*"

// ListAdaptorVMs returns the region's instances named podvm-… that carry
// none of caa's tags and are not terminated: one DescribeInstances filtered
// by EC2 on the Name tag and the state, 1,000 a page.
func (p *Provider) ListAdaptorVMs(ctx context.Context) ([]provider.VM, error) {
	var vms []provider.VM
	err := p.describe(ctx, opListAdaptor, []types.Filter{
		{Name: awssdk.String("tag:" + tagName), Values: []string{adaptorNamePattern}},
		{Name: awssdk.String("instance-state-name"), Values: []string{"pending", "running", "stopping", "stopped", "shutting-down"}},
	}, func(vm provider.VM) bool {
		if strings.HasPrefix(vm.Name, "podvm-") && vm.Tags[provider.TagManagedBy] == "" && vm.Tags[provider.TagPodUID] == "" {
			vms = append(vms, vm)
		}
		return true
	})
	if err != nil {
		return nil, err
	}
	return vms, nil
}
