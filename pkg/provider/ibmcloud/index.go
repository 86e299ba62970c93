package ibmcloud

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/IBM/platform-services-go-sdk/globalsearchv2"

	"github.com/caa-project/caa/pkg/provider"
)

var _ provider.ClusterLister = (*Provider)(nil)

// List returns every VM tagged for sel, from one Global Search (per
// thousand hits) whose hits are the node's instances and their boot
// volumes. An instance's hit carries its state, tags, shape and scope, so
// an alive instance costs no other call. The index lags VPC by seconds to
// minutes, so it decides nothing by itself:
//
//   - an instance it shows in any other state (stopped, failed, deleting,
//     or one it cannot place) is read from VPC by id, and listed as VPC
//     shows it, or not at all once VPC no longer has it;
//   - a VM it does not show (created a moment ago, or deleted) is missing
//     from the listing, which the caller confirms by a Get before it acts
//     (invariant I3);
//   - a boot volume whose instance it does not show as tagged (a create
//     cut off between the instance and its tags, one whose attach the
//     tagging service refused, a VM made before caa tagged instances) is
//     read as before, volume then instance, and List attaches the tags to
//     that instance so the next listing finds it directly. Above
//     bulkAbove such volumes, VPC's listings replace the reads when they
//     cost fewer calls (see listBig).
//
// So an idle node costs one search per listing, whatever else the
// account holds.
func (p *Provider) List(ctx context.Context, sel provider.Selector) ([]provider.VM, error) {
	if sel.Cluster == "" || sel.Node == "" {
		return nil, fmt.Errorf("%w: a listing needs a cluster and a node", provider.ErrInvalidSpec)
	}
	return p.listIndexed(ctx, sel)
}

// ListCluster is List for every node of the cluster at once: the same
// search without the node's tag, the same reads for what the index shows
// dead or cannot place, and for untagged instances found by their boot
// volumes; it tags nothing (the node's caa does). See
// provider.ClusterLister.
func (p *Provider) ListCluster(ctx context.Context, cluster string) ([]provider.VM, error) {
	if cluster == "" {
		return nil, fmt.Errorf("%w: a cluster listing needs a cluster", provider.ErrInvalidSpec)
	}
	return p.listIndexed(ctx, provider.Selector{Cluster: cluster})
}

// indexedVM is an instance as the search index shows it.
type indexedVM struct {
	vm          provider.VM
	bootVolume  string
	vpc, group  string
	placeKnown  bool // the hit named the instance's VPC and resource group
	statusKnown bool
	// teeKnown: the hit named the instance's confidential compute mode. A
	// hit without it is read from VPC: an absent mode is no evidence that
	// the VM is not confidential.
	teeKnown bool
}

