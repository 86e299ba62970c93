package ibmcloud

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/IBM/go-sdk-core/v5/core"
	"github.com/IBM/platform-services-go-sdk/globalsearchv2"
	"github.com/IBM/vpc-go-sdk/vpcv1"
	"github.com/spf13/pflag"

	"github.com/caa-project/caa/pkg/provider"
)

// Environment variables outside caa's own CAA_IBMCLOUD_* set: the ones the
// ibmcloud CLI and IBM's tooling already use.
const (
	EnvAPIKey = "IBMCLOUD_API_KEY"
	EnvRegion = "IBMCLOUD_REGION"
	// The IBM SDK's own settings under the IBMCLOUD_ prefix, which select
	// the credential route when EnvAuthType is set (see authenticator):
	// "container" is a trusted profile with a compute-resource token.
	EnvAuthType    = "IBMCLOUD_AUTH_TYPE"
	EnvProfileID   = "IBMCLOUD_IAM_PROFILE_ID"
	EnvProfileName = "IBMCLOUD_IAM_PROFILE_NAME"
	EnvCRTokenFile = "IBMCLOUD_CR_TOKEN_FILENAME"
	envPrefix      = "ibmcloud"
	// sdkServiceName is the prefix of the IBM SDK's own external
	// configuration (VPC_AUTH_TYPE, VPC_APIKEY, VPC_AUTH_URL, ... or an
	// ibm-credentials.env file), the last link of the credential chain.
	sdkServiceName = "vpc"
)

// Config is the IBM Cloud VPC placement and access of one node's VMs.
type Config struct {
	// Region selects the API endpoint (us-south, eu-de, ...) when Endpoint
	// is empty.
	Region string
	// Zone is where VMs are made, e.g. us-south-1.
	Zone string
	// VPCID, when set, is the VPC of the VMs and scopes List's instance
	// listing; VPC otherwise infers it from the subnet.
	VPCID string
	// SubnetID is the subnet of every VM's network attachment.
	SubnetID string
	// SecurityGroupIDs for the VMs' network interface; empty means the
	// VPC's default group.
	SecurityGroupIDs []string
	// ClusterID is the IBM Cloud Kubernetes service's id of the cluster
	// (IKS or ROKS), whose security group kube-<id> every VM gets
	// (cluster.go); empty: read from kube-system/cluster-info where that
	// exists; ClusterIDNone: no cluster group.
	ClusterID string
	// ResourceGroupID for the VMs; empty means the account's default.
	ResourceGroupID string
	// Image and InstanceType (a VPC profile name) are the defaults for a
	// spec that names none.
	Image        string
	InstanceType string
	// BootVolumeProfile is the storage profile of the boot volume.
	BootVolumeProfile string
	// Tags are added to every VM's tags, below the spec's own.
	Tags map[string]string
	// Endpoint overrides the VPC API URL (private endpoints, fakes), e.g.
	// https://us-south.private.iaas.cloud.ibm.com/v1.
	Endpoint string
	// IAMEndpoint overrides the IAM token service URL for API keys.
	IAMEndpoint string
	// SearchEndpoint is the IBM Cloud Global Search API URL List finds the
	// node's VMs with; empty means the public one,
	// https://api.global-search-tagging.cloud.ibm.com (the private one is
	// https://api.private.global-search-tagging.cloud.ibm.com).
	SearchEndpoint string
	// TaggingEndpoint is the IBM Cloud Global Tagging API URL Create tags
	// instances through; empty means the one beside SearchEndpoint: the
	// public https://tags.global-search-tagging.cloud.ibm.com for the public
	// search endpoint, the private one for the private, and the search URL
	// itself for any other (a proxy or a fake serving both).
	TaggingEndpoint string
	// AccountID, when set, is passed to Global Search as account_id; empty
	// means the account of the credentials.
	AccountID string
	// APIKeyFile is a file holding the API key (a mounted secret).
	APIKeyFile string
	// ReadTimeout bounds each read call (a GET, one page of a listing, its
	// retries and the IAM token exchange included); zero means
	// provider.DefaultReadTimeout (30s). WriteTimeout bounds each create or
	// delete call the same way; zero means provider.DefaultWriteTimeout
	// (2m). A call past its timeout fails with context.DeadlineExceeded,
	// transient.
	ReadTimeout  time.Duration
	WriteTimeout time.Duration

	// envErr is a malformed environment default met by AddFlags.
	envErr error
}

