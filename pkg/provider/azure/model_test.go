package azure

import (
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/compute/armcompute/v8"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/pkg/provider"
)

// hostnameRE is a DNS label, which a Linux computer name must be; it is
// also a valid Azure VM name.
var hostnameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

func TestVMName(t *testing.T) {
	tests := []struct {
		key, want string
	}{
		{"uid-0001-a1", "caa-uid-0001-a1-"},
		{"0f8e2c4a-1b2c-4d5e-8f90-a1b2c3d4e5f6-a1", "caa-0f8e2c4a-1b2c-4d5e-8f90-a1b2c3d4e5f6-a1-"},
		{"Pod_UID/Attempt:2", "caa-pod-uid-attempt-2-"},
		{"__--__", "caa-"},
		{strings.Repeat("x", 100), "caa-" + strings.Repeat("x", 46) + "-"},
		{strings.Repeat("a", 45) + "/b", "caa-" + strings.Repeat("a", 45) + "-"},
	}
	for _, tc := range tests {
		name := vmName(tc.key)
		assert.True(t, strings.HasPrefix(name, tc.want), "%q -> %q, want prefix %q", tc.key, name, tc.want)
		assert.Len(t, name, len(tc.want)+hashLen, "%q -> %q", tc.key, name)
		assert.Regexp(t, hostnameRE, name, "%q -> %q is a DNS label", tc.key, name)
		assert.LessOrEqual(t, len(nicName(name)), 80, "NIC names stop at 80")
		assert.LessOrEqual(t, len(diskName(name)), 80, "disk names stop at 80")
		assert.Equal(t, name, vmName(tc.key), "deterministic")
	}
	// Keys that fold to the same readable part stay apart by their hash.
	seen := map[string]string{}
	for _, k := range []string{"uid-1-a1", "UID-1-A1", "uid_1_a1", "uid-1-a1 ", strings.Repeat("x", 100), strings.Repeat("x", 101)} {
		n := vmName(k)
		_, dup := seen[n]
		assert.False(t, dup, "%q and %q share %s", k, seen[n], n)
		seen[n] = k
	}
}

func TestStateOf(t *testing.T) {
	tests := []struct {
		provisioning, power string
		want                provider.State
	}{
		{"Creating", "", provider.StatePending},
		{"Creating", "running", provider.StatePending},
		{"Succeeded", "starting", provider.StatePending},
		{"Succeeded", "running", provider.StateRunning},
		{"Updating", "running", provider.StateRunning},
		{"Succeeded", "stopping", provider.StateStopping},
		{"Succeeded", "deallocating", provider.StateStopping},
		{"Succeeded", "stopped", provider.StateStopped},
		{"Succeeded", "deallocated", provider.StateStopped},
		{"Deleting", "running", provider.StateStopping},
		// Failed is the last operation's outcome: a running VM stays
		// alive (degraded); only a stopped or deallocated one is dead.
		{"Failed", "running", provider.StateRunning},
		{"Failed", "", provider.StateRunning},
		{"Failed", "unknown", provider.StateRunning},
		{"Failed", "starting", provider.StatePending},
		{"Canceled", "", provider.StateRunning},
		{"Failed", "stopped", provider.StateFailed},
		{"Failed", "deallocated", provider.StateFailed},
		{"Canceled", "deallocated", provider.StateFailed},
		{"Failed", "deallocating", provider.StateStopping},
		{"Succeeded", "", provider.StateRunning},
		{"Updating", "", provider.StateRunning},
		{"Succeeded", "unknown", provider.StateUnknown},
		{"Migrating", "", provider.StateUnknown},
		{"", "", provider.StateUnknown},
	}
	for _, tc := range tests {
		got := stateOf(tc.provisioning, tc.power)
		assert.Equal(t, tc.want, got, "%s + PowerState/%s", tc.provisioning, tc.power)
		degraded := degradedOf(got, tc.provisioning, "VMExtensionProvisioningError")
		if failedProvisioning(tc.provisioning) && got.Alive() {
			assert.Contains(t, degraded, "VMExtensionProvisioningError", "%s + PowerState/%s is degraded", tc.provisioning, tc.power)
		} else {
			assert.Empty(t, degraded, "%s + PowerState/%s is not degraded", tc.provisioning, tc.power)
		}
	}
}

