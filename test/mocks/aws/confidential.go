package ec2fake

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/caa-project/caa/test/mocks/cloud"
)

// AMD SEV-SNP on EC2: RunInstances' CpuOptions.AmdSevSnp ("enabled" or
// "disabled", default disabled), offered on the M6a, C6a and R6a families
// only, and reported back by DescribeInstances as cpuOptions.amdSevSnp.
// Sources: the EC2 API reference (CpuOptionsRequest, CpuOptions) and the
// SDK's serializer and deserializer (aws-sdk-go-v2 service/ec2 v1.347.0).
var sevSNPFamilies = map[string]bool{"m6a": true, "c6a": true, "r6a": true}

const sevSNP = "sev-snp"

type cpuOptionsXML struct {
	AmdSevSnp string `xml:"amdSevSnp,omitempty"`
}

// parseCPUOptions reads CpuOptions.AmdSevSnp into the request's TEE and
// refuses it on a family that cannot run it. The refusal's code and
// message follow EC2's for a launch option the type does not support
// (Unsupported, 400); the exact message text for SEV-SNP is this fake's.
func parseCPUOptions(q query, instanceType string) (string, *apiError) {
	v, ok := q["CpuOptions.AmdSevSnp"]
	if !ok || v[0] == "disabled" {
		return "", nil
	}
	if v[0] != "enabled" {
		return "", invalidValue("Value (%s) for parameter CpuOptions.AmdSevSnp is invalid. Valid values: enabled, disabled.", v[0])
	}
	family, _, _ := strings.Cut(instanceType, ".")
	if !sevSNPFamilies[family] {
		return "", &apiError{http.StatusBadRequest, "Unsupported",
			"The instance type " + instanceType + " does not support AMD SEV-SNP. Launch an M6a, C6a or R6a instance, or do not request AMD SEV-SNP."}
	}
	return sevSNP, nil
}

// renderCPUOptions is what DescribeInstances reports of the TEE.
func renderCPUOptions(tee string) *cpuOptionsXML {
	if tee == sevSNP {
		return &cpuOptionsXML{AmdSevSnp: "enabled"}
	}
	return &cpuOptionsXML{AmdSevSnp: "disabled"}
}

// Boot modes of an AMI (its BootMode attribute, set at RegisterImage).
// AMD SEV-SNP needs an AMI whose boot mode is uefi or uefi-preferred
// (EC2 User Guide, "AMD SEV-SNP requirements"; upstream's AWS provider
// says the same where it enables AmdSevSnp); an AMI without the attribute
// boots the instance type's default, Legacy BIOS on Intel and AMD types.
const (
	BootModeUEFI          = "uefi"
	BootModeUEFIPreferred = "uefi-preferred"
	BootModeLegacyBIOS    = "legacy-bios"
	// BootModeNone is an AMI registered without a boot mode.
	BootModeNone = ""
)

// WithImageBootMode registers ami with a boot mode. An AMI the fake was
// not told about boots on UEFI, so that a test that does not care about
// boot modes can launch SEV-SNP instances from any image.
func WithImageBootMode(ami, mode string) Option {
	return func(s *server) {
		if s.bootModes == nil {
			s.bootModes = map[string]string{}
		}
		s.bootModes[ami] = mode
	}
}

// checkBootMode refuses an SEV-SNP launch from an AMI that does not boot
// on UEFI. EC2 publishes no error text for it: the code
// (InvalidParameterCombination, 400) and message are this fake's guess.
func (s *server) checkBootMode(req cloud.CreateRequest) *apiError {
	if req.TEE != sevSNP {
		return nil
	}
	mode, known := s.bootModes[req.Image]
	if !known || mode == BootModeUEFI || mode == BootModeUEFIPreferred {
		return nil
	}
	shown := mode
	if shown == BootModeNone {
		shown = "none (the instance type's default, legacy-bios)"
	}
	return &apiError{http.StatusBadRequest, "InvalidParameterCombination", fmt.Sprintf(
		"The AMI %s has boot mode %s; AMD SEV-SNP requires an AMI whose boot mode is uefi or uefi-preferred.", req.Image, shown)}
}
