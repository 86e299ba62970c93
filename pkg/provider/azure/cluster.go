package azure

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/caa-project/caa/pkg/provider"
)

var _ provider.ClusterLister = (*Provider)(nil)

// The cluster listing groups on the server: Resource Graph answers at most
// 1,000 rows a query, so a row a VM costs a query per 1,000 VMs (30 for
// 1,000 nodes of 30 VMs, a tenth of a minute of the identity's quota every
// interval). Summarized by the node tag, a row carries a node and every VM
// of it, so one answer holds up to 1,000 nodes.
//
// Resource Graph pages no summarize: it answers the first page only, with
// resultTruncated set and no $skipToken when the groups do not fit (its
// query-language reference, "summarize: simplified first page only"; its
// paging guidance). So the listing splits the nodes itself, the way that
// guidance splits a large result: by a hash of the node tag, into parts
// that each fit one answer, sized from a count made first. An answer that
// says it was truncated anyway makes the listing start again with twice
// the parts. The guidance also puts an answer's size at 16 MB at most: a
// part holds at most clusterVMsPerAnswer VMs (about 2.2 MB with caa's own
// tags), whatever its nodes.

// clusterFilter is every VM of the resource group tagged for the cluster
// with caa as manager, with its node tag as a column. The values go in
// through %s as KQL literals (kqlString).
const clusterFilter = `Resources
| where type =~ 'microsoft.compute/virtualmachines'
| where resourceGroup =~ %s
| where tags[%s] == %s and tags[%s] == %s
| extend node = tostring(tags[%s])`

// clusterCount sizes the listing: its VMs and (an estimate of) its nodes.
const clusterCount = `
| summarize vms = count(), nodes = dcount(node)`

// clusterPart keeps one part of parts (%d, %d: the parts, the part). KQL's
// hash() is a signed 64-bit value and its % keeps the dividend's sign, so
// the remainder's absolute value names the part.
const clusterPart = `
| where abs(hash(node) %% %d) == %d`

// clusterGroups is each node with its VMs, a VM as an array of the columns
// in clusterVM's order (an array, not a bag: the names are not repeated
// in every VM of the answer).
const clusterGroups = `
| extend provisioningState = tostring(properties.provisioningState), powerState = tostring(properties.extended.instanceView.powerState.code), timeCreated = tostring(properties.timeCreated), vmSize = tostring(properties.hardwareProfile.vmSize)
| extend vm = pack_array(id, name, location, zones, tags, provisioningState, powerState, timeCreated, vmSize)
| summarize vms = make_list(vm) by node`

// clusterVM names the elements of a VM in clusterGroups' answer.
var clusterVM = []string{"id", "name", "location", "zones", "tags", "provisioningState", "powerState", "timeCreated", "vmSize"}

const (
	// clusterNodesPerAnswer is the most nodes a part is sized for: below
	// the 1,000 rows of an answer, for dcount's estimate and the hash's
	// uneven split.
	clusterNodesPerAnswer = 800
	// clusterVMsPerAnswer is the most VMs a part is sized for, for the
	// answer's 16 MB.
	clusterVMsPerAnswer = 5000
	// clusterMaxParts bounds the doubling after a truncated answer.
	clusterMaxParts = 1024
)

const opListCluster = "list cluster"

// ClusterParts is how many grouped queries ListCluster sends for a cluster
// of nodes and vms, after its count (none when there are no VMs).
func ClusterParts(nodes, vms int) int {
	if vms <= 0 {
		return 0
	}
	return max(1, int(math.Ceil(float64(nodes)/clusterNodesPerAnswer)), int(math.Ceil(float64(vms)/clusterVMsPerAnswer)))
}

// ListCluster returns every VM of the resource group tagged for cluster
// and managed by caa: a count, then one grouped Resource Graph query per
// part of the nodes (see ClusterParts), each under the same quota gate as
// List. States come from the index as it stands (it lags ARM): the cluster
// caa deletes only VMs of nodes gone from the cluster, and a node's caa
// reads by id whatever the view shows dead or gone before it acts.
func (p *Provider) ListCluster(ctx context.Context, cluster string) ([]provider.VM, error) {
	if cluster == "" {
		return nil, fmt.Errorf("%s %s: no cluster id given", ProviderName, opListCluster)
	}
	var lits []any
	for _, v := range []string{p.cfg.ResourceGroup, provider.TagManagedBy, provider.ManagedByValue, provider.TagCluster, cluster, provider.TagNode} {
		lit, err := kqlString(v)
		if err != nil {
			return nil, fmt.Errorf("%s %s: %w: %w", ProviderName, opListCluster, provider.ErrInvalidSpec, err)
		}
		lits = append(lits, lit)
	}
	base := fmt.Sprintf(clusterFilter, lits...)

	count, err := clusterQuery[clusterCountRow](ctx, p, base+clusterCount)
	if err != nil {
		return nil, err
	}
	if count.rows() != 1 {
		return nil, fmt.Errorf("%s %s: Resource Graph answered the count with %d rows, want 1", ProviderName, opListCluster, count.rows())
	}
	var nodes, vms float64
	if len(count.Data) == 1 {
		nodes, vms = count.Data[0].Nodes, count.Data[0].VMs
	} else {
		row, _ := count.generic[0].(map[string]any)
		nodes, vms = number(row["nodes"]), number(row["vms"])
	}
	parts := ClusterParts(int(nodes), int(vms))
	if parts == 0 {
		return []provider.VM{}, nil
	}
	for {
		out, truncated, err := p.clusterParts(ctx, base, cluster, parts)
		if err != nil || !truncated {
			return out, err
		}
		if parts >= clusterMaxParts {
			return nil, fmt.Errorf("%s %s: Resource Graph truncated a part of %d: the cluster's nodes do not fit %d answers", ProviderName, opListCluster, parts, parts)
		}
		parts *= 2
	}
}

