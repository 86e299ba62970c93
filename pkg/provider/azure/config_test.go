package azure

import (
	"context"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const testSubnet = "/subscriptions/6a1b2c3d-0000-4000-8000-00000000c0a0/resourceGroups/net/providers/Microsoft.Network/virtualNetworks/vnet/subnets/pods"

func validConfig() Config {
	return Config{
		SubscriptionID: "6a1b2c3d-0000-4000-8000-00000000c0a0",
		ResourceGroup:  "caa-peerpods",
		Location:       "eastus",
		SubnetID:       testSubnet,
		AdminUsername:  "caa",
		SSHPublicKey:   "ssh-ed25519 AAAAC3Nza key",
	}
}

func TestValidate(t *testing.T) {
	require.NoError(t, validConfig().Validate())
	tests := []struct {
		name string
		edit func(*Config)
		want []string // all of these in the message
	}{
		{"nothing set", func(c *Config) { *c = Config{} }, []string{
			"--azure-subscription-id (CAA_AZURE_SUBSCRIPTION_ID or AZURE_SUBSCRIPTION_ID): required",
			"--azure-resource-group (CAA_AZURE_RESOURCE_GROUP): required",
			"--azure-location (CAA_AZURE_LOCATION): required",
			"--azure-subnet-id (CAA_AZURE_SUBNET_ID): required",
			"--azure-admin-username (CAA_AZURE_ADMIN_USERNAME): required",
		}},
		{"subscription not a GUID", func(c *Config) { c.SubscriptionID = "my-sub" }, []string{"--azure-subscription-id", "GUID"}},
		{"group with a slash", func(c *Config) { c.ResourceGroup = "a/b" }, []string{"--azure-resource-group"}},
		{"zone", func(c *Config) { c.Zone = "4" }, []string{"--azure-zone (CAA_AZURE_ZONE)"}},
		{"subnet is a vnet", func(c *Config) {
			c.SubnetID = "/subscriptions/s/resourceGroups/net/providers/Microsoft.Network/virtualNetworks/vnet"
		}, []string{"--azure-subnet-id", "not the ARM id of a subnet"}},
		{"security group is a subnet", func(c *Config) { c.SecurityGroupID = testSubnet }, []string{"--azure-security-group-id"}},
		{"root admin", func(c *Config) { c.AdminUsername = "root" }, []string{"--azure-admin-username"}},
		{"private key pasted", func(c *Config) { c.SSHPublicKey = "-----BEGIN OPENSSH PRIVATE KEY-----" }, []string{"--azure-ssh-public-key", "not an OpenSSH public key"}},
		{"image with spaces", func(c *Config) { c.Image = "Canonical ubuntu" }, []string{"--azure-image (CAA_AZURE_IMAGE)"}},
		{"reserved tag", func(c *Config) { c.Tags = map[string]string{"caa-node": "x"} }, []string{"--azure-tags (CAA_AZURE_TAGS)", "caa- prefix"}},
		{"bad tag name", func(c *Config) { c.Tags = map[string]string{"a?b": "x"} }, []string{"--azure-tags", "a?b"}},
		{"cloud", func(c *Config) { c.Cloud = "AzureMoon" }, []string{"--azure-cloud (CAA_AZURE_CLOUD)", "AzureMoon"}},
		{"endpoint not a URL", func(c *Config) { c.Endpoint = "management.azure.com" }, []string{"--azure-endpoint (CAA_AZURE_ENDPOINT)"}},
		{"plain http off loopback", func(c *Config) { c.Endpoint = "http://arm.example.com" }, []string{"--azure-endpoint", "loopback"}},
		{"negative poll interval", func(c *Config) { c.PollInterval = -time.Second }, []string{"--azure-poll-interval"}},
		{"negative read timeout", func(c *Config) { c.ReadTimeout = -time.Second }, []string{"--azure-read-timeout", "CAA_AZURE_READ_TIMEOUT"}},
		{"negative write timeout", func(c *Config) { c.WriteTimeout = -time.Second }, []string{"--azure-write-timeout", "CAA_AZURE_WRITE_TIMEOUT"}},
		{"too many retries", func(c *Config) { c.MaxRetries = 50 }, []string{"--azure-max-retries"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := validConfig()
			tc.edit(&c)
			err := c.Validate()
			require.Error(t, err)
			for _, w := range tc.want {
				assert.Contains(t, err.Error(), w)
			}
		})
	}
	ok := validConfig()
	ok.Endpoint, ok.Zone, ok.Cloud = "http://127.0.0.1:8080", "1", "AzureUSGovernment"
	ok.SecurityGroupID = "/subscriptions/s/resourceGroups/net/providers/Microsoft.Network/networkSecurityGroups/nsg"
	assert.NoError(t, ok.Validate(), "loopback http, a zone, another cloud and an NSG are fine")
}

func TestAddFlagsReadsTheEnvironment(t *testing.T) {
	t.Setenv("AZURE_SUBSCRIPTION_ID", "00000000-0000-0000-0000-0000000000aa")
	t.Setenv("CAA_AZURE_RESOURCE_GROUP", "rg-from-env")
	t.Setenv("CAA_AZURE_LOCATION", "westeurope")
	t.Setenv("CAA_AZURE_SUBNET_ID", testSubnet)
	t.Setenv("CAA_AZURE_SSH_PUBLIC_KEY", "ssh-rsa AAAAB3 k")
	t.Setenv("CAA_AZURE_TAGS", "team=peerpods, env=prod")
	t.Setenv("CAA_AZURE_POLL_INTERVAL", "2s")
	t.Setenv("CAA_AZURE_MAX_RETRIES", "4")

	var c Config
	fs := pflag.NewFlagSet("caa", pflag.ContinueOnError)
	c.AddFlags(fs)
	require.NoError(t, fs.Parse([]string{"--azure-location=northeurope", "--azure-zone", "2"}))
	require.NoError(t, c.Validate())
	assert.Equal(t, "00000000-0000-0000-0000-0000000000aa", c.SubscriptionID, "the SDK's own variable as a fallback")
	assert.Equal(t, "rg-from-env", c.ResourceGroup)
	assert.Equal(t, "northeurope", c.Location, "a flag wins over the environment")
	assert.Equal(t, "2", c.Zone)
	assert.Equal(t, map[string]string{"team": "peerpods", "env": "prod"}, c.Tags)
	assert.Equal(t, 2*time.Second, c.PollInterval)
	assert.Equal(t, 4, c.MaxRetries)
	assert.Equal(t, DefaultRetryDelay, c.RetryDelay)
	assert.Equal(t, DefaultAdminUsername, c.AdminUsername)
	assert.Equal(t, DefaultCloud, c.Cloud)

	t.Setenv("CAA_AZURE_SUBSCRIPTION_ID", "00000000-0000-0000-0000-0000000000bb")
	var c2 Config
	c2.AddFlags(pflag.NewFlagSet("caa", pflag.ContinueOnError))
	assert.Equal(t, "00000000-0000-0000-0000-0000000000bb", c2.SubscriptionID, "caa's own variable first")
}

func TestBadEnvironmentDefaultsFailValidation(t *testing.T) {
	t.Setenv("CAA_AZURE_POLL_INTERVAL", "often")
	t.Setenv("CAA_AZURE_MAX_RETRIES", "many")
	t.Setenv("CAA_AZURE_TAGS", "novalue")
	c := validConfig()
	c.AddFlags(pflag.NewFlagSet("caa", pflag.ContinueOnError))
	err := c.Validate()
	require.Error(t, err)
	for _, w := range []string{"CAA_AZURE_POLL_INTERVAL", "CAA_AZURE_MAX_RETRIES", "CAA_AZURE_TAGS"} {
		assert.Contains(t, err.Error(), w)
	}
}

func TestNew(t *testing.T) {
	_, err := New(context.Background(), Config{})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "--azure-subscription-id")

	// The default chain is built without a call; the first operation
	// would use it.
	p, err := New(context.Background(), validConfig())
	require.NoError(t, err)
	assert.Equal(t, "azure", p.Name())
	assert.Equal(t, DefaultPollInterval, p.cfg.PollInterval)
	assert.Equal(t, DefaultMaxRetries, p.cfg.MaxRetries)

	cc, err := validConfig().cloudConfig()
	require.NoError(t, err)
	assert.Equal(t, "https://management.azure.com", cc.Services["resourceManager"].Endpoint)
	withEndpoint := validConfig()
	withEndpoint.Endpoint = "https://arm.internal.example"
	cc, err = withEndpoint.cloudConfig()
	require.NoError(t, err)
	assert.Equal(t, "https://arm.internal.example", cc.Services["resourceManager"].Endpoint)
	assert.Equal(t, "https://management.core.windows.net/", cc.Services["resourceManager"].Audience, "the token audience stays the cloud's")

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = New(ctx, validConfig())
	assert.ErrorIs(t, err, context.Canceled)
}

