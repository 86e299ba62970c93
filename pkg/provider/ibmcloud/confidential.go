package ibmcloud

import (
	"fmt"
	"slices"
	"strings"

	"github.com/IBM/vpc-go-sdk/vpcv1"

	"github.com/caa-project/caa/pkg/provider"
)

// IBM Cloud VPC confidential computing: the instance prototype's
// confidential_compute_mode ("tdx", "sgx" or "disabled") on the profiles
// that offer it, the Intel Sapphire Rapids "dc" profiles of the balanced,
// compute and memory families (bx3dc-*, cx3dc-*, mx3dc-*), which offer
// both; the instance reports the mode back in the same field. TDX asks for
// secure boot too (enable_secure_boot), as IBM's TDX instances run with it.
//
// caa asks for TDX only. An SGX instance is an ordinary VM whose CPU can
// run enclaves for applications built for them; the pod VM image runs
// nothing in one, so it is not a confidential VM (provider.TEESGX is kept
// only to read back an instance another program made that way).
// Upstream's adaptor asks for TDX only too.

// confidentialFamilies are the profile families that run TDX.
var confidentialFamilies = []string{"bx3dc", "cx3dc", "mx3dc"}

var _ provider.ConfidentialCapable = (*Provider)(nil)

// TEEs is the confidential VM VPC offers on a profile: TDX on the *x3dc
// families, nothing on any other.
func TEEs(profile string) []provider.TEE {
	family, _, ok := strings.Cut(profile, "-")
	if !ok {
		return nil
	}
	for _, f := range confidentialFamilies {
		if family == f {
			return []provider.TEE{provider.TEETDX}
		}
	}
	return nil
}

// TEEs is the package's TEEs, for provider.ConfidentialCapable.
func (p *Provider) TEEs(profile string) []provider.TEE { return TEEs(profile) }

// secure sets the prototype's confidential compute mode and secure boot
// for tee, both always: VPC takes a field left out from the profile's
// defaults (vpc-go-sdk's InstancePrototype: "If unspecified, the default
// ... from the profile will be used"), which caa does not know and IBM may
// change, so an ordinary VM asks for "disabled" and no secure boot as
// upstream's adaptor does. Create has refused any other TEE (checkTEE).
func secure(proto *vpcv1.InstancePrototypeInstanceByImage, tee provider.TEE) {
	if tee == provider.TEETDX {
		proto.ConfidentialComputeMode = ptr(vpcv1.InstanceConfidentialComputeModeTdxConst)
		proto.EnableSecureBoot = ptr(true)
		return
	}
	proto.ConfidentialComputeMode = ptr(vpcv1.InstanceConfidentialComputeModeDisabledConst)
	proto.EnableSecureBoot = ptr(false)
}

// teeOf reads an instance's confidential_compute_mode.
func teeOf(in *vpcv1.Instance) provider.TEE { return teeOfMode(str(in.ConfidentialComputeMode)) }

// teeOfMode reads a confidential_compute_mode value.
func teeOfMode(mode string) provider.TEE {
	switch mode {
	case vpcv1.InstanceConfidentialComputeModeTdxConst:
		return provider.TEETDX
	case vpcv1.InstanceConfidentialComputeModeSgxConst:
		return provider.TEESGX
	}
	return provider.TEENone
}

// checkTEE refuses a spec asking for a TEE caa does not make on its
// profile (SGX, or TDX on a profile without it), which secure would
// otherwise turn into an ordinary VM: never a downgrade (I12).
func checkTEE(spec provider.Spec) error {
	switch {
	case spec.TEE == provider.TEENone:
		return nil
	case spec.TEE == provider.TEESGX:
		return fmt.Errorf("%w: pod %s/%s asks for an SGX instance: %s", provider.ErrInvalidSpec, spec.PodNamespace, spec.PodName, provider.SGXNotConfidential)
	case !slices.Contains(TEEs(spec.InstanceType), spec.TEE):
		return fmt.Errorf("%w: profile %s cannot run a %s VM: choose a bx3dc, cx3dc or mx3dc profile", provider.ErrInvalidSpec, spec.InstanceType, spec.TEE.Long())
	}
	return nil
}