// clusterParts sends the grouped query of each of parts; it stops at the
// first answer that says groups were left out (truncated).
func (p *Provider) clusterParts(ctx context.Context, base, cluster string, parts int) (_ []provider.VM, truncated bool, _ error) {
	out := []provider.VM{}
	for part := range parts {
		query := base
		if parts > 1 {
			query += fmt.Sprintf(clusterPart, parts, part)
		}
		page, err := clusterQuery[clusterGroup](ctx, p, query+clusterGroups)
		if err != nil {
			return nil, false, err
		}
		if page.truncated() || page.SkipToken != "" || (page.TotalRecords != nil && *page.TotalRecords > int64(page.rows())) {
			return nil, true, nil
		}
		for _, group := range page.Data {
			for i := range group.VMs {
				r, _ := group.VMs[i].row(nil)
				if vm, ok := clusterVMOf(r, cluster); ok {
					out = append(out, vm)
				}
			}
		}
		for _, d := range page.generic {
			group, _ := d.(map[string]any)
			vms, _ := group["vms"].([]any)
			for _, v := range vms {
				if vm, ok := clusterRow(v, cluster); ok {
					out = append(out, vm)
				}
			}
		}
	}
	return out, false, nil
}

// clusterQuery sends one query of the cluster listing: one page, under the
// quota gate.
func clusterQuery[R any](ctx context.Context, p *Provider, query string) (graphPage[R], error) {
	if wait := p.quota.wait(p.now()); wait > 0 {
		return graphPage[R]{}, &provider.Error{Kind: provider.ErrThrottled, Provider: ProviderName, Op: opListCluster, Code: "UserQuotaUsedUp",
			Message: "Resource Graph's per-user quota is used up until its window resets", RetryAfter: wait}
	}
	return queryGraph[R](ctx, p, opListCluster, p.graphQuery(query))
}

// clusterCountRow is clusterCount's one row.
type clusterCountRow struct {
	VMs   float64 `json:"vms"`
	Nodes float64 `json:"nodes"`
}

// clusterGroup is a row of clusterGroups' answer: a node's VMs.
type clusterGroup struct {
	VMs []clusterVMRow `json:"vms"`
}

// clusterVMRow is a VM of a group, decoded from its array.
type clusterVMRow struct{ nodeRow }

// UnmarshalJSON reads the array in clusterVM's order. Any other shape is an
// error, which has the answer read the lenient way (clusterRow).
func (v *clusterVMRow) UnmarshalJSON(b []byte) error {
	v.nodeRow = nodeRow{Type: vmType}
	elems := []any{&v.ID, &v.Name, &v.Location, &v.Zones, &v.Tags, &v.ProvisioningState, &v.PowerState, &v.TimeCreated, &v.VMSize}
	if err := json.Unmarshal(b, &elems); err != nil {
		return err
	}
	if len(elems) != len(clusterVM) {
		return fmt.Errorf("a VM of %d elements, want %d", len(elems), len(clusterVM))
	}
	return nil
}

// clusterRow reads one VM of a group as the SDK's model decodes it (an
// array in clusterVM's order); a VM of another shape is left out.
func clusterRow(v any, cluster string) (provider.VM, bool) {
	arr, ok := v.([]any)
	if !ok || len(arr) != len(clusterVM) {
		return provider.VM{}, false
	}
	m := map[string]any{"type": vmType}
	for i, k := range clusterVM {
		m[k] = arr[i]
	}
	r, ok := readRow(m)
	if !ok {
		return provider.VM{}, false
	}
	return clusterVMOf(r, cluster)
}

// clusterVMOf is the VM of row r; only a VM whose own tags name cluster and
// caa as manager is kept.
func clusterVMOf(r graphRow, cluster string) (provider.VM, bool) {
	if r.id == "" || r.tags[provider.TagCluster] != cluster || r.tags[provider.TagManagedBy] != provider.ManagedByValue {
		return provider.VM{}, false
	}
	power, _ := strings.CutPrefix(r.power, "PowerState/")
	vm := provider.VM{ID: r.id, Name: r.name, State: stateOf(r.provisioning, power), Tags: r.tags, Zone: r.location, InstanceType: r.size}
	if r.zone != "" {
		vm.Zone = r.zone
	}
	if t, err := time.Parse(time.RFC3339Nano, r.created); err == nil {
		vm.CreatedAt = t
	}
	return vm, true
}

// number reads a JSON number as the SDK decoded it.
func number(v any) float64 {
	switch n := v.(type) {
	case float64:
		return n
	case int64:
		return float64(n)
	case json.Number:
		f, _ := n.Float64()
		return f
	}
	return 0
}
