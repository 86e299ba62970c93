package deploy_test

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// ibmTrustedProfile is the overlay that runs caa on an IBM Cloud trusted
// profile: overlays/ibmcloud without the API key Secret, plus the settings
// that select the IBM SDK's ContainerAuthenticator and the projected
// ServiceAccount token it reads. Every check of overlays/ibmcloud
// (render_test.go, manifests_test.go, memory_test.go, static_test.go)
// holds for it as long as TestIBMCloudTrustedProfileOverlay shows it
// differs from it in nothing else.
const ibmTrustedProfile = "overlays/ibmcloud-trusted-profile"

// TestIBMCloudTrustedProfileOverlay renders the trusted-profile overlay
// beside overlays/ibmcloud, alone and with every component: the same
// objects, field for field, except that the DaemonSet reads no Secret,
// sets IBMCLOUD_AUTH_TYPE=container, the profile and the token file, and
// mounts a projected token for the audience "iam" at that file. Its README
// says where the access policies are.
func TestIBMCloudTrustedProfileOverlay(t *testing.T) {
	needBinaries(t)
	bin := kubectl(t)
	for name, pair := range withComponents(t, bin, "overlays/ibmcloud", ibmTrustedProfile) {
		t.Run(name, func(t *testing.T) {
			assertOnlyCredentialsDiffer(t, "the overlay", "overlays/ibmcloud", decode(t, pair[0]), decode(t, pair[1]), func(t *testing.T, got *unstructured.Unstructured) {
				if got.GetKind() == "DaemonSet" {
					checkTrustedProfileRoute(t, got)
				}
			})
		})
	}
	assertReadmeSays(t, ibmTrustedProfile, "../ibmcloud/access-policies.json", "the README says where the policies are")
}

// checkTrustedProfileRoute checks what the overlay adds to the DaemonSet
// and takes it out again: the three IBMCLOUD_* variables, the token
// volume and its mount, the token file inside the mount.
func checkTrustedProfileRoute(t *testing.T, ds *unstructured.Unstructured) {
	t.Helper()
	containers, _, err := unstructured.NestedSlice(ds.Object, "spec", "template", "spec", "containers")
	require.NoError(t, err)
	require.Len(t, containers, 1)
	c := containers[0].(map[string]any)
	env, _ := c["env"].([]any)
	got := map[string]string{}
	var kept []any
	for _, e := range env {
		m := e.(map[string]any)
		switch name, _ := m["name"].(string); name {
		case "IBMCLOUD_AUTH_TYPE", "IBMCLOUD_IAM_PROFILE_ID", "IBMCLOUD_CR_TOKEN_FILENAME":
			got[name], _ = m["value"].(string)
		default:
			kept = append(kept, e)
		}
	}
	assert.Equal(t, "container", got["IBMCLOUD_AUTH_TYPE"])
	assert.NotEmpty(t, got["IBMCLOUD_IAM_PROFILE_ID"])
	c["env"] = kept

	mounts, _ := c["volumeMounts"].([]any)
	mountPath := ""
	var keptMounts []any
	for _, m := range mounts {
		if m.(map[string]any)["name"] == "iam-token" {
			mountPath, _ = m.(map[string]any)["mountPath"].(string)
			assert.Equal(t, true, m.(map[string]any)["readOnly"])
			continue
		}
		keptMounts = append(keptMounts, m)
	}
	c["volumeMounts"] = keptMounts
	require.NoError(t, unstructured.SetNestedSlice(ds.Object, containers, "spec", "template", "spec", "containers"))

	volumes, _, err := unstructured.NestedSlice(ds.Object, "spec", "template", "spec", "volumes")
	require.NoError(t, err)
	var keptVolumes []any
	found := false
	for _, v := range volumes {
		m := v.(map[string]any)
		if m["name"] != "iam-token" {
			keptVolumes = append(keptVolumes, v)
			continue
		}
		sources, _, err := unstructured.NestedSlice(m, "projected", "sources")
		require.NoError(t, err)
		require.Len(t, sources, 1)
		tok := sources[0].(map[string]any)["serviceAccountToken"].(map[string]any)
		assert.Equal(t, "iam", tok["audience"], "IAM takes tokens for the audience iam")
		assert.Equal(t, filepath.Join(mountPath, tok["path"].(string)), got["IBMCLOUD_CR_TOKEN_FILENAME"], "the route reads the mounted token")
		found = true
	}
	require.True(t, found, "a projected ServiceAccount token volume")
	require.NoError(t, unstructured.SetNestedSlice(ds.Object, keptVolumes, "spec", "template", "spec", "volumes"))
}

// TestIBMCloudTrustedProfileOverlayOnTheAPIServer dry-runs the overlay
// against a real kube-apiserver.
func TestIBMCloudTrustedProfileOverlayOnTheAPIServer(t *testing.T) {
	t.Parallel() // an apiserver of its own: its start-up and waits overlap the others'
	dryRunOnTheAPIServer(t, ibmTrustedProfile)
}
