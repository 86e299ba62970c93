package azure

import (
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/compute/armcompute/v8"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/network/armnetwork/v9"

	"github.com/caa-project/caa/pkg/provider"
)

// Azure's limits that the provider checks before a call, so that a pod
// whose spec breaks them fails with ErrInvalidSpec naming the cause.
const (
	maxTags     = 50
	maxTagKey   = 512
	maxTagValue = 256
	// maxUserData is the VM's properties.userData cap: 64 KB of its base64
	// text (learn.microsoft.com/azure/virtual-machines/user-data), so
	// 49152 bytes before the encoding.
	maxUserData    = 65536 / 4 * 3
	maxHostnameLen = 63
	hashLen        = 12 // hex digits of the key's hash in a name
)

// reservedTags are the tags caa puts on every VM.
var reservedTags = []string{provider.TagCluster, provider.TagNode, provider.TagPodUID, provider.TagPod, provider.TagKey, provider.TagManagedBy}

// vmName is the VM name for an idempotency key: "caa-", the key's letters
// and digits (lower case, other runs as one '-') cut to fit, '-', and 12 hex
// digits of the key's SHA-256 (provider.DNSLabel). The hash keeps two keys
// apart even when their readable parts are cut or folded to the same text;
// the readable part lets an operator see which pod a VM is for. Lower case,
// because Azure names are case-insensitive; at most 63 characters, because
// the name is also the guest's hostname, a DNS label (and Azure takes 64
// for a Linux VM). Nothing depends on the readable part: discovery goes by
// tags. The result must never change for a key: it is how a retried create
// finds the VM an earlier one (or an earlier version) made.
func vmName(key string) string {
	sum := sha256.Sum256([]byte(key))
	return provider.DNSLabel("caa-", key, sum[:], hashLen, maxHostnameLen)
}

// nicName and diskName derive from the VM name, so Delete finds them with
// nothing but the VM's id.
func nicName(vm string) string { return vm + nicSuffix }

// nicSuffix ends the name of every NIC caa makes.
const nicSuffix = "-nic"

func diskName(vm string) string { return vm + "-osdisk" }

// vmTags are the tags of a VM (and its NIC): the configured extra tags,
// then the spec's, with caa's identity tags over both. They must fit
// Azure's limits.
func (p *Provider) vmTags(spec provider.Spec) (map[string]*string, error) {
	all := maps.Clone(p.cfg.Tags)
	if all == nil {
		all = map[string]string{}
	}
	maps.Copy(all, spec.Tags())
	if err := checkTags(all, maxTags); err != nil {
		return nil, fmt.Errorf("%w: %v", provider.ErrInvalidSpec, err)
	}
	out := make(map[string]*string, len(all))
	for k, v := range all {
		out[k] = new(v)
	}
	return out, nil
}

// checkTags applies Azure's tag limits: count, name and value length, and
// the characters a tag name may not hold.
func checkTags(tags map[string]string, limit int) error {
	if len(tags) > limit {
		return fmt.Errorf("%d tags, Azure allows %d here", len(tags), limit)
	}
	for _, k := range slices.Sorted(maps.Keys(tags)) {
		switch v := tags[k]; {
		case k == "" || len(k) > maxTagKey:
			return fmt.Errorf("tag name %q is empty or longer than %d", k, maxTagKey)
		case strings.ContainsAny(k, `<>%&\?/`):
			return fmt.Errorf("tag name %q has one of <>%%&\\?/", k)
		case len(v) > maxTagValue:
			return fmt.Errorf("tag %s is %d characters, Azure allows %d", k, len(v), maxTagValue)
		}
	}
	return nil
}

