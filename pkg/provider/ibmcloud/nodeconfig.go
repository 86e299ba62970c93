package ibmcloud

import (
	"slices"
	"strings"

	"github.com/caa-project/caa/pkg/provider"
)

// NodeConfig is the settings every create of this node shares beyond the
// pod's profile and image: region, zone, VPC, subnet, security groups,
// resource group, boot volume profile and tags. A refused spec is
// remembered with it, so a change of any of them retries what VPC refused.
func (p *Provider) NodeConfig() string {
	return provider.NodeConfigText(map[string]string{
		"region": p.cfg.Region, "zone": p.cfg.Zone, "vpc": p.cfg.VPCID, "subnet": p.cfg.SubnetID,
		"groups":        strings.Join(slices.Sorted(slices.Values(p.cfg.SecurityGroupIDs)), ","),
		"resourceGroup": p.cfg.ResourceGroupID, "bootVolumeProfile": p.cfg.BootVolumeProfile,
	}, p.cfg.Tags)
}
