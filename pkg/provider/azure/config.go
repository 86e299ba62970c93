package azure

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/arm"
	azcloud "github.com/Azure/azure-sdk-for-go/sdk/azcore/cloud"
	"github.com/spf13/pflag"

	"github.com/caa-project/caa/pkg/provider"
)

// Defaults of the settings that have one.
const (
	DefaultAdminUsername = "caa"
	DefaultCloud         = "AzurePublic"
	DefaultPollInterval  = 5 * time.Second
	DefaultMaxRetries    = 2
	DefaultRetryDelay    = time.Second
	// DefaultWriteTimeout is longer than the other clouds' (2m): a Linux
	// VM create with OS provisioning takes one to several minutes on
	// Azure. It stays under caa's --cloud-timeout (5m), which bounds the
	// whole Create (a read, the NIC's PUT and the VM's).
	DefaultWriteTimeout = 4 * time.Minute
)

// Config is the Azure provider's configuration. Every field has a
// --azure-* flag whose default comes from a CAA_AZURE_* variable (see
// AddFlags). Credentials are not configuration: they come from the SDK's
// default chain (see the package comment).
type Config struct {
	// SubscriptionID, ResourceGroup and Location say where the VMs live.
	SubscriptionID string
	ResourceGroup  string
	Location       string
	// Zone is an availability zone ("1", "2", "3"), or empty for none.
	Zone string
	// SubnetID is the ARM id of the subnet the VMs' NICs join.
	SubnetID string
	// SecurityGroupID is the ARM id of a network security group for the
	// NICs; optional (the subnet's own applies anyway).
	SecurityGroupID string
	// AdminUsername and SSHPublicKey provision the guest's login; Azure
	// requires a key (or a password) for a Linux VM made from an image.
	// An empty SSHPublicKey gets a throwaway RSA key made in memory at New,
	// as upstream does: its private half is dropped at once, so nobody can
	// log in (the pod VM needs no login).
	AdminUsername string
	SSHPublicKey  string
	// SecureBoot turns UEFI secure boot on for confidential VMs (off by
	// default, as upstream's ENABLE_SECURE_BOOT: pod VM images are built
	// by their users and their boot chain is not signed, and a VM with
	// secure boot on never boots from one).
	SecureBoot bool
	// Image and InstanceType are the defaults for pods that name none
	// (read into provider.SpecConfig); Image is an image resource id or
	// publisher:offer:sku:version, InstanceType a VM size.
	Image        string
	InstanceType string
	// Tags are added to every VM and NIC; caa's own tags win on a clash.
	Tags map[string]string
	// Cloud is AzurePublic, AzureChina or AzureUSGovernment.
	Cloud string
	// Endpoint overrides the Resource Manager URL (private endpoints, fakes).
	Endpoint string
	// AuthorityHost overrides the cloud's Microsoft Entra ID authority
	// (https only), where the credential chain gets its tokens. Its
	// default comes from CAA_AZURE_AUTHORITY_HOST, else AZURE_AUTHORITY_HOST,
	// which AKS's workload identity webhook sets; empty means the cloud's.
	AuthorityHost string
	// DisableInstanceDiscovery turns off MSAL's instance discovery, a
	// request to login.microsoftonline.com that validates the authority
	// host. Set it only with an AuthorityHost that Entra ID's public
	// discovery does not know (Azure Stack Hub, a private authority, a
	// test's fake); the public, China and US Government clouds need it off.
	DisableInstanceDiscovery bool
	// PollInterval is the wait between polls of a long-running operation
	// when ARM's reply asks for none (its Retry-After wins). Zero means
	// DefaultPollInterval; under a second polls every second, the SDK's
	// floor.
	PollInterval time.Duration
	// MaxRetries is how often the SDK retries a call that failed with a 5xx
	// or a network error; zero means DefaultMaxRetries, negative none.
	// Throttling is never retried here.
	MaxRetries int
	// RetryDelay is the first backoff of those retries (it doubles, capped
	// at 8s). Zero means DefaultRetryDelay.
	RetryDelay time.Duration
	// ReadTimeout bounds each read call (a GET, one page of a listing,
	// retries included); zero means provider.DefaultReadTimeout (30s).
	// WriteTimeout bounds each PUT or DELETE together with the wait for its
	// long-running operation; zero means DefaultWriteTimeout (4m). A call
	// past its timeout fails with context.DeadlineExceeded, transient; a
	// create cut short is found again by its name. A VM create that ARM
	// accepted and is still running at the timeout is no failure: Create
	// returns the VM as Pending (see Provider.Create).
	ReadTimeout  time.Duration
	WriteTimeout time.Duration

	// envErrs are environment defaults AddFlags could not parse.
	envErrs []error
}

