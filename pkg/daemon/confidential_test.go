package daemon

import (
	"testing"

	"github.com/caa-project/caa/internal/clouds"
	"github.com/spf13/pflag"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// parsedRunFlags is the daemon's flags as args set them, the environment
// left out of it.
func parsedRunFlags(t *testing.T, args ...string) *Options {
	t.Helper()
	t.Setenv("CAA_CONFIDENTIAL", "")
	for _, k := range []string{"CAA_AWS_INSTANCE_TYPE", "CAA_AZURE_INSTANCE_TYPE", "CAA_IBMCLOUD_INSTANCE_TYPE", "CAA_INSTANCE_TYPES", "CAA_ALLOWED_TYPES"} {
		t.Setenv(k, "")
	}
	f := &Options{clouds: clouds.Compiled()}
	fs := pflag.NewFlagSet("run", pflag.ContinueOnError)
	f.AddFlags(fs)
	require.NoError(t, fs.Parse(args))
	return f
}

func TestConfidentialIsTheDefault(t *testing.T) {
	f := parsedRunFlags(t, "--provider", "aws")
	assert.True(t, f.confidential)
	assert.Equal(t, "on", f.confidentialMode())
	f = parsedRunFlags(t, "--provider", "aws", "--confidential=false")
	assert.False(t, f.confidential)
	assert.Equal(t, "off (--confidential=false)", f.confidentialMode(), "the opt-out is named where a VM is reported")
}

// TestConfidentialPreflightRefusesOrdinaryDefaults: a default type that
// cannot run a confidential VM refuses the start, naming the flag, the
// TEE and a type that can; --confidential=false lets it run.
func TestConfidentialPreflightRefusesOrdinaryDefaults(t *testing.T) {
	for _, tc := range []struct{ cloud, typ, want string }{
		{"aws", "t3.small", "--aws-instance-type t3.small cannot run a confidential VM (AMD SEV-SNP); use m6a.large or set --confidential=false"},
		{"azure", "Standard_D2as_v5", "--azure-instance-type Standard_D2as_v5 cannot run a confidential VM (AMD SEV-SNP or Intel TDX); use Standard_DC2as_v5 or set --confidential=false"},
		{"ibmcloud", "bx2-2x8", "--ibmcloud-instance-type bx2-2x8 cannot run a confidential VM (Intel TDX); use bx3dc-2x10 or set --confidential=false"},
	} {
		t.Run(tc.cloud, func(t *testing.T) {
			f := parsedRunFlags(t, "--provider", tc.cloud, "--"+tc.cloud+"-instance-type", tc.typ)
			assert.EqualError(t, f.checkConfidential(), tc.want+" to run ordinary VMs")
			f = parsedRunFlags(t, "--provider", tc.cloud, "--"+tc.cloud+"-instance-type", tc.typ, "--confidential=false")
			assert.NoError(t, f.checkConfidential())
		})
	}
	// The capable defaults pass.
	for _, args := range [][]string{
		{"--provider", "aws", "--aws-instance-type", "m6a.large"},
		{"--provider", "azure", "--azure-instance-type", "Standard_DC2as_v5"},
		{"--provider", "ibmcloud"}, // the default profile, bx3dc-2x10
	} {
		assert.NoError(t, parsedRunFlags(t, args...).checkConfidential(), "%v", args)
	}
}

// TestConfidentialPreflightRefusesOrdinaryListedTypes: --instance-types
// and --allowed-types may list only capable types; the refusal names the
// offending ones, capable ones as examples, and the opt-out.
func TestConfidentialPreflightRefusesOrdinaryListedTypes(t *testing.T) {
	f := parsedRunFlags(t, "--provider", "aws", "--aws-instance-type", "m6a.large",
		"--instance-types", "m6a.large,t3.small,c6a.xlarge:4:8192,g5.xlarge")
	err := f.checkConfidential()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "--instance-types lists t3.small, g5.xlarge, which cannot run a confidential VM (AMD SEV-SNP)")
	assert.Contains(t, err.Error(), "such as m6a.large")
	assert.Contains(t, err.Error(), "--confidential=false")

	f = parsedRunFlags(t, "--provider", "aws", "--aws-instance-type", "m6a.large", "--allowed-types", "m6a.large,t3.large")
	assert.ErrorContains(t, f.checkConfidential(), "--allowed-types lists t3.large, which cannot run")

	f = parsedRunFlags(t, "--provider", "aws", "--aws-instance-type", "m6a.large", "--instance-types", "m6a.large,m6a.xlarge,r6a.large:2:16384")
	assert.NoError(t, f.checkConfidential())
}

// TestCheckRefusesAnOrdinaryDefaultType: the refusal is part of the flag
// checks, so `caa run` exits with it as a usage error before anything.
func TestCheckRefusesAnOrdinaryDefaultType(t *testing.T) {
	f := parsedRunFlags(t, "--provider", "aws", "--node-name", "n", "--aws-instance-type", "t3.small")
	assert.ErrorContains(t, f.check(), "--aws-instance-type t3.small cannot run a confidential VM")
}