// TestAuthorityHost: AZURE_AUTHORITY_HOST (what the workload identity
// webhook sets) is the default of --azure-authority-host, caa's own
// variable wins over it, the flag over both, and it reaches the cloud
// configuration the credential is built with; only https is taken.
func TestAuthorityHost(t *testing.T) {
	parse := func(args ...string) Config {
		t.Helper()
		var c Config
		fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
		c.AddFlags(fs)
		require.NoError(t, fs.Parse(args))
		base := validConfig()
		base.AuthorityHost, base.DisableInstanceDiscovery, base.envErrs = c.AuthorityHost, c.DisableInstanceDiscovery, c.envErrs
		return base
	}
	t.Setenv("AZURE_AUTHORITY_HOST", "https://login.example.test/")
	c := parse()
	assert.Equal(t, "https://login.example.test/", c.AuthorityHost)
	cc, err := c.cloudConfig()
	require.NoError(t, err)
	assert.Equal(t, "https://login.example.test/", cc.ActiveDirectoryAuthorityHost)
	assert.False(t, c.DisableInstanceDiscovery)

	t.Setenv("CAA_AZURE_AUTHORITY_HOST", "https://login.caa.test/")
	t.Setenv("CAA_AZURE_DISABLE_INSTANCE_DISCOVERY", "true")
	c = parse()
	assert.Equal(t, "https://login.caa.test/", c.AuthorityHost)
	assert.True(t, c.DisableInstanceDiscovery)
	c = parse("--azure-authority-host", "https://flag.test/", "--azure-disable-instance-discovery=false")
	assert.Equal(t, "https://flag.test/", c.AuthorityHost)
	assert.False(t, c.DisableInstanceDiscovery)
	require.NoError(t, c.Validate())

	c.AuthorityHost = "http://login.example.test/"
	assert.ErrorContains(t, c.Validate(), "--azure-authority-host (CAA_AZURE_AUTHORITY_HOST or AZURE_AUTHORITY_HOST)")
	c.AuthorityHost = ""
	cc, err = c.cloudConfig()
	require.NoError(t, err)
	assert.Equal(t, "https://login.microsoftonline.com/", cc.ActiveDirectoryAuthorityHost, "the cloud's own by default")

	t.Setenv("CAA_AZURE_DISABLE_INSTANCE_DISCOVERY", "maybe")
	assert.ErrorContains(t, parse().Validate(), "CAA_AZURE_DISABLE_INSTANCE_DISCOVERY")
}