// AddFlags registers --ibmcloud-* flags on fs, each defaulting to its
// CAA_IBMCLOUD_* environment variable (the region also to IBMCLOUD_REGION).
func (c *Config) AddFlags(fs *pflag.FlagSet) {
	tags, err := provider.ParseTags(os.Getenv("CAA_IBMCLOUD_TAGS"))
	if err != nil {
		c.envErr = fmt.Errorf("CAA_IBMCLOUD_TAGS: %w", err)
	}
	fs.StringVar(&c.Region, "ibmcloud-region", provider.FirstEnv("CAA_IBMCLOUD_REGION", EnvRegion), "IBM Cloud region of the VPC API (env CAA_IBMCLOUD_REGION or "+EnvRegion+")")
	fs.StringVar(&c.Zone, "ibmcloud-zone", provider.FirstEnv("CAA_IBMCLOUD_ZONE"), "zone of the VMs, e.g. us-south-1 (env CAA_IBMCLOUD_ZONE)")
	fs.StringVar(&c.VPCID, "ibmcloud-vpc-id", provider.FirstEnv("CAA_IBMCLOUD_VPC_ID"), "VPC of the VMs (env CAA_IBMCLOUD_VPC_ID)")
	fs.StringVar(&c.SubnetID, "ibmcloud-subnet-id", provider.FirstEnv("CAA_IBMCLOUD_SUBNET_ID"), "subnet of the VMs (env CAA_IBMCLOUD_SUBNET_ID)")
	fs.StringSliceVar(&c.SecurityGroupIDs, "ibmcloud-security-group-ids", provider.SplitList(provider.FirstEnv("CAA_IBMCLOUD_SECURITY_GROUP_IDS")), "security groups of the VMs, comma separated (env CAA_IBMCLOUD_SECURITY_GROUP_IDS)")
	fs.StringVar(&c.ClusterID, "ibmcloud-cluster-id", provider.FirstEnv("CAA_IBMCLOUD_CLUSTER_ID"),
		"IBM Cloud Kubernetes service cluster id whose security group kube-<id> every VM gets; empty: read from kube-system/cluster-info when the cluster has it; "+
			ClusterIDNone+": add no cluster group (env CAA_IBMCLOUD_CLUSTER_ID)")
	fs.StringVar(&c.ResourceGroupID, "ibmcloud-resource-group-id", provider.FirstEnv("CAA_IBMCLOUD_RESOURCE_GROUP_ID"), "resource group of the VMs (env CAA_IBMCLOUD_RESOURCE_GROUP_ID)")
	fs.StringVar(&c.Image, "ibmcloud-image", provider.FirstEnv("CAA_IBMCLOUD_IMAGE"), "default image id (env CAA_IBMCLOUD_IMAGE)")
	fs.StringVar(&c.InstanceType, "ibmcloud-instance-type", envOr("CAA_IBMCLOUD_INSTANCE_TYPE", "bx3dc-2x10"),
		"default instance profile; bx3dc, cx3dc and mx3dc profiles run confidential VMs (env CAA_IBMCLOUD_INSTANCE_TYPE)")
	fs.StringVar(&c.BootVolumeProfile, "ibmcloud-boot-volume-profile", envOr("CAA_IBMCLOUD_BOOT_VOLUME_PROFILE", "general-purpose"), "storage profile of boot volumes (env CAA_IBMCLOUD_BOOT_VOLUME_PROFILE)")
	fs.StringToStringVar(&c.Tags, "ibmcloud-tags", tags, "extra tags on every VM, k=v,k2=v2 (env CAA_IBMCLOUD_TAGS)")
	fs.StringVar(&c.Endpoint, "ibmcloud-endpoint", provider.FirstEnv("CAA_IBMCLOUD_ENDPOINT"), "VPC API URL, overriding the region's (env CAA_IBMCLOUD_ENDPOINT)")
	fs.StringVar(&c.IAMEndpoint, "ibmcloud-iam-endpoint", provider.FirstEnv("CAA_IBMCLOUD_IAM_ENDPOINT"), "IAM token service URL (env CAA_IBMCLOUD_IAM_ENDPOINT)")
	fs.StringVar(&c.SearchEndpoint, "ibmcloud-search-endpoint", envOr("CAA_IBMCLOUD_SEARCH_ENDPOINT", globalsearchv2.DefaultServiceURL), "Global Search API URL, for listing the node's VMs by tag (env CAA_IBMCLOUD_SEARCH_ENDPOINT)")
	fs.StringVar(&c.TaggingEndpoint, "ibmcloud-tagging-endpoint", provider.FirstEnv("CAA_IBMCLOUD_TAGGING_ENDPOINT"), "Global Tagging API URL, for tagging the VMs' instances; empty: the one beside the search endpoint (env CAA_IBMCLOUD_TAGGING_ENDPOINT)")
	fs.StringVar(&c.AccountID, "ibmcloud-account-id", provider.FirstEnv("CAA_IBMCLOUD_ACCOUNT_ID"), "account whose resources Global Search looks in; empty: the credentials' account (env CAA_IBMCLOUD_ACCOUNT_ID)")
	c.durationFlag(fs, &c.ReadTimeout, "read-timeout", provider.DefaultReadTimeout, "deadline of each read call, its retries included")
	c.durationFlag(fs, &c.WriteTimeout, "write-timeout", provider.DefaultWriteTimeout, "deadline of each create or delete call, its retries included")
	fs.StringVar(&c.APIKeyFile, "ibmcloud-api-key-file", provider.FirstEnv("CAA_IBMCLOUD_API_KEY_FILE"), "file holding the API key; else "+EnvAPIKey+", else the IBM SDK's VPC_* settings (env CAA_IBMCLOUD_API_KEY_FILE)")
}

