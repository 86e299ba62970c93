package ibmcloud

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/IBM/go-sdk-core/v5/core"
	"github.com/spf13/pflag"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func valid() Config {
	return Config{Region: "us-south", Zone: "us-south-1", SubnetID: "0717-s", BootVolumeProfile: "general-purpose"}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name string
		edit func(*Config)
		want []string // substrings of the error; none: valid
	}{
		{"valid", func(*Config) {}, nil},
		{"endpoint instead of region", func(c *Config) { c.Region, c.Endpoint = "", "https://vpc.example/v1" }, nil},
		{"private endpoint in a region", func(c *Config) { c.Endpoint = "https://us-south.private.iaas.cloud.ibm.com/v1" }, nil},
		{"no region", func(c *Config) { c.Region = "" }, []string{"--ibmcloud-region", "CAA_IBMCLOUD_REGION", "IBMCLOUD_REGION"}},
		{"no zone", func(c *Config) { c.Zone = "" }, []string{"no zone", "--ibmcloud-zone", "CAA_IBMCLOUD_ZONE"}},
		{"no subnet", func(c *Config) { c.SubnetID = "" }, []string{"no subnet id", "--ibmcloud-subnet-id", "CAA_IBMCLOUD_SUBNET_ID"}},
		{"no boot volume profile", func(c *Config) { c.BootVolumeProfile = "" }, []string{"--ibmcloud-boot-volume-profile", "CAA_IBMCLOUD_BOOT_VOLUME_PROFILE"}},
		{"unknown region", func(c *Config) { c.Region, c.Zone = "mars-north", "mars-north-1" }, []string{"--ibmcloud-region", "mars-north"}},
		{"zone of another region", func(c *Config) { c.Zone = "eu-de-1" }, []string{"--ibmcloud-zone", "eu-de-1", "us-south"}},
		{"endpoint not http", func(c *Config) { c.Endpoint = "ftp://vpc.example" }, []string{"--ibmcloud-endpoint"}},
		{"iam endpoint not a URL", func(c *Config) { c.IAMEndpoint = "iam" }, []string{"--ibmcloud-iam-endpoint"}},
		{"empty tag key", func(c *Config) { c.Tags = map[string]string{"": "v"} }, []string{"--ibmcloud-tags"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := valid()
			tc.edit(&c)
			err := c.Validate()
			if tc.want == nil {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			for _, w := range tc.want {
				assert.Contains(t, err.Error(), w)
			}
		})
	}
}

func TestAddFlags(t *testing.T) {
	t.Setenv("CAA_IBMCLOUD_REGION", "")
	t.Setenv(EnvRegion, "eu-de")
	t.Setenv("CAA_IBMCLOUD_ZONE", "eu-de-2")
	t.Setenv("CAA_IBMCLOUD_SUBNET_ID", "02b7-subnet")
	t.Setenv("CAA_IBMCLOUD_SECURITY_GROUP_IDS", "sg-1, sg-2,")
	t.Setenv("CAA_IBMCLOUD_TAGS", "team=infra, cost-center=cc-42")
	t.Setenv("CAA_IBMCLOUD_INSTANCE_TYPE", "")
	t.Setenv("CAA_IBMCLOUD_READ_TIMEOUT", "10s")
	t.Setenv("CAA_IBMCLOUD_WRITE_TIMEOUT", "")
	t.Setenv("CAA_IBMCLOUD_SEARCH_ENDPOINT", "")
	t.Setenv("CAA_IBMCLOUD_ACCOUNT_ID", "")
	var c Config
	fs := pflag.NewFlagSet("caa", pflag.ContinueOnError)
	c.AddFlags(fs)
	require.NoError(t, fs.Parse([]string{"--ibmcloud-vpc-id", "r010-vpc"}))
	assert.Equal(t, Config{
		Region: "eu-de", Zone: "eu-de-2", VPCID: "r010-vpc", SubnetID: "02b7-subnet", SecurityGroupIDs: []string{"sg-1", "sg-2"},
		InstanceType: "bx3dc-2x10", BootVolumeProfile: "general-purpose", Tags: map[string]string{"team": "infra", "cost-center": "cc-42"},
		ReadTimeout: 10 * time.Second, WriteTimeout: 2 * time.Minute,
		SearchEndpoint: "https://api.global-search-tagging.cloud.ibm.com",
	}, c, "Global Search defaults to the public endpoint")
	require.NoError(t, c.Validate())

	t.Setenv("CAA_IBMCLOUD_REGION", "us-east")
	t.Setenv("CAA_IBMCLOUD_SEARCH_ENDPOINT", "https://api.private.global-search-tagging.cloud.ibm.com")
	t.Setenv("CAA_IBMCLOUD_ACCOUNT_ID", "acct-1")
	var d Config
	fs = pflag.NewFlagSet("caa", pflag.ContinueOnError)
	d.AddFlags(fs)
	require.NoError(t, fs.Parse([]string{"--ibmcloud-zone=us-east-3", "--ibmcloud-tags=a=b"}))
	assert.Equal(t, "us-east", d.Region, "caa's own variable wins over IBMCLOUD_REGION")
	assert.Equal(t, "us-east-3", d.Zone, "a flag wins over the environment")
	assert.Equal(t, map[string]string{"a": "b"}, d.Tags)
	assert.Equal(t, "https://api.private.global-search-tagging.cloud.ibm.com", d.SearchEndpoint)
	assert.Equal(t, "acct-1", d.AccountID)
	d.SearchEndpoint = "ftp://search"
	assert.ErrorContains(t, d.Validate(), "--ibmcloud-search-endpoint")
	d.SearchEndpoint = ""
	for _, name := range []string{"ibmcloud-endpoint", "ibmcloud-iam-endpoint", "ibmcloud-api-key-file", "ibmcloud-image",
		"ibmcloud-resource-group-id", "ibmcloud-boot-volume-profile"} {
		assert.NotNil(t, fs.Lookup(name), name)
	}

	t.Setenv("CAA_IBMCLOUD_TAGS", "team")
	var bad Config
	bad.AddFlags(pflag.NewFlagSet("caa", pflag.ContinueOnError))
	err := bad.Validate()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "CAA_IBMCLOUD_TAGS")

	t.Setenv("CAA_IBMCLOUD_TAGS", "")
	t.Setenv("CAA_IBMCLOUD_WRITE_TIMEOUT", "soon")
	var badTimeout Config
	badTimeout.AddFlags(pflag.NewFlagSet("caa", pflag.ContinueOnError))
	err = badTimeout.Validate()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "CAA_IBMCLOUD_WRITE_TIMEOUT")
	d.ReadTimeout = -time.Second
	assert.ErrorContains(t, d.Validate(), "--ibmcloud-read-timeout")
}