// AddFlags registers the --azure-* flags on fs, with defaults from the
// environment: CAA_AZURE_<SETTING>, and AZURE_SUBSCRIPTION_ID as the Azure
// tools' own fallback for the subscription.
func (c *Config) AddFlags(fs *pflag.FlagSet) {
	str := func(p *string, name, def, usage string, envs ...string) {
		if v := provider.FirstEnv(envs...); v != "" {
			def = v
		}
		fs.StringVar(p, "azure-"+name, def, usage+" (env "+strings.Join(envs, " or ")+")")
	}
	str(&c.SubscriptionID, "subscription-id", "", "Azure subscription id", "CAA_AZURE_SUBSCRIPTION_ID", "AZURE_SUBSCRIPTION_ID")
	str(&c.ResourceGroup, "resource-group", "", "resource group of the peer-pod VMs", "CAA_AZURE_RESOURCE_GROUP")
	str(&c.Location, "location", "", "region of the VMs, e.g. eastus", "CAA_AZURE_LOCATION")
	str(&c.Zone, "zone", "", "availability zone 1, 2 or 3 (empty: none)", "CAA_AZURE_ZONE")
	str(&c.SubnetID, "subnet-id", "", "ARM id of the subnet the VMs' NICs join", "CAA_AZURE_SUBNET_ID")
	str(&c.SecurityGroupID, "security-group-id", "", "ARM id of a network security group for the NICs (optional)", "CAA_AZURE_SECURITY_GROUP_ID")
	str(&c.AdminUsername, "admin-username", DefaultAdminUsername, "guest admin user", "CAA_AZURE_ADMIN_USERNAME")
	str(&c.SSHPublicKey, "ssh-public-key", "", "SSH public key of the guest admin user (empty: a throwaway key made in memory, its private half dropped)", "CAA_AZURE_SSH_PUBLIC_KEY")
	str(&c.Image, "image", "", "default image: an image resource id or publisher:offer:sku:version", "CAA_AZURE_IMAGE")
	str(&c.InstanceType, "instance-type", "", "default VM size, e.g. Standard_D2as_v5", "CAA_AZURE_INSTANCE_TYPE")
	str(&c.Cloud, "cloud", DefaultCloud, "Azure cloud: AzurePublic, AzureChina or AzureUSGovernment", "CAA_AZURE_CLOUD")
	str(&c.Endpoint, "endpoint", "", "Resource Manager URL override", "CAA_AZURE_ENDPOINT")
	str(&c.AuthorityHost, "authority-host", "", "Microsoft Entra ID authority host, https (empty: the cloud's)",
		"CAA_AZURE_AUTHORITY_HOST", "AZURE_AUTHORITY_HOST")
	disco := false
	if v := os.Getenv("CAA_AZURE_DISABLE_INSTANCE_DISCOVERY"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			c.envErrs = append(c.envErrs, fmt.Errorf("CAA_AZURE_DISABLE_INSTANCE_DISCOVERY=%q: not true or false", v))
		}
		disco = b
	}
	secureBoot := false
	if v := os.Getenv("CAA_AZURE_SECURE_BOOT"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			c.envErrs = append(c.envErrs, fmt.Errorf("CAA_AZURE_SECURE_BOOT=%q: not true or false", v))
		}
		secureBoot = b
	}
	fs.BoolVar(&c.SecureBoot, "azure-secure-boot", secureBoot,
		"UEFI secure boot on confidential VMs; only for an image whose boot chain is signed (env CAA_AZURE_SECURE_BOOT)")
	fs.BoolVar(&c.DisableInstanceDiscovery, "azure-disable-instance-discovery", disco,
		"skip Entra ID's instance discovery of the authority host; only for an authority it does not know (env CAA_AZURE_DISABLE_INSTANCE_DISCOVERY)")

	tags := map[string]string{}
	if v := os.Getenv("CAA_AZURE_TAGS"); v != "" {
		var err error
		if tags, err = provider.ParseTags(v); err != nil {
			c.envErrs = append(c.envErrs, fmt.Errorf("CAA_AZURE_TAGS: %w", err))
		}
	}
	fs.StringToStringVar(&c.Tags, "azure-tags", tags, "extra tags on every VM, k=v,k2=v2 (env CAA_AZURE_TAGS)")

	dur := func(p *time.Duration, name string, def time.Duration, env, usage string) {
		if v := os.Getenv(env); v != "" {
			d, err := time.ParseDuration(v)
			if err != nil {
				c.envErrs = append(c.envErrs, fmt.Errorf("%s=%q: not a duration like 5s", env, v))
			} else {
				def = d
			}
		}
		fs.DurationVar(p, "azure-"+name, def, usage+" (env "+env+")")
	}
	dur(&c.PollInterval, "poll-interval", DefaultPollInterval, "CAA_AZURE_POLL_INTERVAL", "wait between polls of a long-running operation")
	dur(&c.RetryDelay, "retry-delay", DefaultRetryDelay, "CAA_AZURE_RETRY_DELAY", "first backoff of a retried 5xx or network error")
	dur(&c.ReadTimeout, "read-timeout", provider.DefaultReadTimeout, "CAA_AZURE_READ_TIMEOUT", "deadline of each read call, its retries included")
	dur(&c.WriteTimeout, "write-timeout", DefaultWriteTimeout, "CAA_AZURE_WRITE_TIMEOUT",
		"deadline of each create or delete call, with the wait for its operation (a VM create still running at it is reported booting, not failed)")

	retries := DefaultMaxRetries
	if v := os.Getenv("CAA_AZURE_MAX_RETRIES"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			c.envErrs = append(c.envErrs, fmt.Errorf("CAA_AZURE_MAX_RETRIES=%q: not a whole number", v))
		} else {
			retries = n
		}
	}
	fs.IntVar(&c.MaxRetries, "azure-max-retries", retries, "retries of a 5xx or network error, negative for none (env CAA_AZURE_MAX_RETRIES)")
}

