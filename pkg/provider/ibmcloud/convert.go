package ibmcloud

import (
	"maps"
	"slices"
	"time"

	"github.com/IBM/vpc-go-sdk/vpcv1"

	"github.com/caa-project/caa/pkg/provider"
)

// stateOf maps a VPC instance status onto provider.State. "restarting" is
// a reboot of a live VM, so it counts as Pending (booting), not as going
// away; "deleting" is Stopping, since VPC answers 404 once it is gone.
func stateOf(status string) provider.State {
	switch status {
	case vpcv1.InstanceStatusPendingConst, vpcv1.InstanceStatusStartingConst, vpcv1.InstanceStatusRestartingConst:
		return provider.StatePending
	case vpcv1.InstanceStatusRunningConst:
		return provider.StateRunning
	case vpcv1.InstanceStatusStoppingConst, vpcv1.InstanceStatusDeletingConst:
		return provider.StateStopping
	case vpcv1.InstanceStatusStoppedConst:
		return provider.StateStopped
	case vpcv1.InstanceStatusFailedConst:
		return provider.StateFailed
	default:
		return provider.StateUnknown
	}
}

// vmOf is the provider's view of an instance with the tags read from (or
// just written to) its boot volume.
func vmOf(in *vpcv1.Instance, tags map[string]string) provider.VM {
	vm := provider.VM{
		ID:    str(in.ID),
		Name:  str(in.Name),
		State: stateOf(str(in.Status)),
		IPs:   ipsOf(in),
		Tags:  maps.Clone(tags),
	}
	if in.CreatedAt != nil {
		vm.CreatedAt = time.Time(*in.CreatedAt).UTC()
	}
	if in.Profile != nil {
		vm.InstanceType = str(in.Profile.Name)
	}
	if in.Image != nil {
		vm.Image = str(in.Image.ID)
	}
	if in.Zone != nil {
		vm.Zone = str(in.Zone.Name)
	}
	vm.TEE = teeOf(in)
	return vm
}

// ipsOf lists the instance's private addresses, primary first. VPC shows
// 0.0.0.0 until an address is bound; that is no address.
func ipsOf(in *vpcv1.Instance) []string {
	var ips []string
	add := func(ip *vpcv1.ReservedIPReference) {
		if ip != nil && ip.Address != nil && *ip.Address != "" && *ip.Address != "0.0.0.0" && !slices.Contains(ips, *ip.Address) {
			ips = append(ips, *ip.Address)
		}
	}
	if a := in.PrimaryNetworkAttachment; a != nil {
		add(a.PrimaryIP)
	}
	if n := in.PrimaryNetworkInterface; n != nil {
		add(n.PrimaryIP)
	}
	for _, a := range in.NetworkAttachments {
		add(a.PrimaryIP)
	}
	for _, n := range in.NetworkInterfaces {
		add(n.PrimaryIP)
	}
	return ips
}

// bootVolumeID is the id of the instance's boot volume, "" when VPC shows
// none (the instance is being torn down).
func bootVolumeID(in *vpcv1.Instance) string {
	if a := in.BootVolumeAttachment; a != nil && a.Volume != nil {
		return str(a.Volume.ID)
	}
	return ""
}

// prototype is the create request for spec: the image, profile and zone,
// one network attachment whose virtual network interface is deleted with
// the instance, and a boot volume deleted with it too that carries the
// tags. userTags and name come from tags.go.
func (p *Provider) prototype(spec provider.Spec, name string, userTags []string) *vpcv1.InstancePrototypeInstanceByImage {
	vni := &vpcv1.InstanceNetworkAttachmentPrototypeVirtualNetworkInterfaceVirtualNetworkInterfacePrototypeInstanceNetworkAttachmentContext{
		AutoDelete: ptr(true),
		Subnet:     &vpcv1.SubnetIdentityByID{ID: ptr(p.cfg.SubnetID)},
	}
	for _, id := range p.cfg.SecurityGroupIDs {
		vni.SecurityGroups = append(vni.SecurityGroups, &vpcv1.SecurityGroupIdentityByID{ID: ptr(id)})
	}
	proto := &vpcv1.InstancePrototypeInstanceByImage{
		Name:    ptr(name),
		Image:   &vpcv1.ImageIdentityByID{ID: ptr(spec.Image)},
		Profile: &vpcv1.InstanceProfileIdentityByName{Name: ptr(spec.InstanceType)},
		Zone:    &vpcv1.ZoneIdentityByName{Name: ptr(p.cfg.Zone)},
		PrimaryNetworkAttachment: &vpcv1.InstanceNetworkAttachmentPrototype{
			VirtualNetworkInterface: vni,
		},
		BootVolumeAttachment: &vpcv1.VolumeAttachmentPrototypeInstanceByImageContext{
			DeleteVolumeOnInstanceDelete: ptr(true),
			Volume: &vpcv1.VolumePrototypeInstanceByImageContext{
				Profile:  &vpcv1.VolumeProfileIdentityByName{Name: ptr(p.cfg.BootVolumeProfile)},
				UserTags: userTags,
			},
		},
	}
	secure(proto, spec.TEE)
	if len(spec.UserData) > 0 {
		proto.UserData = ptr(string(spec.UserData))
	}
	if p.cfg.VPCID != "" {
		proto.VPC = &vpcv1.VPCIdentityByID{ID: ptr(p.cfg.VPCID)}
	}
	if p.cfg.ResourceGroupID != "" {
		proto.ResourceGroup = &vpcv1.ResourceGroupIdentityByID{ID: ptr(p.cfg.ResourceGroupID)}
	}
	return proto
}

func ptr[T any](v T) *T { return &v }

func str(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
