package vpcfake

import (
	"fmt"
	"strings"
)

// IBM Cloud VPC confidential computing: the instance prototype's
// confidential_compute_mode ("disabled", "sgx", "tdx"; vpc-go-sdk v0.90.0
// InstancePrototype and Instance) on the profiles that offer it, the
// Sapphire Rapids "dc" profiles (bx3dc, cx3dc, mx3dc), which offer both
// SGX and TDX; an instance reports its mode in the same field. TDX
// instances can be created only in us-south, us-east and eu-de (IBM Cloud
// docs, VPC known issues, "Confidential computing known issues"). The
// codes and messages of the refusals are this fake's own: VPC's for these
// cases were not found published.

var confidentialFamilies = map[string]bool{"bx3dc": true, "cx3dc": true, "mx3dc": true}

var tdxRegions = map[string]bool{"us-south": true, "us-east": true, "eu-de": true}

// checkConfidential checks a prototype's confidential compute mode against
// its profile and zone and returns the TEE the instance runs with.
func checkConfidential(p *instancePrototype) (string, *fieldError) {
	mode := p.ConfidentialComputeMode
	switch mode {
	case "", "disabled":
		return "", nil
	case "sgx", "tdx":
	default:
		return "", badField("confidential_compute_mode", fmt.Sprintf("The value '%s' is not valid: use disabled, sgx or tdx.", mode))
	}
	family, _, _ := strings.Cut(p.Profile.Name, "-")
	if !confidentialFamilies[family] {
		return "", &fieldError{"instance_profile_confidential_compute_mode_not_supported", "confidential_compute_mode",
			fmt.Sprintf("The instance profile '%s' does not support confidential compute mode '%s'.", p.Profile.Name, mode)}
	}
	zone := p.Zone.Name
	if i := strings.LastIndexByte(zone, '-'); i > 0 {
		zone = zone[:i]
	}
	if mode == "tdx" && !tdxRegions[zone] {
		return "", &fieldError{"confidential_compute_mode_not_supported_in_region", "confidential_compute_mode",
			fmt.Sprintf("Confidential compute mode 'tdx' is not available in region '%s'.", zone)}
	}
	return mode, nil
}

// modeOf is what an instance reports as its confidential_compute_mode.
func modeOf(tee string) string {
	if tee == "" {
		return "disabled"
	}
	return tee
}
