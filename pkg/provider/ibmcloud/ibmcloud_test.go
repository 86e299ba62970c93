package ibmcloud_test

import (
	"context"
	"log"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/IBM/go-sdk-core/v5/core"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/internal/logbuf"
	"github.com/caa-project/caa/pkg/provider/ibmcloud"
	"github.com/caa-project/caa/test/conformance"
	"github.com/caa-project/caa/test/mocks/cloud"
	vpcfake "github.com/caa-project/caa/test/mocks/ibmcloud"
)

// The credentials of every harness: the API key IAM accepts and the access
// token it issues. Both must stay out of errors and logs.
const (
	testAPIKey      = "test-apikey-9f8e7d6c5b4a39281706"
	testAccessToken = "test-access-token-0a1b2c3d4e5f"
)

// testConfig points a provider at the fake server at url.
func testConfig(url string) ibmcloud.Config {
	return ibmcloud.Config{
		Zone:              "us-south-1",
		VPCID:             vpcfake.DefaultVPC,
		SubnetID:          vpcfake.DefaultSubnet,
		SecurityGroupIDs:  []string{"r006-sg-1"},
		ResourceGroupID:   vpcfake.DefaultResourceGroup,
		BootVolumeProfile: "general-purpose",
		Endpoint:          url + "/v1",
		IAMEndpoint:       url,
		SearchEndpoint:    url,
	}
}

// serve starts the fake VPC over c and sets the API key the provider finds
// through its credential chain.
func serve(t testing.TB, c *cloud.Cloud) *httptest.Server {
	srv := httptest.NewServer(vpcfake.NewServer(c, vpcfake.WithAPIKey(testAPIKey), vpcfake.WithAccessToken(testAccessToken)))
	t.Cleanup(srv.Close)
	t.Setenv(ibmcloud.EnvAPIKey, testAPIKey)
	return srv
}

func factory(t testing.TB, opts cloud.Options) conformance.Harness {
	c := cloud.New(opts)
	srv := serve(t, c)
	logs := captureSDKLogs(t)
	p, err := ibmcloud.New(context.Background(), testConfig(srv.URL))
	require.NoError(t, err)
	// Search pages as small as the core's, so the suite's pagination
	// case crosses Global Search pages too.
	ibmcloud.SetSearchLimit(p, opts.PageSize)
	return conformance.Harness{Provider: p, Cloud: c, Logs: logs, Secrets: []string{testAPIKey, testAccessToken}}
}

func TestConformance(t *testing.T) { conformance.Run(t, factory) }

func BenchmarkIBMCloud(b *testing.B) {
	for _, latency := range []time.Duration{0, 50 * time.Millisecond} {
		b.Run("latency="+latency.String(), func(b *testing.B) { conformance.Bench(b, factory, latency) })
	}
}

// captureSDKLogs sends the IBM SDK core's log, at info level (the most a
// provider allows), to a buffer for the test, and restores the logger
// after. The provider itself does not log.
func captureSDKLogs(t testing.TB) func() string {
	prev := core.GetLogger()
	buf := &logbuf.Buffer{}
	l := log.New(buf, "", 0)
	core.SetLogger(core.NewLogger(core.LevelInfo, l, l))
	t.Cleanup(func() { core.SetLogger(prev) })
	return buf.String
}
