package aws

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var settingEnvs = []string{
	"CAA_AWS_REGION", "AWS_REGION", "CAA_AWS_SUBNET_ID", "CAA_AWS_SECURITY_GROUP_IDS", "CAA_AWS_IMAGE",
	"CAA_AWS_INSTANCE_TYPE", "CAA_AWS_TAGS", "CAA_AWS_ENDPOINT", "CAA_AWS_MAX_ATTEMPTS", "CAA_AWS_MAX_BACKOFF",
	"CAA_AWS_READ_TIMEOUT", "CAA_AWS_WRITE_TIMEOUT",
}

// parseFlags clears the settings' environment, applies env, and parses args.
func parseFlags(t *testing.T, env map[string]string, args ...string) Config {
	t.Helper()
	for _, k := range settingEnvs {
		t.Setenv(k, env[k])
	}
	var cfg Config
	fs := pflag.NewFlagSet("caa", pflag.ContinueOnError)
	cfg.AddFlags(fs)
	require.NoError(t, fs.Parse(args))
	return cfg
}

func TestFlagsDefaultFromTheEnvironment(t *testing.T) {
	cfg := parseFlags(t, map[string]string{
		"CAA_AWS_REGION": "eu-west-1", "AWS_REGION": "us-east-2", "CAA_AWS_SUBNET_ID": testSubnet,
		"CAA_AWS_SECURITY_GROUP_IDS": "sg-0a1b2c3d, sg-1a2b3c4d", "CAA_AWS_IMAGE": "ami-0123456789abcdef0",
		"CAA_AWS_INSTANCE_TYPE": "t3.small", "CAA_AWS_TAGS": "team=platform, env=prod",
		"CAA_AWS_ENDPOINT": "https://ec2.internal.example", "CAA_AWS_MAX_ATTEMPTS": "5", "CAA_AWS_MAX_BACKOFF": "2s",
		"CAA_AWS_READ_TIMEOUT": "10s",
	})
	require.NoError(t, cfg.Validate())
	cfg.envErrs = nil
	assert.Equal(t, Config{
		Region: "eu-west-1", SubnetID: testSubnet, SecurityGroupIDs: []string{"sg-0a1b2c3d", "sg-1a2b3c4d"},
		Image: "ami-0123456789abcdef0", InstanceType: "t3.small",
		ExtraTags: map[string]string{"team": "platform", "env": "prod"}, Endpoint: "https://ec2.internal.example",
		MaxAttempts: 5, MaxBackoff: 2 * time.Second, ReadTimeout: 10 * time.Second, WriteTimeout: 2 * time.Minute,
	}, cfg)
}

func TestFlagsOverrideTheEnvironment(t *testing.T) {
	cfg := parseFlags(t, map[string]string{"CAA_AWS_REGION": "eu-west-1", "CAA_AWS_MAX_ATTEMPTS": "5"},
		"--aws-region=ap-south-1", "--aws-subnet-id="+testSubnet, "--aws-security-group-ids=sg-0a1b2c3d",
		"--aws-tags=a=1", "--aws-max-attempts=2", "--aws-max-backoff=250ms")
	assert.Equal(t, "ap-south-1", cfg.Region)
	assert.Equal(t, []string{"sg-0a1b2c3d"}, cfg.SecurityGroupIDs)
	assert.Equal(t, map[string]string{"a": "1"}, cfg.ExtraTags)
	assert.Equal(t, 2, cfg.MaxAttempts)
	assert.Equal(t, 250*time.Millisecond, cfg.MaxBackoff)
	assert.NoError(t, cfg.Validate())
}

func TestRegionFallsBackToAWSRegionAndRetriesHaveDefaults(t *testing.T) {
	cfg := parseFlags(t, map[string]string{"AWS_REGION": "us-east-2"})
	assert.Equal(t, "us-east-2", cfg.Region)
	assert.Equal(t, defaultMaxAttempts, cfg.MaxAttempts)
	assert.Equal(t, defaultMaxBackoff, cfg.MaxBackoff)
	assert.Empty(t, cfg.SecurityGroupIDs)
	assert.Empty(t, cfg.ExtraTags)
}