// durationFlag registers --ibmcloud-<name>, defaulting to
// CAA_IBMCLOUD_<NAME> when that parses, else to def.
func (c *Config) durationFlag(fs *pflag.FlagSet, p *time.Duration, name string, def time.Duration, usage string) {
	env := "CAA_IBMCLOUD_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
	if v := os.Getenv(env); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil && c.envErr == nil {
			c.envErr = fmt.Errorf("%s=%q: not a duration like 30s", env, v)
		} else if err == nil {
			def = d
		}
	}
	fs.DurationVar(p, "ibmcloud-"+name, def, usage+" (env "+env+")")
}

// Validate checks the configuration, naming the flag and variable to fix.
func (c Config) Validate() error {
	missing := func(flag, envs string) error {
		return fmt.Errorf("ibmcloud: no %s: set --ibmcloud-%s or %s", strings.ReplaceAll(flag, "-", " "), flag, envs)
	}
	switch {
	case c.envErr != nil:
		return fmt.Errorf("ibmcloud: %w", c.envErr)
	case c.Endpoint == "" && c.Region == "":
		return missing("region", "CAA_IBMCLOUD_REGION or "+EnvRegion+" (or --ibmcloud-endpoint)")
	case c.Zone == "":
		return missing("zone", "CAA_IBMCLOUD_ZONE")
	case c.SubnetID == "":
		return missing("subnet-id", "CAA_IBMCLOUD_SUBNET_ID")
	case c.BootVolumeProfile == "":
		return missing("boot-volume-profile", "CAA_IBMCLOUD_BOOT_VOLUME_PROFILE")
	}
	if c.Region != "" {
		if _, err := vpcv1.GetServiceURLForRegion(c.Region); err != nil && c.Endpoint == "" {
			return fmt.Errorf("ibmcloud: --ibmcloud-region %q is not a VPC region: %w", c.Region, err)
		}
		if !strings.HasPrefix(c.Zone, c.Region+"-") {
			return fmt.Errorf("ibmcloud: --ibmcloud-zone %q is not in region %q", c.Zone, c.Region)
		}
	}
	for flag, u := range map[string]string{"endpoint": c.Endpoint, "iam-endpoint": c.IAMEndpoint, "search-endpoint": c.SearchEndpoint, "tagging-endpoint": c.TaggingEndpoint} {
		if u == "" {
			continue
		}
		if p, err := url.Parse(u); err != nil || (p.Scheme != "https" && p.Scheme != "http") || p.Host == "" {
			return fmt.Errorf("ibmcloud: --ibmcloud-%s %q is not an http(s) URL", flag, u)
		}
	}
	for k := range c.Tags {
		if k == "" {
			return errors.New("ibmcloud: --ibmcloud-tags has an empty key")
		}
	}
	if c.ReadTimeout < 0 || c.WriteTimeout < 0 {
		return fmt.Errorf("ibmcloud: --ibmcloud-read-timeout (%s) and --ibmcloud-write-timeout (%s) must not be negative", c.ReadTimeout, c.WriteTimeout)
	}
	return nil
}

// endpoint is the VPC API URL.
func (c Config) endpoint() (string, error) {
	if c.Endpoint != "" {
		return c.Endpoint, nil
	}
	u, err := vpcv1.GetServiceURLForRegion(c.Region)
	if err != nil {
		return "", fmt.Errorf("ibmcloud: endpoint of region %q: %w", c.Region, err)
	}
	return u, nil
}

// searchEndpoint is the Global Search API URL.
func (c Config) searchEndpoint() string {
	if c.SearchEndpoint != "" {
		return c.SearchEndpoint
	}
	return globalsearchv2.DefaultServiceURL
}

