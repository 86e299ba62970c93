package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/test/mocks/cloud"
)

func TestServesEachCloudAndItsControls(t *testing.T) {
	for _, name := range []string{"aws", "azure", "ibmcloud"} {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			pr, pw := io.Pipe()
			done := make(chan error, 1)
			go func() {
				done <- run(ctx, []string{"--cloud", name, "--latency", "1ms", "--page-size", "7"}, pw)
				_ = pw.Close()
			}()
			line, err := bufio.NewReader(pr).ReadString('\n')
			require.NoError(t, err)
			m := regexp.MustCompile(`^cloud=(\S+) endpoint=(http://127\.0\.0\.1:\d+) control=(\S+)\n$`).FindStringSubmatch(line)
			require.NotNil(t, m, "printed %q", line)
			assert.Equal(t, name, m[1])

			resp, err := http.Get(m[3] + "faults")
			require.NoError(t, err)
			var faults map[string]any
			require.NoError(t, json.NewDecoder(resp.Body).Decode(&faults))
			_ = resp.Body.Close()
			assert.Equal(t, "1ms", faults["latency"], "flags reach the cloud")

			cancel()
			select {
			case err := <-done:
				require.NoError(t, err)
			case <-time.After(10 * time.Second):
				t.Fatal("fakecloud did not stop on cancel")
			}
		})
	}
}

func TestBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--cloud", "gcp"},
		{"--page-size", "0"},
		{"--server-error-rate", "1.5"},
		{"--latency", "soon"},
		{"extra"},
	} {
		err := run(context.Background(), args, io.Discard)
		assert.Error(t, err, "%v", args)
	}
}

func TestPublishedLimitsFlag(t *testing.T) {
	for _, limits := range []bool{false, true} {
		c, err := parse([]string{"--cloud", "aws", "--published-limits=" + strconv.FormatBool(limits)}, io.Discard)
		require.NoError(t, err)
		_, h := handler(c)
		srv := httptest.NewServer(h)
		refused := 0
		for range 200 { // unfiltered DescribeInstances: a burst of 50, then 10 a second
			req, err := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("Action=DescribeInstances&Version=2016-11-15"))
			require.NoError(t, err)
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			req.Header.Set("Authorization", "AWS4-HMAC-SHA256 Credential=AKIDTEST/20260506/us-east-1/ec2/aws4_request, SignedHeaders=host, Signature=00")
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusServiceUnavailable {
				refused++
			}
		}
		srv.Close()
		if limits {
			assert.Positive(t, refused, "calls past the burst are refused")
		} else {
			assert.Zero(t, refused, "no limits unless asked")
		}
	}
}

// TestAWSPolicyFlag: with --aws-policy the EC2 fake enforces the file (the
// shipped policy allows DescribeInstances but no terminate of an instance
// caa did not tag); a bad file or another cloud is refused.
func TestAWSPolicyFlag(t *testing.T) {
	const policy = "../../../../deploy/overlays/aws/iam-policy.json"
	c, err := parse([]string{"--cloud", "aws", "--aws-policy", policy}, io.Discard)
	require.NoError(t, err)
	core, h := handler(c)
	srv := httptest.NewServer(h)
	defer srv.Close()
	in, err := core.Create(cloud.CreateRequest{Image: "ami-0123456789abcdef0", InstanceType: "t3.small"})
	require.NoError(t, err)
	call := func(body string) int {
		req, err := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Authorization", "AWS4-HMAC-SHA256 Credential=AKIDTEST/20260506/us-east-1/ec2/aws4_request, SignedHeaders=host, Signature=00")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	assert.Equal(t, http.StatusOK, call("Action=DescribeInstances&Version=2016-11-15"))
	assert.Equal(t, http.StatusForbidden, call("Action=TerminateInstances&Version=2016-11-15&InstanceId.1="+in.ID), "an untagged instance")
	assert.Len(t, core.Live(), 1)

	for _, args := range [][]string{{"--cloud", "aws", "--aws-policy", "no-such-file.json"}, {"--cloud", "azure", "--aws-policy", policy}} {
		_, err := parse(args, io.Discard)
		assert.Error(t, err, "%v", args)
	}
}
