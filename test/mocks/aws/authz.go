package ec2fake

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"slices"
)

// Defaults EC2 fills in when a launch names no subnet or security group:
// the authorization still covers them, as EC2's does.
const (
	defaultSubnet = "subnet-00000000000000def"
	defaultGroup  = "sg-00000000000000def"
)

// check is one (action, resource, context) question a call asks of the
// policy. A call is allowed only when every one of its checks is.
type check struct {
	action   string
	resource string
	context  map[string][]string
}

func (c caller) arn(resource string) string {
	return fmt.Sprintf("arn:aws:ec2:%s:%s:%s", c.region, ownerID, resource)
}

// imageARN is an AMI's ARN: images have no account in theirs.
func (c caller) imageARN(id string) string {
	return fmt.Sprintf("arn:aws:ec2:%s::image/%s", c.region, id)
}

// tagContext is the context of tags a request sets (aws:RequestTag/k and
// aws:TagKeys) or a resource carries (aws:ResourceTag/k, and EC2's own
// ec2:ResourceTag/k).
func tagContext(tags map[string]string, request bool) map[string][]string {
	ctx := map[string][]string{}
	for _, k := range slices.Sorted(maps.Keys(tags)) {
		if request {
			ctx["aws:RequestTag/"+k] = []string{tags[k]}
			ctx["aws:TagKeys"] = append(ctx["aws:TagKeys"], k)
		} else {
			ctx["aws:ResourceTag/"+k] = []string{tags[k]}
			ctx["ec2:ResourceTag/"+k] = []string{tags[k]}
		}
	}
	return ctx
}

// runChecks are the questions of one RunInstances: RunInstances on the new
// instance, volume and network interface and on the subnet, security
// groups and image it uses, and CreateTags (with ec2:CreateAction) on each
// resource it tags at launch, as EC2 asks them.
func runChecks(c caller, q query, tags map[string]map[string]string) []check {
	run := func(resource string, ctx map[string][]string) check {
		if ctx == nil {
			ctx = map[string][]string{}
		}
		ctx["aws:RequestedRegion"] = []string{c.region}
		return check{"ec2:RunInstances", resource, ctx}
	}
	instance := tagContext(tags["instance"], true)
	instance["ec2:InstanceType"] = []string{q.get("InstanceType")}
	checks := []check{
		run(c.arn("instance/*"), instance),
		run(c.arn("volume/*"), tagContext(tags["volume"], true)),
		run(c.arn("network-interface/*"), nil),
	}
	subnet := q.get("SubnetId")
	if subnet == "" {
		subnet = defaultSubnet
	}
	checks = append(checks, run(c.arn("subnet/"+subnet), nil))
	groups := q.list("SecurityGroupId")
	if len(groups) == 0 {
		groups = []string{defaultGroup}
	}
	for _, g := range groups {
		checks = append(checks, run(c.arn("security-group/"+g), nil))
	}
	checks = append(checks, run(c.imageARN(q.get("ImageId")), nil))
	for _, rt := range []string{"instance", "volume"} {
		if _, tagged := tags[rt]; !tagged {
			continue
		}
		ctx := tagContext(tags[rt], true)
		ctx["ec2:CreateAction"] = []string{"RunInstances"}
		ctx["aws:RequestedRegion"] = []string{c.region}
		checks = append(checks, check{"ec2:CreateTags", c.arn(rt + "/*"), ctx})
	}
	return checks
}

// authorize asks the policy every check of a call, in order, and answers
// the first one it does not allow with EC2's UnauthorizedOperation.
func (s *server) authorize(c caller, checks []check) *apiError {
	if s.policy == nil {
		return nil
	}
	p := s.policy()
	if p == nil {
		return nil
	}
	for _, ch := range checks {
		d := p.Evaluate(Request{Action: ch.action, Resource: ch.resource, Context: ch.context})
		if !d.Allowed {
			return unauthorized(c, ch, d)
		}
	}
	return nil
}

// unauthorized is EC2's 403 for a denied call. The message names the
// caller, the action and the resource, as EC2's does, and ends with the
// encoded authorization failure message, which real EC2 encrypts (sts
// decode-authorization-message reads it) and the fake only base64-encodes:
// the decision, the statement that made it, and the request's context.
func unauthorized(c caller, ch check, d Decision) *apiError {
	why := "because no identity-based policy allows the " + ch.action + " action"
	if d.ExplicitDeny {
		why = "with an explicit deny in an identity-based policy"
	}
	detail, _ := json.Marshal(map[string]any{
		"allowed": false, "explicitDeny": d.ExplicitDeny, "matchedStatement": d.Statement,
		"context": map[string]any{"principal": c.principal, "action": ch.action, "resource": ch.resource, "conditions": ch.context},
	})
	return &apiError{http.StatusForbidden, "UnauthorizedOperation", fmt.Sprintf(
		"You are not authorized to perform this operation. User: %s is not authorized to perform: %s on resource: %s %s. Encoded authorization failure message: %s",
		c.principal, ch.action, ch.resource, why, base64.RawURLEncoding.EncodeToString(detail))}
}

// dryRun reads the DryRun parameter.
func dryRun(q query) (bool, *apiError) {
	v, ok := q["DryRun"]
	if !ok {
		return false, nil
	}
	switch v[0] {
	case "true":
		return true, nil
	case "false":
		return false, nil
	}
	return false, invalidValue("Value (%s) for parameter DryRun is invalid. Expecting true or false.", v[0])
}

// dryRunOK is EC2's answer to an allowed call made with DryRun.
var dryRunOK = &apiError{http.StatusPreconditionFailed, "DryRunOperation", "Request would have succeeded, but DryRun flag is set."}
