package armfake_test

import (
	"encoding/base64"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	armfake "github.com/caa-project/caa/test/mocks/azure"
)

// The VM's IMDS serves properties.userData (base64) and never the custom
// data, which Azure keeps apart; ARM shows the user data only when asked
// with $expand=userData; 64 KB of base64 is accepted.
func TestUserDataIsWhatIMDSServesAndCustomDataIsNot(t *testing.T) {
	f := newFake(t)
	require.Equal(t, 201, f.do(http.MethodPut, nics+"/vm1-nic", nicBody()).status)
	body := edit("properties.osProfile.customData", base64.StdEncoding.EncodeToString([]byte("#custom data")))
	max := make([]byte, 49152) // 65536 characters of base64, the cap
	copy(max, userData)
	body["properties"].(map[string]any)["userData"] = base64.StdEncoding.EncodeToString(max)
	r := f.do(http.MethodPut, vms+"/vm1", body)
	require.Equal(t, 201, r.status, r.raw)
	f.poll(r)
	in := f.cloud.Live()
	require.Len(t, in, 1)

	imds := func(path string, hdr bool) *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodGet, path, nil)
		if hdr {
			req.Header.Set("Metadata", "true")
		}
		armfake.IMDS(f.cloud, in[0].ID).ServeHTTP(rec, req)
		return rec
	}
	rec := imds(armfake.IMDSUserDataPath+"?api-version=2021-01-01&format=text", true)
	require.Equal(t, http.StatusOK, rec.Code)
	got, err := base64.StdEncoding.DecodeString(rec.Body.String())
	require.NoError(t, err)
	assert.Equal(t, max, got, "IMDS serves properties.userData")
	assert.NotContains(t, string(got), "#custom data", "custom data never reaches IMDS")
	assert.Equal(t, http.StatusBadRequest, imds(armfake.IMDSUserDataPath+"?api-version=2021-01-01", false).Code, "Metadata: true is required")
	assert.Equal(t, http.StatusBadRequest, imds(armfake.IMDSUserDataPath, true).Code, "an api-version is required")

	r = f.do(http.MethodGet, vms+"/vm1", nil)
	assert.Empty(t, str(r.body, "properties", "userData"), "a plain GET hides the user data")
	r = f.do(http.MethodGet, vms+"/vm1?api-version="+apiVersion+"&$expand=userData", nil)
	assert.Equal(t, base64.StdEncoding.EncodeToString(max), str(r.body, "properties", "userData"))
	assert.NotContains(t, r.raw, "customData")
}