func TestImageRoundTrip(t *testing.T) {
	tests := []struct {
		image string
		want  armcompute.ImageReference
	}{
		{"/subscriptions/s/resourceGroups/g/providers/Microsoft.Compute/images/podvm", armcompute.ImageReference{ID: new("/subscriptions/s/resourceGroups/g/providers/Microsoft.Compute/images/podvm")}},
		{"/subscriptions/s/resourceGroups/g/providers/Microsoft.Compute/galleries/x/images/podvm/versions/1.0.0",
			armcompute.ImageReference{ID: new("/subscriptions/s/resourceGroups/g/providers/Microsoft.Compute/galleries/x/images/podvm/versions/1.0.0")}},
		{"/SharedGalleries/abc-podvm/Images/podvm/Versions/latest", armcompute.ImageReference{SharedGalleryImageID: new("/SharedGalleries/abc-podvm/Images/podvm/Versions/latest")}},
		{"/CommunityGalleries/cocopod/Images/podvm/Versions/latest", armcompute.ImageReference{CommunityGalleryImageID: new("/CommunityGalleries/cocopod/Images/podvm/Versions/latest")}},
		{"Canonical:ubuntu-24_04-lts:server:latest", armcompute.ImageReference{Publisher: new("Canonical"), Offer: new("ubuntu-24_04-lts"), SKU: new("server"), Version: new("latest")}},
		{"img-0a1b2c3d4e5f60718", armcompute.ImageReference{ID: new("img-0a1b2c3d4e5f60718")}},
		{"a:b:c", armcompute.ImageReference{ID: new("a:b:c")}},
		{"a::c:d", armcompute.ImageReference{ID: new("a::c:d")}},
	}
	for _, tc := range tests {
		ref := imageReference(tc.image)
		assert.Equal(t, tc.want, *ref, tc.image)
		assert.Equal(t, tc.image, imageString(ref), "VM.Image is spec.Image")
	}
}

func TestVMTags(t *testing.T) {
	p := &Provider{cfg: Config{Tags: map[string]string{"team": "peerpods", provider.TagNode: "spoofed"}}}
	spec := provider.Spec{Key: "k", Cluster: "c", Node: "n", PodUID: "u", PodNamespace: "ns", PodName: "pod",
		ExtraTags: map[string]string{"team": "from-spec"}}
	tags, err := p.vmTags(spec)
	require.NoError(t, err)
	assert.Equal(t, "from-spec", *tags["team"], "the spec's extra tags over the configured ones")
	assert.Equal(t, "n", *tags[provider.TagNode], "identity tags over both")
	assert.Equal(t, "ns/pod", *tags[provider.TagPod])

	// A pod name longer than a tag value takes: the pod tag is shortened,
	// so the pod still gets its VM.
	spec.PodNamespace, spec.PodName = "team", strings.Repeat("p", 253)
	tags, err = p.vmTags(spec)
	require.NoError(t, err)
	assert.Equal(t, provider.PodTag(spec.PodNamespace, spec.PodName), *tags[provider.TagPod])
	assert.LessOrEqual(t, len(*tags[provider.TagPod]), maxTagValue)

	spec.PodName = "pod"
	spec.ExtraTags = map[string]string{"a/b": "x"}
	_, err = p.vmTags(spec)
	assert.ErrorIs(t, err, provider.ErrInvalidSpec)

	spec.ExtraTags = map[string]string{}
	for i := range maxTags {
		spec.ExtraTags[strings.Repeat("t", i+1)] = "x"
	}
	_, err = p.vmTags(spec)
	assert.ErrorIs(t, err, provider.ErrInvalidSpec, "more than 50 tags")
}

