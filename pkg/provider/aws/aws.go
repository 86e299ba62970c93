// Package aws is caa's provider for Amazon EC2, built on aws-sdk-go-v2.
//
// Design choices:
//
//   - Idempotency: Create derives the RunInstances ClientToken from
//     Spec.Key ("caa-" and 40 hex digits of its SHA-256, so any key fits
//     EC2's 64 ASCII characters). When the key may have been sent before
//     (Spec.MaybeSent) it looks the instance up first by the client-token
//     filter and the caa-key tag, so a retry after a crash finds the first
//     launch with a read rather than a metered write, even if the
//     configuration changed meanwhile (EC2 answers a replayed token with
//     other parameters IdempotentParameterMismatch, which also sends a
//     fresh key's create to the lookup). A fresh key is one RunInstances.
//     Racing launches with one token get the same instance from EC2
//     itself; an instance the token returns with another pod's identity
//     tags is a conflict, never this pod's VM.
//   - Tags and names: the instance and its root volume carry spec.Tags()
//     (identity tags over the extra tags of the spec, over those of the
//     configuration) and Name = caa-<namespace>-<pod>. Long pod names are
//     shortened with a hash of the whole (provider.PodTag and
//     provider.Spec.DisplayName), so both fit EC2's 256 characters and
//     two pods never share them; nothing is cut silently. List
//     selects by tag:caa-cluster, tag:caa-node and tag:caa-managed-by and
//     follows NextToken to the end, so it needs no ledger.
//   - Deletion: TerminateInstances; the primary network interface and the
//     root volume (DeleteOnTermination, as AMIs set it) go with the
//     instance. An instance EC2 no longer knows is already deleted.
//   - Retries: the SDK's standard retryer with a few attempts
//     (--aws-max-attempts) and jittered exponential backoff, for 5xx and
//     network errors only. Every code this package classifies (throttling,
//     capacity, quota, auth, not found, bad spec, conflict) is returned at
//     once: throttling goes to the reconciler's own token bucket with the
//     Retry-After the cloud sent, and the client-side retry quota is off so
//     it never masks the cloud's answer. RunInstances is safe to retry
//     because of its ClientToken. Get never retries NotFound.
//   - Deadlines: every EC2 call runs under its own deadline, its SDK
//     retries included: Config.ReadTimeout for each DescribeInstances page
//     (30s by default), Config.WriteTimeout for RunInstances and
//     TerminateInstances (2m), so a cloud that stops answering costs a
//     transient context.DeadlineExceeded, never a hung reconcile.
//   - Credentials: only the SDK's default chain (environment, shared files,
//     web identity for IRSA, container credentials for EKS Pod Identity,
//     instance metadata), which renews expiring keys by itself. The
//     provider never holds, logs or echoes them; user data is
//     base64-encoded into the request and appears nowhere else. A token
//     the route refuses (STS, the Pod Identity agent) is ErrAuth.
//   - Permissions: exactly deploy/overlays/aws/iam-policy.json (PolicyFile).
//     Preflight (preflight.go) checks them with DryRun calls before the
//     daemon touches a pod, and every authorization failure names the EC2
//     action it was for.
package aws

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"

	"github.com/caa-project/caa/pkg/provider"
)

// Name is the provider's name in the ledger and in errors.
const Name = "aws"

// Operation names in errors, as the provider interface names them.
const (
	opCreate = "create"
	opGet    = "get"
	opList   = "list"
	opDelete = "delete"
)

const (
	// imdsHopLimit lets containers inside the VM reach IMDSv2 through one
	// extra network hop.
	imdsHopLimit = 2
	// pageSize is EC2's largest DescribeInstances page.
	pageSize = 1000
)

