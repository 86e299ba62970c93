package aws

import (
	"context"
	"fmt"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"

	"github.com/caa-project/caa/pkg/provider"
)

var _ provider.ClusterLister = (*Provider)(nil)

// opListCluster names the cluster-wide listing in errors.
const opListCluster = "list cluster"

// ListCluster returns every instance tagged for cluster and managed by
// caa: DescribeInstances filtered on both tags by EC2 itself, 1,000
// instances a page (EC2's largest), so 30,000 VMs cost 30 calls.
func (p *Provider) ListCluster(ctx context.Context, cluster string) ([]provider.VM, error) {
	if cluster == "" {
		return nil, fmt.Errorf("%s %s: no cluster id given", Name, opListCluster)
	}
	var vms []provider.VM
	err := p.describe(ctx, opListCluster, []types.Filter{
		{Name: awssdk.String("tag:" + provider.TagCluster), Values: []string{cluster}},
		{Name: awssdk.String("tag:" + provider.TagManagedBy), Values: []string{provider.ManagedByValue}},
	}, func(vm provider.VM) bool {
		vms = append(vms, vm)
		return true
	})
	if err != nil {
		return nil, err
	}
	return vms, nil
}
