package azure

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/compute/armcompute/v8"

	"github.com/caa-project/caa/pkg/provider"
)

// nodeQuery is the one Resource Graph query List sends: the VMs and NICs of
// the resource group that carry caa's tags for one cluster and node, with
// only the columns caa reads. It is a constant; the values go in through
// %s, each a KQL string literal made by kqlString, so no value can change
// the query's shape. The tag names are caa's own constants, quoted the same
// way. The NICs come along because caa tags them as it tags their VMs:
// their private IPs cost no call of their own.
const nodeQuery = `Resources
| where type in~ ('microsoft.compute/virtualmachines', 'microsoft.network/networkinterfaces')
| where resourceGroup =~ %s
| where tags[%s] == %s and tags[%s] == %s and tags[%s] == %s
| extend provisioningState = tostring(properties.provisioningState), powerState = tostring(properties.extended.instanceView.powerState.code), timeCreated = tostring(properties.timeCreated), vmSize = tostring(properties.hardwareProfile.vmSize), image = tostring(properties.storageProfile.imageReference), privateIP = tostring(properties.ipConfigurations[0].properties.privateIPAddress), attachedTo = tostring(properties.virtualMachine.id), securityType = tostring(properties.securityProfile.securityType)
| project id, name, type, location, zones, tags, provisioningState, powerState, timeCreated, vmSize, image, privateIP, attachedTo, securityType`

// graphTop is the page size List asks for, Resource Graph's largest.
const graphTop = 1000

// Resource Graph's per-user quota headers.
const (
	headerQuotaRemaining = "x-ms-user-quota-remaining"
	headerQuotaResets    = "x-ms-user-quota-resets-after"
)

// queryFor is the query for sel in the configured resource group.
func (p *Provider) queryFor(sel provider.Selector) (string, error) {
	vals := []struct{ field, v string }{
		{"resource group", p.cfg.ResourceGroup},
		{"tag name", provider.TagManagedBy}, {"managed-by tag", provider.ManagedByValue},
		{"tag name", provider.TagCluster}, {"cluster", sel.Cluster},
		{"tag name", provider.TagNode}, {"node", sel.Node},
	}
	lits := make([]any, len(vals))
	for i, f := range vals {
		lit, err := kqlString(f.v)
		if err != nil {
			return "", fmt.Errorf("%s %s: %w: the %s %w", ProviderName, opList, provider.ErrInvalidSpec, f.field, err)
		}
		lits[i] = lit
	}
	return fmt.Sprintf(nodeQuery, lits...), nil
}

