package azure_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	azlog "github.com/Azure/azure-sdk-for-go/sdk/azcore/log"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/internal/logbuf"
	"github.com/caa-project/caa/pkg/provider/azure"
	"github.com/caa-project/caa/test/conformance"
	armfake "github.com/caa-project/caa/test/mocks/azure"
	"github.com/caa-project/caa/test/mocks/cloud"
)

// testToken is the bearer token the fake accepts; the suite checks it never
// shows in an error or a log line.
const testToken = "eyJhbGciOiJub25lIn0.caa-fake-arm-token-7c1e4b"

const subnetID = "/subscriptions/" + armfake.DefaultSubscription +
	"/resourceGroups/caa-net/providers/Microsoft.Network/virtualNetworks/caa-vnet/subnets/peerpods"

// staticToken is a credential that always hands out the same token.
type staticToken string

func (s staticToken) GetToken(context.Context, policy.TokenRequestOptions) (azcore.AccessToken, error) {
	return azcore.AccessToken{Token: string(s), ExpiresOn: time.Now().Add(time.Hour)}, nil
}

func testConfig(endpoint string) azure.Config {
	return azure.Config{
		SubscriptionID: armfake.DefaultSubscription,
		ResourceGroup:  armfake.DefaultResourceGroup,
		Location:       armfake.DefaultLocation,
		SubnetID:       subnetID,
		AdminUsername:  "caa",
		SSHPublicKey:   "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGNhYS10ZXN0LWtleQ caa@test",
		Tags:           map[string]string{"team": "peerpods"},
		Endpoint:       endpoint,
		PollInterval:   time.Millisecond,
		RetryDelay:     time.Millisecond,
	}
}

// newHarness wires a provider to a fresh fake ARM over a cloud made with
// opts, through the wraps (to watch requests). Tests (not benchmarks) capture the SDK's log, which is global, so
// tests in this package do not run in parallel.
func newHarness(t testing.TB, opts cloud.Options, cred azcore.TokenCredential, wraps ...func(http.Handler) http.Handler) (conformance.Harness, string) {
	t.Helper()
	return newHarnessOn(t, opts, cred, nil, nil, wraps...)
}

// newHarnessOn is newHarness with options for the fake ARM and an edit of
// the provider's configuration (both may be nil).
func newHarnessOn(t testing.TB, opts cloud.Options, cred azcore.TokenCredential, fakeOpts []armfake.Option, edit func(*azure.Config),
	wraps ...func(http.Handler) http.Handler) (conformance.Harness, string) {
	t.Helper()
	c := cloud.New(opts)
	h := armfake.NewServer(c, append([]armfake.Option{armfake.WithBearerToken(testToken)}, fakeOpts...)...)
	for _, wrap := range wraps {
		h = wrap(h)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)

	logs := &logbuf.Buffer{}
	if _, bench := t.(*testing.B); !bench {
		azlog.SetListener(func(ev azlog.Event, msg string) { _, _ = logs.Write([]byte(string(ev) + ": " + msg + "\n")) })
		t.Cleanup(func() { azlog.SetListener(nil) })
	}
	logger := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	cfg := testConfig(srv.URL)
	if edit != nil {
		edit(&cfg)
	}
	p, err := azure.New(context.Background(), cfg, azure.WithCredential(cred), azure.WithLogger(logger))
	require.NoError(t, err)
	return conformance.Harness{Provider: p, Cloud: c, Logs: logs.String, Secrets: []string{testToken}}, srv.URL
}

func factory(t testing.TB, opts cloud.Options) conformance.Harness {
	h, _ := newHarness(t, opts, staticToken(testToken))
	return h
}

func TestConformance(t *testing.T) { conformance.Run(t, factory) }

func BenchmarkAzure(b *testing.B) {
	for _, latency := range []time.Duration{0, 50 * time.Millisecond} {
		b.Run("latency="+latency.String(), func(b *testing.B) { conformance.Bench(b, factory, latency) })
	}
}
