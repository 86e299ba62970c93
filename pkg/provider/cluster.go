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

// AdaptorLister is implemented by a provider that can find the VMs
// upstream's cloud-api-adaptor made: those named podvm-… (see
// pkg/adaptorvm), in the account, region or resource group caa is
// configured with, whatever their node. The adaptor tags them with no
// cluster, node or pod, so the listing is by name alone: it proves
// nothing about whose a VM is.
type AdaptorLister interface {
	// ListAdaptorVMs returns every VM whose name starts with "podvm-" and
	// that carries none of caa's identity tags, in every state the cloud
	// still shows but terminated, following pagination to the end.
	ListAdaptorVMs(ctx context.Context) ([]VM, error)
}