// listIndexed is List, or ListCluster when sel.Node is empty.
func (p *Provider) listIndexed(ctx context.Context, sel provider.Selector) ([]provider.VM, error) {
	items, err := p.searchIndex(ctx, sel)
	if err != nil {
		return nil, err
	}
	var (
		out       []provider.VM
		confirm   []indexedVM
		volumes   []string
		instances = map[string]bool{} // boot volume ids of tagged instances
	)
	for i := range items {
		item := &items[i]
		switch prop(item.GetProperty("type")) {
		case "instance":
			hit, ok := instanceHit(item)
			if !ok || !matches(sel, hit.vm.Tags) {
				continue
			}
			instances[hit.bootVolume] = true
			switch {
			case hit.placeKnown && !p.inScopeIDs(hit.vpc, hit.group):
				// Not in the configured VPC or resource group.
			case hit.placeKnown && hit.statusKnown && hit.teeKnown && hit.vm.State.Alive():
				out = append(out, hit.vm)
			default:
				confirm = append(confirm, hit)
			}
		case "volume":
			if id := volumeIDOfCRN(str(item.CRN)); id != "" {
				volumes = append(volumes, id)
			}
		}
	}
	var untagged []string
	for _, id := range volumes {
		if !instances[id] {
			untagged = append(untagged, id)
		}
	}

	confirmed, err := readAll(ctx, len(confirm), func(ctx context.Context, i int) (provider.VM, bool, error) {
		in, found, err := p.readInstance(ctx, confirm[i].vm.ID)
		if err != nil || !found || !p.inScope(in) {
			return provider.VM{}, false, err
		}
		return vmOf(in, confirm[i].vm.Tags), true, nil
	})
	if err != nil {
		return nil, err
	}
	out = append(out, confirmed...)

	var legacy []readVM
	if sel.Node != "" && len(untagged) > bulkAbove {
		legacy, err = p.listBig(ctx, sel, untagged)
	} else {
		legacy, err = p.readVMs(ctx, sel, untagged)
	}
	if err != nil {
		return nil, err
	}
	seen := make(map[string]bool, len(out))
	for _, vm := range out {
		seen[vm.ID] = true
	}
	for _, r := range legacy {
		if seen[r.vm.ID] {
			continue
		}
		seen[r.vm.ID] = true
		out = append(out, r.vm)
		if sel.Node != "" && r.crn != "" && !r.vm.State.Gone() {
			if userTags, err := encodeUserTags(r.vm.Tags); err == nil {
				p.tagOrLog(ctx, r.crn, userTags)
			}
		}
	}
	return out, nil
}

// instanceHit reads an instance's hit; false when it names no instance.
func instanceHit(item *globalsearchv2.ResultItem) (indexedVM, bool) {
	id := instanceIDOfCRN(str(item.CRN))
	if id == "" {
		return indexedVM{}, false
	}
	doc := item.GetProperty("doc")
	status := prop(doc, "status")
	vm := provider.VM{
		ID:           id,
		Name:         prop(item.GetProperty("name")),
		State:        stateOf(status),
		Tags:         decodeUserTags(stringList(item.GetProperty("tags"))),
		InstanceType: prop(doc, "profile", "name"),
		Image:        prop(doc, "image", "id"),
		Zone:         prop(doc, "zone", "name"),
	}
	mode := prop(doc, "confidential_compute_mode")
	vm.TEE = teeOfMode(mode)
	if t, err := time.Parse(time.RFC3339, prop(doc, "created_at")); err == nil {
		vm.CreatedAt = t.UTC()
	}
	for _, path := range [][]string{{"primary_network_attachment", "primary_ip", "address"}, {"primary_network_interface", "primary_ip", "address"}} {
		if ip := prop(doc, path...); ip != "" && ip != "0.0.0.0" {
			vm.IPs = []string{ip}
			break
		}
	}
	vpc, group := prop(doc, "vpc", "id"), prop(doc, "resource_group", "id")
	return indexedVM{
		vm: vm, bootVolume: prop(doc, "boot_volume_attachment", "volume", "id"),
		vpc: vpc, group: group, placeKnown: vpc != "" && group != "", statusKnown: status != "", teeKnown: mode != "",
	}, true
}

// instanceIDOfCRN is the resource id at the end of a VPC instance CRN
// (crn:v1:...:is:<zone>:a/<account>::instance:<id>), "" for any other.
func instanceIDOfCRN(crn string) string {
	parts := strings.Split(crn, ":")
	if len(parts) != 10 || parts[0] != "crn" || parts[4] != "is" || parts[8] != "instance" {
		return ""
	}
	return parts[9]
}

// prop is the string at path inside v (nested maps of a search hit's
// properties); "" when there is none.
func prop(v any, path ...string) string {
	for _, k := range path {
		m, ok := v.(map[string]any)
		if !ok {
			return ""
		}
		v = m[k]
	}
	s, _ := v.(string)
	return s
}

// stringList reads a hit's list of strings (its tags).
func stringList(v any) []string {
	list, _ := v.([]any)
	out := make([]string, 0, len(list))
	for _, x := range list {
		if s, ok := x.(string); ok {
			out = append(out, s)
		}
	}
	return out
}
