package azure

import (
	"context"
	"time"

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
	NewListPager(group string, opts *armnetwork.InterfacesClientListOptions) *runtime.Pager[armnetwork.InterfacesClientListResponse]
}

var (
	_ vmAPI  = (*armcompute.VirtualMachinesClient)(nil)
	_ nicAPI = (*armnetwork.InterfacesClient)(nil)
)

// pollUntilDone polls a long-running operation until it is terminal, once
// at once and then every interval. It is the SDK's PollUntilDone without
// its one-second floor, so tests against the fake need not wait; the
// caller's context bounds it. Errors are the polls' own; the operation's
// outcome comes from the poller's Result.
func pollUntilDone[T any](ctx context.Context, p *runtime.Poller[T], every time.Duration) error {
	for !p.Done() {
		if _, err := p.Poll(ctx); err != nil {
			return err
		}
		if p.Done() {
			return nil
		}
		t := time.NewTimer(every)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
	return nil
}