// ec2API is the part of the EC2 client the provider uses, so that unit
// tests can stand a fake in.
type ec2API interface {
	RunInstances(ctx context.Context, in *ec2.RunInstancesInput, opts ...func(*ec2.Options)) (*ec2.RunInstancesOutput, error)
	DescribeInstances(ctx context.Context, in *ec2.DescribeInstancesInput, opts ...func(*ec2.Options)) (*ec2.DescribeInstancesOutput, error)
	TerminateInstances(ctx context.Context, in *ec2.TerminateInstancesInput, opts ...func(*ec2.Options)) (*ec2.TerminateInstancesOutput, error)
}

// Provider is the EC2 provider. It is safe for concurrent use.
type Provider struct {
	cfg Config
	api ec2API
}

var _ provider.Provider = (*Provider)(nil)

// New validates cfg and builds an EC2 client from the SDK's default
// configuration chain, with cfg's region, endpoint and retry policy.
func New(ctx context.Context, cfg Config) (*Provider, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	client, err := newClient(ctx, cfg)
	if err != nil {
		return nil, err
	}
	return &Provider{cfg: cfg, api: client}, nil
}

// readCtx and writeCtx bound one EC2 call (see Config.ReadTimeout).
func (p *Provider) readCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return provider.CallContext(ctx, p.cfg.ReadTimeout, provider.DefaultReadTimeout)
}

func (p *Provider) writeCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return provider.CallContext(ctx, p.cfg.WriteTimeout, provider.DefaultWriteTimeout)
}

// Name is "aws".
func (p *Provider) Name() string { return Name }

// Create launches the VM for spec, or returns the one an earlier call with
// the same key launched. Empty instance type or image fall back to the
// configured defaults.
func (p *Provider) Create(ctx context.Context, spec provider.Spec) (provider.VM, error) {
	if spec.InstanceType == "" {
		spec.InstanceType = p.cfg.InstanceType
	}
	if spec.Image == "" {
		spec.Image = p.cfg.Image
	}
	if err := spec.Validate(); err != nil {
		return provider.VM{}, fmt.Errorf("%s %s: %w", Name, opCreate, err)
	}
	if n := len(spec.UserData); n > maxUserData {
		return provider.VM{}, fmt.Errorf("%s %s: %w: user data is %d bytes, EC2 takes at most %d (16 KB before base64)", Name, opCreate, provider.ErrInvalidSpec, n, maxUserData)
	}
	if spec.TEE.Confidential() && spec.TEE != provider.TEESEVSNP {
		return provider.VM{}, fmt.Errorf("%s %s: %w: EC2 offers no %s VM (only sev-snp)", Name, opCreate, provider.ErrInvalidSpec, spec.TEE)
	}
	tags := instanceTags(p.cfg.ExtraTags, spec)
	if err := checkTags(tags); err != nil {
		return provider.VM{}, fmt.Errorf("%s %s: %w", Name, opCreate, err)
	}
	token := clientToken(spec.Key)
	if spec.MaybeSent {
		if vm, ok, err := p.findByToken(ctx, token, spec); err != nil || ok {
			return vm, err
		}
	}
	wctx, cancel := p.writeCtx(ctx)
	defer cancel()
	out, err := p.api.RunInstances(wctx, p.runInput(spec, token, tags))
	if err != nil {
		cerr := classify(opCreate, err)
		var pe *provider.Error
		if !spec.MaybeSent && errors.As(cerr, &pe) && pe.Code == codeParameterMismatch {
			// The token launched an instance after all, with other
			// parameters (a ledger rebuilt, a configuration changed, or
			// someone else's launch): the lookup decides whether it is
			// this pod's VM.
			if vm, ok, ferr := p.findByToken(ctx, token, spec); ferr != nil || ok {
				return vm, ferr
			}
		}
		return provider.VM{}, cerr
	}
	if len(out.Instances) != 1 {
		return provider.VM{}, fmt.Errorf("%s %s: RunInstances returned %d instances for key %s, want 1", Name, opCreate, len(out.Instances), spec.Key)
	}
	vm := toVM(out.Instances[0])
	// A replayed token answers with the instance it launched first, tags
	// and all: one that is not this pod's is left alone, as findByToken
	// leaves it.
	if _, tagged := vm.Tags[provider.TagKey]; tagged {
		if diff := ownerMismatch(vm.Owner(), spec); diff != "" {
			return provider.VM{}, tokenMismatch(vm.ID, spec.Key, diff)
		}
	}
	return vm, nil
}

