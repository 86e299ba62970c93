package aws

import (
	"context"
	"log/slog"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/internal/logbuf"
	"github.com/caa-project/caa/test/conformance"
	ec2fake "github.com/caa-project/caa/test/mocks/aws"
	"github.com/caa-project/caa/test/mocks/cloud"
)

// The test credentials, handed to the SDK through its environment chain.
const (
	testAccessKeyID = "AKIACAATESTKEY4D1F00"
	testSecretKey   = "caa-test-secret/9f8e7d6c5b4a39281706f5e4d3c2b1a0"
	testRegion      = "us-east-1"
	testSubnet      = "subnet-0a1b2c3d4e5f60718"
	testGroup       = "sg-0a1b2c3d4e5f60718"
)

// isolateSDK points the SDK's default chain at the test credentials only:
// no shared files, no instance metadata, nothing from the host.
func isolateSDK(tb testing.TB, accessKeyID, secret string) {
	tb.Helper()
	dir := tb.TempDir()
	for k, v := range map[string]string{
		"AWS_ACCESS_KEY_ID":           accessKeyID,
		"AWS_SECRET_ACCESS_KEY":       secret,
		"AWS_SESSION_TOKEN":           "",
		"AWS_PROFILE":                 "",
		"AWS_CONFIG_FILE":             filepath.Join(dir, "config"),
		"AWS_SHARED_CREDENTIALS_FILE": filepath.Join(dir, "credentials"),
		"AWS_EC2_METADATA_DISABLED":   "true",
		"AWS_ENDPOINT_URL":            "",
		"AWS_ENDPOINT_URL_EC2":        "",
		"AWS_MAX_ATTEMPTS":            "",
		"AWS_RETRY_MODE":              "",
		"AWS_ROLE_ARN":                "",
		"AWS_WEB_IDENTITY_TOKEN_FILE": "",
	} {
		tb.Setenv(k, v)
	}
}

// fakeEC2 is a provider wired to a fresh fake EC2.
type fakeEC2 struct {
	provider *Provider
	cloud    *cloud.Cloud
	url      string
	logs     *logbuf.Buffer
}

// newFakeEC2 starts the fake over a core made with opts and builds a
// provider on it with the test credentials; edit adjusts the Config.
func newFakeEC2(tb testing.TB, opts cloud.Options, edit func(*Config), srvOpts ...ec2fake.Option) fakeEC2 {
	tb.Helper()
	c := cloud.New(ec2fake.CloudOptions(opts))
	srv := httptest.NewServer(ec2fake.NewServer(c, append([]ec2fake.Option{ec2fake.WithCredentials(testAccessKeyID, testSecretKey)}, srvOpts...)...))
	tb.Cleanup(srv.Close)
	isolateSDK(tb, testAccessKeyID, testSecretKey)
	logs := &logbuf.Buffer{}
	cfg := Config{
		Region: testRegion, SubnetID: testSubnet, SecurityGroupIDs: []string{testGroup},
		Endpoint: srv.URL, MaxBackoff: 20 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	if edit != nil {
		edit(&cfg)
	}
	p, err := New(context.Background(), cfg)
	require.NoError(tb, err)
	return fakeEC2{provider: p, cloud: c, url: srv.URL, logs: logs}
}

func factory(tb testing.TB, opts cloud.Options) conformance.Harness {
	f := newFakeEC2(tb, opts, nil)
	return conformance.Harness{
		Provider: f.provider, Cloud: f.cloud, Logs: f.logs.String,
		Secrets: []string{testAccessKeyID, testSecretKey},
		// EC2 throttles with no Retry-After (test/mocks/aws/budget.go).
		NoRetryAfter: true,
	}
}

func TestConformance(t *testing.T) { conformance.Run(t, factory) }

func BenchmarkAWS(b *testing.B) {
	for _, latency := range []time.Duration{0, 50 * time.Millisecond} {
		b.Run("latency="+latency.String(), func(b *testing.B) { conformance.Bench(b, factory, latency) })
	}
}
