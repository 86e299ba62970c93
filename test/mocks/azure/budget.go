package armfake

import (
	"fmt"
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

// PublishedLimits are the compute provider's VM limits by class. NIC calls
// (Microsoft.Network) and polls of long-running operations are not
// metered: the issue quotes no figure for them, and Azure Resource
// Manager's own subscription-wide limits are not modelled either.
func PublishedLimits() map[string]cloud.Limit {
	return map[string]cloud.Limit{
		ClassList:  cloud.PerMinute(900, 300),
		ClassGet:   cloud.PerMinute(24000, 24000),
		ClassGetVM: cloud.PerMinute(36, 12),
		ClassWrite: cloud.PerMinute(1500, 500),
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
