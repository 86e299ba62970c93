package cluster

import (
	"time"

	"github.com/caa-project/caa/pkg/provider"
)

// NodePresence is what the Node cache knows of one node name: whether a
// Node of that name exists now, and the last time one was seen existing
// (an add, update or delete event; zero when never seen).
type NodePresence interface {
	Presence(name string) (present bool, lastSeen time.Time)
}

// Departed remembers, across listings, the VMs whose node was absent, and
// decides which of them may go: a VM is ready once it has been seen with
// its node absent in two listings at least Grace apart, and its node was
// not seen existing in between (a Node deleted and re-created under the
// same name, then deleted again, starts the wait afresh). It keeps no
// state but that map, so a new leader starts with an empty one and waits a
// whole grace before its first delete. Not safe for concurrent use.
type Departed struct {
	Cluster string
	Grace   time.Duration
	first   map[string]time.Time // by VM id: the listing that first showed its node absent
}

// Candidate is a VM of a departed node, with the listing times behind it.
type Candidate struct {
	VM         provider.VM
	Node       string
	FirstSeen  time.Time
	SecondSeen time.Time
}

// Observe takes one listing, started at at, and returns the VMs now ready
// to delete. Only VMs tagged for this cluster, with caa as manager and a
// node, in a state that still needs a delete (alive or dead), are ever
// candidates; a VM already going (Stopping) or gone is left alone, which
// also keeps a new leader from deleting again what the old one deleted.
func (d *Departed) Observe(at time.Time, vms []provider.VM, nodes NodePresence) []Candidate {
	if d.first == nil {
		d.first = map[string]time.Time{}
	}
	var ready []Candidate
	listed := make(map[string]bool, len(vms))
	for _, vm := range vms {
		o := vm.Owner()
		if !o.Managed || o.Cluster != d.Cluster || o.Cluster == "" || o.Node == "" ||
			!(vm.State.Alive() || vm.State.Dead()) {
			continue
		}
		present, last := nodes.Presence(o.Node)
		if present {
			continue
		}
		listed[vm.ID] = true
		first, ok := d.first[vm.ID]
		if !ok || !last.Before(first) {
			// First seen absent now, or the node existed since: start over.
			d.first[vm.ID] = at
			continue
		}
		if at.Sub(first) >= d.Grace {
			ready = append(ready, Candidate{VM: vm, Node: o.Node, FirstSeen: first, SecondSeen: at})
		}
	}
	for id := range d.first {
		if !listed[id] {
			delete(d.first, id)
		}
	}
	return ready
}

// Forget drops what is known of a VM (deleted, or its node found).
func (d *Departed) Forget(id string) { delete(d.first, id) }

// Waiting is how many VMs of absent nodes are waiting out the grace.
func (d *Departed) Waiting() int { return len(d.first) }
