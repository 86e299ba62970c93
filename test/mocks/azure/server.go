// Package armfake is a fake Azure Resource Manager for one subscription and
// one resource group, on top of the shared fake cloud core: enough of
// Microsoft.Compute/virtualMachines and Microsoft.Network/networkInterfaces,
// with their long-running operations, that the official Go SDK talks to it
// unchanged except for the endpoint URL.
//
// How it maps onto the core: a VM is a core instance whose Name is the VM
// name (ARM names are unique in a resource group, so a PUT of a live name is
// an update, never a second VM); a NIC and an OS disk are core resources, and
// the ones the VM references with deleteOption Delete die with it. Creation
// and deletion finish at once: the operation a PUT or DELETE points to is
// already terminal when first polled, and a new VM boots through its power
// state (PowerState/starting, then running) rather than its provisioning
// state. Only allocation failures are reported asynchronously, through a
// failed operation, as Azure reports them.
//
// States beyond the lifecycle come from the core's controls: a stopped VM
// shows PowerState/stopped, a deallocated one PowerState/deallocated (both
// with provisioning Succeeded), and a failed one provisioning Failed with a
// ProvisioningState/failed/<code> status at level Error; each stays listed
// until it is deleted. The instance view (statuses) is shown by a GET with
// $expand=instanceView and by the group listing with the same expansion.
//
// Azure Resource Graph's query API (POST /providers/Microsoft.ResourceGraph/
// resources, api-version 2024-04-01, graph.go) answers over the same core:
// the group's VMs and NICs as Resource Graph documents, the VMs with the
// power state under properties.extended.instanceView. It parses exactly the
// KQL subset caa sends (kql.go: where on type, resourceGroup and tags with
// ==, =~, !=, !~, in and in~; extend of tostring(properties...); project)
// and refuses anything else as Resource Graph does (400 BadRequest, details
// InvalidQuery and ParserFailure with the line and position). It pages with
// $skipToken (WithGraphPageSize, by default the core's page size), puts the
// per-user quota headers on every answer and, with WithBudget, enforces the
// per-user limit (ClassGraphUser) with a 429. Its index lags the VMs by
// WithSearchLag on the fake's clock (WithClock), 0 by default.
//
// Identity and authorization. WithBearerToken takes one token,
// WithAccessTokens a check (Entra.Check: the short-lived tokens of the fake
// Entra ID in entra.go, which verifies a federated ServiceAccount token as
// workload identity does). WithRole authorizes every call against a custom
// role definition (role.go, the JSON of deploy/overlays/azure/role.json):
// AuthorizationFailed naming the action and scope, LinkedAuthorizationFailed
// for the join actions a NIC or VM write needs on what it references, and
// Resource Graph rows only of the types the role may read; WithRoleScopes
// says where it is assigned. The fake also serves what caa's preflight
// reads (scopes.go): the resource group, subnets (WithSubnets), and
// Microsoft.Authorization/permissions at any scope, from the role.
//
// Every request is counted by the core's Admit: the four provider calls under
// cloud.OpCreate, OpGet, OpList and OpDelete (a Resource Graph query is a
// list), the rest under the Op* constants below. The test controls are
// mounted at cloud.ControlPrefix.
package armfake

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caa-project/caa/test/mocks/cloud"
)

// Defaults for the one subscription, resource group and region the fake
// serves.
const (
	DefaultSubscription  = "6a1b2c3d-0000-4000-8000-00000000c0a0"
	DefaultResourceGroup = "caa-fake-rg"
	DefaultLocation      = "eastus"
)

// Counter names of the calls that are not one of the four provider
// operations.
const (
	OpNICCreate = "nic-create"
	OpNICGet    = "nic-get"
	OpNICDelete = "nic-delete"
	OpNICList   = "nic-list"
	OpOperation = "operation" // polls of a long-running operation
	OpGroupGet  = "group-get"
	OpSubnetGet = "subnet-get"
	// OpPermissions counts reads of Microsoft.Authorization/permissions.
	OpPermissions = "permissions"
	OpUnknown     = "unknown" // requests no route serves
)

// Option configures the fake.
type Option func(*options)

