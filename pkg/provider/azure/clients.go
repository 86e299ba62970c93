package azure

import (
	"context"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/runtime"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/compute/armcompute/v8"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/network/armnetwork/v9"
)

// vmAPI is the part of the compute SDK the provider uses;
// *armcompute.VirtualMachinesClient implements it.
type vmAPI interface {
	BeginCreateOrUpdate(ctx context.Context, group, name string, vm armcompute.VirtualMachine,
		opts *armcompute.VirtualMachinesClientBeginCreateOrUpdateOptions) (*runtime.Poller[armcompute.VirtualMachinesClientCreateOrUpdateResponse], error)
	BeginDelete(ctx context.Context, group, name string,
		opts *armcompute.VirtualMachinesClientBeginDeleteOptions) (*runtime.Poller[armcompute.VirtualMachinesClientDeleteResponse], error)
	Get(ctx context.Context, group, name string, opts *armcompute.VirtualMachinesClientGetOptions) (armcompute.VirtualMachinesClientGetResponse, error)
	NewListPager(group string, opts *armcompute.VirtualMachinesClientListOptions) *runtime.Pager[armcompute.VirtualMachinesClientListResponse]
}

// nicAPI is the part of the network SDK the provider uses;
// *armnetwork.InterfacesClient implements it.
type nicAPI interface {
	BeginCreateOrUpdate(ctx context.Context, group, name string, nic armnetwork.Interface,
		opts *armnetwork.InterfacesClientBeginCreateOrUpdateOptions) (*runtime.Poller[armnetwork.InterfacesClientCreateOrUpdateResponse], error)
	BeginDelete(ctx context.Context, group, name string,
		opts *armnetwork.InterfacesClientBeginDeleteOptions) (*runtime.Poller[armnetwork.InterfacesClientDeleteResponse], error)
	Get(ctx context.Context, group, name string, opts *armnetwork.InterfacesClientGetOptions) (armnetwork.InterfacesClientGetResponse, error)
}

var (
	_ vmAPI  = (*armcompute.VirtualMachinesClient)(nil)
	_ nicAPI = (*armnetwork.InterfacesClient)(nil)
)