func (p *Provider) runInput(spec provider.Spec, token string, instanceTags map[string]string) *ec2.RunInstancesInput {
	tags := ec2Tags(instanceTags)
	in := &ec2.RunInstancesInput{
		ImageId:      awssdk.String(spec.Image),
		InstanceType: types.InstanceType(spec.InstanceType),
		MinCount:     awssdk.Int32(1),
		MaxCount:     awssdk.Int32(1),
		ClientToken:  awssdk.String(token),
		CpuOptions:   cpuOptions(spec.TEE),
		SubnetId:     awssdk.String(p.cfg.SubnetID),
		MetadataOptions: &types.InstanceMetadataOptionsRequest{
			HttpTokens:              types.HttpTokensStateRequired,
			HttpEndpoint:            types.InstanceMetadataEndpointStateEnabled,
			HttpPutResponseHopLimit: awssdk.Int32(imdsHopLimit),
		},
		TagSpecifications: []types.TagSpecification{
			{ResourceType: types.ResourceTypeInstance, Tags: tags},
			{ResourceType: types.ResourceTypeVolume, Tags: tags},
		},
	}
	if len(p.cfg.SecurityGroupIDs) > 0 {
		in.SecurityGroupIds = p.cfg.SecurityGroupIDs
	}
	if len(spec.UserData) > 0 {
		in.UserData = awssdk.String(base64.StdEncoding.EncodeToString(spec.UserData))
	}
	return in
}

// findByToken looks for an instance an earlier Create launched with token.
// The client token is derived from the key alone, and whoever holds the
// node's credential can launch an instance with it (and the key tag, which
// the pod's UID and attempt make readable on its VMs): so a found instance
// is taken only when its cluster, node and pod tags are spec's too. Any
// other is a conflict naming what differed; it is neither adopted nor
// deleted.
func (p *Provider) findByToken(ctx context.Context, token string, spec provider.Spec) (provider.VM, bool, error) {
	var found *provider.VM
	err := p.describe(ctx, opCreate, []types.Filter{
		{Name: awssdk.String("client-token"), Values: []string{token}},
		{Name: awssdk.String("tag:" + provider.TagKey), Values: []string{spec.Key}},
	}, func(vm provider.VM) bool {
		found = &vm
		return false
	})
	if err != nil || found == nil {
		return provider.VM{}, false, err
	}
	if diff := ownerMismatch(found.Owner(), spec); diff != "" {
		return provider.VM{}, false, tokenMismatch(found.ID, spec.Key, diff)
	}
	return *found, true, nil
}

// tokenMismatch is the conflict of an instance with key's client token
// whose identity tags differ from the spec's as diff says.
func tokenMismatch(id, key, diff string) error {
	return &provider.Error{Kind: provider.ErrConflict, Provider: Name, Op: opCreate, Code: codeTokenMismatch, Message: fmt.Sprintf(
		"instance %s carries the client token of key %s but %s; it is not this pod's VM and is left alone (neither adopted nor deleted)",
		id, key, diff)}
}

// codeParameterMismatch is EC2's answer to a client token replayed with
// other launch parameters.
const codeParameterMismatch = "IdempotentParameterMismatch"

// codeTokenMismatch is caa's code for an instance found by client token
// whose identity tags are not the spec's.
const codeTokenMismatch = "ClientTokenTagMismatch"

// ownerMismatch says which of the identity tags of an instance differ
// from spec's, or "" when none does.
func ownerMismatch(o provider.Owner, spec provider.Spec) string {
	var diffs []string
	for _, c := range []struct{ tag, got, want string }{
		{provider.TagCluster, o.Cluster, spec.Cluster},
		{provider.TagNode, o.Node, spec.Node},
		{provider.TagPodUID, o.PodUID, spec.PodUID},
		{provider.TagPod, o.Pod, provider.PodTag(spec.PodNamespace, spec.PodName)},
	} {
		if c.got != c.want {
			diffs = append(diffs, fmt.Sprintf("tag %s is %q, want %q", c.tag, c.got, c.want))
		}
	}
	if !o.Managed {
		diffs = append(diffs, fmt.Sprintf("tag %s is not %q", provider.TagManagedBy, provider.ManagedByValue))
	}
	return strings.Join(diffs, "; ")
}

