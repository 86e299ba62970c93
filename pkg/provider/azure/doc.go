// Package azure is caa's provider for Azure: peer-pod VMs in one resource
// group, through the official SDK (armcompute for VirtualMachines,
// armnetwork for their NICs). The SDK is narrowed to the few calls used
// (vmAPI, nicAPI).
//
// Idempotency. A VM's name is derived from spec.Key (see vmName): "caa-",
// the key's readable part, and 12 hex digits of its SHA-256. ARM names are
// unique in a resource group, so the name is the idempotency key. Create
// GETs that name first and returns the VM it finds (refusing with
// ErrConflict one that carries another key or shape); otherwise it PUTs the
// NIC "<vm>-nic" (an idempotent PUT) and then the VM with If-None-Match: *,
// so that two racing creates make one VM and the loser gets ErrConflict
// (its retry then finds the VM). A VM found by key is returned as it is,
// Failed included, for the reconciler to replace. When ARM refuses the VM for good (invalid
// spec, quota, capacity), Create removes the NIC, and the VM too if Azure
// kept it in the Failed state.
//
// Tags. Every VM and NIC carries spec.Tags() over the configured extra
// tags; the caa-* identity tags win. List cannot filter by tag on the
// server: ARM's VM list in a resource group has no tag filter, so List
// pages through every VM of the group and filters on the client. That costs
// one call per page of the group (not of this node), plus one listing of
// the group's NICs for the IPs; give caa a resource group of its own.
//
// State. Get and List both read the instance view ($expand=instanceView,
// which the group listing serves in the same pages, at no extra call) and
// map the provisioning state and PowerState (see stateOf): a VM stopped or
// deallocated behind caa's back lists as Stopped, and a VM whose
// provisioning failed as Failed; both stay in the group, and so in List,
// until they are deleted. The REST reference says the listing's expansion
// needs a $filter; should ARM ever refuse it, List falls back for good to the
// plain listing, where a provisioned VM reads as Running and only Get sees
// the power state.
//
// Long-running operations. Create and Delete wait for their operations
// (Azure-AsyncOperation) with the SDK's Poller.PollUntilDone, which waits
// what ARM asks between polls (Retry-After) and Config.PollInterval when it
// asks nothing (at least a second, the SDK's floor), so a refused
// allocation surfaces as ErrCapacity from Create and Delete returns once
// the VM, its OS disk and its NIC are gone (both carry deleteOption
// Delete). Get never retries a NotFound: a VM just created may be
// invisible for a while, and that is reported as it is. If the read back
// after a successful create is NotFound, Create returns the VM as the
// accepted PUT described it.
//
// Deadlines. Every call runs under its own deadline, the SDK's retries
// included: Config.ReadTimeout (30s by default) for a GET or one page of a
// listing, Config.WriteTimeout (2m) for a PUT or DELETE with the wait for
// its operation. A call past it fails with context.DeadlineExceeded,
// transient; a create cut short finds its VM by name on the next try.
//
// Retries. The SDK retries 408 and 5xx replies and network errors
// Config.MaxRetries times (default 2) with exponential backoff from
// Config.RetryDelay, each try bounded by a minute. It never retries 429:
// throttling surfaces at once as ErrThrottled with the Retry-After the
// cloud sent, for the reconciler's own token bucket and backoff. Automatic
// resource-provider registration is off.
//
// Errors. Every cloud failure is a *provider.Error with ARM's code, message
// and status and the SDK's *azcore.ResponseError underneath; the kind comes
// from the code first, then the status (see codeKinds). A failure to get a
// token is ErrAuth. A VM id from another subscription or resource group is
// refused as ErrInvalidSpec, never as NotFound.
//
// Credentials. Only the SDK's default chain (azidentity's
// DefaultAzureCredential: environment, workload identity, managed
// identity, Azure CLI, ...), or a credential passed with WithCredential.
// Tokens are never logged, stored or put in an error; the SDK's logging
// policy redacts the Authorization header, and request bodies (which hold
// the user data, base64 in customData) are never logged.
package azure
