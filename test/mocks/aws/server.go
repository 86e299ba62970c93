// Package ec2fake serves the EC2 Query API (RunInstances, DescribeInstances,
// TerminateInstances, and the catalog reads DescribeImages and
// DescribeInstanceTypes) over the shared fake cloud core, so that the official
// aws-sdk-go-v2 EC2 client talks to it unchanged but for its endpoint URL.
//
// Each instance gets a root EBS volume, a side resource of the core that
// dies with the instance (DeleteOnTermination). Requests are parsed
// strictly: an unknown parameter, a malformed id or an out-of-range value
// gets EC2's own validation error. Faults drawn by the core's Admit become
// EC2's throttling (503 RequestLimitExceeded, with no Retry-After header:
// see budget.go),
// 500 InternalError and 403 UnauthorizedOperation replies. WithBudget adds
// EC2's published request limits (budget.go): a call over them gets the
// same throttling reply.
package ec2fake

import (
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caa-project/caa/test/mocks/cloud"
)

// APIVersion is the only EC2 API version the fake answers.
const APIVersion = "2016-11-15"

const (
	xmlNamespace = "http://ec2.amazonaws.com/doc/" + APIVersion + "/"
	ownerID      = "123456789012"
	maxBodyBytes = 1 << 20
)

// Counter names for work that is not one of the four provider operations.
const (
	// OpOther counts requests whose Action the fake does not serve.
	OpOther = "other"
	// OpLookup counts a DescribeInstances without instance ids but with a
	// client-token filter: an idempotency lookup (caa's AWS provider makes
	// one before each RunInstances) that matches at most the one instance
	// launched with that token. It costs what any DescribeInstances costs,
	// but it is no listing of the account's instances, so it is not
	// counted under cloud.OpList.
	OpLookup = "lookup"
	// OpDryRun counts a call made with DryRun=true (caa's startup
	// preflight): a permission check that creates and deletes nothing, so
	// it is not counted under cloud.OpCreate or cloud.OpDelete, and draws
	// no write fault.
	OpDryRun = "dryrun"
	// OpCatalog counts DescribeImages and DescribeInstanceTypes: reads of
	// EC2's catalog (an AMI's root device, a type's size), not of the
	// account's instances (catalog.go).
	OpCatalog = "catalog"
)

// CloudOptions fills in what makes the core look like EC2: instance ids of
// 17 hex digits, terminated instances visible for an hour, a zone name.
// Fields already set are kept.
func CloudOptions(o cloud.Options) cloud.Options {
	if o.IDPrefix == "" {
		o.IDPrefix = "i-00000"
	}
	if o.KeepTerminated == 0 {
		o.KeepTerminated = time.Hour
	}
	if o.Zone == "" {
		o.Zone = "us-east-1a"
	}
	return o
}

// Option configures the server.
type Option func(*server)

// WithCredentials makes the server verify every request's SigV4 signature
// against this key pair, answering AuthFailure when it does not match.
// Without it the server only checks that requests are signed for ec2.
func WithCredentials(accessKeyID, secretAccessKey string) Option {
	return func(s *server) { s.accessKeyID, s.secretAccessKey = accessKeyID, secretAccessKey }
}

// WithKeyring makes the server accept the temporary keys keyring issued
// (through the fake STS or container credentials endpoint), each with its
// session token and only until it expires, besides any WithCredentials.
func WithKeyring(k *Keyring) Option {
	return func(s *server) { s.keyring = k }
}

// WithNetwork makes the server know exactly these subnets and security
// groups: a launch naming another gets EC2's InvalidSubnetID.NotFound or
// InvalidGroup.NotFound (before it is authorized, since EC2 needs the
// resource to authorize against it). Without it any well-formed id goes.
func WithNetwork(subnets, groups []string) Option {
	return func(s *server) { s.subnets, s.groups = subnets, groups }
}

// WithPolicy makes the server authorize every call against policy, as IAM
// does (policy.go): a call it does not allow, for any resource the call
// touches, is answered 403 UnauthorizedOperation with an encoded
// authorization message. Without it every authenticated call is allowed.
func WithPolicy(p *Policy) Option {
	return WithPolicyFunc(func() *Policy { return p })
}

// WithPolicyFunc is WithPolicy with the policy read at every call, so a
// test can change the permissions while a client runs (nil: allow all).
func WithPolicyFunc(f func() *Policy) Option {
	return func(s *server) { s.policy = f }
}

// WithZone names the zone of the subnets, for the messages that name it
// (default us-east-1a, CloudOptions' zone).
func WithZone(zone string) Option {
	return func(s *server) { s.zone = zone }
}

type server struct {
	cloud           *cloud.Cloud
	zone            string
	accessKeyID     string
	secretAccessKey string
	keyring         *Keyring
	subnets, groups []string          // nil: any
	defaultGroup    string            // the VPC's default security group
	bootModes       map[string]string // AMI -> boot mode (WithImageBootMode)
	policy          func() *Policy    // nil, or returning nil: allow all
	budget          *cloud.Budget     // nil: nothing metered
	seq             atomic.Uint64

	mu       sync.Mutex
	launches map[string]*launch // by instance id

	// gen moves with every write the fake serves (its own state may
	// change); answers are listings' answers made at a generation.
	gen     atomic.Uint64
	answers cloud.Memo[memoAnswer]
}