type options struct {
	subscription  string
	resourceGroup string
	location      string
	token         string
	// noListView makes the group listing refuse $expand=instanceView.
	noListView bool
	// slowPolls and slowWait make operations slow (WithSlowOperations).
	slowPolls int
	slowWait  time.Duration
	// budget, when set, meters VM calls (WithBudget).
	budget *cloud.Budget
	// searchLag, now and graphPage shape the Resource Graph index
	// (WithSearchLag, WithClock, WithGraphPageSize).
	searchLag time.Duration
	now       func() time.Time
	graphPage int
	// role, when set, authorizes every call (WithRole).
	role func() *Role
	// roleScopes, when set, are where the role is assigned
	// (WithRoleScopes).
	roleScopes []string
	// tokenCheck, when set, decides which bearer tokens are good
	// (WithAccessTokens).
	tokenCheck func(token string) error
	// plainImages are images that cannot boot a ConfidentialVM
	// (WithPlainImages).
	plainImages map[string]bool
	// signedImages are images whose boot chain is signed (WithSignedImages).
	signedImages map[string]bool
	// subnets, when set, are the subnets that exist (WithSubnets).
	subnets []string
	// Fidelity to the real cloud (fidelity.go): extensions that fail,
	// case echoed otherwise, NIC reservations, creates that take time.
	failingExtension bool
	echoCase         bool
	nicReservation   time.Duration
	createDuration   time.Duration
}

// WithPlainImages names images whose definition does not support
// ConfidentialVM: a confidential VM from one is refused. Every other image
// supports it.
func WithPlainImages(images ...string) Option {
	return func(o *options) {
		o.plainImages = map[string]bool{}
		for _, i := range images {
			o.plainImages[i] = true
		}
	}
}

// WithSubscription sets the subscription id the fake serves.
func WithSubscription(id string) Option { return func(o *options) { o.subscription = id } }

// WithResourceGroup sets the resource group the fake serves.
func WithResourceGroup(name string) Option { return func(o *options) { o.resourceGroup = name } }

// WithLocation sets the region every resource must be created in.
func WithLocation(loc string) Option { return func(o *options) { o.location = loc } }

// WithoutListInstanceView makes the resource group's VM listing refuse
// $expand=instanceView, as the REST reference describes it (the expansion
// "can only be specified if a valid $filter option is specified"). By
// default the fake serves the expansion without a $filter, as current API
// versions do; this option tests a client's answer to a region that does
// not.
func WithoutListInstanceView() Option { return func(o *options) { o.noListView = true } }

// WithSlowOperations makes every long-running operation report InProgress
// for its first polls polls before its outcome, and makes the accepted
// reply and each InProgress poll ask the client to wait (Retry-After-Ms,
// one of the headers ARM uses) before polling again. The resource changes
// at once, as before; only the operation's reports are slow.
func WithSlowOperations(polls int, wait time.Duration) Option {
	return func(o *options) { o.slowPolls, o.slowWait = polls, wait }
}

// WithBearerToken makes the fake accept only this bearer token (by default
// any non-empty one).
func WithBearerToken(token string) Option { return func(o *options) { o.token = token } }

// server is the fake's state beyond the core: what ARM shows of a VM that
// the core does not model, and the long-running operations.
type server struct {
	cloud *cloud.Cloud
	opts  options

	// writes serialises PUTs and DELETEs, whose checks of side resources
	// must not interleave.
	writes sync.Mutex

	// index is the lagging Resource Graph index; nil without a lag.
	index *searchIndex
	// docs are the Resource Graph documents of the last rendering.
	docs cloud.DocCache

	mu    sync.Mutex
	meta  map[string]vmMeta // by core instance id
	ops   map[string]operation
	opSeq int
	// reserved are the NICs held for a VM whose create failed, by key.
	reserved map[string]reservation

	// gen moves with every change the fake's own state may have seen (any
	// request but a read, FailExtension). answers are Resource Graph's
	// encoded answers by request body, and answerRows the rows of each
	// query (all its pages), kept at the stamp they were made at and
	// served again only at the same one: nothing in the core or the fake
	// changed since, and nothing was due to change with the clock. A
	// listing's pages, and a warm restart's listing, ask the same query of
	// an unchanged group; the real service answers from its index on its
	// own hardware, and rendering the whole answer again for every page
	// was time counted against caa. Rows handed out are shared: callers
	// only read them.
	gen        atomic.Uint64
	answers    cloud.Memo[[]byte]
	answerRows cloud.Memo[[]map[string]any]
}

