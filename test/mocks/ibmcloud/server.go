// Package vpcfake is a fake IBM Cloud VPC: an HTTP front end that speaks the
// VPC JSON API (instances and volumes, version and generation query
// parameters, start-token pagination, the {"errors":[...],"trace":...} error
// body) and a minimal IAM token endpoint, on top of the shared fake cloud
// core, so that the official VPC Go SDK talks to it unchanged but for its
// URLs.
//
// Routes:
//
//	POST   /identity/token      IAM: API key, or a trusted profile's compute
//	                            resource token (WithTrustedProfile) -> bearer
//	                            token, valid until it expires or is revoked
//	POST   /v1/instances        create (op "create")
//	GET    /v1/instances        list, filters name, vpc.id, resource_group.id (op "list")
//	GET    /v1/instances/{id}   (op "get")
//	DELETE /v1/instances/{id}   (op "delete")
//	GET    /v1/volumes          list, filter tag (op "volume.list")
//	GET    /v1/volumes/{id}     (op "volume.get")
//	DELETE /v1/volumes/{id}     (op "volume.delete")
//	GET    /v1/security_groups  list, filter vpc.id (op "security_group.list";
//	                            WithNetwork's groups, with their names)
//	GET    /v1/subnets/{id}, /v1/vpcs/{id}, /v1/security_groups/{id},
//	       /v1/images/{id}      reads of what caa's configuration names
//	                            (WithNetwork; ops "subnet.get", ...)
//	POST   /v3/resources/search Global Search over the instances' and the
//	                            volumes' user tags (op "list", budget class
//	                            "search"; search.go)
//	POST   /v3/tags/attach      Global Tagging: user tags onto an instance
//	                            (op "tags.attach", class "tagging"; tagging.go)
//	GET    /v3/tags             Global Tagging: the account's user tags
//	                            (op "tags.list", class "tagging"; tagging.go)
//	       /_control/...        the core's test controls
//
// How the fake maps VPC onto the core: an instance is a core instance; its
// boot volume and its network attachment (a virtual network interface, or a
// legacy network interface) are core side resources, created with it and
// deleted with it when the request asks (delete_volume_on_instance_delete,
// auto_delete). VPC instances carry no tags; user tags live on volumes, so
// the boot volume's user tags are kept on its core resource. An instance put
// straight into the core by a test (no side resources) is shown with an
// implicit boot volume whose user tags are the instance's core tags, written
// "key:value", so that a seeded core reads as a VPC account would.
// Deleted instances vanish at once (VPC shows no terminated instances).
//
// With WithPolicies every VPC call is authorized against IAM access
// policies (authz.go): a call outside them is 403 forbidden naming the
// action, and listings and search leave out what the caller may not read.
package vpcfake

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caa-project/caa/test/mocks/cloud"
)

// Operation names for the calls that are not one of the four provider
// operations; cloud.OpCreate, OpGet, OpList and OpDelete count the instance
// calls.
const (
	OpIAMToken     = "iam.token"
	OpVolumeGet    = "volume.get"
	OpVolumeList   = "volume.list"
	OpVolumeDelete = "volume.delete"
)

// Resource kinds the fake keeps in the core.
const (
	KindVolume           = "volume"
	KindVNI              = "virtual_network_interface"
	KindNetworkInterface = "network_interface"
)

// Option configures the server.
type Option func(*Server)

// WithAPIKey makes the IAM endpoint accept only this API key (by default
// any non-empty key is accepted).
func WithAPIKey(key string) Option { return func(s *Server) { s.apiKey = key } }

// WithAccessToken makes the IAM endpoint issue this access token instead of
// a random one, so that a test knows the secret to look for.
func WithAccessToken(token string) Option { return func(s *Server) { s.fixedToken = token } }

// WithTrustedProfile makes the IAM endpoint exchange compute resource
// tokens for access tokens of the profile p (grant type cr-token).
func WithTrustedProfile(p *TrustedProfile) Option { return func(s *Server) { s.profile = p } }

// WithPolicies makes the VPC and Global Search routes authorize every call
// against the policies fn returns at the time (nil: everything allowed),
// answering 403 with the action that no policy grants. Global Search, as
// the real one, leaves out what the caller may not read instead.
func WithPolicies(fn func() *Policies) Option { return func(s *Server) { s.policyFn = fn } }

