package vpcfake

import (
	"net/http"
	"strconv"
	"time"

	"github.com/caa-project/caa/test/mocks/cloud"
)

// Bucket classes of the fake's request limits. IBM Cloud publishes no
// per-account rate figures for the VPC API, so the fake meters it as EC2
// meters its own (see the EC2 fake's PublishedLimits): reads like
// DescribeInstances, creates like RunInstances, deletes like
// TerminateInstances. The figures are EC2's, an assumption, not IBM's.
const (
	// ClassRead: instance and volume GETs and listings, 100 tokens, 20
	// back a second.
	ClassRead = "read"
	// ClassCreate: instance creates, 50 tokens, 5 back a second.
	ClassCreate = "create"
	// ClassDelete: instance and volume deletes, 50 tokens, 5 back a second.
	ClassDelete = "delete"
	// ClassSearch: Global Search requests, a bucket of their own (the
	// service is not VPC's), 50 tokens, 10 back a second. IBM publishes no
	// figure for it either: an assumption.
	ClassSearch = "search"
	// ClassTagging: Global Tagging requests (one attach per create), a
	// bucket of their own, 50 tokens, 10 back a second: an assumption too.
	ClassTagging = "tagging"
)

// PublishedLimits are the limits the fake enforces by class; the IAM token
// endpoint is not metered.
func PublishedLimits() map[string]cloud.Limit {
	return map[string]cloud.Limit{
		ClassRead:    cloud.PerSecond(100, 20),
		ClassCreate:  cloud.PerSecond(50, 5),
		ClassDelete:  cloud.PerSecond(50, 5),
		ClassSearch:  cloud.PerSecond(50, 10),
		ClassTagging: cloud.PerSecond(50, 10),
	}
}

// NewBudget returns a budget with PublishedLimits on the clock now
// (time.Now when nil), for WithBudget.
func NewBudget(now func() time.Time) *cloud.Budget {
	return cloud.NewBudget(now, PublishedLimits())
}

// WithBudget makes the server enforce b: a VPC call over its bucket gets
// 429 with the VPC error body (code rate_limit_exceeded) and a Retry-After
// header saying when the bucket has a token again. b counts calls under
// the operation names the server counts them by (cloud.OpCreate, OpGet,
// OpList, OpDelete, OpVolume...). Without this option nothing is metered.
func WithBudget(b *cloud.Budget) Option { return func(s *Server) { s.budget = b } }

// classOf is the bucket class of a VPC call of op.
func classOf(op string, write bool) string {
	switch {
	case op == cloud.OpCreate:
		return ClassCreate
	case write:
		return ClassDelete
	}
	return ClassRead
}

// metered charges the budget for a call of op to class and answers the
// refusal; it reports whether the call may go on.
func (s *Server) metered(w http.ResponseWriter, op, class string) bool {
	if s.budget == nil {
		return true
	}
	take := s.budget.Take(op, cloud.Charge{Class: class})
	if take.OK {
		return true
	}
	s.cloud.CountThrottled()
	w.Header().Set("Retry-After", strconv.Itoa(take.RetryAfterSeconds()))
	if class == ClassSearch {
		writeSearchProblem(w, http.StatusTooManyRequests, "rate_limit_exceeded", "Too many requests within a short time.")
	} else {
		writeProblem(w, http.StatusTooManyRequests, "rate_limit_exceeded", "Too many requests within a short time.", nil)
	}
	return false
}
