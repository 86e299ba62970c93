package provider

import "context"

// ClusterLister is implemented by a provider that can list, in one paged
// and server-side filtered listing, every VM caa made for a cluster,
// whatever its node: the cluster caa's view (see pkg/cluster). The node's
// caa never calls it; its audits stay O(VMs of the node).
type ClusterLister interface {
	// ListCluster returns every VM whose tags name cluster and caa as
	// manager, in every state the cloud still shows, following pagination
	// to the end. An empty cluster is an error, never "every VM". A
	// listing is a snapshot that may lag the cloud: it proves nothing by
	// itself about a VM it does not show.
	ListCluster(ctx context.Context, cluster string) ([]VM, error)
}
