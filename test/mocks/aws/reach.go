package ec2fake

import "slices"

// DefaultGroup is the id of the VPC's default security group in the fake.
// A launch that names no security group goes into it, as on EC2
// (RunInstances' SecurityGroupId: "If you don't specify a security group,
// we use the default security group for the VPC").
const DefaultGroup = "sg-0defa0000000000aa"

// unreachableDefaultGroup is why an instance in the default group only
// never answers the worker. The default group's inbound rules admit only
// its own members (EC2 User Guide, "Default security groups for your
// VPCs"); the worker node is not one, so its TCP 15150
// (agent-protocol-forwarder) and UDP 4789 (VXLAN) never arrive.
const unreachableDefaultGroup = "in the VPC's default security group only, whose inbound rules admit only its own members: " +
	"the worker reaches neither TCP 15150 (agent-protocol-forwarder) nor UDP 4789 (VXLAN)"

// WithDefaultGroup renames the VPC's default security group (default
// DefaultGroup). It is always a known group, WithNetwork or not.
func WithDefaultGroup(id string) Option {
	return func(s *server) { s.defaultGroup = id }
}

// reach puts a launch that names no group into the default group and says
// whether the worker can reach the instance: not when all its groups are
// the default group. The fake's worker is in none of the groups, and any
// group other than the default one stands for a group whose rules admit
// the worker (the one upstream and caa take from the worker's own
// interface admits it by a self-reference, or the operator's own).
func (s *server) reach(l *launch) (unreachable string) {
	if len(l.groups) == 0 {
		l.groups = []string{s.defaultGroup}
	}
	if !slices.ContainsFunc(l.groups, func(g string) bool { return g != s.defaultGroup }) {
		return unreachableDefaultGroup
	}
	return ""
}