var (
	guidRE     = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)
	groupRE    = regexp.MustCompile(`^[-\w._()]{0,89}[-\w_()]$`)
	locationRE = regexp.MustCompile(`^[A-Za-z0-9 ]{1,64}$`)
	userRE     = regexp.MustCompile(`^[a-z_][a-z0-9_-]{0,31}$`)
)

// Validate checks the configuration before any call, naming each bad
// setting by its flag and environment variable.
func (c Config) Validate() error {
	errs := append([]error(nil), c.envErrs...)
	bad := func(flag, env, format string, args ...any) {
		errs = append(errs, fmt.Errorf("--azure-%s (%s): %s", flag, env, fmt.Sprintf(format, args...)))
	}
	required := func(v, flag, env string) bool {
		if v == "" {
			bad(flag, env, "required")
		}
		return v != ""
	}
	if required(c.SubscriptionID, "subscription-id", "CAA_AZURE_SUBSCRIPTION_ID or AZURE_SUBSCRIPTION_ID") && !guidRE.MatchString(c.SubscriptionID) {
		bad("subscription-id", "CAA_AZURE_SUBSCRIPTION_ID", "%q is not a subscription id (a GUID)", c.SubscriptionID)
	}
	if required(c.ResourceGroup, "resource-group", "CAA_AZURE_RESOURCE_GROUP") && !groupRE.MatchString(c.ResourceGroup) {
		bad("resource-group", "CAA_AZURE_RESOURCE_GROUP", "%q is not a resource group name", c.ResourceGroup)
	}
	if required(c.Location, "location", "CAA_AZURE_LOCATION") && !locationRE.MatchString(c.Location) {
		bad("location", "CAA_AZURE_LOCATION", "%q is not a region name like eastus", c.Location)
	}
	if c.Zone != "" && c.Zone != "1" && c.Zone != "2" && c.Zone != "3" {
		bad("zone", "CAA_AZURE_ZONE", "%q is not an availability zone (1, 2 or 3)", c.Zone)
	}
	if required(c.SubnetID, "subnet-id", "CAA_AZURE_SUBNET_ID") && !isType(c.SubnetID, "Microsoft.Network/virtualNetworks/subnets") {
		bad("subnet-id", "CAA_AZURE_SUBNET_ID", "%q is not the ARM id of a subnet", c.SubnetID)
	}
	if c.SecurityGroupID != "" && !isType(c.SecurityGroupID, "Microsoft.Network/networkSecurityGroups") {
		bad("security-group-id", "CAA_AZURE_SECURITY_GROUP_ID", "%q is not the ARM id of a network security group", c.SecurityGroupID)
	}
	if required(c.AdminUsername, "admin-username", "CAA_AZURE_ADMIN_USERNAME") &&
		(!userRE.MatchString(c.AdminUsername) || c.AdminUsername == "root" || c.AdminUsername == "admin") {
		bad("admin-username", "CAA_AZURE_ADMIN_USERNAME", "%q is not an allowed Linux user name", c.AdminUsername)
	}
	if c.SSHPublicKey != "" &&
		!strings.HasPrefix(c.SSHPublicKey, "ssh-") && !strings.HasPrefix(c.SSHPublicKey, "ecdsa-") {
		bad("ssh-public-key", "CAA_AZURE_SSH_PUBLIC_KEY", "not an OpenSSH public key (ssh-ed25519 AAAA..., ssh-rsa AAAA...)")
	}
	for name, v := range map[string]string{"image": c.Image, "instance-type": c.InstanceType} {
		if strings.ContainsFunc(v, func(r rune) bool { return r == ' ' || r == '\t' || r == '\n' }) {
			bad(name, "CAA_AZURE_"+strings.ToUpper(strings.ReplaceAll(name, "-", "_")), "%q has spaces", v)
		}
	}
	if err := checkTags(c.Tags, maxTags-len(reservedTags)); err != nil {
		bad("tags", "CAA_AZURE_TAGS", "%v", err)
	}
	for k := range c.Tags {
		if strings.HasPrefix(strings.ToLower(k), "caa-") {
			bad("tags", "CAA_AZURE_TAGS", "tag %q: the caa- prefix is caa's own", k)
		}
	}
	if _, err := c.cloudConfig(); err != nil {
		bad("cloud", "CAA_AZURE_CLOUD", "%v", err)
	}
	if c.Endpoint != "" {
		u, err := url.Parse(c.Endpoint)
		switch {
		case err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "":
			bad("endpoint", "CAA_AZURE_ENDPOINT", "%q is not an http(s) URL", c.Endpoint)
		case u.Scheme == "http" && !isLoopback(u.Hostname()):
			bad("endpoint", "CAA_AZURE_ENDPOINT", "%q: plain http only to a loopback address, or the bearer token travels in clear", c.Endpoint)
		}
	}
	if c.AuthorityHost != "" {
		if u, err := url.Parse(c.AuthorityHost); err != nil || u.Scheme != "https" || u.Host == "" || u.RawQuery != "" {
			bad("authority-host", "CAA_AZURE_AUTHORITY_HOST or AZURE_AUTHORITY_HOST", "%q is not an https URL like https://login.microsoftonline.com/", c.AuthorityHost)
		}
	}
	if c.PollInterval < 0 {
		bad("poll-interval", "CAA_AZURE_POLL_INTERVAL", "negative")
	}
	if c.RetryDelay < 0 {
		bad("retry-delay", "CAA_AZURE_RETRY_DELAY", "negative")
	}
	if c.ReadTimeout < 0 {
		bad("read-timeout", "CAA_AZURE_READ_TIMEOUT", "negative")
	}
	if c.WriteTimeout < 0 {
		bad("write-timeout", "CAA_AZURE_WRITE_TIMEOUT", "negative")
	}
	if c.MaxRetries > 10 {
		bad("max-retries", "CAA_AZURE_MAX_RETRIES", "%d is more than 10", c.MaxRetries)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("azure configuration: %w", err)
	}
	return nil
}

