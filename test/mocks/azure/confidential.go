package armfake

import (
	"fmt"
	"net/http"
	"strings"
)

// Azure confidential VMs, as ARM takes and shows them: the VM's
// properties.securityProfile {securityType: ConfidentialVM, uefiSettings:
// {secureBootEnabled, vTpmEnabled}} and the OS disk's
// managedDisk.securityProfile.securityEncryptionType (VMGuestStateOnly or
// DiskWithVMGuestState), on a confidential size (DCasv5/ECasv5 and their
// d variants: AMD SEV-SNP; DCesv5/ECesv5: Intel TDX). ARM refuses a
// ConfidentialVM of another size, and a confidential size without the
// ConfidentialVM type, with BadRequest and the messages quoted below
// (reported in confidential-containers/cloud-api-adaptor#1742 and
// openshift/installer#6733); what it answers to a missing vTPM or disk
// encryption type is this fake's (InvalidParameter naming the field).

type securityProfile struct {
	SecurityType string        `json:"securityType,omitempty"`
	UefiSettings *uefiSettings `json:"uefiSettings,omitempty"`
}

type uefiSettings struct {
	SecureBootEnabled *bool `json:"secureBootEnabled,omitempty"`
	VTpmEnabled       *bool `json:"vTpmEnabled,omitempty"`
}

type diskSecurityProfile struct {
	SecurityEncryptionType string `json:"securityEncryptionType,omitempty"`
}

const confidentialVM = "ConfidentialVM"

// sizeTEE is the TEE of a confidential size, "" for any other.
func sizeTEE(size string) string {
	rest, ok := strings.CutPrefix(strings.ToLower(size), "standard_")
	if !ok {
		return ""
	}
	rest, ok = strings.CutSuffix(rest, "_v5")
	if !ok || len(rest) < 3 || (rest[:2] != "dc" && rest[:2] != "ec") {
		return ""
	}
	switch strings.TrimLeft(rest[2:], "0123456789") {
	case "as", "ads":
		return "sev-snp"
	case "es", "eds":
		return "tdx"
	}
	return ""
}

// parseSecurity checks a VM's security settings against its size and
// image and returns the TEE the VM will run with.
func (s *server) parseSecurity(p *vmProperties, disk *osDisk) (string, *apiError) {
	size := p.HardwareProfile.VMSize
	sp := p.SecurityProfile
	if sp == nil || sp.SecurityType == "" {
		if sizeTEE(size) != "" {
			return "", &apiError{http.StatusBadRequest, "BadRequest", fmt.Sprintf(
				"The VM size '%s' is not supported for creation of VMs and Virtual Machine Scale Set with '<NULL>' security type.", size), ""}
		}
		return "", nil
	}
	if !strings.EqualFold(sp.SecurityType, confidentialVM) && !strings.EqualFold(sp.SecurityType, "TrustedLaunch") {
		return "", invalidParameter("securityProfile.securityType", "The value '%s' is not valid: use TrustedLaunch or ConfidentialVM.", sp.SecurityType)
	}
	if !strings.EqualFold(sp.SecurityType, confidentialVM) {
		return "", nil
	}
	enc := ""
	if disk != nil && disk.ManagedDisk != nil && disk.ManagedDisk.SecurityProfile != nil {
		enc = disk.ManagedDisk.SecurityProfile.SecurityEncryptionType
	}
	if enc != "VMGuestStateOnly" && enc != "DiskWithVMGuestState" {
		return "", invalidParameter("storageProfile.osDisk.managedDisk.securityProfile.securityEncryptionType",
			"A ConfidentialVM needs securityEncryptionType VMGuestStateOnly or DiskWithVMGuestState on its OS disk.")
	}
	tee := sizeTEE(size)
	if tee == "" {
		return "", &apiError{http.StatusBadRequest, "BadRequest", fmt.Sprintf(
			"The VM size '%s' is not supported for creation of VMs and Virtual Machine Scale Set with 'ConfidentialVM' security type "+
				"and managedDisk.securityProfile.securityEncryptionType set as '%s'", size, enc), ""}
	}
	if u := sp.UefiSettings; u == nil || u.VTpmEnabled == nil || !*u.VTpmEnabled {
		return "", invalidParameter("securityProfile.uefiSettings.vTpmEnabled", "A ConfidentialVM needs vTpmEnabled true.")
	}
	if len(s.opts.plainImages) > 0 && s.opts.plainImages[p.StorageProfile.ImageReference.String()] {
		// ARM refuses it; the code and message are this fake's guess (no
		// published text found).
		return "", &apiError{http.StatusBadRequest, "BadRequest", fmt.Sprintf(
			"The image '%s' does not support security type 'ConfidentialVM': use an image whose definition has securityType ConfidentialVMSupported.",
			p.StorageProfile.ImageReference.String()), "storageProfile.imageReference"}
	}
	return tee, nil
}

// securityOf is what a VM shows of its TEE: a ConfidentialVM with a vTPM
// and secure boot as it was created (on for a VM made on the core), or
// nothing for an ordinary VM.
func securityOf(tee string, m *vmMeta) *securityProfile {
	if tee == "" {
		return nil
	}
	on, boot := true, m == nil || m.secureBoot
	return &securityProfile{SecurityType: confidentialVM, UefiSettings: &uefiSettings{SecureBootEnabled: &boot, VTpmEnabled: &on}}
}

// WithSignedImages names images whose boot chain (shim, boot loader,
// kernel) is signed by a key in Azure's default UEFI secure boot database.
// Every other image is unsigned, as the pod VM images upstream's users
// build are: a VM with secure boot on from one is created and runs as far
// as ARM shows, but its firmware refuses the boot loader and the guest
// never boots (Azure's Trusted Launch and confidential VM docs: secure
// boot needs signed boot components).
func WithSignedImages(images ...string) Option {
	return func(o *options) {
		o.signedImages = map[string]bool{}
		for _, i := range images {
			o.signedImages[i] = true
		}
	}
}

// unsignedBoot is why a VM with secure boot on from an unsigned image
// never answers.
const unsignedBoot = "secure boot is on and the image's boot chain is not signed: the firmware refuses its boot loader, the guest never boots"

// secureBootOf says whether a VM asks for UEFI secure boot.
func secureBootOf(p *vmProperties) bool {
	sp := p.SecurityProfile
	return sp != nil && sp.UefiSettings != nil && sp.UefiSettings.SecureBootEnabled != nil && *sp.UefiSettings.SecureBootEnabled
}

// bootFails is why a VM never boots ("" when it boots): secure boot on
// from an image that is not signed.
func (s *server) bootFails(secureBoot bool, image string) string {
	if secureBoot && !s.opts.signedImages[image] {
		return unsignedBoot
	}
	return ""
}