// imageReference reads spec.Image: an ARM image id (a shared or community
// gallery id by its prefix), publisher:offer:sku:version, or any other
// string, passed as an id for the cloud to judge.
func imageReference(image string) *armcompute.ImageReference {
	lower := strings.ToLower(image)
	parts := strings.Split(image, ":")
	switch {
	case strings.HasPrefix(lower, "/sharedgalleries/"):
		return &armcompute.ImageReference{SharedGalleryImageID: new(image)}
	case strings.HasPrefix(lower, "/communitygalleries/"):
		return &armcompute.ImageReference{CommunityGalleryImageID: new(image)}
	case !strings.HasPrefix(image, "/") && len(parts) == 4 && !slices.Contains(parts, ""):
		return &armcompute.ImageReference{Publisher: new(parts[0]), Offer: new(parts[1]), SKU: new(parts[2]), Version: new(parts[3])}
	}
	return &armcompute.ImageReference{ID: new(image)}
}

// imageString is the inverse of imageReference, so VM.Image is the
// spec.Image the VM was made with.
func imageString(ref *armcompute.ImageReference) string {
	switch {
	case ref == nil:
		return ""
	case ref.ID != nil:
		return *ref.ID
	case ref.SharedGalleryImageID != nil:
		return *ref.SharedGalleryImageID
	case ref.CommunityGalleryImageID != nil:
		return *ref.CommunityGalleryImageID
	}
	return strings.Join([]string{deref(ref.Publisher), deref(ref.Offer), deref(ref.SKU), deref(ref.Version)}, ":")
}

// nicModel is the NIC of a VM: one dynamic private IP in the configured
// subnet, the configured security group if any.
func (p *Provider) nicModel(tags map[string]*string) armnetwork.Interface {
	nic := armnetwork.Interface{
		Location: new(p.cfg.Location),
		Tags:     tags,
		Properties: &armnetwork.InterfacePropertiesFormat{
			IPConfigurations: []*armnetwork.InterfaceIPConfiguration{{
				Name: new("ipconfig1"),
				Properties: &armnetwork.InterfaceIPConfigurationPropertiesFormat{
					Subnet:                    &armnetwork.Subnet{ID: new(p.cfg.SubnetID)},
					PrivateIPAllocationMethod: new(armnetwork.IPAllocationMethodDynamic),
					Primary:                   new(true),
				},
			}},
		},
	}
	if p.cfg.SecurityGroupID != "" {
		nic.Properties.NetworkSecurityGroup = &armnetwork.SecurityGroup{ID: new(p.cfg.SecurityGroupID)}
	}
	return nic
}

// vmModel is the VM for spec. Its OS disk and NIC carry deleteOption
// Delete, so deleting the VM deletes them. The model holds the user data:
// it is never logged.
func (p *Provider) vmModel(name, nicID string, spec provider.Spec, tags map[string]*string) armcompute.VirtualMachine {
	admin := p.cfg.AdminUsername
	vm := armcompute.VirtualMachine{
		Location: new(p.cfg.Location),
		Tags:     tags,
		Properties: &armcompute.VirtualMachineProperties{
			HardwareProfile: &armcompute.HardwareProfile{VMSize: new(armcompute.VirtualMachineSizeTypes(spec.InstanceType))},
			StorageProfile: &armcompute.StorageProfile{
				ImageReference: imageReference(spec.Image),
				OSDisk: &armcompute.OSDisk{
					Name:         new(diskName(name)),
					CreateOption: new(armcompute.DiskCreateOptionTypesFromImage),
					DeleteOption: new(armcompute.DiskDeleteOptionTypesDelete),
				},
			},
			OSProfile: &armcompute.OSProfile{
				ComputerName:  new(name),
				AdminUsername: new(admin),
				LinuxConfiguration: &armcompute.LinuxConfiguration{
					DisablePasswordAuthentication: new(true),
					SSH: &armcompute.SSHConfiguration{PublicKeys: []*armcompute.SSHPublicKey{{
						Path:    new("/home/" + admin + "/.ssh/authorized_keys"),
						KeyData: new(p.cfg.SSHPublicKey),
					}}},
				},
			},
			NetworkProfile: &armcompute.NetworkProfile{NetworkInterfaces: []*armcompute.NetworkInterfaceReference{{
				ID:         new(nicID),
				Properties: &armcompute.NetworkInterfaceReferenceProperties{Primary: new(true), DeleteOption: new(armcompute.DeleteOptionsDelete)},
			}}},
		},
	}
	secure(&vm, spec.TEE, p.cfg.SecureBoot)
	// The pod VM image reads its user data from the instance metadata
	// service's compute/userData, which serves properties.userData; IMDS
	// never serves osProfile.customData, so that stays empty.
	if len(spec.UserData) > 0 {
		vm.Properties.UserData = new(base64.StdEncoding.EncodeToString(spec.UserData))
	}
	if p.cfg.Zone != "" {
		vm.Zones = []*string{new(p.cfg.Zone)}
	}
	return vm
}

