package armfake

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/caa-project/caa/test/mocks/cloud"
)

// Bucket classes of the compute resource provider's VM throttling, per
// subscription and region, with the figures the project's issue quotes.
const (
	// ClassList: VM list calls, 900 tokens, 300 back a minute.
	ClassList = "vm-list"
	// ClassGet: single VM GETs for the subscription, 24,000 a minute. The
	// bucket size is taken as one minute's worth (the quoted figure is a
	// rate only).
	ClassGet = "vm-get"
	// ClassGetVM: single VM GETs of one VM (a bucket per VM name), 36
	// tokens, 12 back a minute.
	ClassGetVM = "vm-get-per-vm"
	// ClassWrite: VM PUTs and DELETEs together, 1,500 tokens, 500 back a
	// minute.
	ClassWrite = "vm-put-delete"
	// ClassGraphUser: Resource Graph queries of one user (a bucket per
	// caller), 15 a 5-second window, Resource Graph's published per-user
	// limit. Its state goes back in x-ms-user-quota-remaining and
	// x-ms-user-quota-resets-after on every answer of the query API.
	ClassGraphUser = "graph-per-user"
)

// policyNames are what the fake calls each class in its
// x-ms-ratelimit-remaining-resource header. Azure names its compute
// policies in the same form (Microsoft.Compute/<policy>); these names are
// the fake's own.
var policyNames = map[string]string{
	ClassList:  "Microsoft.Compute/ListVMs",
	ClassGet:   "Microsoft.Compute/GetVMSubscription",
	ClassGetVM: "Microsoft.Compute/GetVMResource",
	ClassWrite: "Microsoft.Compute/PutDeleteVM",
}

// PublishedLimits are the compute provider's VM limits by class, and
// Resource Graph's per-user query limit. NIC calls
// (Microsoft.Network) and polls of long-running operations are not
// metered: the issue quotes no figure for them, and Azure Resource
// Manager's own subscription-wide limits are not modelled either.
func PublishedLimits() map[string]cloud.Limit {
	return map[string]cloud.Limit{
		ClassList:  cloud.PerMinute(900, 300),
		ClassGet:   cloud.PerMinute(24000, 24000),
		ClassGetVM: cloud.PerMinute(36, 12),
		ClassWrite: cloud.PerMinute(1500, 500),
		// A window of 15 queries in 5 seconds, modelled as a bucket of 15
		// that refills 15 in 5 seconds.
		ClassGraphUser: {Burst: 15, Refill: 15, Per: 5 * time.Second},
	}
}

// NewBudget returns a budget with PublishedLimits on the clock now
// (time.Now when nil), for WithBudget.
func NewBudget(now func() time.Time) *cloud.Budget {
	return cloud.NewBudget(now, PublishedLimits())
}

// WithBudget makes the fake enforce b on VM calls: every metered reply
// carries x-ms-ratelimit-remaining-resource, and a call over a bucket gets
// 429 TooManyRequests with Retry-After (seconds until the bucket has a
// token again). b counts calls under cloud.OpCreate, OpGet, OpList and
// OpDelete. Without this option nothing is metered.
func WithBudget(b *cloud.Budget) Option { return func(o *options) { o.budget = b } }

// vmCharges are the buckets a VM call of op draws from; nil for a call the
// budget does not meter.
func vmCharges(op string, r *http.Request) []cloud.Charge {
	switch op {
	case cloud.OpList:
		return []cloud.Charge{{Class: ClassList}}
	case cloud.OpGet:
		return []cloud.Charge{{Class: ClassGet}, {Class: ClassGetVM, Key: strings.ToLower(r.PathValue("name"))}}
	case cloud.OpCreate, cloud.OpDelete:
		return []cloud.Charge{{Class: ClassWrite}}
	}
	return nil
}