// Get describes one instance. EC2 answers InvalidInstanceID.NotFound for an
// id it does not know, including one it has not made visible yet.
func (p *Provider) Get(ctx context.Context, id string) (provider.VM, error) {
	ctx, cancel := p.readCtx(ctx)
	defer cancel()
	out, err := p.api.DescribeInstances(ctx, &ec2.DescribeInstancesInput{InstanceIds: []string{id}})
	if err != nil {
		return provider.VM{}, classify(opGet, err)
	}
	for _, r := range out.Reservations {
		for _, in := range r.Instances {
			if awssdk.ToString(in.InstanceId) == id {
				return toVM(in), nil
			}
		}
	}
	return provider.VM{}, &provider.Error{
		Kind: provider.ErrNotFound, Provider: Name, Op: opGet, Code: codeNotInResponse,
		Message: "DescribeInstances answered without instance " + id,
	}
}

// List returns every instance tagged for sel's cluster and node, page by
// page to the end.
func (p *Provider) List(ctx context.Context, sel provider.Selector) ([]provider.VM, error) {
	if sel.Cluster == "" || sel.Node == "" {
		return nil, fmt.Errorf("%s %s: the selector needs both a cluster and a node, got %+v", Name, opList, sel)
	}
	var vms []provider.VM
	err := p.describe(ctx, opList, []types.Filter{
		{Name: awssdk.String("tag:" + provider.TagCluster), Values: []string{sel.Cluster}},
		{Name: awssdk.String("tag:" + provider.TagNode), Values: []string{sel.Node}},
		{Name: awssdk.String("tag:" + provider.TagManagedBy), Values: []string{provider.ManagedByValue}},
	}, func(vm provider.VM) bool {
		vms = append(vms, vm)
		return true
	})
	if err != nil {
		return nil, err
	}
	return vms, nil
}

// describe pages through DescribeInstances with filters, handing each
// instance to yield until it returns false.
func (p *Provider) describe(ctx context.Context, op string, filters []types.Filter, yield func(provider.VM) bool) error {
	pages := ec2.NewDescribeInstancesPaginator(p.api, &ec2.DescribeInstancesInput{
		Filters: filters, MaxResults: awssdk.Int32(pageSize),
	})
	for pages.HasMorePages() {
		pctx, cancel := p.readCtx(ctx)
		page, err := pages.NextPage(pctx)
		cancel()
		if err != nil {
			return classify(op, err)
		}
		for _, r := range page.Reservations {
			for _, in := range r.Instances {
				if !yield(toVM(in)) {
					return nil
				}
			}
		}
	}
	return nil
}

// Delete terminates the instance; nil when EC2 no longer knows it.
func (p *Provider) Delete(ctx context.Context, id string) error {
	ctx, cancel := p.writeCtx(ctx)
	defer cancel()
	_, err := p.api.TerminateInstances(ctx, &ec2.TerminateInstancesInput{InstanceIds: []string{id}})
	if err == nil {
		return nil
	}
	if err := classify(opDelete, err); !errors.Is(err, provider.ErrNotFound) {
		return err
	}
	return nil
}

// maxUserData is EC2's cap on user data: 16 KB before base64 encoding
// (RunInstances' UserData parameter; the EC2 User Guide, "Run commands
// when you launch an EC2 instance with user data input").
const maxUserData = 16 << 10

var _ provider.UserDataLimited = (*Provider)(nil)

// UserDataLimit is EC2's cap, for provider.UserDataLimited.
func (p *Provider) UserDataLimit() int { return maxUserData }
