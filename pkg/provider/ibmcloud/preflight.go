package ibmcloud

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"

	"github.com/IBM/go-sdk-core/v5/core"
	"github.com/IBM/platform-services-go-sdk/globalsearchv2"
	"github.com/IBM/platform-services-go-sdk/globaltaggingv1"
	"github.com/IBM/vpc-go-sdk/vpcv1"

	"github.com/caa-project/caa/pkg/provider"
)

const (
	opPreflight = "preflight"
	// policyFile is where the access policies caa needs are written down.
	policyFile = "deploy/overlays/ibmcloud/access-policies.json"
)

// defaultCRTokenFiles are where the SDK's ContainerAuthenticator looks for
// the compute-resource token when IBMCLOUD_CR_TOKEN_FILENAME is not set,
// in its order; the second is where IBM's Kubernetes service projects it.
var defaultCRTokenFiles = []string{
	"/var/run/secrets/tokens/vault-token",
	"/var/run/secrets/tokens/sa-token",
	"/var/run/secrets/codeengine.cloud.ibm.com/compute-resource-token/token",
}

func readable(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	_ = f.Close()
	return true
}

var _ provider.Preflighter = (*Provider)(nil)

// Preflight checks, with reads only, what every later call needs:
//
//   - on the trusted-profile route, that the compute-resource token file
//     can be read (ErrAuth naming the file and IBMCLOUD_CR_TOKEN_FILENAME);
//   - the subnet (GET /subnets/{id}), and that it lies in the configured
//     VPC; the VPC (the configured one, else the subnet's); each security
//     group; the configured image;
//   - one page of the instances of the resource group, and of volumes: the
//     reads List and Get make (is.instance.instance.list, is.volume.volume.list);
//   - one Global Search query, for the endpoint and the token;
//   - one page of one user tag from Global Tagging, where Create and List
//     attach the instances' tags (--ibmcloud-tagging-endpoint, else the
//     one beside the search endpoint): its endpoint and that it takes the
//     token. Attaching needs the Editor role on the instance, which no
//     read can show before an instance exists; without it the instance
//     is still found by its boot volume, and the refusal is logged at
//     each create.
//
// The checks go out together. The token exchange happens with them, so a trusted
// profile IAM refuses, or an API key it does not know, fails here too. A
// 403 is an error wrapping provider.ErrAuth that names the IAM action and
// the resource; a 404 is one wrapping provider.ErrInvalidSpec that names
// the setting to fix. A refusal of the instance create itself (the
// operate actions on the subnet, security groups and VPC, the create
// actions, Viewer on the resource group) cannot be read without making
// something, and shows at the first create, with the action VPC names.
func (p *Provider) Preflight(ctx context.Context) error {
	if len(p.crTokenFiles) > 0 && !slices.ContainsFunc(p.crTokenFiles, readable) {
		_, err := os.Stat(p.crTokenFiles[0])
		return &provider.Error{Kind: provider.ErrAuth, Provider: providerName, Op: opPreflight, Code: "cr_token_unreadable",
			Message: fmt.Sprintf("the trusted profile's compute-resource token file %s (%s) cannot be read: mount the projected ServiceAccount token there (deploy/overlays/ibmcloud-trusted-profile)",
				strings.Join(p.crTokenFiles, " or "), EnvCRTokenFile), Err: err}
	}
	// The checks go out together (the SDK makes one token exchange for
	// them all), so a start waits about two round trips, not one per
	// check; the first failure in this order is the one reported.
	checks := []func(context.Context) error{p.preflightNetwork}
	if p.cfg.VPCID != "" {
		checks = append(checks, func(ctx context.Context) error { return p.preflightVPC(ctx, p.cfg.VPCID, "--ibmcloud-vpc-id") })
	}
	for _, id := range p.cfg.SecurityGroupIDs {
		checks = append(checks, func(ctx context.Context) error {
			_, err := read(ctx, p, "is.security-group.security-group.read", "security group "+id, "--ibmcloud-security-group-ids",
				func(ctx context.Context) (*vpcv1.SecurityGroup, *core.DetailedResponse, error) {
					return p.api.GetSecurityGroupWithContext(ctx, &vpcv1.GetSecurityGroupOptions{ID: ptr(id)})
				})
			return err
		})
	}
	if p.cfg.Image != "" {
		checks = append(checks, func(ctx context.Context) error {
			_, err := read(ctx, p, "is.image.image.read", "image "+p.cfg.Image, "--ibmcloud-image",
				func(ctx context.Context) (*vpcv1.Image, *core.DetailedResponse, error) {
					return p.api.GetImageWithContext(ctx, &vpcv1.GetImageOptions{ID: ptr(p.cfg.Image)})
				})
			return err
		})
	}
	checks = append(checks, p.preflightListings, p.preflightVolumes, p.preflightSearch, p.preflightTagging)
	errs := make([]error, len(checks))
	var wg sync.WaitGroup
	for i, check := range checks {
		wg.Go(func() { errs[i] = check(ctx) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// preflightNetwork reads the subnet, checks it lies in the configured
// VPC, and reads the subnet's VPC when none is configured.
func (p *Provider) preflightNetwork(ctx context.Context) error {
	sub, err := read(ctx, p, "is.subnet.subnet.read", "subnet "+p.cfg.SubnetID, "--ibmcloud-subnet-id",
		func(ctx context.Context) (*vpcv1.Subnet, *core.DetailedResponse, error) {
			return p.api.GetSubnetWithContext(ctx, &vpcv1.GetSubnetOptions{ID: ptr(p.cfg.SubnetID)})
		})
	if err != nil {
		return err
	}
	if sub.VPC == nil || sub.VPC.ID == nil {
		return nil
	}
	switch vpc := *sub.VPC.ID; {
	case p.cfg.VPCID == "":
		return p.preflightVPC(ctx, vpc, "--ibmcloud-subnet-id (its VPC)")
	case p.cfg.VPCID != vpc:
		return preflightSpec(fmt.Sprintf("--ibmcloud-subnet-id %s is in VPC %s, not in --ibmcloud-vpc-id %s", p.cfg.SubnetID, vpc, p.cfg.VPCID), nil)
	}
	return nil
}

func (p *Provider) preflightVPC(ctx context.Context, id, setting string) error {
	_, err := read(ctx, p, "is.vpc.vpc.read", "VPC "+id, setting,
		func(ctx context.Context) (*vpcv1.VPC, *core.DetailedResponse, error) {
			return p.api.GetVPCWithContext(ctx, &vpcv1.GetVPCOptions{ID: ptr(id)})
		})
	return err
}

// preflightListings reads one page of the resource group's instances, and
// preflightVolumes one of volumes: the list actions List and Create's
// lookup need.
func (p *Provider) preflightListings(ctx context.Context) error {
	instances := &vpcv1.ListInstancesOptions{Limit: ptr(int64(1))}
	where := "instances"
	if p.cfg.ResourceGroupID != "" {
		instances.ResourceGroupID = ptr(p.cfg.ResourceGroupID)
		where = "instances in resource group " + p.cfg.ResourceGroupID
	}
	_, err := read(ctx, p, "is.instance.instance.list", where, "--ibmcloud-resource-group-id",
		func(ctx context.Context) (*vpcv1.InstanceCollection, *core.DetailedResponse, error) {
			return p.api.ListInstancesWithContext(ctx, instances)
		})
	return err
}

func (p *Provider) preflightVolumes(ctx context.Context) error {
	_, err := read(ctx, p, "is.volume.volume.list", "volumes", "",
		func(ctx context.Context) (*vpcv1.VolumeCollection, *core.DetailedResponse, error) {
			return p.api.ListVolumesWithContext(ctx, &vpcv1.ListVolumesOptions{Limit: ptr(int64(1))})
		})
	return err
}

// preflightSearch makes one Global Search query, for its endpoint and the
// token.
func (p *Provider) preflightSearch(ctx context.Context) error {
	search := &globalsearchv2.SearchOptions{Query: ptr(searchQuery(provider.Selector{Cluster: "caa-preflight", Node: "caa-preflight"})),
		Fields: searchFields, Limit: ptr(int64(1))}
	if p.cfg.AccountID != "" {
		search.AccountID = ptr(p.cfg.AccountID)
	}
	_, err := read(ctx, p, "a Global Search query", "Global Search at "+p.cfg.searchEndpoint(), "--ibmcloud-search-endpoint",
		func(ctx context.Context) (*globalsearchv2.ScanResult, *core.DetailedResponse, error) {
			return p.search.SearchWithContext(ctx, search)
		})
	return err
}

// preflightTagging lists one user tag through Global Tagging: the
// endpoint answers as Global Tagging and takes caa's token. Every failure
// names --ibmcloud-tagging-endpoint.
func (p *Provider) preflightTagging(ctx context.Context) error {
	opts := &globaltaggingv1.ListTagsOptions{TagType: ptr(globaltaggingv1.ListTagsOptionsTagTypeUserConst), Limit: ptr(int64(1))}
	if p.cfg.AccountID != "" {
		opts.AccountID = ptr(p.cfg.AccountID)
	}
	endpoint := p.cfg.taggingEndpoint()
	_, err := read(ctx, p, "a Global Tagging listing of tags", "Global Tagging at "+endpoint, "--ibmcloud-tagging-endpoint",
		func(ctx context.Context) (*globaltaggingv1.TagList, *core.DetailedResponse, error) {
			return p.tags.ListTagsWithContext(ctx, opts)
		})
	if err == nil || strings.Contains(err.Error(), "--ibmcloud-tagging-endpoint") {
		return err
	}
	var pe *provider.Error
	if !errors.As(err, &pe) {
		pe = &provider.Error{Provider: providerName, Op: opPreflight, Err: err}
	}
	fix := "set --ibmcloud-tagging-endpoint (env CAA_IBMCLOUD_TAGGING_ENDPOINT) to the Global Tagging API of the account " +
		"(https://tags.global-search-tagging.cloud.ibm.com, or tags.private. on the private network), or leave it empty to use the one beside --ibmcloud-search-endpoint"
	return &provider.Error{Kind: pe.Kind, Provider: providerName, Op: opPreflight, Code: pe.Code, Status: pe.Status, RetryAfter: pe.RetryAfter,
		Message: fmt.Sprintf("Global Tagging at %s, where caa tags its instances, cannot be used: %s: %v", endpoint, fix, err), Err: err}
}

// read makes one preflight read and turns its failure into an error that
// says what to change: the action to grant on a 403, the setting on a 404.
func read[T any](ctx context.Context, p *Provider, action, what, setting string, fn func(context.Context) (T, *core.DetailedResponse, error)) (T, error) {
	v, resp, err := call(ctx, p.cfg.ReadTimeout, provider.DefaultReadTimeout, fn)
	if err == nil {
		return v, nil
	}
	cerr := classify(opPreflight, resp, err)
	var pe *provider.Error
	errors.As(cerr, &pe)
	switch {
	case errors.Is(cerr, provider.ErrAuth) && pe.Status == 403:
		return v, &provider.Error{Kind: provider.ErrAuth, Provider: providerName, Op: opPreflight, Code: pe.Code, Status: pe.Status,
			Message: fmt.Sprintf("reading %s was refused: grant %s to caa's identity%s: %s", what, action, orFix(setting), pe.Message),
			Err:     cerr}
	case errors.Is(cerr, provider.ErrAuth):
		return v, &provider.Error{Kind: provider.ErrAuth, Provider: providerName, Op: opPreflight, Code: pe.Code, Status: pe.Status,
			Message: fmt.Sprintf("reading %s: the credentials were refused (%s): %s", what, credentialHint(), pe.Message), Err: cerr}
	case errors.Is(cerr, provider.ErrNotFound) && setting != "":
		return v, preflightSpec(fmt.Sprintf("%s does not exist, or is in another region or account: check %s", what, setting), cerr)
	}
	return v, cerr
}

// orFix says which setting names the resource, for a refusal that may as
// well be a wrong id: IAM refuses a resource no policy covers before VPC
// could say it does not exist.
func orFix(setting string) string {
	if setting == "" {
		return ""
	}
	return ", or correct " + setting + " if it names the wrong one"
}

func preflightSpec(msg string, err error) error {
	return &provider.Error{Kind: provider.ErrInvalidSpec, Provider: providerName, Op: opPreflight, Code: "not_found", Message: msg, Err: err}
}

// credentialHint names the credential route in use, for a refusal.
func credentialHint() string {
	if t := os.Getenv(EnvAuthType); t != "" {
		return fmt.Sprintf("%s=%s: check %s/%s, the profile's link to this cluster's ServiceAccount and %s",
			EnvAuthType, strings.ToLower(t), EnvProfileID, EnvProfileName, EnvCRTokenFile)
	}
	return "check the API key (--ibmcloud-api-key-file or " + EnvAPIKey + ")"
}
