package daemon

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/internal/clouds"
	"github.com/caa-project/caa/pkg/ledger"
	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/pkg/reconcile"
	"github.com/caa-project/caa/test/mocks/memory"
)

// fingerprintOf parses args as `caa run` would and digests the preflight's
// settings for the --provider given, in environ.
func fingerprintOf(t *testing.T, environ []string, args ...string) string {
	t.Helper()
	f := &Options{clouds: clouds.Compiled()}
	fs := pflag.NewFlagSet("run", pflag.ContinueOnError)
	f.AddFlags(fs)
	require.NoError(t, fs.Parse(args))
	files := map[string]string{"/keys/a": "key-a\n", "/keys/b": "key-b"}
	read := func(p string) ([]byte, error) {
		if v, ok := files[p]; ok {
			return []byte(v), nil
		}
		return nil, errors.New("no such file")
	}
	return preflightFingerprint(f.providerName, f.flags, environ, read)
}

// TestPreflightFingerprint: another image, subnet, security group,
// region or identity is another fingerprint; flags of other clouds and of
// caa itself, the order of the environment and a rotated session token or
// secret are not.
func TestPreflightFingerprint(t *testing.T) {
	// awsArgs are a start's flags, with some set to other values (a
	// slice flag given twice would append, not replace).
	awsArgs := func(kv ...string) []string {
		set := map[string]string{"--aws-region": "us-east-1", "--aws-subnet-id": "subnet-1", "--aws-image": "ami-1",
			"--aws-instance-type": "t3.small", "--aws-security-group-ids": "sg-1,sg-2"}
		for i := 0; i+1 < len(kv); i += 2 {
			set[kv[i]] = kv[i+1]
		}
		args := []string{"--provider", "aws"}
		for k, v := range set {
			args = append(args, k, v)
		}
		return args
	}
	awsBase := awsArgs()
	awsEnv := []string{"AWS_ACCESS_KEY_ID=AKID1", "AWS_SECRET_ACCESS_KEY=s1", "AWS_SESSION_TOKEN=tok1", "PATH=/bin"}
	base := fingerprintOf(t, awsEnv, awsBase...)
	require.True(t, strings.HasPrefix(base, "sha256:"), base)
	for _, s := range []string{"AKID1", "s1", "tok1", "ami-1", "subnet-1"} {
		assert.NotContains(t, base, s, "only a digest is kept")
	}

	same := map[string]struct {
		env  []string
		args []string
	}{
		"the same start":             {awsEnv, awsBase},
		"environment in other order": {[]string{"PATH=/bin", "AWS_SESSION_TOKEN=tok1", "AWS_SECRET_ACCESS_KEY=s1", "AWS_ACCESS_KEY_ID=AKID1"}, awsBase},
		"a rotated session token":    {[]string{"AWS_ACCESS_KEY_ID=AKID1", "AWS_SECRET_ACCESS_KEY=s1", "AWS_SESSION_TOKEN=tok2"}, awsBase},
		"a rotated secret":           {[]string{"AWS_ACCESS_KEY_ID=AKID1", "AWS_SECRET_ACCESS_KEY=s2", "AWS_SESSION_TOKEN=tok1"}, awsBase},
		"caa's own flags":            {awsEnv, append(awsArgs(), "--resync", "5m", "--create-rate", "1")},
		"another cloud's settings":   {append(append([]string{}, awsEnv...), "AZURE_CLIENT_ID=x"), append(awsArgs(), "--azure-image", "/img/x")},
	}
	for name, c := range same {
		t.Run("same/"+name, func(t *testing.T) {
			assert.Equal(t, base, fingerprintOf(t, c.env, c.args...))
		})
	}

	differs := map[string]struct {
		env  []string
		args []string
	}{
		"another image":              {awsEnv, awsArgs("--aws-image", "ami-2")},
		"another subnet":             {awsEnv, awsArgs("--aws-subnet-id", "subnet-2")},
		"another security group":     {awsEnv, awsArgs("--aws-security-group-ids", "sg-1")},
		"another region":             {awsEnv, awsArgs("--aws-region", "eu-west-1")},
		"another access key":         {[]string{"AWS_ACCESS_KEY_ID=AKID2", "AWS_SECRET_ACCESS_KEY=s1"}, awsBase},
		"a role instead of keys":     {[]string{"AWS_ROLE_ARN=arn:aws:iam::1:role/caa", "AWS_WEB_IDENTITY_TOKEN_FILE=/var/run/token"}, awsBase},
		"another endpoint":           {awsEnv, awsArgs("--aws-endpoint", "http://127.0.0.1:1")},
		"another default type":       {awsEnv, awsArgs("--aws-instance-type", "t3.large")},
		"a session token goes unset": {[]string{"AWS_ACCESS_KEY_ID=AKID1", "AWS_SECRET_ACCESS_KEY=s1"}, awsBase},
	}
	for name, c := range differs {
		t.Run("differs/"+name, func(t *testing.T) {
			assert.NotEqual(t, base, fingerprintOf(t, c.env, c.args...))
		})
	}
}

