package ibmcloud

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/IBM/go-sdk-core/v5/core"
	"github.com/IBM/platform-services-go-sdk/globalsearchv2"
	"github.com/IBM/platform-services-go-sdk/globaltaggingv1"
	"github.com/IBM/vpc-go-sdk/vpcv1"

	"github.com/caa-project/caa/pkg/provider"
)

const providerName = "ibmcloud"

// MaxUserData is the most user data VPC takes for an instance: "The size
// limit of the User Data field (or file) is 64 K bytes" (IBM Cloud docs,
// VPC, "User data"). Create refuses more before any call.
const MaxUserData = 64 << 10

// UserDataLimit is MaxUserData (provider.UserDataLimited): a sandbox
// whose user data would pass it drops the pull credentials first.
func (p *Provider) UserDataLimit() int { return MaxUserData }

// vpcAPI is the part of vpcv1.VpcV1 the provider uses, so a test can stand
// in for it.
type vpcAPI interface {
	CreateInstanceWithContext(context.Context, *vpcv1.CreateInstanceOptions) (*vpcv1.Instance, *core.DetailedResponse, error)
	GetInstanceWithContext(context.Context, *vpcv1.GetInstanceOptions) (*vpcv1.Instance, *core.DetailedResponse, error)
	ListInstancesWithContext(context.Context, *vpcv1.ListInstancesOptions) (*vpcv1.InstanceCollection, *core.DetailedResponse, error)
	DeleteInstanceWithContext(context.Context, *vpcv1.DeleteInstanceOptions) (*core.DetailedResponse, error)
	GetVolumeWithContext(context.Context, *vpcv1.GetVolumeOptions) (*vpcv1.Volume, *core.DetailedResponse, error)
	// Preflight's reads of what the configuration names.
	GetSubnetWithContext(context.Context, *vpcv1.GetSubnetOptions) (*vpcv1.Subnet, *core.DetailedResponse, error)
	GetVPCWithContext(context.Context, *vpcv1.GetVPCOptions) (*vpcv1.VPC, *core.DetailedResponse, error)
	GetSecurityGroupWithContext(context.Context, *vpcv1.GetSecurityGroupOptions) (*vpcv1.SecurityGroup, *core.DetailedResponse, error)
	GetImageWithContext(context.Context, *vpcv1.GetImageOptions) (*vpcv1.Image, *core.DetailedResponse, error)
	ListVolumesWithContext(context.Context, *vpcv1.ListVolumesOptions) (*vpcv1.VolumeCollection, *core.DetailedResponse, error)
	// The SDK's pagers, which follow the collections' next links.
	NewInstancesPager(*vpcv1.ListInstancesOptions) (*vpcv1.InstancesPager, error)
	NewVolumesPager(*vpcv1.ListVolumesOptions) (*vpcv1.VolumesPager, error)
	// The VPC's security groups, for the cluster's (cluster.go).
	NewSecurityGroupsPager(*vpcv1.ListSecurityGroupsOptions) (*vpcv1.SecurityGroupsPager, error)
}

// Provider is provider.Provider on IBM Cloud VPC.
type Provider struct {
	api    vpcAPI
	search searchAPI
	tags   taggingAPI
	cfg    Config
	// crTokenFiles are where the trusted-profile route looks for its
	// compute-resource token, the first found being used (nil on other
	// routes), for Preflight.
	crTokenFiles []string
	// route describes the credential route, for the log; no secret.
	route string
	log   *slog.Logger
	// searchLimit is the page List asks Global Search for; zero is
	// searchLimit, the API's largest. Tests lower it to see pages.
	searchLimit int
}

var _ provider.Provider = (*Provider)(nil)

// New validates cfg, resolves credentials through the chain (see the
// package comment) and returns a provider. It makes no call, so ctx is
// unused: a bad API key shows on the first operation, as ErrAuth. New
// refuses to run while the IBM SDK logs at debug level, which dumps request
// bodies, user data included.
func New(_ context.Context, cfg Config) (*Provider, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if core.GetLogger().IsLogLevelEnabled(core.LevelDebug) {
		return nil, errors.New("ibmcloud: the IBM SDK logger is at debug level, which logs request bodies with user data; lower it")
	}
	auth, err := cfg.authenticator()
	if err != nil {
		return nil, err
	}
	url, err := cfg.endpoint()
	if err != nil {
		return nil, err
	}
	svc, err := vpcv1.NewVpcV1(&vpcv1.VpcV1Options{URL: url, Authenticator: auth})
	if err != nil {
		return nil, fmt.Errorf("ibmcloud: VPC client for %s: %w", url, err)
	}
	searchURL := cfg.searchEndpoint()
	gs, err := globalsearchv2.NewGlobalSearchV2(&globalsearchv2.GlobalSearchV2Options{URL: searchURL, Authenticator: auth})
	if err != nil {
		return nil, fmt.Errorf("ibmcloud: Global Search client for %s: %w", searchURL, err)
	}
	taggingURL := cfg.taggingEndpoint()
	gt, err := globaltaggingv1.NewGlobalTaggingV1(&globaltaggingv1.GlobalTaggingV1Options{URL: taggingURL, Authenticator: auth})
	if err != nil {
		return nil, fmt.Errorf("ibmcloud: Global Tagging client for %s: %w", taggingURL, err)
	}
	p := &Provider{api: svc, search: gs, tags: gt, cfg: cfg, log: slog.Default()}
	switch a := auth.(type) {
	case *core.ContainerAuthenticator:
		p.crTokenFiles = []string{a.CRTokenFilename}
		if a.CRTokenFilename == "" {
			p.crTokenFiles = defaultCRTokenFiles
		}
		profile := a.IAMProfileID
		if profile == "" {
			profile = a.IAMProfileName
		}
		p.route = fmt.Sprintf("trusted profile %s with the compute-resource token in %s (%s=container)",
			profile, strings.Join(p.crTokenFiles, " or "), EnvAuthType)
	case *core.IamAuthenticator:
		p.route = "IAM API key"
		if cfg.APIKeyFile != "" {
			p.route += " from " + cfg.APIKeyFile
		}
	default:
		p.route = "the IBM SDK's " + auth.AuthenticationType() + " authenticator"
	}
	return p, nil
}

