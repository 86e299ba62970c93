package aws

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/aws/smithy-go"

	"github.com/caa-project/caa/pkg/provider"
)

const (
	opPreflight = "preflight"
	// codeDryRunOK is EC2's answer to an allowed call made with DryRun.
	codeDryRunOK = "DryRunOperation"
	// preflightValue fills caa's identity tags in the dry-run launch: the
	// provider does not know the cluster id, and the policy asks only that
	// the tags be there (caa-managed-by=caa, caa-cluster and caa-node set).
	preflightValue = "caa-preflight"
)

var _ provider.Preflighter = (*Provider)(nil)

// Preflight checks, without changing anything, what every later call
// needs: ec2:DescribeInstances (a one-page read of caa's own instances),
// ec2:RunInstances with DryRun and exactly what a launch sends (the
// configured subnet, security groups, image and instance type, caa's tags
// on the instance and volume, so the ec2:CreateTags permission at launch
// and the tag conditions are checked too), and ec2:TerminateInstances with
// DryRun on one of caa's own instances, when the read found one (EC2
// authorizes a terminate against the instance's tags, so a made-up id
// could never pass a tag-scoped policy). EC2 answers an allowed dry run
// DryRunOperation and a denied one UnauthorizedOperation.
//
// A denied call is an error wrapping provider.ErrAuth that names the
// action; a subnet, security group, image or instance type EC2 does not
// know is one wrapping provider.ErrInvalidSpec that names the setting.
// Without a configured image and instance type the launch is not checked
// (pods must then name theirs, and a made-up default could be refused for
// reasons of its own), nor the terminate without an instance of caa's.
//
// The read and the launch go out together, so a start waits two round
// trips for the checks, not three.
func (p *Provider) Preflight(ctx context.Context) error {
	launched := make(chan error, 1)
	if p.cfg.Image != "" && p.cfg.InstanceType != "" {
		go func() { launched <- p.preflightLaunch(ctx) }()
	} else {
		launched <- nil
	}
	victim, readErr := p.preflightRead(ctx)
	launchErr := <-launched
	if readErr != nil {
		return readErr
	}
	if launchErr != nil {
		return launchErr
	}
	if victim != "" {
		if err := p.preflightTerminate(ctx, victim); err != nil {
			return err
		}
	}
	return nil
}

// preflightRead reads one page of caa's instances and returns the id of
// one that is not terminated, if any.
func (p *Provider) preflightRead(ctx context.Context) (string, error) {
	rctx, cancel := p.readCtx(ctx)
	defer cancel()
	out, err := p.api.DescribeInstances(rctx, &ec2.DescribeInstancesInput{
		Filters: []types.Filter{
			{Name: awssdk.String("tag:" + provider.TagManagedBy), Values: []string{provider.ManagedByValue}},
			{Name: awssdk.String("instance-state-name"), Values: []string{"pending", "running", "stopping", "stopped"}},
		},
		MaxResults: awssdk.Int32(5),
	})
	if err != nil {
		return "", preflightError("DescribeInstances", "reading caa's instances", "", err)
	}
	for _, r := range out.Reservations {
		for _, in := range r.Instances {
			if id := awssdk.ToString(in.InstanceId); id != "" {
				return id, nil
			}
		}
	}
	return "", nil
}

// preflightLaunch is RunInstances with DryRun: what Create would send for
// a pod that names neither image nor type.
func (p *Provider) preflightLaunch(ctx context.Context) error {
	spec := provider.Spec{
		Key: preflightValue, Cluster: preflightValue, Node: preflightValue, PodUID: preflightValue,
		PodNamespace: preflightValue, PodName: preflightValue,
		InstanceType: p.cfg.InstanceType, Image: p.cfg.Image,
	}
	in := p.runInput(spec, "", instanceTags(p.cfg.ExtraTags, spec))
	in.ClientToken = nil
	in.DryRun = awssdk.Bool(true)
	wctx, cancel := p.writeCtx(ctx)
	defer cancel()
	_, err := p.api.RunInstances(wctx, in)
	return preflightError("RunInstances", "a dry-run launch with caa's tags", p.settingOf(err), err)
}

// preflightTerminate is TerminateInstances with DryRun on one of caa's
// instances: nothing is terminated.
func (p *Provider) preflightTerminate(ctx context.Context, id string) error {
	wctx, cancel := p.writeCtx(ctx)
	defer cancel()
	_, err := p.api.TerminateInstances(wctx, &ec2.TerminateInstancesInput{InstanceIds: []string{id}, DryRun: awssdk.Bool(true)})
	var apiErr smithy.APIError
	if errors.As(err, &apiErr) && kindOf(apiErr.ErrorCode()) == provider.ErrNotFound {
		// Gone since the read: nothing to learn, nothing wrong.
		return nil
	}
	return preflightError("TerminateInstances", "a dry-run terminate of caa's instance "+id, "", err)
}

// zoneInMessage finds the zone in EC2's Unsupported message, which names
// it as "Availability Zone (us-east-1e)".
var zoneInMessage = regexp.MustCompile(`Availability Zone \(([a-z0-9-]+)\)`)

// settingOf names the setting behind an EC2 code that refuses a
// configured value of a launch, or "" for any other error.
func (p *Provider) settingOf(err error) string {
	var apiErr smithy.APIError
	if !errors.As(err, &apiErr) {
		return ""
	}
	code := apiErr.ErrorCode()
	switch {
	case strings.HasPrefix(code, "InvalidSubnetID."):
		return fmt.Sprintf("check %s (%q)", setSubnet.both(), p.cfg.SubnetID)
	case strings.HasPrefix(code, "InvalidGroup"):
		return fmt.Sprintf("check %s (%q)", setGroups.both(), strings.Join(p.cfg.SecurityGroupIDs, ","))
	case strings.HasPrefix(code, "InvalidAMIID."):
		return fmt.Sprintf("check %s (%q)", setImage.both(), p.cfg.Image)
	case code == "InvalidParameterValue":
		return fmt.Sprintf("check %s (%q) and the other launch settings", setInstanceType.both(), p.cfg.InstanceType)
	case code == "Unsupported":
		zone := "the zone of " + p.cfg.SubnetID
		if m := zoneInMessage.FindStringSubmatch(apiErr.ErrorMessage()); m != nil {
			zone = "zone " + m[1] + " (of " + p.cfg.SubnetID + ")"
		}
		return fmt.Sprintf("EC2 does not offer %s (%q) in %s: choose a type offered there, or a subnet in another zone (%s)",
			setInstanceType.both(), p.cfg.InstanceType, zone, setSubnet.both())
	}
	return ""
}

// preflightError turns the answer to one dry run or read into Preflight's
// error: nil for success and for DryRunOperation, else the classified
// error with what was checked (and the setting to fix, if known) in front.
func preflightError(action, what, setting string, err error) error {
	if err == nil {
		return nil
	}
	var apiErr smithy.APIError
	if errors.As(err, &apiErr) && apiErr.ErrorCode() == codeDryRunOK {
		return nil
	}
	if setting != "" {
		what += "; " + setting
	}
	return fmt.Errorf("%w (preflight check of ec2:%s: %s)", classify(opPreflight, err), action, what)
}