// NewServer returns the fake ARM endpoint over c, with the core's test
// controls mounted at cloud.ControlPrefix.
func NewServer(c *cloud.Cloud, opts ...Option) http.Handler {
	o := options{subscription: DefaultSubscription, resourceGroup: DefaultResourceGroup, location: DefaultLocation}
	for _, opt := range opts {
		opt(&o)
	}
	if o.now == nil {
		o.now = time.Now
	}
	s := &server{cloud: c, opts: o, meta: map[string]vmMeta{}, ops: map[string]operation{}}
	if o.searchLag > 0 {
		s.index = &searchIndex{lag: o.searchLag, now: o.now, history: map[string][]docVersion{}}
	}

	mux := http.NewServeMux()
	const group = "/subscriptions/{sub}/resourceGroups/{rg}/providers/"
	vms := group + "Microsoft.Compute/virtualMachines"
	nics := group + "Microsoft.Network/networkInterfaces"
	mux.Handle("PUT "+vms+"/{name}", s.route(cloud.OpCreate, true, s.putVM))
	mux.Handle("GET "+vms+"/{name}", s.route(cloud.OpGet, false, s.getVM))
	mux.Handle("DELETE "+vms+"/{name}", s.route(cloud.OpDelete, true, s.deleteVM))
	mux.Handle("GET "+vms, s.route(cloud.OpList, false, s.listVMs))
	mux.Handle("PUT "+nics+"/{name}", s.route(OpNICCreate, true, s.putNIC))
	mux.Handle("GET "+nics+"/{name}", s.route(OpNICGet, false, s.getNIC))
	mux.Handle("DELETE "+nics+"/{name}", s.route(OpNICDelete, true, s.deleteNIC))
	mux.Handle("GET "+nics, s.route(OpNICList, false, s.listNICs))
	mux.Handle("GET /subscriptions/{sub}/providers/{ns}/locations/{loc}/operations/{id}", s.route(OpOperation, false, s.getOperation))
	mux.Handle("POST "+GraphPath, s.route(cloud.OpList, false, s.queryResources))
	mux.HandleFunc("POST "+ControlFailExtension, s.controlFailExtension)
	for _, groups := range []string{"resourceGroups", "resourcegroups"} {
		mux.Handle("GET /subscriptions/{sub}/"+groups+"/{rg}", s.route(OpGroupGet, false, s.getGroup))
	}
	// A subnet may live in another group (a shared network): {netrg} is
	// not checked against the group the fake serves.
	mux.Handle("GET /subscriptions/{sub}/resourceGroups/{netrg}/providers/Microsoft.Network/virtualNetworks/{vnet}/subnets/{name}",
		s.route(OpSubnetGet, false, s.getSubnet))
	permissions := s.route(OpPermissions, false, s.listPermissions)
	control := cloud.ControlHandler(c)
	mux.Handle(cloud.ControlPrefix, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		control.ServeHTTP(w, r)
		s.observeIndex()
	}))
	mux.Handle("/", s.route(OpUnknown, false, func(w http.ResponseWriter, r *http.Request) {
		writeError(w, apiError{http.StatusNotFound, "InvalidResourceType",
			fmt.Sprintf("No route serves %s %s in this fake.", r.Method, r.URL.Path), ""})
	}))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The permissions API is an extension of any scope, which a mux
		// pattern cannot end in.
		if scope, ok := permissionsScope(r); ok && r.Method == http.MethodGet {
			if parts := strings.Split(scope, "/"); len(parts) >= 3 {
				r.SetPathValue("sub", parts[2])
			}
			if parts := strings.Split(scope, "/"); len(parts) == 5 {
				r.SetPathValue("rg", parts[4])
			}
			permissions.ServeHTTP(w, r)
			return
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead && !isGraph(r) {
			// A write (or a control) may change what the fake shows: no
			// answer made before it, or while it runs, is served again.
			s.gen.Add(1)
			defer s.gen.Add(1)
		}
		mux.ServeHTTP(w, r)
	})
}

var apiVersionRE = regexp.MustCompile(`^\d{4}-\d{2}-\d{2}(-preview)?$`)