// stateOf maps a VM's provisioning state and power state (from the
// instance view; empty when the call had none) onto provider.State.
// Provisioning wins while it says the VM is coming or going; otherwise the
// power state decides. Without a power state, a VM whose provisioning
// succeeded reads as Running: caa never stops VMs, so that is what it
// almost always is, and Get, which reads the power state, tells otherwise.
//
// A provisioning state of Failed or Canceled is the outcome of the VM's
// last control-plane operation, not of the VM: a failed extension (often
// one Azure Policy or Defender pushes) or a failed update leaves a VM
// Failed while it runs and its guest serves (Azure's "VM provisioning
// states" and "Troubleshoot extension failures" pages). Such a VM reads as
// the power state says; only a stopped or deallocated one is dead (Failed),
// and one whose power state is unknown or missing reads as Running, and
// degraded (see degradedOf).
func stateOf(provisioning, power string) provider.State {
	prov := strings.ToLower(provisioning)
	switch prov {
	case "deleting":
		return provider.StateStopping
	case "creating":
		return provider.StatePending
	}
	failed := failedProvisioning(prov)
	switch strings.ToLower(power) {
	case "starting":
		return provider.StatePending
	case "running":
		return provider.StateRunning
	case "stopping", "deallocating":
		return provider.StateStopping
	case "stopped", "deallocated":
		if failed {
			return provider.StateFailed
		}
		return provider.StateStopped
	case "":
		if prov == "succeeded" || prov == "updating" {
			return provider.StateRunning
		}
	}
	if failed {
		return provider.StateRunning
	}
	return provider.StateUnknown
}

// failedProvisioning: the VM's last operation failed or was canceled.
func failedProvisioning(provisioning string) bool {
	p := strings.ToLower(provisioning)
	return p == "failed" || p == "canceled"
}

// degradedOf says why a VM in state is degraded: alive while its last
// operation failed (code, from the instance view, when known). Empty for a
// VM that is not.
func degradedOf(state provider.State, provisioning, code string) string {
	if !state.Alive() || !failedProvisioning(provisioning) {
		return ""
	}
	msg := "the VM runs, but Azure reports its provisioning state " + provisioning
	if code != "" {
		msg += " (" + code + ")"
	}
	return msg + ": kept, never replaced; see the VM's instance view in Azure"
}

// failureCode is the code of a ProvisioningState/failed/<code> status of an
// instance view, if any.
func failureCode(vm armcompute.VirtualMachine) string {
	if vm.Properties == nil || vm.Properties.InstanceView == nil {
		return ""
	}
	for _, s := range vm.Properties.InstanceView.Statuses {
		if s == nil || s.Code == nil {
			continue
		}
		if rest, ok := strings.CutPrefix(strings.ToLower(*s.Code), "provisioningstate/"); ok {
			if _, code, ok := strings.Cut(rest, "/"); ok {
				return (*s.Code)[len(*s.Code)-len(code):]
			}
		}
	}
	return ""
}