// kqlString quotes s as a KQL string literal: single quotes, with the
// backslash, both quotes and the line breaks and tab escaped. Any other
// control character is refused: no caa name holds one, and KQL has no
// escape for it that Resource Graph is known to take.
func kqlString(s string) (string, error) {
	var b strings.Builder
	b.Grow(len(s) + 2)
	b.WriteByte('\'')
	for _, r := range s {
		switch r {
		case '\\':
			b.WriteString(`\\`)
		case '\'':
			b.WriteString(`\'`)
		case '"':
			b.WriteString(`\"`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		default:
			if r < 0x20 || r == 0x7f {
				return "", fmt.Errorf("%q holds the control character %U", s, r)
			}
			b.WriteRune(r)
		}
	}
	b.WriteByte('\'')
	return b.String(), nil
}

// quotaGate remembers Resource Graph's per-user quota as its last answer
// reported it: once no query is left, none is sent before the window
// resets. Between providers of one process it is not shared (caa has one).
type quotaGate struct {
	mu    sync.Mutex
	until time.Time
}

// wait is how long the quota still forbids a query; zero when it does not.
func (g *quotaGate) wait(now time.Time) time.Duration {
	g.mu.Lock()
	defer g.mu.Unlock()
	if now.Before(g.until) {
		return g.until.Sub(now)
	}
	return 0
}

// note reads the quota headers of an answer; an answer without them changes
// nothing.
func (g *quotaGate) note(h http.Header, now time.Time) {
	if h == nil {
		return
	}
	remaining, err := strconv.Atoi(strings.TrimSpace(h.Get(headerQuotaRemaining)))
	if err != nil || remaining > 0 {
		return
	}
	reset, ok := parseHMS(h.Get(headerQuotaResets))
	if !ok {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if until := now.Add(reset); until.After(g.until) {
		g.until = until
	}
}

// parseHMS reads Resource Graph's hh:mm:ss (seconds may have a fraction).
func parseHMS(v string) (time.Duration, bool) {
	parts := strings.Split(strings.TrimSpace(v), ":")
	if len(parts) != 3 {
		return 0, false
	}
	h, err1 := strconv.Atoi(parts[0])
	m, err2 := strconv.Atoi(parts[1])
	s, err3 := strconv.ParseFloat(parts[2], 64)
	if err1 != nil || err2 != nil || err3 != nil || h < 0 || m < 0 || s < 0 {
		return 0, false
	}
	return time.Duration(h)*time.Hour + time.Duration(m)*time.Minute + time.Duration(s*float64(time.Second)), true
}

// graphRow is one row of nodeQuery's answer.
type graphRow struct {
	id, name, typ, location, zone, provisioning, power, created string
	size, image, ip, attachedTo, securityType                   string
	tags                                                        map[string]string
}

// nodeRow is a row of nodeQuery's answer as it comes on the wire.
type nodeRow struct {
	ID                string            `json:"id"`
	Name              string            `json:"name"`
	Type              string            `json:"type"`
	Location          string            `json:"location"`
	Zones             []string          `json:"zones"`
	Tags              map[string]string `json:"tags"`
	ProvisioningState string            `json:"provisioningState"`
	PowerState        string            `json:"powerState"`
	TimeCreated       string            `json:"timeCreated"`
	VMSize            string            `json:"vmSize"`
	Image             string            `json:"image"`
	PrivateIP         string            `json:"privateIP"`
	AttachedTo        string            `json:"attachedTo"`
	SecurityType      string            `json:"securityType"`
}

// row is r as List reads it; images caches the image references read so
// far, as the VMs of a node mostly share one. A row without an id is left
// out.
func (r *nodeRow) row(images imageRefs) (graphRow, bool) {
	row := graphRow{
		id: r.ID, name: r.Name, typ: strings.ToLower(r.Type), location: r.Location,
		provisioning: r.ProvisioningState, power: r.PowerState, created: r.TimeCreated,
		size: r.VMSize, image: images.read(r.Image), ip: r.PrivateIP, attachedTo: r.AttachedTo, tags: r.Tags,
		securityType: r.SecurityType,
	}
	if len(r.Zones) > 0 {
		row.zone = r.Zones[0]
	}
	if row.tags == nil {
		row.tags = map[string]string{}
	}
	return row, row.id != ""
}

// imageRefs maps the JSON of an image reference to caa's image string.
type imageRefs map[string]string

func (m imageRefs) read(raw string) string {
	if raw == "" {
		return ""
	}
	s, ok := m[raw]
	if !ok {
		s = imageOf(raw)
		m[raw] = s
	}
	return s
}

// imageOf reads the image reference the query's tostring() made JSON of;
// "" when it is not one.
func imageOf(raw string) string {
	var ref armcompute.ImageReference
	if raw == "" || json.Unmarshal([]byte(raw), &ref) != nil {
		return ""
	}
	return imageString(&ref)
}

// readRow reads a row as the SDK's model decodes it (any JSON), for an
// answer whose rows do not fit nodeRow: a value of another type reads as
// absent, and a row that is not an object or has no id is left out.
func readRow(v any) (graphRow, bool) {
	m, ok := v.(map[string]any)
	if !ok {
		return graphRow{}, false
	}
	str := func(k string) string { s, _ := m[k].(string); return s }
	row := graphRow{
		id: str("id"), name: str("name"), typ: strings.ToLower(str("type")), location: str("location"),
		provisioning: str("provisioningState"), power: str("powerState"), created: str("timeCreated"),
		size: str("vmSize"), image: imageOf(str("image")), ip: str("privateIP"), attachedTo: str("attachedTo"), tags: map[string]string{},
		securityType: str("securityType"),
	}
	if zones, ok := m["zones"].([]any); ok && len(zones) > 0 {
		row.zone, _ = zones[0].(string)
	}
	if tags, ok := m["tags"].(map[string]any); ok {
		for k, v := range tags {
			if s, ok := v.(string); ok {
				row.tags[k] = s
			}
		}
	}
	return row, row.id != ""
}

// List finds the node's VMs with one Resource Graph query (paged), scoped
// to the subscription and filtered by the resource group and caa's tags on
// the server, so its cost follows the node's VMs, not the group's. The
// query brings the VMs' NICs along for their private IPs, and each VM's
// power state from the instance view Resource Graph keeps.
//
// The index lags ARM by seconds to minutes, so List treats what it shows as
// a hint: a VM it misses is confirmed by the caller with Get before
// anything is recreated, and a VM it shows as dead (stopped, deallocated,
// failed) is read directly here (Get) before List reports it dead; a VM
// that read does not find is left out. Nothing the provider writes is
// decided on the index: Create finds its VM by name with a direct GET, and
// Delete and Get never look at it.
//
// Throttling: when an answer said the caller's quota is used up
// (x-ms-user-quota-remaining 0), List sends no query before the window
// resets (x-ms-user-quota-resets-after): it returns ErrThrottled with that
// wait as RetryAfter at once, without waiting, so the reconciler's own
// backoff decides, as for every other throttled call. A 429 is ErrThrottled
// with the Retry-After Resource Graph sent.
func (p *Provider) List(ctx context.Context, sel provider.Selector) ([]provider.VM, error) {
	query, err := p.queryFor(sel)
	if err != nil {
		return nil, err
	}
	var rows []graphRow
	images := imageRefs{}
	req := p.graphQuery(query)
	for {
		if wait := p.quota.wait(p.now()); wait > 0 {
			return nil, &provider.Error{Kind: provider.ErrThrottled, Provider: ProviderName, Op: opList, Code: "UserQuotaUsedUp",
				Message: "Resource Graph's per-user quota is used up until its window resets", RetryAfter: wait}
		}
		page, err := queryGraph[nodeRow](ctx, p, opList, req)
		if err != nil {
			return nil, err
		}
		if rows == nil {
			rows = make([]graphRow, 0, page.rows())
		}
		for i := range page.Data {
			if row, ok := page.Data[i].row(images); ok {
				rows = append(rows, row)
			}
		}
		for _, d := range page.generic {
			if row, ok := readRow(d); ok {
				rows = append(rows, row)
			}
		}
		if page.SkipToken == "" {
			break
		}
		req.Options.SkipToken = new(page.SkipToken)
	}
	return p.fromRows(ctx, sel, rows)
}

// fromRows joins the VMs with their NICs' addresses and confirms the dead.
func (p *Provider) fromRows(ctx context.Context, sel provider.Selector, rows []graphRow) ([]provider.VM, error) {
	ips := map[string][]string{} // by lower-case VM id, else by NIC name
	for _, r := range rows {
		if r.typ != strings.ToLower(nicType) || r.ip == "" {
			continue
		}
		key := strings.ToLower(r.attachedTo)
		if key == "" {
			key = "nic:" + strings.ToLower(r.name)
		}
		ips[key] = append(ips[key], r.ip)
	}
	out := []provider.VM{}
	vmNames := map[string]bool{} // every VM of the listing, lower case
	for _, r := range rows {
		if r.typ == strings.ToLower(vmType) {
			vmNames[strings.ToLower(r.name)] = true
		}
	}
	p.noteLeftovers(sel, leftoverNICs(sel, rows, vmNames))
	for _, r := range rows {
		if r.typ != strings.ToLower(vmType) || !sel.Matches(r.tags) {
			continue
		}
		power, _ := strings.CutPrefix(r.power, "PowerState/")
		vm := provider.VM{ID: r.id, Name: r.name, State: stateOf(r.provisioning, power), Tags: r.tags, Zone: r.location,
			InstanceType: r.size, Image: r.image, TEE: teeOf(r.securityType, r.size)}
		vm.Degraded = degradedOf(vm.State, r.provisioning, "")
		if r.zone != "" {
			vm.Zone = r.zone
		}
		if t, err := time.Parse(time.RFC3339Nano, r.created); err == nil {
			vm.CreatedAt = t
		}
		vm.IPs = ips[strings.ToLower(r.id)]
		if vm.IPs == nil {
			vm.IPs = ips["nic:"+strings.ToLower(nicName(r.name))]
		}
		if vm.State.Dead() {
			// The index may be stale: only ARM's own answer says dead.
			got, err := p.Get(ctx, vm.ID)
			switch {
			case errors.Is(err, provider.ErrNotFound):
				continue
			case err != nil:
				return nil, fmt.Errorf("%s %s: confirm the %s state of VM %s: %w", ProviderName, opList, vm.State, vm.Name, err)
			}
			vm = got
		}
		out = append(out, vm)
	}
	return out, nil
}

// The ARM types of what List reads.
const (
	vmType  = "Microsoft.Compute/virtualMachines"
	nicType = "Microsoft.Network/networkInterfaces"
)

// leftoverNICs are the NICs of a listing that caa made for sel's node and
// that outlived their VM: tagged for sel, attached to no VM, and with no VM
// of the name they were made for in the same listing. A NIC whose VM's
// create was refused, or whose delete Azure refused while it kept the NIC
// reserved for the failed VM (NicReservedForAnotherVm, about 180 s), stays
// otherwise, holding a subnet address. The index may lag: the caller
// deletes one only after seeing it so in two listings a grace period apart,
// and Azure refuses the delete of a NIC a VM uses (NicInUse) anyway.
func leftoverNICs(sel provider.Selector, rows []graphRow, vmNames map[string]bool) []provider.VM {
	var out []provider.VM
	for _, r := range rows {
		if r.typ != strings.ToLower(nicType) || !sel.Matches(r.tags) || r.attachedTo != "" {
			continue
		}
		vm, ok := strings.CutSuffix(strings.ToLower(r.name), nicSuffix)
		if !ok || vmNames[vm] {
			continue
		}
		out = append(out, provider.VM{ID: r.id, Name: r.name, State: provider.StateTerminated, Tags: r.tags, Zone: r.location})
	}
	return out
}

// noteLeftovers keeps what the last listing for sel showed of leftover
// NICs, for Leftovers.
func (p *Provider) noteLeftovers(sel provider.Selector, nics []provider.VM) {
	p.leftMu.Lock()
	defer p.leftMu.Unlock()
	if p.leftovers == nil {
		p.leftovers = map[provider.Selector][]provider.VM{}
	}
	p.leftovers[sel] = nics
}

var _ provider.LeftoverFinder = (*Provider)(nil)

// Leftovers returns the leftover NICs the last List for sel showed (see
// leftoverNICs); Delete takes their ids.
func (p *Provider) Leftovers(sel provider.Selector) []provider.VM {
	p.leftMu.Lock()
	defer p.leftMu.Unlock()
	return slices.Clone(p.leftovers[sel])
}
