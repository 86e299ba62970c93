package ec2fake

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
)

// Policy is an IAM identity policy, as far as the fake evaluates one:
// Allow and Deny statements, Action and Resource lists with the * and ?
// wildcards, and the condition operators StringEquals, StringNotEquals,
// StringLike, StringNotLike and Null. ParsePolicy refuses anything else
// (NotAction, NotResource, Principal, another operator, a set operator),
// so a policy the fake accepts is one it evaluates in full.
//
// Evaluation is IAM's for one identity policy: an explicit Deny wins, then
// any Allow; nothing matching is an implicit deny.
type Policy struct {
	Version   string
	Statement []Statement
}

// Statement is one policy statement.
type Statement struct {
	Sid       string
	Effect    string
	Action    []string
	Resource  []string
	Condition map[string]map[string][]string
}

// Request is one authorization question: may the caller do Action on
// Resource, with these context keys (each a list of values)?
type Request struct {
	Action   string
	Resource string
	Context  map[string][]string
}

// Decision is the answer to a Request.
type Decision struct {
	Allowed bool
	// ExplicitDeny: a Deny statement matched (else the deny, if any, is
	// implicit: no Allow matched).
	ExplicitDeny bool
	// Statement is the Sid (or index) of the statement that decided.
	Statement string
}

var conditionOps = []string{"StringEquals", "StringNotEquals", "StringLike", "StringNotLike", "Null"}

// ParsePolicy reads a policy document strictly.
func ParsePolicy(doc []byte) (*Policy, error) {
	var raw struct {
		Version   string
		Statement json.RawMessage
	}
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&raw); err != nil {
		return nil, fmt.Errorf("policy: %w", err)
	}
	if raw.Version != "2012-10-17" {
		return nil, fmt.Errorf("policy: Version %q: want 2012-10-17", raw.Version)
	}
	var stmts []json.RawMessage
	if err := json.Unmarshal(raw.Statement, &stmts); err != nil {
		stmts = []json.RawMessage{raw.Statement}
	}
	p := &Policy{Version: raw.Version}
	for i, s := range stmts {
		st, err := parseStatement(s)
		if err != nil {
			return nil, fmt.Errorf("policy: statement %d: %w", i, err)
		}
		if st.Sid == "" {
			st.Sid = fmt.Sprintf("#%d", i)
		}
		p.Statement = append(p.Statement, st)
	}
	if len(p.Statement) == 0 {
		return nil, errors.New("policy: no statement")
	}
	return p, nil
}

// ReadPolicy reads and parses a policy file.
func ReadPolicy(file string) (*Policy, error) {
	doc, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("policy: %w", err)
	}
	return ParsePolicy(doc)
}

func parseStatement(doc json.RawMessage) (Statement, error) {
	var raw struct {
		Sid       string
		Effect    string
		Action    stringList
		Resource  stringList
		Condition map[string]map[string]stringList
	}
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&raw); err != nil {
		return Statement{}, err
	}
	if raw.Effect != "Allow" && raw.Effect != "Deny" {
		return Statement{}, fmt.Errorf("effect %q: want Allow or Deny", raw.Effect)
	}
	if len(raw.Action) == 0 || len(raw.Resource) == 0 {
		return Statement{}, errors.New("a statement needs Action and Resource")
	}
	st := Statement{Sid: raw.Sid, Effect: raw.Effect, Action: raw.Action, Resource: raw.Resource}
	if len(raw.Condition) > 0 {
		st.Condition = map[string]map[string][]string{}
	}
	for op, keys := range raw.Condition {
		if !slices.Contains(conditionOps, op) {
			return Statement{}, fmt.Errorf("condition operator %q is not one the fake evaluates (%s)", op, strings.Join(conditionOps, ", "))
		}
		st.Condition[op] = map[string][]string{}
		for k, vs := range keys {
			if op == "Null" && (len(vs) != 1 || (vs[0] != "true" && vs[0] != "false")) {
				return Statement{}, fmt.Errorf("the Null condition on %s: want \"true\" or \"false\"", k)
			}
			st.Condition[op][k] = vs
		}
	}
	return st, nil
}

// stringList is IAM's "one string or a list of strings".
type stringList []string

