package main

import (
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	ec2fake "github.com/caa-project/caa/test/mocks/aws"
	armfake "github.com/caa-project/caa/test/mocks/azure"
	"github.com/caa-project/caa/test/mocks/cloud"
	vpcfake "github.com/caa-project/caa/test/mocks/ibmcloud"
)

// The kinds of call a fake cloud counts, as S6 reports them.
const (
	kindRead  = "read"
	kindWrite = "write"
	// kindPoll: a poll of a long-running operation the SDK makes on its
	// own while it waits for a write (Azure's operation status).
	kindPoll = "poll"
	// kindAuth: a token from the cloud's identity service (IBM's IAM).
	kindAuth = "auth"
	// kindMeta: the core's derived counters, no call at all.
	kindMeta = "meta"
	// kindDryRun: a call sent with DryRun (EC2; the fake counts it under
	// its own name), which changes nothing: caa's preflight.
	kindDryRun = "dry run"
)

// kindOf says what a fake's counter name counts. Every name that is not a
// write, a poll, a token or a derived counter is a read: a call S6 cannot
// place is counted against caa, never dropped.
func kindOf(op string) string {
	switch {
	case op == ec2fake.OpDryRun:
		return kindDryRun
	case strings.HasPrefix(op, lroPrefix):
		return kindPoll
	case slices.Contains(writeOps, op):
		return kindWrite
	case op == armfake.OpOperation:
		return kindPoll
	case op == vpcfake.OpIAMToken:
		return kindAuth
	}
	switch op {
	case "total", "created", "deleted", "throttled", "serverErrors":
		return kindMeta
	}
	return kindRead
}

// listingOps are the counters of calls that page through a collection (as
// opposed to reading one resource by id or name).
var listingOps = []string{cloud.OpList, armfake.OpNICList, vpcfake.OpVolumeList, opGraph, opSearch}

// sumKind adds the counters of one kind.
func sumKind[V int64 | float64](m map[string]V, kind string) V {
	var n V
	for op, v := range m {
		if kindOf(op) == kind {
			n += v
		}
	}
	return n
}

// listings adds the listing counters.
func listings[V int64 | float64](m map[string]V) V {
	var n V
	for _, op := range listingOps {
		n += m[op]
	}
	return n
}

// ofKind keeps the counters of one kind.
func ofKind[V int64 | float64](m map[string]V, kind string) map[string]V {
	out := map[string]V{}
	for op, v := range m {
		if kindOf(op) == kind {
			out[op] = v
		}
	}
	return out
}

// opClasses are, per cloud, the account-wide buckets of the fake's
// published limits that each counted operation draws one token from (see
// each fake's budget.go). Buckets kept per resource (Azure's per-VM GET
// bucket) are left out: a fleet's total says nothing about them, except
// Resource Graph's per-user bucket, which a fleet with one identity shares. An
// operation absent here draws from no published bucket (Azure's NIC calls,
// which the fake does not meter).
var opClasses = map[string]map[string][]string{
	"aws": {
		cloud.OpList:     {ec2fake.ClassDescribe},
		cloud.OpGet:      {ec2fake.ClassDescribe},
		ec2fake.OpLookup: {ec2fake.ClassDescribe},
		cloud.OpCreate:   {ec2fake.ClassRun, ec2fake.ClassRunInstances},
		cloud.OpDelete:   {ec2fake.ClassTerminate, ec2fake.ClassTerminateInstances},
	},
	"azure": {
		cloud.OpList: {armfake.ClassList},
		// The fake keeps a Resource Graph bucket per caller; every caa of
		// the bench (and of a DaemonSet with one identity) is one caller.
		opGraph:        {armfake.ClassGraphUser},
		cloud.OpGet:    {armfake.ClassGet},
		cloud.OpCreate: {armfake.ClassWrite},
		cloud.OpDelete: {armfake.ClassWrite},
	},
	"ibmcloud": {
		opSearch:               {vpcfake.ClassSearch},
		opLookup:               {vpcfake.ClassRead},
		cloud.OpList:           {vpcfake.ClassRead},
		cloud.OpGet:            {vpcfake.ClassRead},
		vpcfake.OpVolumeList:   {vpcfake.ClassRead},
		vpcfake.OpVolumeGet:    {vpcfake.ClassRead},
		cloud.OpCreate:         {vpcfake.ClassCreate},
		cloud.OpDelete:         {vpcfake.ClassDelete},
		vpcfake.OpVolumeDelete: {vpcfake.ClassDelete},
		vpcfake.OpTagAttach:    {vpcfake.ClassTagging},
	},
}

