package vpcfake_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/test/mocks/cloud"
	vpcfake "github.com/caa-project/caa/test/mocks/ibmcloud"
)

const (
	apiKey  = "fake-test-apikey"
	version = "?version=2026-08-18&generation=2"
	image   = "img-good"
	profile = "bx2-2x8"
)

// env is one fake server with a bearer token from its IAM endpoint.
type env struct {
	t     *testing.T
	cloud *cloud.Cloud
	url   string
	token string
}

func newEnv(t *testing.T, opts ...vpcfake.Option) *env {
	t.Helper()
	c := cloud.New(cloud.Options{
		IDPrefix: "0717_", PageSize: 3, Images: []string{image}, Types: []string{profile, "bx2-8x32"},
		Now: func() time.Time { return time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC) },
	})
	srv := httptest.NewServer(vpcfake.NewServer(c, append([]vpcfake.Option{vpcfake.WithAPIKey(apiKey)}, opts...)...))
	t.Cleanup(srv.Close)
	e := &env{t: t, cloud: c, url: srv.URL}
	status, body := e.iam(url.Values{"grant_type": {"urn:ibm:params:oauth:grant-type:apikey"}, "apikey": {apiKey}})
	require.Equal(t, http.StatusOK, status, "%v", body)
	e.token = body["access_token"].(string)
	require.NotEmpty(t, e.token)
	return e
}

// iam posts a token request.
func (e *env) iam(form url.Values) (int, map[string]any) {
	e.t.Helper()
	resp, err := http.Post(e.url+"/identity/token", "application/x-www-form-urlencoded", strings.NewReader(form.Encode()))
	require.NoError(e.t, err)
	return decode(e.t, resp)
}

// call makes an authorised VPC call; path carries its own query.
func (e *env) call(method, path string, body any) (int, map[string]any, http.Header) {
	e.t.Helper()
	return e.raw(method, path, body, "Bearer "+e.token)
}

func (e *env) raw(method, path string, body any, auth string) (int, map[string]any, http.Header) {
	e.t.Helper()
	var r io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		r = strings.NewReader(b)
	default:
		buf, err := json.Marshal(b)
		require.NoError(e.t, err)
		r = bytes.NewReader(buf)
	}
	req, err := http.NewRequest(method, e.url+path, r)
	require.NoError(e.t, err)
	if r != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(e.t, err)
	status, m := decode(e.t, resp)
	return status, m, resp.Header
}

func decode(t *testing.T, resp *http.Response) (int, map[string]any) {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	m := map[string]any{}
	if len(b) > 0 {
		require.NoError(t, json.Unmarshal(b, &m), "body %s", b)
	}
	return resp.StatusCode, m
}

// code is the first VPC error code of a body.
func code(body map[string]any) string {
	errs, _ := body["errors"].([]any)
	if len(errs) == 0 {
		return ""
	}
	first, _ := errs[0].(map[string]any)
	c, _ := first["code"].(string)
	return c
}

// prototype is a valid instance-by-image prototype to vary.
func prototype(name string, tags ...string) map[string]any {
	return map[string]any{
		"name":    name,
		"image":   map[string]any{"id": image},
		"profile": map[string]any{"name": profile},
		"zone":    map[string]any{"name": "us-south-1"},
		"vpc":     map[string]any{"id": "r006-vpc-a"},
		"primary_network_attachment": map[string]any{
			"virtual_network_interface": map[string]any{
				"auto_delete": true, "subnet": map[string]any{"id": "0717-subnet-a"},
				"security_groups": []any{map[string]any{"id": "r006-sg-a"}},
			},
		},
		"boot_volume_attachment": map[string]any{
			"delete_volume_on_instance_delete": true,
			"volume":                           map[string]any{"profile": map[string]any{"name": "general-purpose"}, "user_tags": tags},
		},
		"user_data": "#cloud-config\n",
	}
}

// str digs a string out of nested maps: str(m, "a", "b") is m["a"]["b"].
func str(m map[string]any, path ...string) string {
	var cur any = m
	for _, p := range path {
		mm, ok := cur.(map[string]any)
		if !ok {
			return ""
		}
		cur = mm[p]
	}
	s, _ := cur.(string)
	return s
}
