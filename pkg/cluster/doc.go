// Package cluster is caa's cluster scope: what no node's caa can see. One
// leader among the replicas of `caa cluster` lists every VM of the cluster
// once per interval, deletes the VMs of nodes that left the cluster (seen
// absent twice, a grace apart, and confirmed by a direct read of the Node),
// and publishes on each Node what the cloud showed for it, so that the
// node's caa can audit against it instead of listing the cloud itself.
//
// Who may delete what (invariant I10): a VM of a node that exists is only
// ever deleted by that node's caa; this package deletes only VMs whose node
// is absent from the apiserver, and never acts on an unsynced Node cache, an
// apiserver it cannot read, or a Lease it no longer holds.
//
// Run is `caa cluster` itself (run.go): its settings (Options, AddFlags),
// the Lease, the Node cache and the health endpoints around the sweeper.
package cluster
