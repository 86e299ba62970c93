package ec2fake

import (
	"time"

	"github.com/caa-project/caa/test/mocks/cloud"
)

// Bucket classes of EC2's published request throttling, per account and
// region (https://docs.aws.amazon.com/ec2/latest/devguide/ec2-api-throttling.html).
// EC2 keeps a bucket per API: DescribeInstances, RunInstances and
// TerminateInstances each draw from their own, sized by the API's category.
// RunInstances and TerminateInstances also draw from a resource bucket, one
// token per instance launched or terminated.
const (
	// ClassDescribe: DescribeInstances, a non-mutating action:
	// 100 tokens, 20 back a second (the figures the issue quotes).
	ClassDescribe = "DescribeInstances"
	// ClassDescribeUnfiltered: a DescribeInstances with no instance id, no
	// filter and no page size, which EC2 meters as an "unfiltered and
	// unpaginated" call: 50 tokens, 10 a second.
	ClassDescribeUnfiltered = "DescribeInstances/unfiltered"
	// ClassRun and ClassTerminate: the request buckets of the two
	// resource-intensive actions, 50 tokens and 5 a second each.
	ClassRun       = "RunInstances"
	ClassTerminate = "TerminateInstances"
	// ClassRunInstances and ClassTerminateInstances: the resource buckets,
	// in instances: 1,000 launched with 2 back a second, 1,000 terminated
	// with 20 back a second.
	ClassRunInstances       = "RunInstances/instances"
	ClassTerminateInstances = "TerminateInstances/instances"
)

// PublishedLimits are EC2's default request limits by bucket class. The
// figures for DescribeInstances are the ones the project's issue quotes;
// those of the unfiltered category, of the request buckets of RunInstances
// and TerminateInstances and of their resource buckets are AWS's default
// table as we read it (an account can have them raised, and AWS revises
// them): where that table and these differ, the table wins, and these
// should follow it.
func PublishedLimits() map[string]cloud.Limit {
	return map[string]cloud.Limit{
		ClassDescribe:           cloud.PerSecond(100, 20),
		ClassDescribeUnfiltered: cloud.PerSecond(50, 10),
		ClassRun:                cloud.PerSecond(50, 5),
		ClassTerminate:          cloud.PerSecond(50, 5),
		ClassRunInstances:       cloud.PerSecond(1000, 2),
		ClassTerminateInstances: cloud.PerSecond(1000, 20),
	}
}

// NewBudget returns a budget with EC2's PublishedLimits on the clock now
// (time.Now when nil), for WithBudget.
func NewBudget(now func() time.Time) *cloud.Budget {
	return cloud.NewBudget(now, PublishedLimits())
}

// WithBudget makes the server enforce b: a call its buckets refuse gets
// EC2's throttling reply, 503 RequestLimitExceeded and nothing that says
// when to come back. EC2 sends no Retry-After header: its
// throttling page (the link above) and AWS's knowledge-center article on
// RequestLimitExceeded
// (https://repost.aws/knowledge-center/ec2-launch-multiple-requestlimitexceeded)
// tell callers to retry with exponential backoff and to pace themselves to
// the bucket's refill, and the SDKs' standard retryer picks its own delay
// for throttling codes. So a client that waits only as long as the server
// says gets no help here, as against EC2. b counts the calls it sees under cloud.OpCreate,
// OpGet, OpList and OpDelete. Without this option nothing is metered.
func WithBudget(b *cloud.Budget) Option { return func(s *server) { s.budget = b } }

// charges classifies one request for the budget: the class it counts
// under and the buckets it draws from. ok is false for an action the
// budget does not meter.
func charges(name string, q query) (op string, cs []cloud.Charge, ok bool) {
	op = counterOp(name, q)
	switch name {
	case "DescribeInstances":
		if !q.has("InstanceId.") && !q.has("Filter.") && !q.has("MaxResults") && !q.has("NextToken") {
			return op, []cloud.Charge{{Class: ClassDescribeUnfiltered}}, true
		}
		return op, []cloud.Charge{{Class: ClassDescribe}}, true
	case "RunInstances":
		if op == OpDryRun {
			// A request, but no instance launched: no resource token.
			return op, []cloud.Charge{{Class: ClassRun}}, true
		}
		// The fake launches one instance a call (MinCount = MaxCount = 1).
		return op, []cloud.Charge{{Class: ClassRun}, {Class: ClassRunInstances}}, true
	case "TerminateInstances":
		if op == OpDryRun {
			return op, []cloud.Charge{{Class: ClassTerminate}}, true
		}
		n := max(1, len(q.list("InstanceId")))
		return op, []cloud.Charge{{Class: ClassTerminate}, {Class: ClassTerminateInstances, Tokens: float64(n)}}, true
	}
	return op, nil, false
}
