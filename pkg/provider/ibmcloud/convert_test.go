package ibmcloud

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/IBM/vpc-go-sdk/vpcv1"
	"github.com/go-openapi/strfmt"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/pkg/provider"
)

func TestStateOf(t *testing.T) {
	tests := map[string]provider.State{
		vpcv1.InstanceStatusPendingConst:    provider.StatePending,
		vpcv1.InstanceStatusStartingConst:   provider.StatePending,
		vpcv1.InstanceStatusRestartingConst: provider.StatePending,
		vpcv1.InstanceStatusRunningConst:    provider.StateRunning,
		vpcv1.InstanceStatusStoppingConst:   provider.StateStopping,
		vpcv1.InstanceStatusDeletingConst:   provider.StateStopping,
		vpcv1.InstanceStatusStoppedConst:    provider.StateStopped,
		vpcv1.InstanceStatusFailedConst:     provider.StateFailed,
		"hibernating":                       provider.StateUnknown,
		"":                                  provider.StateUnknown,
	}
	for status, want := range tests {
		assert.Equal(t, want, stateOf(status), "status %q", status)
	}
	assert.True(t, stateOf("restarting").Alive(), "a reboot keeps the pod's VM")
	assert.False(t, stateOf("deleting").Alive() || stateOf("deleting").Gone(), "deleting is neither alive nor positive evidence of gone")
}

func TestVMOf(t *testing.T) {
	created := strfmt.DateTime(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	ip := func(a string) *vpcv1.ReservedIPReference { return &vpcv1.ReservedIPReference{Address: ptr(a)} }
	in := &vpcv1.Instance{
		ID: ptr("0717_abc"), Name: ptr("caa-web-0-1234"), Status: ptr("running"), CreatedAt: &created,
		Profile:                  &vpcv1.InstanceProfileReference{Name: ptr("bx2-2x8")},
		Image:                    &vpcv1.ImageReference{ID: ptr("r006-img")},
		Zone:                     &vpcv1.ZoneReference{Name: ptr("us-south-1")},
		PrimaryNetworkAttachment: &vpcv1.InstanceNetworkAttachmentReference{PrimaryIP: ip("10.0.0.5")},
		NetworkAttachments: []vpcv1.InstanceNetworkAttachmentReference{
			{PrimaryIP: ip("10.0.0.5")}, {PrimaryIP: ip("10.0.1.9")}, {PrimaryIP: ip("0.0.0.0")}, {},
		},
		BootVolumeAttachment: &vpcv1.VolumeAttachmentReferenceInstanceContext{Volume: &vpcv1.VolumeReferenceVolumeAttachmentContext{ID: ptr("r006-vol")}},
	}
	tags := map[string]string{"a": "b"}
	vm := vmOf(in, tags)
	assert.Equal(t, provider.VM{
		ID: "0717_abc", Name: "caa-web-0-1234", State: provider.StateRunning, IPs: []string{"10.0.0.5", "10.0.1.9"},
		Tags: tags, CreatedAt: time.Time(created), InstanceType: "bx2-2x8", Image: "r006-img", Zone: "us-south-1",
	}, vm)
	tags["a"] = "changed"
	assert.Equal(t, "b", vm.Tags["a"], "the VM holds its own copy")
	assert.Equal(t, "r006-vol", bootVolumeID(in))

	bare := vmOf(&vpcv1.Instance{ID: ptr("x"), Status: ptr("pending"), PrimaryNetworkInterface: &vpcv1.NetworkInterfaceInstanceContextReference{PrimaryIP: ip("0.0.0.0")}}, nil)
	assert.Equal(t, provider.VM{ID: "x", State: provider.StatePending}, bare, "nothing invented for what VPC does not show")
	assert.Empty(t, bootVolumeID(&vpcv1.Instance{}))
}

func TestPrototype(t *testing.T) {
	p := &Provider{cfg: Config{
		Zone: "eu-de-2", SubnetID: "02b7-subnet", SecurityGroupIDs: []string{"sg-1", "sg-2"},
		VPCID: "r010-vpc", ResourceGroupID: "rg-1", BootVolumeProfile: "sdp",
	}}
	s := provider.Spec{InstanceType: "bx2-4x16", Image: "r010-img", UserData: []byte("#cloud-config\n")}
	b, err := json.Marshal(p.prototype(s, "caa-x-0123", []string{"k:v"}))
	require.NoError(t, err)
	assert.JSONEq(t, `{
		"name": "caa-x-0123",
		"image": {"id": "r010-img"},
		"profile": {"name": "bx2-4x16"},
		"zone": {"name": "eu-de-2"},
		"vpc": {"id": "r010-vpc"},
		"resource_group": {"id": "rg-1"},
		"user_data": "#cloud-config\n",
		"confidential_compute_mode": "disabled", "enable_secure_boot": false,
		"primary_network_attachment": {"virtual_network_interface": {
			"auto_delete": true, "subnet": {"id": "02b7-subnet"},
			"security_groups": [{"id": "sg-1"}, {"id": "sg-2"}]}},
		"boot_volume_attachment": {"delete_volume_on_instance_delete": true,
			"volume": {"profile": {"name": "sdp"}, "user_tags": ["k:v"]}}
	}`, string(b))

	p.cfg = Config{Zone: "eu-de-2", SubnetID: "s", BootVolumeProfile: "sdp"}
	b, err = json.Marshal(p.prototype(provider.Spec{InstanceType: "t", Image: "i"}, "n", nil))
	require.NoError(t, err)
	var m map[string]any
	require.NoError(t, json.Unmarshal(b, &m))
	for _, absent := range []string{"vpc", "resource_group", "user_data"} {
		assert.NotContains(t, m, absent, "left to VPC's defaults")
	}
}