func TestVMModel(t *testing.T) {
	p := &Provider{cfg: Config{Location: "westeurope", Zone: "2", AdminUsername: "peer", SSHPublicKey: "ssh-ed25519 AAAA k"}}
	spec := provider.Spec{InstanceType: "Standard_D2as_v5", Image: "Canonical:o:s:v", UserData: []byte("#cloud-config\n")}
	vm := p.vmModel("caa-x-0123456789ab", "/nic/id", spec, nil)
	props := vm.Properties
	assert.Equal(t, "westeurope", *vm.Location)
	assert.Equal(t, []*string{new("2")}, vm.Zones)
	assert.Equal(t, armcompute.VirtualMachineSizeTypes("Standard_D2as_v5"), *props.HardwareProfile.VMSize)
	assert.Equal(t, "I2Nsb3VkLWNvbmZpZwo=", *props.UserData, "base64 user data in properties.userData, which IMDS serves")
	assert.Nil(t, props.OSProfile.CustomData, "no customData: IMDS never serves it")
	assert.Equal(t, "caa-x-0123456789ab", *props.OSProfile.ComputerName)
	assert.Equal(t, "/home/peer/.ssh/authorized_keys", *props.OSProfile.LinuxConfiguration.SSH.PublicKeys[0].Path)
	assert.True(t, *props.OSProfile.LinuxConfiguration.DisablePasswordAuthentication)
	assert.Equal(t, armcompute.DiskDeleteOptionTypesDelete, *props.StorageProfile.OSDisk.DeleteOption)
	assert.Equal(t, "caa-x-0123456789ab-osdisk", *props.StorageProfile.OSDisk.Name)
	nic := props.NetworkProfile.NetworkInterfaces[0]
	assert.Equal(t, "/nic/id", *nic.ID)
	assert.Equal(t, armcompute.DeleteOptionsDelete, *nic.Properties.DeleteOption)

	spec.UserData = nil
	assert.Nil(t, p.vmModel("n", "/nic", spec, nil).Properties.UserData, "no userData without user data")
}

func TestToVM(t *testing.T) {
	created := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	vm := armcompute.VirtualMachine{
		ID: new("/subscriptions/s/resourceGroups/g/providers/Microsoft.Compute/virtualMachines/caa-x"), Name: new("caa-x"),
		Location: new("eastus"), Zones: []*string{new("3")}, Tags: map[string]*string{"caa-node": new("n")},
		Properties: &armcompute.VirtualMachineProperties{
			ProvisioningState: new("Succeeded"),
			TimeCreated:       &created,
			HardwareProfile:   &armcompute.HardwareProfile{VMSize: new(armcompute.VirtualMachineSizeTypes("Standard_B2s"))},
			StorageProfile:    &armcompute.StorageProfile{ImageReference: &armcompute.ImageReference{ID: new("/img")}},
			InstanceView: &armcompute.VirtualMachineInstanceView{Statuses: []*armcompute.InstanceViewStatus{
				{Code: new("ProvisioningState/succeeded")}, {Code: new("PowerState/deallocated")},
			}},
			NetworkProfile: &armcompute.NetworkProfile{NetworkInterfaces: []*armcompute.NetworkInterfaceReference{
				{ID: new("/second")},
				{ID: new("/primary"), Properties: &armcompute.NetworkInterfaceReferenceProperties{Primary: new(true)}},
			}},
		},
	}
	got := toVM(vm, []string{"10.0.0.4"})
	assert.Equal(t, provider.VM{
		ID: *vm.ID, Name: "caa-x", State: provider.StateStopped, IPs: []string{"10.0.0.4"}, Tags: map[string]string{"caa-node": "n"},
		CreatedAt: created, InstanceType: "Standard_B2s", Image: "/img", Zone: "3",
	}, got)
	assert.Equal(t, []string{"/primary", "/second"}, nicIDs(vm), "primary NIC first")
	assert.Equal(t, provider.StateUnknown, toVM(armcompute.VirtualMachine{}, nil).State)
}

// TestVMNamesNeverChange pins names made by earlier versions: the name is
// the idempotency key, so a create retried after an upgrade must find the
// VM the old version made under the same key.
func TestVMNamesNeverChange(t *testing.T) {
	for key, want := range map[string]string{
		"uid-0001-a1": "caa-uid-0001-a1-2cc3b93a1306",
		"0f8e2c4a-1b2c-4d5e-8f90-a1b2c3d4e5f6-a1": "caa-0f8e2c4a-1b2c-4d5e-8f90-a1b2c3d4e5f6-a1-04fd0a582771",
		"Pod_UID/Attempt:2":                       "caa-pod-uid-attempt-2-93380efb7ac9",
		"__--__":                                  "caa-d20c33b431bc",
		strings.Repeat("a", 45) + "/b":            "caa-" + strings.Repeat("a", 45) + "-7c2f416ba0d7",
		strings.Repeat("a", 46) + "/b":            "caa-" + strings.Repeat("a", 46) + "-4f3485d7c827",
		strings.Repeat("x", 75):                   "caa-" + strings.Repeat("x", 46) + "-81d23bf0aae0",
		"":                                        "caa-e3b0c44298fc",
	} {
		assert.Equal(t, want, vmName(key), "key %q", key)
	}
}