func (s *stringList) UnmarshalJSON(b []byte) error {
	var one string
	if err := json.Unmarshal(b, &one); err == nil {
		*s = []string{one}
		return nil
	}
	var many []string
	if err := json.Unmarshal(b, &many); err != nil {
		return errors.New("want a string or a list of strings")
	}
	*s = many
	return nil
}

// Evaluate answers one request.
func (p *Policy) Evaluate(r Request) Decision {
	var allow *Statement
	for i := range p.Statement {
		st := &p.Statement[i]
		if !st.matches(r) {
			continue
		}
		if st.Effect == "Deny" {
			return Decision{ExplicitDeny: true, Statement: st.Sid}
		}
		if allow == nil {
			allow = st
		}
	}
	if allow != nil {
		return Decision{Allowed: true, Statement: allow.Sid}
	}
	return Decision{}
}

func (st *Statement) matches(r Request) bool {
	// Action names are case-insensitive in IAM; resources are not.
	if !slices.ContainsFunc(st.Action, func(a string) bool { return glob(strings.ToLower(a), strings.ToLower(r.Action)) }) {
		return false
	}
	if !slices.ContainsFunc(st.Resource, func(res string) bool { return glob(res, r.Resource) }) {
		return false
	}
	for op, keys := range st.Condition {
		for key, want := range keys {
			if !condition(op, want, r.Context[contextKey(r.Context, key)]) {
				return false
			}
		}
	}
	return true
}

// contextKey finds key in the context the way IAM does: the service and
// global prefixes and key names are case-insensitive, a tag key after the
// slash is not.
func contextKey(ctx map[string][]string, key string) string {
	prefix, tag, hasTag := strings.Cut(key, "/")
	for k := range ctx {
		kp, kt, kHasTag := strings.Cut(k, "/")
		if strings.EqualFold(kp, prefix) && hasTag == kHasTag && kt == tag {
			return k
		}
	}
	return key
}

// condition evaluates one operator for one key: the request's values have
// to meet one of the policy's (StringEquals etc. on a key with several
// values asks that any of them match, as IAM's single-valued operators do
// on a single-valued key). A missing key fails every operator but the
// negated ones, and Null.
func condition(op string, want, got []string) bool {
	anyMatch := func(eq func(w, g string) bool) bool {
		for _, g := range got {
			if slices.ContainsFunc(want, func(w string) bool { return eq(w, g) }) {
				return true
			}
		}
		return false
	}
	equal := func(w, g string) bool { return w == g }
	switch op {
	case "StringEquals":
		return anyMatch(equal)
	case "StringNotEquals":
		return !anyMatch(equal)
	case "StringLike":
		return anyMatch(glob)
	case "StringNotLike":
		return !anyMatch(glob)
	case "Null":
		return (want[0] == "true") == (len(got) == 0)
	}
	return false
}

// glob matches IAM's wildcards: * any run of characters, ? one character.
// path.Match is not used whole: its * stops at '/', IAM's does not.
func glob(pattern, s string) bool {
	if !strings.ContainsAny(pattern, "*?") {
		return pattern == s
	}
	px, sx := 0, 0
	star, mark := -1, 0
	for sx < len(s) {
		switch {
		case px < len(pattern) && (pattern[px] == '?' || pattern[px] == s[sx]):
			px++
			sx++
		case px < len(pattern) && pattern[px] == '*':
			star, mark = px, sx
			px++
		case star >= 0:
			px = star + 1
			mark++
			sx = mark
		default:
			return false
		}
	}
	for px < len(pattern) && pattern[px] == '*' {
		px++
	}
	return px == len(pattern)
}

// Without returns a copy of p with action (e.g. "ec2:TerminateInstances")
// taken out of every Allow statement; a statement left with no action is
// dropped. Tests use it to show each permission is needed.
func (p *Policy) Without(action string) *Policy {
	out := &Policy{Version: p.Version}
	for _, st := range p.Statement {
		if st.Effect == "Allow" {
			st.Action = slices.DeleteFunc(slices.Clone(st.Action), func(a string) bool { return strings.EqualFold(a, action) })
			if len(st.Action) == 0 {
				continue
			}
		}
		out.Statement = append(out.Statement, st)
	}
	return out
}

// Actions lists every action an Allow statement names, sorted, once each.
func (p *Policy) Actions() []string {
	var out []string
	for _, st := range p.Statement {
		if st.Effect == "Allow" {
			out = append(out, st.Action...)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}
