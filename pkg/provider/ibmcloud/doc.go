// Package ibmcloud is caa's provider for IBM Cloud VPC virtual server
// instances, built on the official VPC Go SDK (vpcv1) and IBM's Go SDK
// core, narrowed to the calls it makes (vpcAPI), with the SDK's own pagers
// (NewInstancesPager, NewVolumesPager) for its two listings, and on IBM's
// Global Search and Global Tagging (platform-services-go-sdk,
// globalsearchv2 and globaltaggingv1) to tag VMs and find them by tag.
//
// Where the tags live. Every tag of the VM (spec.Tags() over the
// configured extra tags) is written twice: as user tags of its boot
// volume, in the same POST /instances that makes the instance (VPC takes
// no tags for the instance itself), and as user tags of the instance,
// attached right after through IBM's Global Tagging service (POST
// /v3/tags/attach, globaltaggingv1; tagging.go). User tags are short and
// of a small alphabet, so keys and values are escaped and long ones cut
// into numbered pieces (see tags.go); every tag round-trips exactly,
// TagPod's '/' included. The volume's copy closes the window the attach
// leaves: a create cut off before it, or an attach the tagging service
// refuses (it may not know a new instance yet), still leaves a VM its
// tags name, which the node's next List finds by the volume and tags.
// Create does not fail for a failed attach: its caller needs the id.
//
// Names. The instance name is "caa-" + up to 15 characters of the
// idempotency key (for people matching a VM to its ledger record) + 80 bits
// of SHA-256 over (cluster, key): a function of (cluster, key) alone, within
// VPC's rule (63 of [a-z0-9-], letter first) and 40 characters, as the
// guest's hostname derives from it. VPC refuses a second live
// instance of the same name in the region (validation_unique_failed), which
// is the idempotency mechanism: Create first looks the name up
// (GET /instances?name=, exact match) and adopts what it finds after
// checking the boot volume's tags carry the same key and cluster and the
// shape matches; otherwise it creates, and a create refused for the name
// looks again and adopts the winner of the race. The lookup first makes a
// retry after a crash cost one call instead of a refused create and a
// lookup; it cannot replace the uniqueness check, which is what closes the
// race. While a new instance is not yet visible to the lookup, a second
// create is refused for its name and surfaces as ErrConflict.
//
// List asks Global Search (Config.SearchEndpoint, the public endpoint by
// default) for the VPC resources carrying caa's managed-by tag and the
// (first piece of the) encoded cluster and node tags, each a quoted phrase
// of the escaped alphabet, so no node name can change the query: the
// node's instances and their boot volumes. It asks, per hit, for the CRN,
// type and tags and, of an instance, the parts of its VPC document List
// needs (status, creation time, shape, zone, VPC, resource group, boot
// volume, address), in pages of 1,000, and follows search_cursor until a
// page holds fewer hits than that (the service hands a live cursor back
// on every page, the last one included, so waiting for an empty page
// would cost every listing a second search). An alive instance in the
// configured VPC and resource group is listed as the index shows it: an
// idle node's audit costs one search, whatever else the account holds.
// ListCluster (index.go) is the same search without the node's tag: the
// cluster caa's one listing of every node's VMs.
//
// The search index lags VPC by seconds to minutes, so it decides nothing
// alone (invariant I3): an instance it shows in another state (stopped,
// failed, deleting) or cannot place is read from VPC by id and listed as
// VPC shows it, or not at all on VPC's 404; a VM it does not show yet is
// missing from the listing, which the reconciler confirms by a Get before
// it acts; a boot volume whose instance it does not show as tagged is
// read as before (volume, then instance: two reads), and above 50 of
// those VPC's instance and volume listings replace the reads when they
// cost fewer calls (bulk.go). Create's lookup by name goes to VPC (GET
// /instances?name=), never to the index, so a VM the index does not show
// is still found by its key. Get reads the instance and then its boot
// volume. Neither retries a NotFound: eventual consistency is the
// caller's to see.
//
// Delete deletes the instance; the boot volume (delete_volume_on_instance_delete)
// and the virtual network interface of its network attachment (auto_delete)
// go with it, so nothing Create made is left. A 404 is success.
//
// Deadlines. Every call runs under its own deadline, its retries and the
// IAM token exchange included: Config.ReadTimeout (30s by default) for a
// GET or one page of a listing, Config.WriteTimeout (2m) for a create or a
// delete. A call past it fails with context.DeadlineExceeded, transient.
//
// Retries. The SDK's retrying client stays off, because it retries 429 too.
// The provider retries only transient failures itself: 5xx (but 501) and
// requests that got no answer, three attempts in all with jittered
// exponential backoff from 100ms, honouring ctx. Creates are safe to retry
// because the name is unique. Throttling (429) is never retried: it returns
// at once as ErrThrottled carrying the Retry-After header, so the
// reconciler's token bucket and backoff decide. Errors are *provider.Error
// with the VPC error code and message ({"errors":[{"code",...}]}), or IAM's
// errorCode for token failures, the HTTP status and the SDK error; the code
// table is in errors.go.
//
// Credentials. With IBMCLOUD_AUTH_TYPE set, the IBM SDK's own settings
// under the IBMCLOUD_ prefix decide (core.GetAuthenticatorFromEnvironment):
// IBMCLOUD_AUTH_TYPE=container with IBMCLOUD_IAM_PROFILE_ID or
// IBMCLOUD_IAM_PROFILE_NAME and IBMCLOUD_CR_TOKEN_FILENAME is a trusted
// profile with a compute-resource token, the route for IKS and ROKS: the
// SDK's ContainerAuthenticator reads the projected ServiceAccount token
// from the file for every new access token (so the kubelet's rotation
// needs no restart) and exchanges it at IAM (grant type cr-token). An API
// key set beside it is refused as ambiguous. Otherwise, in order: the API
// key file (--ibmcloud-api-key-file), the IBMCLOUD_API_KEY variable (both
// exchanged for tokens by the SDK's IamAuthenticator), then the SDK's
// external configuration for service "vpc" (VPC_AUTH_TYPE, VPC_APIKEY,
// VPC_AUTH_URL, an ibm-credentials.env file). --ibmcloud-iam-endpoint,
// when set, is the token service of the API key and trusted-profile
// routes. The same authenticator signs the Global Search and Global
// Tagging calls: IAM tokens are account-wide, search shows only what the
// caller may view, and attaching a user tag takes the Editor role on the
// resource, which caa holds on its instances already.
// Config.AccountID, when set, is passed as account_id. Keys and tokens are
// held by the SDK's authenticator only and never logged or put in an
// error.
//
// Permissions. deploy/overlays/ibmcloud/access-policies.json is the exact
// set of IAM access policies: Editor on instances, volumes and virtual
// network interfaces in the resource group, Operator on the subnet, VPC
// and security groups, Viewer on the image and on the resource group. A
// 403 from VPC is ErrAuth, and its message says where that file is.
// Preflight (preflight.go) reads what the configuration names at start, so
// a missing read grant or a wrong id is named before any pod is touched;
// Global Tagging, where the instances' tags go, is read too (one user tag).
//
// User data is sent as the instance's user_data
// and never logged or put in an error; since the SDK core dumps request
// bodies at debug level, New refuses to run with the SDK logger at debug.
// VPC takes user data as text, so bytes that are not UTF-8 are refused as
// ErrInvalidSpec rather than silently mangled by JSON encoding.
//
// What VM.Tags can hold: everything Create wrote, once the boot volume is
// readable. An instance whose boot volume is gone (it is being deleted)
// shows without tags from Get and is not listed.
package ibmcloud