func TestMalformedEnvironmentIsReportedByValidate(t *testing.T) {
	cfg := parseFlags(t, map[string]string{
		"CAA_AWS_REGION": "eu-west-1", "CAA_AWS_SUBNET_ID": testSubnet,
		"CAA_AWS_MAX_ATTEMPTS": "three", "CAA_AWS_MAX_BACKOFF": "soon", "CAA_AWS_TAGS": "team",
	})
	err := cfg.Validate()
	require.Error(t, err)
	for _, want := range []string{`CAA_AWS_MAX_ATTEMPTS="three"`, `CAA_AWS_MAX_BACKOFF="soon"`, `CAA_AWS_TAGS: "team"`} {
		assert.Contains(t, err.Error(), want)
	}
}

func TestValidateNamesTheFlagAndTheVariable(t *testing.T) {
	valid := Config{Region: testRegion, SubnetID: testSubnet}
	tests := []struct {
		name string
		edit func(*Config)
		want []string
	}{
		{"no region", func(c *Config) { c.Region = "" }, []string{"--aws-region", "CAA_AWS_REGION", "AWS_REGION"}},
		{"no subnet", func(c *Config) { c.SubnetID = "" }, []string{"--aws-subnet-id", "CAA_AWS_SUBNET_ID"}},
		{"bad subnet", func(c *Config) { c.SubnetID = "my-subnet" }, []string{"--aws-subnet-id", `"my-subnet"`}},
		{"bad group", func(c *Config) { c.SecurityGroupIDs = []string{"default"} }, []string{"--aws-security-group-ids", "CAA_AWS_SECURITY_GROUP_IDS"}},
		{"bad endpoint", func(c *Config) { c.Endpoint = "ec2.local:8080" }, []string{"--aws-endpoint", "CAA_AWS_ENDPOINT"}},
		{"too many attempts", func(c *Config) { c.MaxAttempts = 50 }, []string{"--aws-max-attempts", "CAA_AWS_MAX_ATTEMPTS"}},
		{"negative backoff", func(c *Config) { c.MaxBackoff = -time.Second }, []string{"--aws-max-backoff", "CAA_AWS_MAX_BACKOFF"}},
		{"negative read timeout", func(c *Config) { c.ReadTimeout = -time.Second }, []string{"--aws-read-timeout", "CAA_AWS_READ_TIMEOUT"}},
		{"negative write timeout", func(c *Config) { c.WriteTimeout = -time.Second }, []string{"--aws-write-timeout", "CAA_AWS_WRITE_TIMEOUT"}},
		{"reserved tag", func(c *Config) { c.ExtraTags = map[string]string{"aws:cloudformation": "x"} }, []string{"--aws-tags", "aws:"}},
		{"caa's own tag", func(c *Config) { c.ExtraTags = map[string]string{"caa-node": "x"} }, []string{"set by caa"}},
		{"Name tag", func(c *Config) { c.ExtraTags = map[string]string{"Name": "x"} }, []string{"set by caa"}},
		{"long tag value", func(c *Config) { c.ExtraTags = map[string]string{"k": strings.Repeat("v", 257)} }, []string{"longer than 256"}},
		{"too many tags", func(c *Config) {
			c.ExtraTags = map[string]string{}
			for i := range maxExtraTags + 1 {
				c.ExtraTags[strings.Repeat("k", i+1)] = "v"
			}
		}, []string{"at most 43"}},
	}
	require.NoError(t, valid.Validate())
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := valid
			tc.edit(&cfg)
			err := cfg.Validate()
			require.Error(t, err)
			for _, w := range tc.want {
				assert.Contains(t, err.Error(), w)
			}
		})
	}
}

func TestValidateReportsEveryProblem(t *testing.T) {
	err := Config{}.Validate()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "--aws-region")
	assert.Contains(t, err.Error(), "--aws-subnet-id")
}

func TestNewRefusesAnInvalidConfig(t *testing.T) {
	_, err := New(context.Background(), Config{Region: testRegion})
	assert.ErrorContains(t, err, "--aws-subnet-id")
}
