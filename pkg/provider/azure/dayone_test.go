package azure_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/pkg/provider/azure"
	"github.com/caa-project/caa/test/conformance"
	armfake "github.com/caa-project/caa/test/mocks/azure"
	"github.com/caa-project/caa/test/mocks/cloud"
)

const (
	cvmSize  = "Standard_DC2as_v5"
	podImage = "/CommunityGalleries/caa-test/Images/podvm/Versions/1.0.0"
)

// vmPuts records the body of every VM PUT the provider sends.
type vmPuts struct {
	mu     sync.Mutex
	bodies []map[string]any
}

func (v *vmPuts) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPut && strings.Contains(r.URL.Path, "/virtualMachines/") {
			b, _ := io.ReadAll(r.Body)
			r.Body = io.NopCloser(bytes.NewReader(b))
			var doc map[string]any
			if json.Unmarshal(b, &doc) == nil {
				v.mu.Lock()
				v.bodies = append(v.bodies, doc)
				v.mu.Unlock()
			}
		}
		next.ServeHTTP(w, r)
	})
}

func (v *vmPuts) last(t *testing.T) map[string]any {
	t.Helper()
	v.mu.Lock()
	defer v.mu.Unlock()
	require.NotEmpty(t, v.bodies)
	return v.bodies[len(v.bodies)-1]
}

// at walks a JSON document by member names.
func at(doc map[string]any, path ...string) any {
	var cur any = doc
	for _, p := range path {
		m, ok := cur.(map[string]any)
		if !ok {
			return nil
		}
		cur = m[p]
	}
	return cur
}

func cvmSpec(n int) provider.Spec {
	spec := conformance.Spec(n, "node-a")
	spec.InstanceType, spec.Image, spec.TEE = cvmSize, podImage, provider.TEESEVSNP
	return spec
}

// Upstream leaves secure boot off unless ENABLE_SECURE_BOOT is true: the
// pod VM images its users build are not signed, and a confidential VM with
// secure boot on never boots from one. caa's default is the same, and the
// OS disk is Premium_LRS with its guest state encrypted, as upstream sends.
func TestConfidentialVMSecureBootFollowsTheSetting(t *testing.T) {
	for _, tc := range []struct {
		name        string
		secureBoot  bool
		signed      bool
		unreachable bool
	}{
		{"default off, unsigned image", false, false, false},
		{"on, unsigned image", true, false, true},
		{"on, signed image", true, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			puts := &vmPuts{}
			var fakeOpts []armfake.Option
			if tc.signed {
				fakeOpts = append(fakeOpts, armfake.WithSignedImages(podImage))
			}
			h, _ := newHarnessOn(t, cloud.Options{}, staticToken(testToken), fakeOpts,
				func(c *azure.Config) { c.SecureBoot = tc.secureBoot }, puts.wrap)
			vm, err := h.Provider.Create(context.Background(), cvmSpec(1))
			require.NoError(t, err)
			assert.Equal(t, provider.TEESEVSNP, vm.TEE)

			body := puts.last(t)
			props := body["properties"].(map[string]any)
			assert.Equal(t, tc.secureBoot, at(props, "securityProfile", "uefiSettings", "secureBootEnabled"))
			assert.Equal(t, true, at(props, "securityProfile", "uefiSettings", "vTpmEnabled"))
			assert.Equal(t, "Premium_LRS", at(props, "storageProfile", "osDisk", "managedDisk", "storageAccountType"))
			assert.Equal(t, "VMGuestStateOnly", at(props, "storageProfile", "osDisk", "managedDisk", "securityProfile", "securityEncryptionType"))

			live := h.Cloud.Live()
			require.Len(t, live, 1)
			in := live[0]
			if tc.unreachable {
				assert.Contains(t, in.Unreachable, "secure boot", "the fake's VM never boots, as on Azure")
			} else {
				assert.Empty(t, in.Unreachable, "the VM boots")
			}
		})
	}
}