// ClassUse turns calls by operation into tokens by bucket class, with the
// reads and writes no published bucket meters beside them (by operation).
func ClassUse(cloudName string, calls map[string]float64) (byClass, unmetered map[string]float64) {
	byClass, unmetered = map[string]float64{}, map[string]float64{}
	for op, n := range calls {
		k := kindOf(op)
		if n == 0 || (k != kindRead && k != kindWrite) {
			continue
		}
		classes, ok := opClasses[cloudName][op]
		if !ok {
			unmetered[op] += n
			continue
		}
		for _, c := range classes {
			byClass[c] += n
		}
	}
	return byClass, unmetered
}

// writeClasses are the bucket classes a cloud's writes draw from.
func writeClasses(cloudName string) []string {
	var out []string
	for op, classes := range opClasses[cloudName] {
		if kindOf(op) == kindWrite {
			out = append(out, classes...)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// RefillPerSecond is a limit's refill in tokens a second.
func RefillPerSecond(l cloud.Limit) float64 {
	if l.Per <= 0 {
		return 0
	}
	return l.Refill / l.Per.Seconds()
}

// PercentOfRefill is a steady draw of perSecond tokens as a percentage of
// what the bucket gets back a second: above 100 the bucket runs dry.
func PercentOfRefill(perSecond float64, l cloud.Limit) float64 {
	r := RefillPerSecond(l)
	if r <= 0 {
		return math.Inf(1)
	}
	return 100 * perSecond / r
}

// AuditsPerHour is how many audits a node makes an hour at caa's
// --audit-interval mean: each wait is the mean times 0.5 + u for u uniform
// in [0, 1) (reconcile.AuditJitter), so the waits average the mean and the
// long-run rate is one audit per mean interval, whatever the jitter.
func AuditsPerHour(mean time.Duration) float64 {
	if mean <= 0 {
		return 0
	}
	return float64(time.Hour) / float64(mean)
}

// ScaleToInterval turns calls counted over a window with audits every
// short (mean) into calls an hour with audits every long: the audits'
// share scales by short/long. All calls in the window are taken to be the
// audits' (the between-audit rate is measured apart).
func ScaleToInterval(calls float64, window, short, long time.Duration) float64 {
	if window <= 0 || long <= 0 {
		return 0
	}
	return calls * float64(time.Hour) / float64(window) * float64(short) / float64(long)
}

// Extend is one pass's calls at an account of v VMs, from the calls
// measured at v0 VMs and the growth per VM (never below zero).
func Extend(perPass, slopePerVM, v0, v float64) float64 {
	return max(0, perPass+slopePerVM*(v-v0))
}

// WriteBoundRate is the fastest steady pod churn (pods a second) the
// write buckets allow, given each write class's tokens per pod, and the
// class that binds; 0 and "" when no write class is drawn.
func WriteBoundRate(perPod map[string]float64, writes []string, limits map[string]cloud.Limit) (rate float64, binding string) {
	rate = math.Inf(1)
	for _, c := range writes {
		n := perPod[c]
		lim, ok := limits[c]
		if n <= 0 || !ok {
			continue
		}
		if r := RefillPerSecond(lim) / n; r < rate {
			rate, binding = r, c
		}
	}
	if binding == "" {
		return 0, ""
	}
	return rate, binding
}

// scaleMap multiplies every value.
func scaleMap(m map[string]float64, k float64) map[string]float64 {
	out := make(map[string]float64, len(m))
	for key, v := range m {
		out[key] = v * k
	}
	return out
}

// addMaps sums maps key by key.
func addMaps(ms ...map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for _, m := range ms {
		for k, v := range m {
			out[k] += v
		}
	}
	return out
}

// toFloat copies counters into floats.
func toFloat(m map[string]int64) map[string]float64 {
	out := make(map[string]float64, len(m))
	for k, v := range m {
		out[k] = float64(v)
	}
	return out
}

// subCounts is after minus before, key by key.
func subCounts(after, before map[string]int64) map[string]int64 {
	out := maps.Clone(after)
	for k, v := range before {
		out[k] -= v
	}
	for k, v := range out {
		if v == 0 {
			delete(out, k)
		}
	}
	return out
}
