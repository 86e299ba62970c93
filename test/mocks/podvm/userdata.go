package podvmfake

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"

	"github.com/caa-project/caa/test/mocks/cloud"
)

// UserDataSource is where a fake pod VM reads its user data, the way the
// peer-pods image does on one cloud (confidential-containers/
// cloud-api-adaptor src/cloud-api-adaptor/pkg/userdata: provision.go,
// imds.go): never from the fake cloud's core directly, so that user data
// caa puts where the image does not look never reaches the VM.
type UserDataSource interface {
	// UserData returns instance instanceID's user data as the image gets it.
	UserData(ctx context.Context, instanceID string) ([]byte, error)
	// Name says which path this is, for errors.
	Name() string
}

// IMDSAddr is the link-local address every cloud's metadata service has.
const IMDSAddr = "169.254.169.254"

// handlerClient is an HTTP client whose every request is served by h in
// process: the VM's link-local metadata service.
func handlerClient(h http.Handler) *http.Client {
	return &http.Client{Transport: roundTripper(func(r *http.Request) (*http.Response, error) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		return rec.Result(), nil
	})}
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func get(ctx context.Context, c *http.Client, method, url string, hdr map[string]string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, url, nil)
	if err != nil {
		return nil, err
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s %s: %s", method, url, resp.Status)
	}
	return body, nil
}

// EC2IMDS reads user data as the image does on EC2: IMDSv2, a PUT for a
// session token (TTL 60 s), then a GET of /latest/user-data with it; the
// body is the user data itself, not base64.
type EC2IMDS struct {
	// IMDS is the instance's metadata service (ec2fake.IMDS).
	IMDS func(instanceID string) http.Handler
}

func (EC2IMDS) Name() string { return "EC2 IMDSv2 /latest/user-data" }

func (s EC2IMDS) UserData(ctx context.Context, id string) ([]byte, error) {
	c := handlerClient(s.IMDS(id))
	tok, err := get(ctx, c, http.MethodPut, "http://"+IMDSAddr+"/latest/api/token", map[string]string{"X-aws-ec2-metadata-token-ttl-seconds": "60"})
	if err != nil {
		return nil, fmt.Errorf("IMDSv2 token: %w", err)
	}
	return get(ctx, c, http.MethodGet, "http://"+IMDSAddr+"/latest/user-data", map[string]string{"X-aws-ec2-metadata-token": string(tok)})
}

// AzureIMDS reads user data as the image does on Azure: a GET of
// compute/userData (format=text) with Metadata: true, base64-decoded. It
// is the VM's properties.userData; custom data never reaches it.
type AzureIMDS struct {
	// IMDS is the VM's metadata service (armfake.IMDS).
	IMDS func(instanceID string) http.Handler
}

func (AzureIMDS) Name() string { return "Azure IMDS compute/userData" }

func (s AzureIMDS) UserData(ctx context.Context, id string) ([]byte, error) {
	b64, err := get(ctx, handlerClient(s.IMDS(id)), http.MethodGet,
		"http://"+IMDSAddr+"/metadata/instance/compute/userData?api-version=2021-01-01&format=text", map[string]string{"Metadata": "true"})
	if err != nil {
		return nil, err
	}
	data, err := base64.StdEncoding.DecodeString(string(b64))
	if err != nil {
		return nil, fmt.Errorf("compute/userData is not base64: %w", err)
	}
	if len(data) == 0 {
		return nil, fmt.Errorf("compute/userData is empty: the VM has no properties.userData")
	}
	return data, nil
}

// CIDataVolume reads user data as the image does where cloud-init's NoCloud
// volume is attached (IBM Cloud VPC): the file user-data of the volume
// mounted at /media/cidata. The fake writes the volume's files into a
// fresh directory (its mount) and reads the file from there.
type CIDataVolume struct {
	// Files are the volume's files (vpcfake.CIData).
	Files func(instanceID string) (map[string][]byte, error)
}

func (CIDataVolume) Name() string { return "cidata volume user-data" }

func (s CIDataVolume) UserData(_ context.Context, id string) ([]byte, error) {
	files, err := s.Files(id)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "cidata-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	for name, b := range files {
		if strings.ContainsRune(name, '/') {
			return nil, fmt.Errorf("cidata file name %q", name)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			return nil, err
		}
	}
	data, err := os.ReadFile(filepath.Join(dir, "user-data"))
	if err != nil {
		return nil, fmt.Errorf("cidata: %w", err)
	}
	return data, nil
}

// CoreUserData hands the VM what the core holds, for clouds that have no
// metadata path of their own (the in-memory provider of unit tests).
type CoreUserData struct{ Cloud *cloud.Cloud }

func (CoreUserData) Name() string { return "the core's user data (no cloud metadata path)" }

func (s CoreUserData) UserData(_ context.Context, id string) ([]byte, error) {
	in, err := s.Cloud.Get(id)
	if err != nil {
		return nil, err
	}
	return in.UserData(), nil
}