func isLoopback(host string) bool {
	ip := net.ParseIP(host)
	return host == "localhost" || (ip != nil && ip.IsLoopback())
}

func isType(id, typ string) bool {
	rid, err := arm.ParseResourceID(id)
	return err == nil && strings.EqualFold(rid.ResourceType.String(), typ)
}

// withDefaults fills the zero values that stand for a default.
func (c Config) withDefaults() Config {
	if c.PollInterval == 0 {
		c.PollInterval = DefaultPollInterval
	}
	if c.RetryDelay == 0 {
		c.RetryDelay = DefaultRetryDelay
	}
	if c.MaxRetries == 0 {
		c.MaxRetries = DefaultMaxRetries
	}
	if c.Cloud == "" {
		c.Cloud = DefaultCloud
	}
	if c.ReadTimeout == 0 {
		c.ReadTimeout = provider.DefaultReadTimeout
	}
	if c.WriteTimeout == 0 {
		c.WriteTimeout = DefaultWriteTimeout
	}
	return c
}

// cloudConfig is the SDK's description of the cloud, with the Resource
// Manager endpoint overridden when Endpoint is set (the token audience
// stays the cloud's).
func (c Config) cloudConfig() (azcloud.Configuration, error) {
	var base azcloud.Configuration
	switch strings.ToLower(c.Cloud) {
	case "", "azurepublic", "azurecloud":
		base = azcloud.AzurePublic
	case "azurechina", "azurechinacloud":
		base = azcloud.AzureChina
	case "azureusgovernment", "azuregovernment":
		base = azcloud.AzureGovernment
	default:
		return azcloud.Configuration{}, fmt.Errorf("unknown cloud %q (want AzurePublic, AzureChina or AzureUSGovernment)", c.Cloud)
	}
	out := azcloud.Configuration{ActiveDirectoryAuthorityHost: base.ActiveDirectoryAuthorityHost, Services: map[azcloud.ServiceName]azcloud.ServiceConfiguration{}}
	if c.AuthorityHost != "" {
		// azidentity would read AZURE_AUTHORITY_HOST only when the cloud
		// names no authority; caa names the cloud, so it passes it on.
		out.ActiveDirectoryAuthorityHost = c.AuthorityHost
	}
	for k, v := range base.Services {
		out.Services[k] = v
	}
	if c.Endpoint != "" {
		rm := out.Services[azcloud.ResourceManager]
		rm.Endpoint = c.Endpoint
		out.Services[azcloud.ResourceManager] = rm
	}
	return out, nil
}