// route admits a request through the core, then applies what ARM checks
// before any resource provider sees it: the injected fault, the bearer
// token, the subscription and resource group, and the api-version.
func (s *server) route(op string, write bool, h http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// A lagging search index sees the core before and after every
		// request, so that changes are stamped with the time they happened.
		s.observeIndex()
		defer s.observeIndex()
		// Read the body first: until it is read, the server does not
		// notice a client that gave up, and the injected latency would
		// hold the handler (and a test's server Close) for its full length.
		if r.Body != nil && r.ContentLength != 0 {
			body, err := io.ReadAll(io.LimitReader(r.Body, 4<<20))
			if err != nil {
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
		}
		fault, err := s.cloud.Admit(r.Context(), op, write)
		if err != nil {
			return // the client went away during the injected latency
		}
		if isGraph(r) {
			// Resource Graph's quota headers go on every answer of its
			// query API, refusals included; metered updates them.
			s.quotaHeaders(w, r)
		}
		if e, ok := s.authenticate(r); !ok {
			writeError(w, e)
			return
		}
		switch fault.Kind {
		case cloud.FaultThrottle:
			if fault.RetryAfter > 0 {
				secs := int((fault.RetryAfter + time.Second - 1) / time.Second)
				w.Header().Set("Retry-After", strconv.Itoa(secs))
			}
			writeError(w, apiError{http.StatusTooManyRequests, "TooManyRequests",
				"The request is being throttled as the limit has been reached for this operation type.", ""})
			return
		case cloud.FaultServerError:
			writeError(w, apiError{http.StatusInternalServerError, "InternalServerError",
				"An internal execution error occurred. Please retry later.", ""})
			return
		case cloud.FaultAuth:
			writeError(w, apiError{http.StatusForbidden, "AuthorizationFailed",
				fmt.Sprintf("The client does not have authorization to perform action '%s' over scope '%s' or the scope is invalid.",
					action(r), r.URL.Path), ""})
			return
		}
		if op == OpUnknown {
			h(w, r)
			return
		}
		// RBAC comes before the resource provider sees the request, so a
		// caller without the action learns nothing of the resource.
		if act, scope, skip := requestAction(r); !skip {
			if e := s.authorize(act, scope); e != nil {
				writeError(w, *e)
				return
			}
		}
		if !s.metered(w, r, op) {
			return
		}
		if sub := r.PathValue("sub"); !isGraph(r) && !strings.EqualFold(sub, s.opts.subscription) {
			writeError(w, apiError{http.StatusNotFound, "SubscriptionNotFound",
				fmt.Sprintf("The subscription '%s' could not be found.", sub), ""})
			return
		}
		if rg := r.PathValue("rg"); rg != "" && !strings.EqualFold(rg, s.opts.resourceGroup) {
			writeError(w, apiError{http.StatusNotFound, "ResourceGroupNotFound",
				fmt.Sprintf("Resource group '%s' could not be found.", rg), ""})
			return
		}
		switch v := r.URL.Query().Get("api-version"); {
		case v == "":
			writeError(w, apiError{http.StatusBadRequest, "MissingApiVersionParameter",
				"The api-version query parameter (?api-version=) is required for all requests.", ""})
			return
		case !apiVersionRE.MatchString(v):
			writeError(w, apiError{http.StatusBadRequest, "InvalidApiVersionParameter",
				fmt.Sprintf("The api-version '%s' is invalid. The supported versions look like '2024-07-01'.", v), ""})
			return
		}
		h(w, r)
	})
}

// authenticate checks the bearer token: present always, equal to the
// configured one when there is one. The token is never echoed.
func (s *server) authenticate(r *http.Request) (apiError, bool) {
	h := r.Header.Get("Authorization")
	if h == "" {
		return apiError{http.StatusUnauthorized, "AuthenticationFailed",
			"Authentication failed. The 'Authorization' header is missing.", ""}, false
	}
	token, ok := strings.CutPrefix(h, "Bearer ")
	if !ok || token == "" || (s.opts.token != "" && token != s.opts.token) {
		return apiError{http.StatusUnauthorized, "InvalidAuthenticationToken",
			"The access token is invalid.", ""}, false
	}
	if s.opts.tokenCheck != nil {
		switch err := s.opts.tokenCheck(token); {
		case errors.Is(err, ErrAccessTokenExpired):
			return apiError{http.StatusUnauthorized, "ExpiredAuthenticationToken",
				"The access token expiry UTC time is earlier than current UTC time.", ""}, false
		case err != nil:
			return apiError{http.StatusUnauthorized, "InvalidAuthenticationToken",
				"The access token is invalid.", ""}, false
		}
	}
	return apiError{}, true
}

// action names the RBAC action a request needs, for AuthorizationFailed.
func action(r *http.Request) string {
	verb := map[string]string{http.MethodPut: "write", http.MethodDelete: "delete"}[r.Method]
	if verb == "" {
		verb = "read"
	}
	if act, _, skip := requestAction(r); !skip {
		return act
	}
	typ := "Microsoft.Compute/virtualMachines"
	switch {
	case strings.Contains(r.URL.Path, "/networkInterfaces"):
		typ = "Microsoft.Network/networkInterfaces"
	case isGraph(r):
		// A query needs this action at its scope; it sees only the
		// resources the caller may read.
		return "Microsoft.ResourceGraph/resources/read"
	}
	return typ + "/" + verb
}

// baseURL is the scheme and host the client reached the fake at, for the
// absolute URLs ARM hands out (nextLink, Azure-AsyncOperation).
func baseURL(r *http.Request) string {
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	return scheme + "://" + r.Host
}
