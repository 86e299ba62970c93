package azure

import "github.com/caa-project/caa/pkg/provider"

// NodeConfig is the settings every create of this node shares beyond the
// pod's size and image: where the VM goes (subscription, group, location,
// zone), its network (subnet, security group), its OS profile's user and
// the tags. A refused spec is remembered with it, so a change of any of
// them retries what Azure refused.
func (p *Provider) NodeConfig() string {
	return provider.NodeConfigText(map[string]string{
		"subscription": p.cfg.SubscriptionID, "group": p.cfg.ResourceGroup, "location": p.cfg.Location,
		"zone": p.cfg.Zone, "subnet": p.cfg.SubnetID, "securityGroup": p.cfg.SecurityGroupID,
		"adminUsername": p.cfg.AdminUsername,
	}, p.cfg.Tags)
}