// Server is the fake's HTTP handler.
type Server struct {
	cloud         *cloud.Cloud
	mux           *http.ServeMux
	apiKey        string
	fixedToken    string
	budget        *cloud.Budget    // nil: nothing metered (WithBudget)
	searchLag     time.Duration    // WithSearchLag
	untaggedSeeds bool             // WithUntaggedSeeds
	profile       *TrustedProfile  // WithTrustedProfile
	policyFn      func() *Policies // WithPolicies
	network       *Network         // WithNetwork
	seq           atomic.Int64
	docCache      cloud.DocCache // instances' search documents (search.go)

	mu     sync.Mutex
	tokens map[string]grantee   // access tokens IAM issued
	docs   map[string]searchDoc // search documents of API-made instances' boot volumes, by instance id
	// instanceTags are the user tags attached to instances through Global
	// Tagging (tagging.go), by instance id.
	instanceTags map[string][]string
	pinned       map[string]string    // statuses the index shows, by instance id (PinIndexStatus)
	requested    map[string]Requested // what each API-made instance's create asked, by instance id

	// gen moves with every change the fake's own state may have seen (any
	// request but a read or a search, PinIndexStatus). built is the last
	// search index built and answers the search answers made from it, at
	// the stamp they were made at (search.go); resources the side
	// resources by id at the core generation they were read at
	// (resourcesByID).
	gen       atomic.Uint64
	built     cloud.Memo[builtIndex]
	answers   cloud.Memo[[]byte]
	resources cloud.Memo[map[string]cloud.Resource]
}

// NewServer returns the VPC and IAM front end over c, with the core's
// controls mounted at cloud.ControlPrefix.
func NewServer(c *cloud.Cloud, opts ...Option) http.Handler {
	s := &Server{cloud: c, mux: http.NewServeMux(), tokens: map[string]grantee{}, docs: map[string]searchDoc{}, instanceTags: map[string][]string{}, pinned: map[string]string{},
		requested: map[string]Requested{}}
	for _, o := range opts {
		o(s)
	}
	s.mux.Handle(cloud.ControlPrefix, cloud.ControlHandler(c))
	s.mux.HandleFunc("POST "+tokenPath, s.token)
	s.route("POST /v1/instances", cloud.OpCreate, true, s.createInstance)
	s.route("GET /v1/instances", cloud.OpList, false, s.listInstances)
	s.route("GET /v1/instances/{id}", cloud.OpGet, false, s.getInstance)
	s.route("DELETE /v1/instances/{id}", cloud.OpDelete, true, s.deleteInstance)
	s.route("GET /v1/volumes", OpVolumeList, false, s.listVolumes)
	s.route("GET /v1/volumes/{id}", OpVolumeGet, false, s.getVolume)
	s.route("DELETE /v1/volumes/{id}", OpVolumeDelete, true, s.deleteVolume)
	s.route("GET /v1/subnets/{id}", OpSubnetGet, false, s.getSubnet)
	s.route("GET /v1/vpcs/{id}", OpVPCGet, false, s.getVPC)
	s.route("GET /v1/security_groups/{id}", OpSecurityGroupGet, false, s.getSecurityGroup)
	s.route("GET /v1/security_groups", OpSecurityGroupList, false, s.listSecurityGroups)
	s.route("GET /v1/images/{id}", OpImageGet, false, s.getImage)
	s.mux.HandleFunc("POST "+searchPath, func(w http.ResponseWriter, r *http.Request) {
		// Read the body first: until it is read, the server cannot notice
		// a client that gave up, and an injected latency would outlive it.
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
		if err != nil {
			writeSearchProblem(w, http.StatusBadRequest, "bad_request", "The request body could not be read.")
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		s.globalRoute(cloud.OpList, false, ClassSearch, s.search)(w, r)
	})
	s.mux.HandleFunc("POST "+tagAttachPath, s.globalRoute(OpTagAttach, true, ClassTagging, s.attachTags))
	s.mux.HandleFunc("GET "+tagListPath, s.globalRoute(OpTagList, false, ClassTagging, s.listTags))
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeProblem(w, http.StatusNotFound, "invalid_route", "The requested route does not exist.", nil)
	})
	return s
}