// metered charges the budget for a VM call, sets the remaining-calls
// header, and answers the refusal; it reports whether the call may go on.
func (s *server) metered(w http.ResponseWriter, r *http.Request, op string) bool {
	if isGraph(r) {
		return s.meteredGraph(w, r)
	}
	cs := vmCharges(op, r)
	if s.opts.budget == nil || cs == nil {
		return true
	}
	take := s.opts.budget.Take(op, cs...)
	parts := make([]string, 0, len(cs))
	for i, c := range cs {
		if take.Remaining[i] >= 0 {
			parts = append(parts, fmt.Sprintf("%s;%d", policyNames[c.Class], take.Remaining[i]))
		}
	}
	w.Header().Set("x-ms-ratelimit-remaining-resource", strings.Join(parts, ","))
	if take.OK {
		return true
	}
	s.cloud.CountThrottled()
	w.Header().Set("Retry-After", strconv.Itoa(take.RetryAfterSeconds()))
	writeError(w, apiError{http.StatusTooManyRequests, "TooManyRequests",
		"The request is being throttled as the limit has been reached for this operation type.", ""})
	return false
}

// graphLimit is Resource Graph's per-user limit.
var graphLimit = PublishedLimits()[ClassGraphUser]

// meteredGraph charges a Resource Graph query to its caller's bucket and
// sets the quota headers Resource Graph puts on every answer: the queries
// left in the window and the time until the quota is whole again
// (hh:mm:ss). It reports whether the query may go on.
func (s *server) meteredGraph(w http.ResponseWriter, r *http.Request) bool {
	if s.opts.budget == nil {
		setQuotaHeaders(w, int64(graphLimit.Burst), 0)
		return true
	}
	user := graphUser(r)
	take := s.opts.budget.Take(ClassGraphUser, cloud.Charge{Class: ClassGraphUser, Key: user})
	if take.Remaining[0] < 0 {
		setQuotaHeaders(w, int64(graphLimit.Burst), 0)
		return true
	}
	s.quotaHeaders(w, r)
	if take.OK {
		return true
	}
	s.cloud.CountThrottled()
	w.Header().Set("Retry-After", strconv.Itoa(take.RetryAfterSeconds()))
	writeGraphError(w, graphError{http.StatusTooManyRequests, "RateLimiting",
		"Please provide below info when asking for support: timestamp, correlation id.",
		[]graphDetail{{Code: "RateLimiting", Message: "Client application has been throttled and should not attempt to repeat the request until an amount of time has elapsed. Please see https://aka.ms/resourcegraph-throttling for help."}}})
	return false
}

// quotaHeaders sets the quota headers from the caller's bucket as it
// stands, without charging it: a full quota when nothing is metered.
func (s *server) quotaHeaders(w http.ResponseWriter, r *http.Request) {
	lim, metered := graphLimit, false
	if s.opts.budget != nil {
		lim, metered = s.opts.budget.Limits()[ClassGraphUser]
	}
	if !metered {
		setQuotaHeaders(w, int64(graphLimit.Burst), 0)
		return
	}
	tokens, _ := s.opts.budget.Tokens(ClassGraphUser, graphUser(r))
	var full time.Duration
	if rate := lim.Refill / lim.Per.Seconds(); rate > 0 {
		full = time.Duration((lim.Burst - tokens) / rate * float64(time.Second))
	}
	setQuotaHeaders(w, int64(math.Floor(tokens)), full)
}

func setQuotaHeaders(w http.ResponseWriter, remaining int64, reset time.Duration) {
	w.Header().Set("x-ms-user-quota-remaining", strconv.FormatInt(max(remaining, 0), 10))
	w.Header().Set("x-ms-user-quota-resets-after", formatHMS(reset))
}

// formatHMS writes d as hh:mm:ss, rounded up to the second.
func formatHMS(d time.Duration) string {
	secs := int64((d + time.Second - 1) / time.Second)
	return fmt.Sprintf("%02d:%02d:%02d", secs/3600, secs/60%60, secs%60)
}

// graphUser names the caller for the per-user quota (see GraphUser).
func graphUser(r *http.Request) string {
	token, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	return GraphUser(token)
}

// GraphUser is the key of the ClassGraphUser bucket of the caller with
// this bearer token: a digest of it, never the token itself.
func GraphUser(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:6])
}