// An ordinary VM carries no security profile and no disk type of caa's.
func TestOrdinaryVMHasNoSecurityProfile(t *testing.T) {
	puts := &vmPuts{}
	h, _ := newHarnessOn(t, cloud.Options{}, staticToken(testToken), nil, func(c *azure.Config) { c.SecureBoot = true }, puts.wrap)
	spec := cvmSpec(2)
	spec.InstanceType, spec.TEE = "Standard_D2as_v5", provider.TEENone
	_, err := h.Provider.Create(context.Background(), spec)
	require.NoError(t, err)
	props := puts.last(t)["properties"].(map[string]any)
	assert.Nil(t, props["securityProfile"])
	assert.Nil(t, at(props, "storageProfile", "osDisk", "managedDisk"))
}

// A migrated ConfigMap without an SSH key starts: caa makes a throwaway
// RSA key in memory, as upstream does, and logs no private key.
func TestNoSSHKeyMakesAThrowawayOne(t *testing.T) {
	puts := &vmPuts{}
	h, _ := newHarnessOn(t, cloud.Options{}, staticToken(testToken), nil, func(c *azure.Config) { c.SSHPublicKey = "" }, puts.wrap)
	_, err := h.Provider.Create(context.Background(), conformance.Spec(3, "node-a"))
	require.NoError(t, err)
	keys, _ := at(puts.last(t), "properties", "osProfile", "linuxConfiguration", "ssh", "publicKeys").([]any)
	require.Len(t, keys, 1)
	key, _ := keys[0].(map[string]any)["keyData"].(string)
	assert.True(t, strings.HasPrefix(key, "ssh-rsa AAAA"), "an RSA key, which every Azure API version takes: %q", key)
	assert.Contains(t, h.Logs(), "throwaway RSA key")
	assert.NotContains(t, h.Logs(), "PRIVATE KEY")

	h2, _ := newHarnessOn(t, cloud.Options{}, staticToken(testToken), nil, func(c *azure.Config) { c.SSHPublicKey = "" }, puts.wrap)
	_, err = h2.Provider.Create(context.Background(), conformance.Spec(4, "node-a"))
	require.NoError(t, err)
	other := at(puts.last(t), "properties", "osProfile", "linuxConfiguration", "ssh", "publicKeys").([]any)[0].(map[string]any)["keyData"]
	assert.NotEqual(t, key, other, "each start makes its own key")
}

// A confidential VM from an image whose definition does not support
// ConfidentialVM is refused by Azure; caa takes it as a refusal of the
// pod's image, terminal, and names the image.
func TestConfidentialFromAPlainImageIsARefusalOfTheImage(t *testing.T) {
	h, _ := newHarnessOn(t, cloud.Options{}, staticToken(testToken), []armfake.Option{armfake.WithPlainImages(podImage)}, nil)
	_, err := h.Provider.Create(context.Background(), cvmSpec(5))
	require.ErrorIs(t, err, provider.ErrInvalidSpec)
	assert.True(t, provider.Terminal(err))
	assert.Equal(t, provider.RefusedImage, provider.RefusedPart(err))
	assert.ErrorContains(t, err, "ConfidentialVM")
	assert.ErrorContains(t, err, podImage)
	assert.Empty(t, h.Cloud.Live())

	spec := cvmSpec(6)
	spec.InstanceType, spec.TEE = "Standard_D2as_v5", provider.TEENone
	_, err = h.Provider.Create(context.Background(), spec)
	require.NoError(t, err, "an ordinary VM from the same image is fine")
}

// Azure's cap on properties.userData is 64 KB of base64 text: 49152 bytes
// before the encoding, which caa declares for the sandbox manager.
func TestUserDataLimitIsAzures(t *testing.T) {
	h, _ := newHarness(t, cloud.Options{}, staticToken(testToken))
	assert.Equal(t, 49152, provider.UserDataLimitOf(h.Provider))
	spec := conformance.Spec(7, "node-a")
	spec.UserData = make([]byte, 49152)
	_, err := h.Provider.Create(context.Background(), spec)
	require.NoError(t, err, "the cap fits, and the fake takes its base64")
}