// Credentials says which credential route the provider uses (never a key
// or token), for the daemon's log at start.
func (p *Provider) Credentials() string { return p.route }

// Name is "ibmcloud".
func (p *Provider) Name() string { return providerName }

// Create makes the VM of spec, or returns the one an earlier call with the
// same key made. When the key may have been sent before (Spec.MaybeSent) it
// looks the deterministic name up first, so a retry after a crash costs one
// read; a fresh key goes straight to the create. A create whose name is
// taken (validation_unique_failed: a racing call, or a key sent after all)
// looks the name up then and adopts that VM if it is this pod's.
func (p *Provider) Create(ctx context.Context, spec provider.Spec) (provider.VM, error) {
	if spec.InstanceType == "" {
		spec.InstanceType = p.cfg.InstanceType
	}
	if spec.Image == "" {
		spec.Image = p.cfg.Image
	}
	if err := spec.Validate(); err != nil {
		return provider.VM{}, invalidSpec(err)
	}
	if err := checkTEE(spec); err != nil {
		return provider.VM{}, invalidSpec(err)
	}
	if n := len(spec.UserData); n > MaxUserData {
		return provider.VM{}, invalidSpec(fmt.Errorf("%w: the user data of pod %s/%s is %d bytes; IBM Cloud VPC takes at most %d (64 KiB): "+
			"shrink what goes into it (the initdata, the pod's secrets and config)", provider.ErrInvalidSpec, spec.PodNamespace, spec.PodName, n, MaxUserData))
	}
	if !utf8.Valid(spec.UserData) {
		return provider.VM{}, invalidSpec(fmt.Errorf("%w: the user data of pod %s/%s is not UTF-8 text, which VPC requires",
			provider.ErrInvalidSpec, spec.PodNamespace, spec.PodName))
	}
	tags := maps.Clone(p.cfg.Tags)
	if tags == nil {
		tags = map[string]string{}
	}
	maps.Copy(tags, spec.Tags())
	userTags, err := encodeUserTags(tags)
	if err != nil {
		return provider.VM{}, invalidSpec(err)
	}
	name := instanceName(spec)

	if spec.MaybeSent {
		if vm, found, err := p.adopt(ctx, name, spec, userTags); err != nil || found {
			return vm, err
		}
	}
	opts := &vpcv1.CreateInstanceOptions{InstancePrototype: p.prototype(spec, name, userTags)}
	in, resp, err := call(ctx, p.cfg.WriteTimeout, provider.DefaultWriteTimeout, func(ctx context.Context) (*vpcv1.Instance, *core.DetailedResponse, error) {
		return p.api.CreateInstanceWithContext(ctx, opts)
	})
	if err != nil {
		cerr := classify(opCreate, resp, err)
		if errors.Is(cerr, provider.ErrConflict) {
			// Most likely our own name, taken by a racing or earlier call.
			if vm, found, aerr := p.adopt(ctx, name, spec, userTags); aerr != nil || found {
				return vm, aerr
			}
		}
		return provider.VM{}, cerr
	}
	// The instance exists now; until its tags are attached only its boot
	// volume names it. A failed attach (the tagging service may not know
	// the instance yet) does not fail the create, whose caller needs the
	// id: the node's next List finds the VM by its boot volume and
	// attaches them then.
	p.tagOrLog(ctx, str(in.CRN), userTags)
	return vmOf(in, tags), nil
}

