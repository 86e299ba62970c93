package azure

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/resourcegraph/armresourcegraph"

	"github.com/caa-project/caa/pkg/provider"
)

var _ provider.ClusterLister = (*Provider)(nil)

// clusterQuery is nodeQuery for every node of a cluster, VMs only: the
// cluster caa needs each VM's identity tags and state, not its address.
const clusterQuery = `Resources
| where type =~ 'microsoft.compute/virtualmachines'
| where resourceGroup =~ %s
| where tags[%s] == %s and tags[%s] == %s
| extend provisioningState = tostring(properties.provisioningState), powerState = tostring(properties.extended.instanceView.powerState.code), timeCreated = tostring(properties.timeCreated), vmSize = tostring(properties.hardwareProfile.vmSize)
| project id, name, type, location, zones, tags, provisioningState, powerState, timeCreated, vmSize`

const opListCluster = "list cluster"

// ListCluster returns every VM of the resource group tagged for cluster
// and managed by caa: one Resource Graph query, 1,000 rows a page, under
// the same quota gate as List. States come from the index as it stands
// (it lags ARM): the cluster caa deletes only VMs of nodes gone from the
// cluster, and a node's caa reads by id whatever the view shows dead or
// gone before it acts.
func (p *Provider) ListCluster(ctx context.Context, cluster string) ([]provider.VM, error) {
	if cluster == "" {
		return nil, fmt.Errorf("%s %s: no cluster id given", ProviderName, opListCluster)
	}
	var lits []any
	for _, v := range []string{p.cfg.ResourceGroup, provider.TagManagedBy, provider.ManagedByValue, provider.TagCluster, cluster} {
		lit, err := kqlString(v)
		if err != nil {
			return nil, fmt.Errorf("%s %s: %w: %w", ProviderName, opListCluster, provider.ErrInvalidSpec, err)
		}
		lits = append(lits, lit)
	}
	query := fmt.Sprintf(clusterQuery, lits...)
	req := armresourcegraph.QueryRequest{
		Query:         &query,
		Subscriptions: []*string{new(p.cfg.SubscriptionID)},
		Options:       &armresourcegraph.QueryRequestOptions{ResultFormat: new(armresourcegraph.ResultFormatObjectArray), Top: new(int32(graphTop))},
	}
	out := []provider.VM{}
	for {
		if wait := p.quota.wait(p.now()); wait > 0 {
			return nil, &provider.Error{Kind: provider.ErrThrottled, Provider: ProviderName, Op: opListCluster, Code: "UserQuotaUsedUp",
				Message: "Resource Graph's per-user quota is used up until its window resets", RetryAfter: wait}
		}
		page, err := p.queryPage(ctx, req)
		if err != nil {
			return nil, err
		}
		data, ok := page.Data.([]any)
		if page.Data != nil && !ok {
			return nil, fmt.Errorf("%s %s: Resource Graph answered data of type %T, not the objectArray asked for", ProviderName, opListCluster, page.Data)
		}
		for _, d := range data {
			r, ok := readRow(d)
			if !ok || r.typ != strings.ToLower(vmType) || r.tags[provider.TagCluster] != cluster || r.tags[provider.TagManagedBy] != provider.ManagedByValue {
				continue
			}
			power, _ := strings.CutPrefix(r.power, "PowerState/")
			vm := provider.VM{ID: r.id, Name: r.name, State: stateOf(r.provisioning, power), Tags: r.tags, Zone: r.location, InstanceType: r.size}
			if r.zone != "" {
				vm.Zone = r.zone
			}
			if t, err := time.Parse(time.RFC3339Nano, r.created); err == nil {
				vm.CreatedAt = t
			}
			out = append(out, vm)
		}
		if page.SkipToken == nil || *page.SkipToken == "" {
			return out, nil
		}
		req.Options.SkipToken = page.SkipToken
	}
}
