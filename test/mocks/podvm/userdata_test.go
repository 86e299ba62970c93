package podvmfake_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	ec2fake "github.com/caa-project/caa/test/mocks/aws"
	armfake "github.com/caa-project/caa/test/mocks/azure"
	"github.com/caa-project/caa/test/mocks/cloud"
	vpcfake "github.com/caa-project/caa/test/mocks/ibmcloud"
	podvmfake "github.com/caa-project/caa/test/mocks/podvm"
)

// Each cloud's path hands the VM the user data the instance was created
// with, by the requests the stock image makes.
func TestEachCloudsPathServesTheUserData(t *testing.T) {
	ctx := context.Background()
	c := cloud.New(cloud.Options{IDPrefix: "i-"})
	ud := []byte("#cloud-config\nwrite_files: []\n")
	in, err := c.Create(cloud.CreateRequest{Name: "vm", UserData: ud})
	require.NoError(t, err)
	bare, err := c.Create(cloud.CreateRequest{Name: "bare"})
	require.NoError(t, err)
	sources := []podvmfake.UserDataSource{
		podvmfake.EC2IMDS{IMDS: func(id string) http.Handler { return ec2fake.IMDS(c, id, nil) }},
		podvmfake.AzureIMDS{IMDS: func(id string) http.Handler { return armfake.IMDS(c, id) }},
		podvmfake.CIDataVolume{Files: func(id string) (map[string][]byte, error) { return vpcfake.CIData(c, id) }},
	}
	for _, src := range sources {
		t.Run(src.Name(), func(t *testing.T) {
			got, err := src.UserData(ctx, in.ID)
			require.NoError(t, err)
			assert.Equal(t, ud, got)
		})
	}
	_, err = sources[0].UserData(ctx, bare.ID)
	require.ErrorContains(t, err, "404", "EC2: an instance without user data has none")
	_, err = sources[1].UserData(ctx, bare.ID)
	require.ErrorContains(t, err, "empty", "Azure: a VM without properties.userData gets nothing")
}

// EC2's IMDS is IMDSv2 only, as caa launches its VMs: no token, a wrong or
// expired token, or a GET for a token are refused.
func TestEC2IMDSNeedsALiveToken(t *testing.T) {
	c := cloud.New(cloud.Options{IDPrefix: "i-"})
	in, err := c.Create(cloud.CreateRequest{Name: "vm", UserData: []byte("x")})
	require.NoError(t, err)
	now := time.Now()
	h := ec2fake.IMDS(c, in.ID, func() time.Time { return now })
	do := func(method, path string, hdr ...string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(method, path, nil)
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	assert.Equal(t, http.StatusUnauthorized, do(http.MethodGet, ec2fake.IMDSUserDataPath).Code, "IMDSv1 is off")
	assert.Equal(t, http.StatusMethodNotAllowed, do(http.MethodGet, ec2fake.IMDSTokenPath).Code)
	assert.Equal(t, http.StatusBadRequest, do(http.MethodPut, ec2fake.IMDSTokenPath, "X-aws-ec2-metadata-token-ttl-seconds", "0").Code)
	tok := do(http.MethodPut, ec2fake.IMDSTokenPath, "X-aws-ec2-metadata-token-ttl-seconds", "60").Body.String()
	assert.Equal(t, http.StatusUnauthorized, do(http.MethodGet, ec2fake.IMDSUserDataPath, "X-aws-ec2-metadata-token", tok+"x").Code)
	r := do(http.MethodGet, ec2fake.IMDSUserDataPath, "X-aws-ec2-metadata-token", tok)
	assert.Equal(t, http.StatusOK, r.Code)
	assert.Equal(t, "x", r.Body.String())
	now = now.Add(61 * time.Second)
	assert.Equal(t, http.StatusUnauthorized, do(http.MethodGet, ec2fake.IMDSUserDataPath, "X-aws-ec2-metadata-token", tok).Code, "expired")
}

// The fake VM decodes strictly: a key other than write_files, an entry key
// other than path and content, or a path off the image's allow-list is
// refused before anything boots.
func TestBootRefusesWhatTheImageWouldNotWrite(t *testing.T) {
	for name, ud := range map[string]string{
		"another top-level key": "#cloud-config\nruncmd: [reboot]\n",
		"another entry key":     "#cloud-config\nwrite_files:\n- path: /run/peerpod/apf.json\n  content: '{}'\n  permissions: '0777'\n",
		"a path off the list":   "#cloud-config\nwrite_files:\n- path: /etc/shadow\n  content: x\n",
	} {
		t.Run(name, func(t *testing.T) {
			_, err := podvmfake.Boot(context.Background(), podvmfake.Options{UserData: []byte(ud)})
			require.Error(t, err)
			if strings.Contains(name, "off the list") {
				assert.ErrorContains(t, err, "allow-list")
			}
		})
	}
}