// adopt finds the instance named for spec and checks it is spec's: its
// tags carry spec's key and cluster, and its shape is spec's. It attaches
// userTags to the instance it adopts (again: attaching is idempotent), so
// that a create cut off between the instance and its tags ends tagged.
func (p *Provider) adopt(ctx context.Context, name string, spec provider.Spec, userTags []string) (provider.VM, bool, error) {
	opts := &vpcv1.ListInstancesOptions{Name: ptr(name)}
	coll, resp, err := call(ctx, p.cfg.ReadTimeout, provider.DefaultReadTimeout, func(ctx context.Context) (*vpcv1.InstanceCollection, *core.DetailedResponse, error) {
		return p.api.ListInstancesWithContext(ctx, opts)
	})
	if err != nil {
		return provider.VM{}, false, classify(opCreate, resp, err)
	}
	if len(coll.Instances) == 0 {
		return provider.VM{}, false, nil
	}
	in := &coll.Instances[0]
	tags, err := p.bootVolumeTags(ctx, opCreate, in)
	if err != nil {
		return provider.VM{}, false, err
	}
	vm := vmOf(in, tags)
	conflict := func(format string, args ...any) (provider.VM, bool, error) {
		return provider.VM{}, false, &provider.Error{Kind: provider.ErrConflict, Provider: providerName, Op: opCreate,
			Code: "idempotency_mismatch", Message: fmt.Sprintf(format, args...)}
	}
	switch owner := vm.Owner(); {
	case owner.Key != spec.Key || owner.Cluster != spec.Cluster:
		return conflict("instance %s (%s) is named for key %s but tagged for key %q of cluster %q (tags not readable yet, or a name collision)",
			vm.ID, name, spec.Key, owner.Key, owner.Cluster)
	case vm.InstanceType != spec.InstanceType || vm.Image != spec.Image:
		return conflict("instance %s for key %s has profile %s and image %s; this call asks for %s and %s",
			vm.ID, spec.Key, vm.InstanceType, vm.Image, spec.InstanceType, spec.Image)
	}
	p.tagOrLog(ctx, str(in.CRN), userTags)
	return vm, true, nil
}

// Get returns the VM, ErrNotFound once VPC no longer shows it. It reads the
// instance, then its boot volume for the tags; an instance whose volume is
// already gone (being deleted) comes back without tags.
func (p *Provider) Get(ctx context.Context, id string) (provider.VM, error) {
	opts := &vpcv1.GetInstanceOptions{ID: ptr(id)}
	in, resp, err := call(ctx, p.cfg.ReadTimeout, provider.DefaultReadTimeout, func(ctx context.Context) (*vpcv1.Instance, *core.DetailedResponse, error) {
		return p.api.GetInstanceWithContext(ctx, opts)
	})
	if err != nil {
		return provider.VM{}, classify(opGet, resp, err)
	}
	tags, err := p.bootVolumeTags(ctx, opGet, in)
	if err != nil {
		return provider.VM{}, err
	}
	return vmOf(in, tags), nil
}

// bootVolumeTags reads the tags off the instance's boot volume; nil when
// the volume is gone.
func (p *Provider) bootVolumeTags(ctx context.Context, op string, in *vpcv1.Instance) (map[string]string, error) {
	id := bootVolumeID(in)
	if id == "" {
		return nil, nil
	}
	opts := &vpcv1.GetVolumeOptions{ID: ptr(id)}
	vol, resp, err := call(ctx, p.cfg.ReadTimeout, provider.DefaultReadTimeout, func(ctx context.Context) (*vpcv1.Volume, *core.DetailedResponse, error) {
		return p.api.GetVolumeWithContext(ctx, opts)
	})
	if err != nil {
		if resp != nil && resp.StatusCode == http.StatusNotFound {
			return nil, nil
		}
		return nil, classify(op, resp, err)
	}
	return decodeUserTags(vol.UserTags), nil
}

// Delete deletes the instance; its boot volume and network interface go
// with it (delete_volume_on_instance_delete, auto_delete). Nil when the
// instance is already gone.
func (p *Provider) Delete(ctx context.Context, id string) error {
	opts := &vpcv1.DeleteInstanceOptions{ID: ptr(id)}
	_, resp, err := call(ctx, p.cfg.WriteTimeout, provider.DefaultWriteTimeout, func(ctx context.Context) (struct{}, *core.DetailedResponse, error) {
		resp, err := p.api.DeleteInstanceWithContext(ctx, opts)
		return struct{}{}, resp, err
	})
	if err != nil {
		if cerr := classify(opDelete, resp, err); !errors.Is(cerr, provider.ErrNotFound) {
			return cerr
		}
	}
	return nil
}

// call runs one cloud call, with its transient-failure retries, under its
// own deadline: timeout from now, or def when timeout is zero (see
// Config.ReadTimeout).
func call[T any](ctx context.Context, timeout, def time.Duration, fn func(context.Context) (T, *core.DetailedResponse, error)) (T, *core.DetailedResponse, error) {
	ctx, cancel := provider.CallContext(ctx, timeout, def)
	defer cancel()
	return retry(ctx, func() (T, *core.DetailedResponse, error) { return fn(ctx) })
}

func invalidSpec(err error) error {
	return &provider.Error{Kind: provider.ErrInvalidSpec, Provider: providerName, Op: opCreate,
		Code: "invalid_spec", Message: err.Error(), Err: err}
}