// tokenPath is where IAM issues tokens.
const tokenPath = "/identity/token"

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead && r.URL.Path != searchPath && r.URL.Path != tokenPath {
		// A write (a create, a tag attach, a control call) may change
		// what the index shows: nothing built before it, or while it
		// runs, is used again. An IAM token changes only who may call,
		// which every request checks before any answer is made.
		s.gen.Add(1)
		defer s.gen.Add(1)
	}
	if r.Body != nil && r.Body != http.NoBody {
		// Read the body before any injected latency: net/http notices a
		// client that hung up (and cancels r.Context()) only once the
		// body is read, so a create whose caller timed out would hold its
		// handler, and the server's Close, for the whole latency.
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxRequestBody))
		if err != nil {
			writeProblem(w, http.StatusRequestEntityTooLarge, "bad_request", "the request body could not be read: "+err.Error(), nil)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
	}
	s.mux.ServeHTTP(w, r)
}

// maxRequestBody bounds what the fake reads of a request; VPC's largest
// (an instance prototype with 64 KiB of user data) fits many times.
const maxRequestBody = 4 << 20

// globalRoute serves a call of op to Global Search or Global Tagging:
// admitted as a write or a read, metered under class, then refused with
// the services' own error body unless its IAM token is good, and handled.
func (s *Server) globalRoute(op string, write bool, class string, handle http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !s.admit(w, r, op, write, false) || !s.metered(w, op, class) {
			return
		}
		if !s.authorized(r) {
			writeSearchProblem(w, http.StatusUnauthorized, "not_authorized", "The request is not authorized: the IAM token is missing, expired or invalid.")
			return
		}
		handle(w, r)
	}
}

// route mounts a VPC API handler behind the checks every VPC call passes:
// admission (counting and faults), the bearer token, and the version and
// generation query parameters.
func (s *Server) route(pattern, op string, write bool, h http.HandlerFunc) {
	s.mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
		if !s.admit(w, r, op, write, false) {
			return
		}
		if !s.metered(w, op, classOf(op, write)) {
			return
		}
		if !s.authorized(r) {
			writeProblem(w, http.StatusUnauthorized, "not_authorized", "The request is not authorized: the IAM token is missing, expired or invalid.", nil)
			return
		}
		if !checkVersion(w, r) {
			return
		}
		h(w, r)
	})
}

// admit counts the call and answers with the fault the core chose, if any;
// it reports whether the handler should go on.
func (s *Server) admit(w http.ResponseWriter, r *http.Request, op string, write, iam bool) bool {
	f, err := s.cloud.Admit(r.Context(), op, write)
	if err != nil {
		// The client went away while the latency was injected.
		w.WriteHeader(http.StatusServiceUnavailable)
		return false
	}
	switch f.Kind {
	case cloud.FaultNone:
		return true
	case cloud.FaultThrottle:
		if f.RetryAfter > 0 {
			w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(f.RetryAfter.Seconds()))))
		}
		if iam {
			writeIAMProblem(w, http.StatusTooManyRequests, "BXNIM0436E", "Too many requests. Please wait and try again.")
		} else {
			writeProblem(w, http.StatusTooManyRequests, "rate_limit_exceeded", "Too many requests within a short time.", nil)
		}
	case cloud.FaultServerError:
		if iam {
			writeIAMProblem(w, http.StatusInternalServerError, "BXNIM0400E", "Internal error.")
		} else {
			writeProblem(w, http.StatusInternalServerError, "internal_error", "An internal error occurred.", nil)
		}
	case cloud.FaultAuth:
		if iam {
			writeIAMProblem(w, http.StatusBadRequest, "BXNIM0415E", "Provided API key could not be found.")
		} else {
			writeProblem(w, http.StatusUnauthorized, "not_authorized", "The request is not authorized.", nil)
		}
	}
	return false
}

var versionRE = regexp.MustCompile(`^\d{4}-\d{2}-\d{2}$`)