// isolateCredentials clears every source of the credential chain: caa's,
// the CLI's, and the IBM SDK's own (variables and credentials files).
func isolateCredentials(t *testing.T) {
	t.Helper()
	t.Setenv("HOME", t.TempDir())
	for _, k := range []string{EnvAPIKey, "IBM_CREDENTIALS_FILE", "VPC_AUTH_TYPE", "VPC_APIKEY", "VPC_AUTH_URL", "VCAP_SERVICES",
		EnvAuthType, EnvProfileID, EnvProfileName, EnvCRTokenFile, "IBMCLOUD_AUTH_URL"} {
		t.Setenv(k, "")
		require.NoError(t, os.Unsetenv(k))
	}
}

func TestCredentialChain(t *testing.T) {
	const fileKey, envKey, sdkKey = "key-from-file-0001", "key-from-env-0002", "key-from-sdk-0003"
	keyFile := filepath.Join(t.TempDir(), "apikey")
	require.NoError(t, os.WriteFile(keyFile, []byte(fileKey+"\n"), 0o600))

	iamKey := func(t *testing.T, c Config) (string, string) {
		t.Helper()
		a, err := c.authenticator()
		require.NoError(t, err)
		iam, ok := a.(*core.IamAuthenticator)
		require.True(t, ok, "an IAM authenticator, got %T", a)
		return iam.ApiKey, iam.URL
	}

	t.Run("file first", func(t *testing.T) {
		isolateCredentials(t)
		t.Setenv(EnvAPIKey, envKey)
		key, url := iamKey(t, Config{APIKeyFile: keyFile, IAMEndpoint: "https://iam.example"})
		assert.Equal(t, fileKey, key)
		assert.Equal(t, "https://iam.example", url)
	})
	t.Run("then IBMCLOUD_API_KEY", func(t *testing.T) {
		isolateCredentials(t)
		t.Setenv(EnvAPIKey, envKey)
		t.Setenv("VPC_APIKEY", sdkKey)
		key, _ := iamKey(t, Config{})
		assert.Equal(t, envKey, key)
	})
	t.Run("then the SDK's own settings", func(t *testing.T) {
		isolateCredentials(t)
		t.Setenv("VPC_AUTH_TYPE", "iam")
		t.Setenv("VPC_APIKEY", sdkKey)
		t.Setenv("VPC_AUTH_URL", "https://iam.sdk.example")
		key, url := iamKey(t, Config{})
		assert.Equal(t, sdkKey, key)
		assert.Equal(t, "https://iam.sdk.example", url)
	})
	t.Run("nothing", func(t *testing.T) {
		isolateCredentials(t)
		_, err := Config{}.authenticator()
		require.Error(t, err)
		for _, w := range []string{"--ibmcloud-api-key-file", "CAA_IBMCLOUD_API_KEY_FILE", EnvAPIKey, "VPC_AUTH_TYPE"} {
			assert.Contains(t, err.Error(), w)
		}
	})
	t.Run("errors never show the key", func(t *testing.T) {
		isolateCredentials(t)
		empty := filepath.Join(t.TempDir(), "empty")
		require.NoError(t, os.WriteFile(empty, []byte(" \n"), 0o600))
		_, err := Config{APIKeyFile: empty}.authenticator()
		assert.ErrorContains(t, err, "is empty")
		_, err = Config{APIKeyFile: filepath.Join(t.TempDir(), "missing")}.authenticator()
		assert.ErrorIs(t, err, os.ErrNotExist)

		const odd = `"quoted-key-0004"`
		t.Setenv(EnvAPIKey, odd)
		_, err = Config{}.authenticator()
		require.Error(t, err, "the SDK refuses a key wrapped in quotes")
		assert.NotContains(t, err.Error(), "quoted-key-0004")
	})
}

