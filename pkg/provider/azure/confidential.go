package azure

import (
	"strings"

	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/compute/armcompute/v8"

	"github.com/caa-project/caa/pkg/provider"
)

// Azure confidential VMs: a VM with securityProfile.securityType
// ConfidentialVM, a vTPM (UEFI secure boot only with --azure-secure-boot), and an OS disk whose
// managedDisk.securityProfile.securityEncryptionType is VMGuestStateOnly
// (the VM guest state encrypted; DiskWithVMGuestState would encrypt the
// whole disk too and needs an image that supports it), on a confidential
// size and from an image marked for confidential VMs. The TEE is the
// size's: the DCasv5/ECasv5 families (and their d variants) run AMD
// SEV-SNP, the DCesv5/ECesv5 families Intel TDX. securityType says only
// "ConfidentialVM", so the read back names the TEE from the size.

// confidentialSizes maps a size family's suffix pattern to its TEE: the
// family is Standard_{DC|EC}<n>{a|e}[d]s_v5 (e.g. Standard_DC2as_v5,
// Standard_EC4eds_v5).
func sizeTEE(size string) provider.TEE {
	s := strings.ToLower(size)
	rest, ok := strings.CutPrefix(s, "standard_")
	if !ok || !strings.HasSuffix(rest, "_v5") {
		return provider.TEENone
	}
	rest = strings.TrimSuffix(rest, "_v5")
	if !strings.HasPrefix(rest, "dc") && !strings.HasPrefix(rest, "ec") {
		return provider.TEENone
	}
	rest = strings.TrimLeft(rest[2:], "0123456789")
	switch rest {
	case "as", "ads":
		return provider.TEESEVSNP
	case "es", "eds":
		return provider.TEETDX
	}
	return provider.TEENone
}

var _ provider.ConfidentialCapable = (*Provider)(nil)

// TEEs is the confidential computing Azure offers on a size.
func TEEs(size string) []provider.TEE {
	if t := sizeTEE(size); t.Confidential() {
		return []provider.TEE{t}
	}
	return nil
}

// TEEs is the package's TEEs, for provider.ConfidentialCapable.
func (p *Provider) TEEs(size string) []provider.TEE { return TEEs(size) }

// secure makes vm a confidential VM: the VM's security profile (secure
// boot as configured, a vTPM) and its OS disk's, a Premium_LRS managed disk
// with its VM guest state encrypted, as upstream's Azure provider asks for
// them (src/cloud-providers/azure/provider.go, getVMParameters). Nothing
// for an ordinary VM: the disk's type is then the size's default, since
// Premium_LRS needs a size with premium storage, which every confidential
// size has.
func secure(vm *armcompute.VirtualMachine, tee provider.TEE, secureBoot bool) {
	if !tee.Confidential() {
		return
	}
	props := vm.Properties
	props.SecurityProfile = &armcompute.SecurityProfile{
		SecurityType: new(armcompute.SecurityTypesConfidentialVM),
		UefiSettings: &armcompute.UefiSettings{SecureBootEnabled: new(secureBoot), VTpmEnabled: new(true)},
	}
	props.StorageProfile.OSDisk.ManagedDisk = &armcompute.ManagedDiskParameters{
		StorageAccountType: new(armcompute.StorageAccountTypesPremiumLRS),
		SecurityProfile: &armcompute.VMDiskSecurityProfile{
			SecurityEncryptionType: new(armcompute.SecurityEncryptionTypesVMGuestStateOnly),
		},
	}
}

// teeOf is what a VM's security type and size say of its TEE: none unless
// the type is ConfidentialVM; then the size's. A ConfidentialVM of a size
// caa does not know reads as a TEE no pod asks for ("ConfidentialVM"), so
// it is never taken for one of a known kind.
func teeOf(securityType, size string) provider.TEE {
	if !strings.EqualFold(securityType, string(armcompute.SecurityTypesConfidentialVM)) {
		return provider.TEENone
	}
	if t := sizeTEE(size); t.Confidential() {
		return t
	}
	return provider.TEE(armcompute.SecurityTypesConfidentialVM)
}