// checkVersion enforces the query parameters every VPC request carries.
func checkVersion(w http.ResponseWriter, r *http.Request) bool {
	q := r.URL.Query()
	v := q.Get("version")
	switch {
	case v == "":
		writeProblem(w, http.StatusBadRequest, "missing_version", "The `version` parameter is required, and it must be of the form `YYYY-MM-DD`.", queryTarget("version", ""))
		return false
	case !versionRE.MatchString(v):
		writeProblem(w, http.StatusBadRequest, "invalid_version", "The `version` parameter is invalid, it must be of the form `YYYY-MM-DD`.", queryTarget("version", v))
		return false
	}
	if _, err := time.Parse(time.DateOnly, v); err != nil || v < "2019-01-01" {
		writeProblem(w, http.StatusBadRequest, "invalid_version_range", "The `version` value cannot be set at a future date nor before `2019-01-01`.", queryTarget("version", v))
		return false
	}
	switch g := q.Get("generation"); g {
	case "2":
		return true
	case "":
		writeProblem(w, http.StatusBadRequest, "missing_generation_parameter", "The generation query parameter is required.", queryTarget("generation", ""))
	default:
		writeProblem(w, http.StatusBadRequest, "invalid_generation_parameter", "The generation query parameter is invalid.", queryTarget("generation", g))
	}
	return false
}

// writeCoreError turns a core error into the VPC error the API answers.
func writeCoreError(w http.ResponseWriter, err error, what string) {
	switch {
	case errors.Is(err, cloud.ErrNotFound), errors.Is(err, cloud.ErrResourceNotFound):
		writeProblem(w, http.StatusNotFound, "not_found", what+" not found", nil)
	case errors.Is(err, cloud.ErrNameConflict):
		writeProblem(w, http.StatusBadRequest, "validation_unique_failed", "Provided Name is not unique", &problemTarget{Name: "name", Type: "field"})
	case errors.Is(err, cloud.ErrQuota):
		writeProblem(w, http.StatusBadRequest, "over_quota", "The request would exceed the quota for a resource type: instances.", nil)
	case errors.Is(err, cloud.ErrCapacity):
		writeProblem(w, http.StatusConflict, "insufficient_capacity", "There is not enough capacity in the zone for the requested instance profile.", nil)
	case errors.Is(err, cloud.ErrBadImage):
		writeProblem(w, http.StatusNotFound, "not_found", "Image not found", &problemTarget{Name: "image.id", Type: "field"})
	case errors.Is(err, cloud.ErrBadType):
		writeProblem(w, http.StatusNotFound, "not_found", "Instance profile not found", &problemTarget{Name: "profile.name", Type: "field"})
	case errors.Is(err, cloud.ErrResourceInUse):
		writeProblem(w, http.StatusConflict, "volume_in_use", "The volume is attached to an instance.", nil)
	case errors.Is(err, cloud.ErrIdempotencyMismatch):
		writeProblem(w, http.StatusConflict, "conflict", "The request conflicts with the state of the resource.", nil)
	default:
		writeProblem(w, http.StatusInternalServerError, "internal_error", "An internal error occurred.", nil)
	}
}

func queryTarget(name, value string) *problemTarget {
	return &problemTarget{Name: name, Type: "query_parameter", Value: value}
}

func fieldTarget(name string) *problemTarget { return &problemTarget{Name: name, Type: "field"} }

// writeProblem writes the VPC error body. Messages never echo request
// bodies, so user data cannot come back in an error.
func writeProblem(w http.ResponseWriter, status int, code, msg string, target *problemTarget) {
	writeJSON(w, status, problem{
		Errors: []problemItem{{
			Code: code, Message: msg, Target: target,
			MoreInfo: "https://cloud.ibm.com/docs/vpc?topic=vpc-rias-error-messages#" + code,
		}},
		Trace:      randomHex(16),
		StatusCode: status,
	})
}

func writeIAMProblem(w http.ResponseWriter, status int, code, msg string) {
	writeJSON(w, status, iamProblem{ErrorCode: code, ErrorMessage: msg, Context: map[string]string{"requestId": randomHex(16)}})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// writeJSONBytes writes JSON already encoded, as writeJSON would.
func writeJSONBytes(w http.ResponseWriter, status int, raw []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(raw)
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// newID names a side resource the way VPC ids look: a regional prefix and
// an opaque suffix.
func (s *Server) newID(kind string) string {
	return fmt.Sprintf("r006-%s-%012x", kind, s.seq.Add(1))
}

// baseURL is the scheme and host the client used, for hrefs.
func baseURL(r *http.Request) string {
	if r.TLS != nil {
		return "https://" + r.Host
	}
	return "http://" + r.Host
}
