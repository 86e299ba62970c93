package cluster

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// writeKeys writes a ConfigMap's or a Secret's keys as a mounted volume
// does: one file per key.
func writeKeys(t *testing.T, keys map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for k, v := range keys {
		require.NoError(t, os.WriteFile(filepath.Join(dir, k), []byte(v), 0o600))
	}
	return dir
}

// TestClusterScopeReadsTheAdaptorsSettings: `caa cluster` given upstream's
// peer-pods-cm and peer-pods-secret (as `caa run` reads them) takes its
// cloud, region and credentials from them, ignores the node's keys, and
// lets its own variables win. Before, it had no such flag: with the
// adaptor's settings only, it refused to start without --provider.
func TestClusterScopeReadsTheAdaptorsSettings(t *testing.T) {
	for _, k := range []string{"CAA_PROVIDER", "CAA_AWS_REGION", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} {
		t.Setenv(k, "")
		os.Unsetenv(k)
	}
	cm := writeKeys(t, map[string]string{"CLOUD_PROVIDER": "aws", "AWS_REGION": "eu-west-1", "AWS_SUBNET_ID": "subnet-1",
		"PODVM_AMI_ID": "ami-1", "DISABLECVM": "true", "PEERPODS_LIMIT_PER_NODE": "4"})
	secret := writeKeys(t, map[string]string{"AWS_ACCESS_KEY_ID": "AKIAEXAMPLE", "AWS_SECRET_ACCESS_KEY": "s3cret"})
	t.Setenv("CAA_ADAPTOR_CONFIG_DIR", cm+","+secret)
	f := NewOptions("test")
	fs := pflag.NewFlagSet("cluster", pflag.ContinueOnError)
	f.AddFlags(fs)
	require.NoError(t, fs.Parse([]string{"--identity", "r1"}))
	applied, err := f.applyAdaptorConfig()
	require.NoError(t, err)
	require.NoError(t, f.check(), "it starts with the adaptor's settings alone")
	assert.Equal(t, "aws", f.providerName)
	assert.Equal(t, "eu-west-1", fs.Lookup("aws-region").Value.String())
	assert.Equal(t, "AKIAEXAMPLE", os.Getenv("AWS_ACCESS_KEY_ID"), "the credentials reach the SDK")
	var keys []string
	for _, a := range applied {
		keys = append(keys, a.Key)
	}
	assert.NotContains(t, keys, "DISABLECVM", "a node's key is not the cluster scope's")
	assert.NotContains(t, keys, "PEERPODS_LIMIT_PER_NODE")

	// caa's own variable wins over the adaptor's key.
	t.Setenv("CAA_AWS_REGION", "us-east-2")
	f = NewOptions("test")
	fs = pflag.NewFlagSet("cluster", pflag.ContinueOnError)
	f.AddFlags(fs)
	require.NoError(t, fs.Parse(nil))
	_, err = f.applyAdaptorConfig()
	require.NoError(t, err)
	assert.Equal(t, "us-east-2", fs.Lookup("aws-region").Value.String())

	// An unknown key is refused by name, as `caa run` refuses it.
	t.Setenv("CAA_ADAPTOR_CONFIG_DIR", writeKeys(t, map[string]string{"CLOUD_PROVIDER": "aws", "AWS_REGON": "x"}))
	f = NewOptions("test")
	fs = pflag.NewFlagSet("cluster", pflag.ContinueOnError)
	f.AddFlags(fs)
	require.NoError(t, fs.Parse(nil))
	_, err = f.applyAdaptorConfig()
	assert.ErrorContains(t, err, "AWS_REGON")
}