// NewServer returns the EC2 front end over c, with the core's test controls
// mounted at cloud.ControlPrefix. Build c with CloudOptions so that its ids
// look like EC2's (the fake rejects others as malformed).
func NewServer(c *cloud.Cloud, opts ...Option) http.Handler {
	s := &server{cloud: c, launches: map[string]*launch{}, zone: "us-east-1a", defaultGroup: DefaultGroup}
	for _, o := range opts {
		o(s)
	}
	mux := http.NewServeMux()
	mux.Handle(cloud.ControlPrefix, cloud.ControlHandler(c))
	mux.Handle("/", s)
	return mux
}

// action serves one parsed request from caller and returns the response
// document.
type action func(s *server, q query, c caller) (any, *apiError)

var actions = map[string]struct {
	run   action
	write bool
}{
	"RunInstances":       {(*server).runInstances, true},
	"DescribeInstances":  {(*server).describeInstances, false},
	"TerminateInstances": {(*server).terminateInstances, true},
	// The catalog (catalog.go).
	"DescribeImages":        {(*server).describeImages, false},
	"DescribeInstanceTypes": {(*server).describeInstanceTypes, false},
}

// counterOp is the core operation a request counts under.
func counterOp(name string, q query) string {
	if q.get("DryRun") == "true" {
		return OpDryRun
	}
	switch name {
	case "RunInstances":
		return cloud.OpCreate
	case "TerminateInstances":
		return cloud.OpDelete
	case "DescribeImages", "DescribeInstanceTypes":
		return OpCatalog
	case "DescribeInstances":
		if q.has("InstanceId.") {
			return cloud.OpGet
		}
		for _, n := range q.indexes("Filter") {
			if q.get("Filter."+n+".Name") == "client-token" {
				return OpLookup
			}
		}
		return cloud.OpList
	}
	return OpOther
}

func (s *server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		s.writeError(w, &apiError{http.StatusBadRequest, "UnsupportedOperation", "The fake EC2 endpoint accepts POST requests only."})
		return
	}
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/x-www-form-urlencoded" {
		s.writeError(w, &apiError{http.StatusBadRequest, "InvalidParameterValue", "The request body must be application/x-www-form-urlencoded."})
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	if err != nil {
		s.writeError(w, &apiError{http.StatusBadRequest, "MalformedQueryString", "The request body could not be read."})
		return
	}
	values, err := url.ParseQuery(string(body))
	if err != nil {
		s.writeError(w, &apiError{http.StatusBadRequest, "MalformedQueryString", "The request body is not a valid query string."})
		return
	}
	q := query(values)
	name := q.get("Action")
	act, known := actions[name]

	op := counterOp(name, q)
	fault, err := s.cloud.Admit(r.Context(), op, act.write && op != OpDryRun)
	if err != nil {
		// The client went away during the injected latency; never let
		// anything read this as a success.
		s.writeError(w, &apiError{http.StatusServiceUnavailable, "Unavailable", "The request was cancelled."})
		return
	}
	who, e := s.authenticate(r, body)
	if e != nil {
		s.writeError(w, e)
		return
	}
	if e := faultError(fault); e != nil {
		// No Retry-After, whatever the fault asks for: see throttleReply.
		s.writeError(w, e)
		return
	}
	switch {
	case name == "":
		s.writeError(w, &apiError{http.StatusBadRequest, "MissingAction", "The request must contain the parameter Action."})
		return
	case !known:
		s.writeError(w, &apiError{http.StatusBadRequest, "InvalidAction", fmt.Sprintf("The action %s is not valid for this web service.", name)})
		return
	}
	if s.budget != nil {
		if op, cs, ok := charges(name, q); ok {
			if take := s.budget.Take(op, cs...); !take.OK {
				s.cloud.CountThrottled()
				s.writeError(w, faultError(cloud.Fault{Kind: cloud.FaultThrottle}))
				return
			}
		}
	}
	switch v := q.get("Version"); v {
	case "":
		s.writeError(w, missing("Version"))
		return
	case APIVersion:
	default:
		s.writeError(w, &apiError{http.StatusBadRequest, "NoSuchVersion", fmt.Sprintf("An unknown API version %q was specified.", v)})
		return
	}
	if act.write {
		// Nothing made before this write, or while it runs, is used again.
		s.gen.Add(1)
		defer s.gen.Add(1)
	}
	doc, e := act.run(s, q, who)
	if e != nil {
		s.writeError(w, e)
		return
	}
	s.writeXML(w, http.StatusOK, doc)
}

// faultError is the EC2 reply for a fault the core drew, or nil.
func faultError(f cloud.Fault) *apiError {
	switch f.Kind {
	case cloud.FaultThrottle:
		return &apiError{http.StatusServiceUnavailable, "RequestLimitExceeded", "Request limit exceeded."}
	case cloud.FaultServerError:
		return &apiError{http.StatusInternalServerError, "InternalError", "An internal error has occurred."}
	case cloud.FaultAuth:
		return &apiError{http.StatusForbidden, "UnauthorizedOperation", "You are not authorized to perform this operation."}
	}
	return nil
}

// requestID returns a fresh id in the UUID shape EC2 uses.
func (s *server) requestID() string {
	n := s.seq.Add(1)
	return fmt.Sprintf("%08x-0000-4000-8000-%012x", uint32(time.Now().UnixNano()), n)
}