// taggingEndpoint is the Global Tagging API URL: the configured one, or
// the one beside the search endpoint. IBM serves the two APIs from
// api.[private.]global-search-tagging.cloud.ibm.com and
// tags.[private.]global-search-tagging.cloud.ibm.com; any other search
// URL is taken to serve both.
func (c Config) taggingEndpoint() string {
	if c.TaggingEndpoint != "" {
		return c.TaggingEndpoint
	}
	search := c.searchEndpoint()
	if u, err := url.Parse(search); err == nil && strings.HasSuffix(u.Host, "global-search-tagging.cloud.ibm.com") {
		if host, ok := strings.CutPrefix(u.Host, "api."); ok {
			u.Host = "tags." + host
			return u.String()
		}
	}
	return search
}

// authenticator picks the credential route:
//
//   - IBMCLOUD_AUTH_TYPE set: the IBM SDK's own environment configuration
//     under the IBMCLOUD_ prefix (core.GetAuthenticatorFromEnvironment), the
//     route for a trusted profile with a compute-resource token:
//     IBMCLOUD_AUTH_TYPE=container, IBMCLOUD_IAM_PROFILE_ID or
//     IBMCLOUD_IAM_PROFILE_NAME, and IBMCLOUD_CR_TOKEN_FILENAME (a projected
//     ServiceAccount token; the SDK's defaults otherwise). The SDK reads the
//     file again for every new access token, so a rotated token is picked
//     up without a restart. An API key set beside it is refused as
//     ambiguous.
//   - else the API key file, then IBMCLOUD_API_KEY (both through IAM);
//   - else the SDK's external configuration for service "vpc"
//     (VPC_AUTH_TYPE and friends, or an ibm-credentials.env file).
//
// --ibmcloud-iam-endpoint, when set, is the token service of the API key
// and trusted-profile routes. Secrets are handed to the SDK's
// authenticator and kept nowhere else.
func (c Config) authenticator() (core.Authenticator, error) {
	if authType := os.Getenv(EnvAuthType); authType != "" {
		if c.APIKeyFile != "" || os.Getenv(EnvAPIKey) != "" {
			return nil, fmt.Errorf("ibmcloud: %s=%s and an API key (--ibmcloud-api-key-file or %s) are both set: keep one credential route",
				EnvAuthType, authType, EnvAPIKey)
		}
		a, err := core.GetAuthenticatorFromEnvironment(envPrefix)
		if err != nil {
			return nil, fmt.Errorf("ibmcloud: credentials from %s=%s and the other IBMCLOUD_* settings: %w", EnvAuthType, authType, err)
		}
		if a == nil {
			return nil, fmt.Errorf("ibmcloud: %s is set but the IBM SDK found no IBMCLOUD_* settings", EnvAuthType)
		}
		if ca, ok := a.(*core.ContainerAuthenticator); ok && c.IAMEndpoint != "" {
			ca.URL = c.IAMEndpoint
		}
		return a, nil
	}
	key := ""
	switch {
	case c.APIKeyFile != "":
		b, err := os.ReadFile(c.APIKeyFile)
		if err != nil {
			return nil, fmt.Errorf("ibmcloud: read the API key file %s: %w", c.APIKeyFile, err)
		}
		if key = strings.TrimSpace(string(b)); key == "" {
			return nil, fmt.Errorf("ibmcloud: the API key file %s is empty", c.APIKeyFile)
		}
	case os.Getenv(EnvAPIKey) != "":
		key = strings.TrimSpace(os.Getenv(EnvAPIKey))
	}
	if key != "" {
		b := core.NewIamAuthenticatorBuilder().SetApiKey(key)
		if c.IAMEndpoint != "" {
			b = b.SetURL(c.IAMEndpoint)
		}
		a, err := b.Build()
		if err != nil {
			// The SDK's validation messages name properties, not values.
			return nil, fmt.Errorf("ibmcloud: IAM authenticator: %w", err)
		}
		return a, nil
	}
	a, err := core.GetAuthenticatorFromEnvironment(sdkServiceName)
	if err != nil {
		return nil, fmt.Errorf("ibmcloud: credentials from the IBM SDK's VPC_* settings: %w", err)
	}
	if a == nil {
		return nil, errors.New("ibmcloud: no credentials: set " + EnvAuthType + "=container with " + EnvProfileID +
			" (a trusted profile), or --ibmcloud-api-key-file (CAA_IBMCLOUD_API_KEY_FILE), " +
			EnvAPIKey + ", or the IBM SDK's VPC_AUTH_TYPE/VPC_APIKEY settings")
	}
	if ca, ok := a.(*core.ContainerAuthenticator); ok && c.IAMEndpoint != "" && ca.URL == "" {
		ca.URL = c.IAMEndpoint
	}
	return a, nil
}

// ClusterIDNone as --ibmcloud-cluster-id turns the cluster's security
// group off: --ibmcloud-security-group-ids must then admit the workers.
const ClusterIDNone = "none"

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
