package aws

import (
	"slices"
	"strings"

	"github.com/caa-project/caa/pkg/provider"
)

// NodeConfig is the launch settings every create of this node shares,
// beyond the pod's type and image: region, subnet (and so zone), security
// groups and extra tags. A refused spec is remembered with it, so a change
// of any of them retries what EC2 refused.
func (p *Provider) NodeConfig() string {
	return provider.NodeConfigText(map[string]string{
		"region": p.cfg.Region, "subnet": p.cfg.SubnetID,
		"groups": strings.Join(slices.Sorted(slices.Values(p.cfg.SecurityGroupIDs)), ","),
	}, p.cfg.ExtraTags)
}
