// Package azure is caa's provider for Azure: peer-pod VMs in one resource
// group, through the official SDK (armcompute for VirtualMachines,
// armnetwork for their NICs, Resource Graph for List on azcore's ARM
// pipeline with armresourcegraph's request model). The SDK is narrowed to
// the few calls used (vmAPI, nicAPI, queryGraph).
//
// Idempotency. A VM's name is derived from spec.Key (see vmName): "caa-",
// the key's readable part, and 12 hex digits of its SHA-256. ARM names are
// unique in a resource group, so the name is the idempotency key. Create
// GETs that name first and returns the VM it finds (refusing with
// ErrConflict one that carries another key or shape); otherwise it PUTs the
// NIC "<vm>-nic" (an idempotent PUT) and then the VM with If-None-Match: *,
// so that two racing creates make one VM and the loser gets ErrConflict
// (its retry then finds the VM). A VM found by key is returned as it is,
// Failed included, for the reconciler to judge; its size and image compare
// with the spec's without regard to case, as Azure defines them (it may
// echo another case). When ARM refuses the VM for good (invalid
// spec, quota, capacity), Create removes the NIC, and the VM too if Azure
// kept it in the Failed state.
//
// Tags and List. Every VM and NIC carries spec.Tags() over the configured
// extra tags; the caa-* identity tags win. ARM's VM listing has no tag
// filter, so List asks Azure Resource Graph instead (armresourcegraph, the
// query API 2024-04-01): one query, paged with its $skipToken (1,000 rows a
// page), scoped to the subscription and filtered on the server by the
// resource group and the managed-by, cluster and node tags. It projects
// only what caa reads: id, name, location and zones, tags, provisioning
// state, the power state Resource Graph keeps from the instance view
// (properties.extended.instanceView.powerState.code), creation time, size
// and image, and, for the NICs the query brings along (they carry the same
// tags), their private IP. A listing so costs one call per 1,000 rows of
// this node, whatever the rest of the group holds (see graph.go).
//
// The query is a constant template (nodeQuery); every value in it is a KQL
// string literal made by kqlString (backslash, both quotes and line breaks
// escaped; other control characters refused with ErrInvalidSpec before any
// call), so a node or cluster name cannot change the query.
//
// ListCluster (cluster.go), the cluster caa's listing of every node's
// VMs, groups on the server instead: a count, then one summarize by node
// tag per part of the nodes (split by a hash of the tag), a row a node,
// since Resource Graph answers a summarize with its first page only.
//
// The search index lags. Resource Graph trails ARM by seconds to minutes:
// a new VM may be missing, a deleted one still present, a state stale.
// Nothing the provider writes is decided on it: Create finds its VM by name
// with a direct GET, Get and Delete never look at the index, and the
// reconciler confirms a VM missing from a listing with Get before anything
// is recreated. The other direction is List's own: a VM the index shows
// stopped, deallocated or failed is read directly (Get, with the instance
// view) before List reports it, so a replacement is never decided on a
// stale dead state; one that read does not find is left out. Dead VMs are
// rare, so this costs a read now and then. A VM the index still shows
// running after it was deleted or killed is reported running until the
// index catches up: the reconciler keeps it, which writes nothing, and
// replaces it an audit later.
//
// Resource Graph's quota. Resource Graph limits queries per user (15 in 5
// seconds, shared by every process of one identity) and says what is left
// on every answer (x-ms-user-quota-remaining, x-ms-user-quota-resets-after
// as hh:mm:ss). Once an answer said 0, List sends no query before the
// reset: it returns ErrThrottled with the time left as RetryAfter at once,
// without waiting inside ctx, so the reconciler's backoff decides as for
// every other throttled call. A 429 is ErrThrottled with its Retry-After.
// The caller needs Microsoft.ResourceGraph/resources/read besides its VM
// and NIC permissions; Resource Graph shows it only what it may read.
//
// State. Get reads the instance view ($expand=instanceView) and maps the
// provisioning state and PowerState (see stateOf): a VM stopped or
// deallocated behind caa's back reads as Stopped, and a VM whose
// provisioning failed and that is not running as Failed; both stay in the
// group, and so in List, until they are deleted. The provisioning state is
// the last control-plane operation's outcome, not the VM's: a VM whose
// extension failed (one Azure Policy pushes, say) is Failed and running,
// and its guest serves. That VM reads as Running with VM.Degraded set
// (the failure's code when the instance view has it): the reconciler keeps
// and reports it, never replaces it (a replacement would get the same
// extension).
//
// Leftover NICs. A NIC outlives its VM when ARM refused the VM's create:
// Create deletes the NIC then, but Azure keeps a NIC reserved for the VM
// that failed for about 180 s and refuses its delete meanwhile (400
// NicReservedForAnotherVm). The listing brings the node's NICs along; a
// NIC tagged for the node, attached to no VM and whose VM is not in the
// listing is a leftover (Leftovers, provider.LeftoverFinder). The
// reconciler collects leftovers as it collects orphan VMs (seen in two
// listings a grace period apart), through Delete, which takes a NIC's id
// too; a delete refused for the reservation is tried again at a later
// pass, and Azure refuses the delete of a NIC a VM uses (NicInUse).
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
// listing, Config.WriteTimeout (4m) for a PUT or DELETE with the wait for
// its operation. A call past it fails with context.DeadlineExceeded,
// transient; a create cut short finds its VM by name on the next try. The
// exception is a VM create that ARM accepted and is still provisioning at
// the write timeout: Create returns the VM as Pending, without an error,
// and Get and List follow it from there (a real create takes minutes).
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
// DefaultAzureCredential: environment (a client secret), workload identity,
// managed identity, Azure CLI, ...), or a credential passed with
// WithCredential. On AKS, workload identity: the webhook sets
// AZURE_CLIENT_ID, AZURE_TENANT_ID, AZURE_FEDERATED_TOKEN_FILE and
// AZURE_AUTHORITY_HOST; Config.AuthorityHost takes the last as its default
// and hands it to the credential (azidentity itself reads it only when the
// cloud names no authority, and caa always names one), and
// Config.DisableInstanceDiscovery turns off MSAL's instance discovery for
// an authority Entra ID's public discovery does not know. azidentity
// renews access tokens before they expire and rereads the token file every
// 10 minutes, so neither rotation needs a restart. Tokens are never
// logged, stored or put in an error; the SDK's logging policy redacts the
// Authorization header, and request bodies (which hold the user data,
// base64 in properties.userData, which the pod VM reads from IMDS) are
// never logged.
//
// Permissions and preflight. The actions caa uses are GroupActions (on
// the resource group), SubnetActions and SecurityGroupActions; RoleFile
// (deploy/overlays/azure/role.json) is the custom role that grants exactly
// them. Preflight reads the resource group and the subnet, and the
// caller's permissions at each scope (Microsoft.Authorization/permissions,
// through the bare ARM pipeline: no SDK module of caa's covers it), and
// fails naming every missing action (provider.ErrAuth) or the setting of a
// group or subnet that does not exist (provider.ErrInvalidSpec). A call
// refused later is ARM's AuthorizationFailed or LinkedAuthorizationFailed,
// ErrAuth, whose message names the action and the scope and points at
// RoleFile.
package azure