func TestTrustedProfileRoute(t *testing.T) {
	container := func(t *testing.T, c Config) *core.ContainerAuthenticator {
		t.Helper()
		a, err := c.authenticator()
		require.NoError(t, err)
		ca, ok := a.(*core.ContainerAuthenticator)
		require.True(t, ok, "a container authenticator, got %T", a)
		return ca
	}
	t.Run("by id, with the token file", func(t *testing.T) {
		isolateCredentials(t)
		t.Setenv(EnvAuthType, "container")
		t.Setenv(EnvProfileID, "Profile-1")
		t.Setenv(EnvCRTokenFile, "/var/run/secrets/tokens/sa-token")
		ca := container(t, Config{IAMEndpoint: "https://private.iam.example"})
		assert.Equal(t, "Profile-1", ca.IAMProfileID)
		assert.Equal(t, "/var/run/secrets/tokens/sa-token", ca.CRTokenFilename)
		assert.Equal(t, "https://private.iam.example", ca.URL, "--ibmcloud-iam-endpoint is the token service")
	})
	t.Run("by name, the SDK's defaults otherwise", func(t *testing.T) {
		isolateCredentials(t)
		t.Setenv(EnvAuthType, "CONTAINER")
		t.Setenv(EnvProfileName, "caa-peer-pods")
		t.Setenv("IBMCLOUD_AUTH_URL", "https://iam.sdk.example")
		ca := container(t, Config{})
		assert.Equal(t, "caa-peer-pods", ca.IAMProfileName)
		assert.Empty(t, ca.CRTokenFilename)
		assert.Equal(t, "https://iam.sdk.example", ca.URL)
		p, err := New(t.Context(), Config{Region: "us-south", Zone: "us-south-1", SubnetID: "s", BootVolumeProfile: "general-purpose"})
		require.NoError(t, err)
		assert.Equal(t, defaultCRTokenFiles, p.crTokenFiles, "the preflight looks where the SDK looks")
		assert.Contains(t, p.Credentials(), "caa-peer-pods")
		assert.Contains(t, p.Credentials(), "/var/run/secrets/tokens/sa-token")
	})
	t.Run("IBMCLOUD_REGION alone selects nothing", func(t *testing.T) {
		isolateCredentials(t)
		t.Setenv(EnvRegion, "us-south")
		t.Setenv(EnvAPIKey, "key-0005")
		a, err := Config{}.authenticator()
		require.NoError(t, err)
		assert.IsType(t, &core.IamAuthenticator{}, a)
	})
	t.Run("no profile", func(t *testing.T) {
		isolateCredentials(t)
		t.Setenv(EnvAuthType, "container")
		_, err := Config{}.authenticator()
		require.Error(t, err)
		assert.Contains(t, err.Error(), EnvAuthType)
	})
	t.Run("an API key beside it is refused", func(t *testing.T) {
		isolateCredentials(t)
		t.Setenv(EnvAuthType, "container")
		t.Setenv(EnvProfileID, "Profile-1")
		t.Setenv(EnvAPIKey, "key-0006")
		_, err := Config{}.authenticator()
		require.Error(t, err)
		assert.Contains(t, err.Error(), "keep one credential route")
		assert.NotContains(t, err.Error(), "key-0006")
		keyFile := filepath.Join(t.TempDir(), "apikey")
		require.NoError(t, os.WriteFile(keyFile, []byte("key-0007"), 0o600))
		t.Setenv(EnvAPIKey, "")
		_, err = Config{APIKeyFile: keyFile}.authenticator()
		assert.ErrorContains(t, err, "keep one credential route")
	})
}
