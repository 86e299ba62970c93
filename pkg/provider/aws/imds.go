package aws

import (
	"context"

	"fmt"
	"io"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/feature/ec2/imds"
)

// imdsTimeout bounds the whole read of the worker's metadata: off EC2 the
// service's address does not answer at all.
const imdsTimeout = 15 * time.Second

// ruleHint says what the pod VMs' security groups must admit.
const ruleHint = "groups that admit TCP 15150 (agent-protocol-forwarder) and UDP 4789 (VXLAN) from the worker nodes"

// FillFromIMDS fills the region, the subnet and the security groups the
// configuration leaves empty from the worker's own instance metadata
// (IMDSv2), as upstream's adaptor does with AWS_REGION, AWS_SUBNET_ID and
// AWS_SG_IDS unset: the region it runs in, and its primary interface's
// subnet and security groups. Without groups a VM would go into the VPC's
// default security group, which admits only its own members, so the
// worker could reach neither the VM's forwarder nor its VXLAN port.
//
// It reads nothing when all three are set. When the metadata service does
// not answer (not on EC2, AWS_EC2_METADATA_DISABLED, a hop limit of 1 in
// a pod network), the error names the flags to set. The endpoint is the
// SDK's: IMDSEndpoint, else AWS_EC2_METADATA_SERVICE_ENDPOINT, else
// 169.254.169.254.
func (c *Config) FillFromIMDS(ctx context.Context) error {
	var missing []setting
	if c.Region == "" {
		missing = append(missing, setRegion)
	}
	if c.SubnetID == "" {
		missing = append(missing, setSubnet)
	}
	if len(c.SecurityGroupIDs) == 0 {
		missing = append(missing, setGroups)
	}
	if len(missing) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, imdsTimeout)
	defer cancel()
	client := imds.New(imds.Options{}, func(o *imds.Options) {
		if c.IMDSEndpoint != "" {
			o.Endpoint, o.ClientEnableState = c.IMDSEndpoint, imds.ClientEnabled
		}
	})
	get := func(path string) (string, error) {
		out, err := client.GetMetadata(ctx, &imds.GetMetadataInput{Path: path})
		if err != nil {
			return "", fmt.Errorf("read %s: %w", path, err)
		}
		defer out.Content.Close()
		b, err := io.ReadAll(out.Content)
		if err != nil {
			return "", fmt.Errorf("read %s: %w", path, err)
		}
		v := strings.TrimSpace(string(b))
		if v == "" {
			return "", fmt.Errorf("read %s: empty", path)
		}
		return v, nil
	}
	fail := func(err error) error {
		var names []string
		for _, s := range missing {
			names = append(names, s.both())
		}
		hint := ""
		if len(c.SecurityGroupIDs) == 0 {
			hint = " (security groups: " + ruleHint + ")"
		}
		return fmt.Errorf("aws: %s not set and the worker's instance metadata did not give them: %w; set %s%s",
			strings.Join(names, ", "), err, strings.Join(names, " and "), hint)
	}
	var err error
	if c.Region == "" {
		if c.Region, err = get("placement/region"); err != nil {
			return fail(err)
		}
	}
	if c.SubnetID == "" || len(c.SecurityGroupIDs) == 0 {
		mac, err := get("mac")
		if err != nil {
			return fail(err)
		}
		iface := "network/interfaces/macs/" + mac + "/"
		if c.SubnetID == "" {
			if c.SubnetID, err = get(iface + "subnet-id"); err != nil {
				return fail(err)
			}
		}
		if len(c.SecurityGroupIDs) == 0 {
			groups, err := get(iface + "security-group-ids")
			if err != nil {
				return fail(err)
			}
			c.SecurityGroupIDs = strings.Fields(groups)
		}
	}
	if c.Logger != nil {
		c.Logger.InfoContext(ctx, "aws settings taken from the worker's instance metadata",
			"region", c.Region, "subnet", c.SubnetID, "securityGroups", strings.Join(c.SecurityGroupIDs, ","),
			"filled", strings.Join(missingNames(missing), ","))
	}
	return nil
}

func missingNames(ss []setting) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = s.flag()
	}
	return out
}
