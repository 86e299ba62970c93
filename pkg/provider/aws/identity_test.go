package aws

import (
	"context"
	"errors"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/test/conformance"
	ec2fake "github.com/caa-project/caa/test/mocks/aws"
	"github.com/caa-project/caa/test/mocks/cloud"
)

// These tests give the provider its keys through the keyless routes of the
// SDK's default chain, against a fake STS and a fake EKS Pod Identity
// endpoint: a refused token is ErrAuth that says where to look (and holds
// no token), and once the token is good the same provider works, with no
// restart.

const (
	goodToken = "good-projected-token-4f0c2a"
	badToken  = "stale-projected-token-91be77"
)

// keylessFake is a fake EC2 that accepts only keys from keys.
func keylessFake(t *testing.T, keys *ec2fake.Keyring) string {
	t.Helper()
	c := cloud.New(ec2fake.CloudOptions(conformance.Options(&conformance.Clock{})))
	srv := httptest.NewServer(ec2fake.NewServer(c, ec2fake.WithKeyring(keys)))
	t.Cleanup(srv.Close)
	return srv.URL
}

// keylessEnv clears the static keys and every other route, then sets env.
func keylessEnv(t *testing.T, env map[string]string) {
	t.Helper()
	isolateSDK(t, "", "")
	for _, k := range []string{"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE",
		"AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_AUTHORIZATION_TOKEN",
		"AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE", "AWS_ENDPOINT_URL_STS"} {
		t.Setenv(k, "")
		require.NoError(t, os.Unsetenv(k))
	}
	for k, v := range env {
		t.Setenv(k, v)
	}
}

func checkRefusedToken(t *testing.T, p *Provider) {
	t.Helper()
	sel := provider.Selector{Cluster: conformance.Cluster, Node: "node-a"}
	_, err := p.List(context.Background(), sel)
	require.Error(t, err)
	assert.ErrorIs(t, err, provider.ErrAuth, "a refused token blocks the daemon, it is no transient failure")
	assert.Contains(t, err.Error(), "credential route refused its token")
	assert.Contains(t, err.Error(), "ec2:DescribeInstances")
	assert.False(t, strings.Contains(err.Error(), badToken), "the token is not in the error")
	var pe *provider.Error
	require.True(t, errors.As(err, &pe))
	t.Logf("refused token: %v", err)
}

func TestRefusedWebIdentityTokenIsErrAuthAndRecovers(t *testing.T) {
	keys := ec2fake.NewKeyring(nil, 0)
	sts := &ec2fake.STS{Keyring: keys, RoleARN: "arn:aws:iam::123456789012:role/caa", Subject: "system:serviceaccount:caa-system:caa",
		Verify: func(token string) (string, error) {
			if token != goodToken {
				return "", errors.New("signature does not verify")
			}
			return "system:serviceaccount:caa-system:caa", nil
		}}
	stsSrv := httptest.NewServer(sts)
	t.Cleanup(stsSrv.Close)
	file := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(file, []byte(badToken), 0o600))
	keylessEnv(t, map[string]string{"AWS_ROLE_ARN": sts.RoleARN, "AWS_WEB_IDENTITY_TOKEN_FILE": file, "AWS_ENDPOINT_URL_STS": stsSrv.URL})
	p, err := New(context.Background(), Config{Region: testRegion, SubnetID: testSubnet, Endpoint: keylessFake(t, keys), MaxBackoff: 10 * time.Millisecond})
	require.NoError(t, err)

	checkRefusedToken(t, p)
	assert.Positive(t, sts.Refused.Load())

	require.NoError(t, os.WriteFile(file, []byte(goodToken), 0o600))
	_, err = p.List(context.Background(), provider.Selector{Cluster: conformance.Cluster, Node: "node-a"})
	require.NoError(t, err, "the kubelet wrote a good token: the same provider gets keys")
	assert.Equal(t, int64(1), sts.Issued.Load())
}

func TestRefusedPodIdentityTokenIsErrAuthAndRecovers(t *testing.T) {
	keys := ec2fake.NewKeyring(nil, 0)
	endpoint := &ec2fake.ContainerCredentials{Keyring: keys, Principal: "arn:aws:sts::123456789012:assumed-role/caa/eks"}
	endpoint.SetTokens(goodToken)
	credSrv := httptest.NewServer(endpoint)
	t.Cleanup(credSrv.Close)
	file := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(file, []byte(badToken), 0o600))
	keylessEnv(t, map[string]string{"AWS_CONTAINER_CREDENTIALS_FULL_URI": credSrv.URL + "/v1/credentials", "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE": file})
	p, err := New(context.Background(), Config{Region: testRegion, SubnetID: testSubnet, Endpoint: keylessFake(t, keys), MaxBackoff: 10 * time.Millisecond})
	require.NoError(t, err)

	checkRefusedToken(t, p)
	assert.Positive(t, endpoint.Refused.Load())

	require.NoError(t, os.WriteFile(file, []byte(goodToken), 0o600))
	_, err = p.List(context.Background(), provider.Selector{Cluster: conformance.Cluster, Node: "node-a"})
	require.NoError(t, err)
	assert.Equal(t, int64(1), endpoint.Issued.Load())
}