// powerState is the PowerState/... status of an instance view, if any.
func powerState(vm armcompute.VirtualMachine) string {
	if vm.Properties == nil || vm.Properties.InstanceView == nil {
		return ""
	}
	for _, s := range vm.Properties.InstanceView.Statuses {
		if s != nil && s.Code != nil {
			if v, ok := strings.CutPrefix(*s.Code, "PowerState/"); ok {
				return v
			}
		}
	}
	return ""
}

// toVM is what caa keeps of an Azure VM.
func toVM(vm armcompute.VirtualMachine, ips []string) provider.VM {
	out := provider.VM{ID: deref(vm.ID), Name: deref(vm.Name), IPs: ips, Tags: map[string]string{}, Zone: deref(vm.Location)}
	for k, v := range vm.Tags {
		out.Tags[k] = deref(v)
	}
	if len(vm.Zones) > 0 && vm.Zones[0] != nil {
		out.Zone = *vm.Zones[0]
	}
	props := vm.Properties
	if props == nil {
		out.State = provider.StateUnknown
		return out
	}
	out.State = stateOf(deref(props.ProvisioningState), powerState(vm))
	out.Degraded = degradedOf(out.State, deref(props.ProvisioningState), failureCode(vm))
	if props.TimeCreated != nil {
		out.CreatedAt = *props.TimeCreated
	}
	if props.HardwareProfile != nil && props.HardwareProfile.VMSize != nil {
		out.InstanceType = string(*props.HardwareProfile.VMSize)
	}
	if props.StorageProfile != nil {
		out.Image = imageString(props.StorageProfile.ImageReference)
	}
	if props.SecurityProfile != nil && props.SecurityProfile.SecurityType != nil {
		out.TEE = teeOf(string(*props.SecurityProfile.SecurityType), out.InstanceType)
	}
	return out
}

// nicIDs are the ids of a VM's NICs, primary first.
func nicIDs(vm armcompute.VirtualMachine) []string {
	if vm.Properties == nil || vm.Properties.NetworkProfile == nil {
		return nil
	}
	var ids []string
	for _, ref := range vm.Properties.NetworkProfile.NetworkInterfaces {
		if ref == nil || ref.ID == nil {
			continue
		}
		if ref.Properties != nil && ref.Properties.Primary != nil && *ref.Properties.Primary {
			ids = slices.Insert(ids, 0, *ref.ID)
		} else {
			ids = append(ids, *ref.ID)
		}
	}
	return ids
}

// privateIPs are a NIC's private addresses.
func privateIPs(nic armnetwork.Interface) []string {
	if nic.Properties == nil {
		return nil
	}
	var ips []string
	for _, c := range nic.Properties.IPConfigurations {
		if c != nil && c.Properties != nil && c.Properties.PrivateIPAddress != nil && *c.Properties.PrivateIPAddress != "" {
			ips = append(ips, *c.Properties.PrivateIPAddress)
		}
	}
	return ips
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

// sameShape compares a VM size or an image reference as Azure does: VM
// sizes, ARM ids (managed images, gallery image versions) and marketplace
// publisher, offer, SKU and version are case-insensitive, and Azure may echo
// them in another case than they were sent ("Standard_DS2_V2" for
// "Standard_DS2_v2": azure-cli issue 9238; resource groups upper-cased in
// ids: MicrosoftDocs/azure-docs issue 36222).
func sameShape(a, b string) bool { return strings.EqualFold(a, b) }

var _ provider.UserDataLimited = (*Provider)(nil)

// UserDataLimit is Azure's cap on properties.userData before base64 (64 KB
// of base64 text: 49152 bytes), for provider.UserDataLimited. caa sends
// the user data as properties.userData, never osProfile.customData (whose
// own cap is 64 KB before base64), because the pod VM reads it from the
// instance metadata service, which serves userData only.
func (p *Provider) UserDataLimit() int { return maxUserData }