// TestPreflightFingerprintIdentityOfOtherClouds: the identity that changes
// an Azure or IBM Cloud fingerprint, and what does not.
func TestPreflightFingerprintIdentityOfOtherClouds(t *testing.T) {
	for _, c := range clouds.Compiled() {
		if c.Name == "aws" {
			continue
		}
		t.Run(c.Name, func(t *testing.T) {
			args := []string{"--provider", c.Name}
			var env, other, rotated []string
			switch c.Name {
			case "azure":
				env = []string{"AZURE_CLIENT_ID=c1", "AZURE_TENANT_ID=t1", "AZURE_CLIENT_SECRET=s1"}
				other = []string{"AZURE_CLIENT_ID=c2", "AZURE_TENANT_ID=t1", "AZURE_CLIENT_SECRET=s1"}
				rotated = []string{"AZURE_CLIENT_ID=c1", "AZURE_TENANT_ID=t1", "AZURE_CLIENT_SECRET=s2"}
			case "ibmcloud":
				env = []string{"IBMCLOUD_API_KEY=k1"}
				other = []string{"IBMCLOUD_API_KEY=k2"}
				rotated = []string{"IBMCLOUD_API_KEY= k1 "}
			}
			base := fingerprintOf(t, env, args...)
			assert.NotEqual(t, base, fingerprintOf(t, other, args...), "another identity")
			assert.Equal(t, base, fingerprintOf(t, rotated, args...))
			assert.NotContains(t, base, "k1")
			if c.Name == "ibmcloud" {
				a := fingerprintOf(t, nil, "--provider", "ibmcloud", "--ibmcloud-api-key-file", "/keys/a")
				b := fingerprintOf(t, nil, "--provider", "ibmcloud", "--ibmcloud-api-key-file", "/keys/b")
				assert.NotEqual(t, a, b, "another key in the key file")
			}
		})
	}
}

// TestRecordedPreflight reads the fingerprint of a ledger nobody holds,
// and "" for none, another node's, or no file.
func TestRecordedPreflight(t *testing.T) {
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "ledger.db")
	assert.Empty(t, recordedPreflight(ctx, path, "n1", "c1", "", recordedPreflightTimeout), "no file")
	_, err := os.Stat(path)
	assert.ErrorIs(t, err, os.ErrNotExist, "the read creates no file")

	id := writeLedger(t, path, "n1", "c1", "sha256:abc")
	assert.Equal(t, "sha256:abc", recordedPreflight(ctx, path, "n1", "c1", id, recordedPreflightTimeout))
	assert.Equal(t, "sha256:abc", recordedPreflight(ctx, path, "n1", "c1", "", recordedPreflightTimeout))
	assert.Empty(t, recordedPreflight(ctx, path, "n2", "c1", "", recordedPreflightTimeout), "another node's")
	assert.Empty(t, recordedPreflight(ctx, path, "n1", "c2", "", recordedPreflightTimeout), "another cluster's")
	assert.Empty(t, recordedPreflight(ctx, path, "n1", "c1", "other-id", recordedPreflightTimeout), "not the Node's ledger")
}

// writeLedger creates a ledger for node and cluster with the preflight
// fingerprint fp recorded, and returns its id.
func writeLedger(t *testing.T, path, node, cluster, fp string) string {
	t.Helper()
	l, err := ledger.Open(ledger.Options{Path: path, Node: node, Cluster: cluster, Timeout: time.Second, Preflight: fp})
	require.NoError(t, err)
	id := l.Meta().ID
	require.NoError(t, l.Close())
	return id
}

// TestStartEarly: a warm restart lists ahead of the apiserver's answers
// only under the cluster and node its ledger recorded, when the cloud
// settings are those of the last passed preflight and no caa holds the
// ledger; otherwise it waits for the cluster id (and hypervisor mode and
// a held ledger never list early).
func TestStartEarly(t *testing.T) {
	f := &Options{clouds: clouds.Compiled()}
	fs := pflag.NewFlagSet("run", pflag.ContinueOnError)
	f.AddFlags(fs)
	require.NoError(t, fs.Parse([]string{"--provider", "aws", "--aws-region", "us-east-1"}))
	f.node = "n1"
	f.ledgerPath = filepath.Join(t.TempDir(), "ledger.db")
	fp := preflightFingerprint(f.providerName, f.flags, os.Environ(), os.ReadFile)
	p := memory.New(nil)
	ctx := t.Context()
	sel := func(pf *reconcile.Prefetch, cluster string) bool {
		_, ok := pf.Wait(ctx, provider.Selector{Cluster: cluster, Node: "n1"})
		return ok
	}

	assert.Nil(t, f.startEarly(ctx, p, recordedMeta{}, fp, ""), "nothing recorded: wait for the cluster id")
	writeLedger(t, f.ledgerPath, "n1", "c1", fp)
	rec := readRecordedMeta(ctx, f.ledgerPath, recordedPreflightTimeout)
	require.True(t, rec.ok)
	pf := f.startEarly(ctx, p, rec, fp, "")
	require.NotNil(t, pf, "recorded cluster, same settings, free ledger")
	assert.True(t, sel(pf, "c1"))
	assert.False(t, sel(pf, "c2"), "a guess the apiserver contradicts is not used")

	other := rec
	other.m.Preflight = "sha256:other"
	assert.Nil(t, f.startEarly(ctx, p, other, fp, ""), "changed settings: the preflight first")
	other = rec
	other.m.Node = "n2"
	assert.Nil(t, f.startEarly(ctx, p, other, fp, ""), "another node's ledger")
	assert.NotNil(t, f.startEarly(ctx, p, other, fp, "c1"), "with the cluster id known, the usual early listing")

	l, err := ledger.Open(ledger.Options{Path: f.ledgerPath, Node: "n1", Cluster: "c1", Timeout: time.Second})
	require.NoError(t, err)
	assert.Nil(t, f.startEarly(ctx, p, rec, fp, ""), "a held ledger is listed after its release")
	assert.Nil(t, f.startEarly(ctx, p, rec, fp, "c1"))
	require.NoError(t, l.Close())

	f.hv.socket = filepath.Join(t.TempDir(), "hv.sock")
	assert.Nil(t, f.startEarly(ctx, p, rec, fp, "c1"), "hypervisor mode lists nothing at the start")
}
