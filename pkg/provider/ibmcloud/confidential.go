package ibmcloud

import (
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

// confidentialFamilies are the profile families that run TDX and SGX.
var confidentialFamilies = []string{"bx3dc", "cx3dc", "mx3dc"}

var _ provider.ConfidentialCapable = (*Provider)(nil)

// TEEs is the confidential computing VPC offers on a profile: TDX (the
// default) and SGX on the *x3dc families, nothing on any other.
func TEEs(profile string) []provider.TEE {
	family, _, ok := strings.Cut(profile, "-")
	if !ok {
		return nil
	}
	for _, f := range confidentialFamilies {
		if family == f {
			return []provider.TEE{provider.TEETDX, provider.TEESGX}
		}
	}
	return nil
}

// TEEs is the package's TEEs, for provider.ConfidentialCapable.
func (p *Provider) TEEs(profile string) []provider.TEE { return TEEs(profile) }

// secure sets the prototype's confidential compute mode for tee; nothing
// for an ordinary VM (the profile's default mode is disabled).
func secure(proto *vpcv1.InstancePrototypeInstanceByImage, tee provider.TEE) {
	switch tee {
	case provider.TEETDX:
		proto.ConfidentialComputeMode = ptr(vpcv1.InstanceConfidentialComputeModeTdxConst)
		proto.EnableSecureBoot = ptr(true)
	case provider.TEESGX:
		proto.ConfidentialComputeMode = ptr(vpcv1.InstanceConfidentialComputeModeSgxConst)
	}
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
