package armfake

import (
	"encoding/json"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/test/mocks/cloud"
)

// searchIndex is what the fake Resource Graph answers from: the resource
// group's VMs and NICs as Resource Graph documents. With no lag it is the
// core as it is now. With a lag it is the core as it was lag ago: the fake
// observes the core at the start and the end of every request it serves and
// keeps each document's versions with the time it saw them, so a VM created
// less than lag ago is absent and one deleted less than lag ago is still
// there, with its old state. Creation is stamped with the VM's own creation
// time; any other change with the time of the request that first saw it, so
// a test that changes the core directly (not through the fake's routes, the
// control routes included) and then moves the clock makes the index lag a
// little more than lag. Everything runs on the fake's clock; nothing sleeps.
type searchIndex struct {
	lag time.Duration
	now func() time.Time

	mu      sync.Mutex
	history map[string][]docVersion // by lower-case resource id
}

type docVersion struct {
	at  time.Time
	doc map[string]any // nil: absent from this time on
	raw string         // doc's JSON, to see changes
}

// doc is one document with the time it came to exist.
type doc struct {
	body    map[string]any
	created time.Time
}

// observe records the documents as they are now.
func (x *searchIndex) observe(current []doc) {
	now := x.now()
	x.mu.Lock()
	defer x.mu.Unlock()
	seen := make(map[string]bool, len(current))
	for _, d := range current {
		id := strings.ToLower(d.body["id"].(string))
		seen[id] = true
		raw, _ := json.Marshal(d.body)
		vs := x.history[id]
		if n := len(vs); n > 0 && vs[n-1].raw == string(raw) {
			continue
		}
		at := now
		if len(vs) == 0 && !d.created.IsZero() && d.created.Before(now) {
			at = d.created
		}
		x.history[id] = append(vs, docVersion{at: at, doc: d.body, raw: string(raw)})
	}
	for id, vs := range x.history {
		if !seen[id] && vs[len(vs)-1].doc != nil {
			x.history[id] = append(vs, docVersion{at: now})
		}
	}
	x.prune(now.Add(-x.lag))
}

// prune drops the versions no snapshot can reach any more: those older than
// the last one at or before horizon.
func (x *searchIndex) prune(horizon time.Time) {
	for id, vs := range x.history {
		keep := 0
		for i, v := range vs {
			if !v.at.After(horizon) {
				keep = i
			}
		}
		vs = vs[keep:]
		if len(vs) == 1 && vs[0].doc == nil {
			delete(x.history, id)
			continue
		}
		x.history[id] = vs
	}
}

// snapshot is the documents as they were lag ago, in id order.
func (x *searchIndex) snapshot() []map[string]any {
	asOf := x.now().Add(-x.lag)
	x.mu.Lock()
	defer x.mu.Unlock()
	ids := make([]string, 0, len(x.history))
	for id := range x.history {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	var out []map[string]any
	for _, id := range ids {
		var cur map[string]any
		for _, v := range x.history[id] {
			if v.at.After(asOf) {
				break
			}
			cur = v.doc
		}
		if cur != nil {
			out = append(out, cur)
		}
	}
	return out
}

// documents renders the resource group's VMs and NICs as Resource Graph
// shows them, in id order: what the index holds with no lag.
func (s *server) documents() []doc { return s.documentsWhere(nil, nil) }

// documentsWhere is documents of the resources that hold every term's tag
// and whose tags pass keep (nil: all). The tags a document shows are its
// resource's, so filtering first leaves out exactly what the query's
// filter on tags would; the core's tag index finds the candidates, so a
// query by node costs that node's VMs, not the group's.
func (s *server) documentsWhere(terms []cloud.TagTerm, keep func(tags map[string]string) bool) []doc {
	var out []doc
	token := ""
	s.docs.Turn()
	for {
		page, next, err := s.cloud.ListTagged(terms, nil, token, 0)
		if err != nil {
			break
		}
		for _, in := range page {
			if in.State == provider.StateTerminated || (keep != nil && !keep(in.Tags)) {
				continue
			}
			out = append(out, doc{body: s.graphVM(in), created: in.CreatedAt})
		}
		if next == "" {
			break
		}
		token = next
	}
	for _, res := range s.cloud.ResourcesTagged(nicType, terms) {
		if keep != nil && !keep(res.Tags) {
			continue
		}
		out = append(out, doc{body: s.document(s.renderNIC(res), nicType)})
	}
	keys := make(map[string]string, len(out)) // lower-case ids, once each
	for _, d := range out {
		id := d.body["id"].(string)
		keys[id] = strings.ToLower(id)
	}
	slices.SortFunc(out, func(a, b doc) int {
		return strings.Compare(keys[a.body["id"].(string)], keys[b.body["id"].(string)])
	})
	return out
}

// graphVM is a VM as Resource Graph shows it: ARM's model, and under
// properties.extended.instanceView the power state, as Resource Graph adds
// it for virtual machines (none for a failed VM, as in the instance view).
func (s *server) graphVM(in cloud.Instance) map[string]any {
	// The cached document is shared: change copies of the levels written.
	d := maps.Clone(s.document(s.renderVM(in, s.metaOf(in.ID), "", false), vmType))
	// Resource Graph keeps the id as the group was created, whatever case
	// the compute API echoes (fidelity.go, WithEchoedCase).
	d["id"] = s.armID(vmType, in.Name)
	_, power := armStates(in)
	if power != "" {
		props, _ := d["properties"].(map[string]any)
		props = maps.Clone(props)
		if props == nil {
			props = map[string]any{}
		}
		d["properties"] = props
		props["extended"] = map[string]any{"instanceView": map[string]any{"powerState": map[string]any{
			"code": "PowerState/" + power, "level": "Info", "displayStatus": "VM " + power,
		}}}
	}
	return d
}

// document turns an ARM model into a Resource Graph document (toDocument).
// The document is shared, from the server's cache while the model's JSON
// is unchanged: callers copy what they change.
func (s *server) document(model any, typ string) map[string]any {
	raw, _ := json.Marshal(model)
	return s.docs.Get(typ+"\x00"+string(raw), func() map[string]any {
		return toDocument(raw, typ, s.opts.resourceGroup)
	})
}

// toDocument turns an ARM model's JSON into a Resource Graph document: a
// generic object, the type in lower case, and the resource group and
// subscription as columns of their own.
func toDocument(raw []byte, typ, group string) map[string]any {
	var d map[string]any
	_ = json.Unmarshal(raw, &d)
	d["type"] = strings.ToLower(typ)
	d["resourceGroup"] = strings.ToLower(group)
	if id, ok := d["id"].(string); ok {
		if rid, ok := parseResourceID(id); ok {
			d["subscriptionId"] = rid.sub
		}
	}
	return d
}
