package aws

import (
	"strings"

	"github.com/aws/aws-sdk-go-v2/service/ec2/types"

	"github.com/caa-project/caa/pkg/provider"
)

// sevSNPFamilies are the EC2 instance families that run AMD SEV-SNP
// (CpuOptions.AmdSevSnp=enabled at RunInstances): M6a, C6a and R6a, in
// the regions that offer it (us-east-2 and eu-west-1 when this was
// written); a region without it refuses the launch.
var sevSNPFamilies = []string{"m6a", "c6a", "r6a"}

var _ provider.ConfidentialCapable = (*Provider)(nil)

// TEEs is the confidential computing EC2 offers on an instance type:
// SEV-SNP on the M6a, C6a and R6a families, nothing on any other.
func TEEs(instanceType string) []provider.TEE {
	family, _, ok := strings.Cut(instanceType, ".")
	if !ok {
		return nil
	}
	for _, f := range sevSNPFamilies {
		if family == f {
			return []provider.TEE{provider.TEESEVSNP}
		}
	}
	return nil
}

// TEEs is the package's TEEs, for provider.ConfidentialCapable.
func (p *Provider) TEEs(instanceType string) []provider.TEE { return TEEs(instanceType) }

// cpuOptions is RunInstances' CPU options for a TEE: SEV-SNP enabled, or
// nothing for an ordinary VM (EC2's default is disabled).
func cpuOptions(tee provider.TEE) *types.CpuOptionsRequest {
	if tee != provider.TEESEVSNP {
		return nil
	}
	return &types.CpuOptionsRequest{AmdSevSnp: types.AmdSevSnpSpecificationEnabled}
}

// teeOf reads what DescribeInstances reports of an instance's TEE.
func teeOf(in types.Instance) provider.TEE {
	if in.CpuOptions != nil && in.CpuOptions.AmdSevSnp == types.AmdSevSnpSpecificationEnabled {
		return provider.TEESEVSNP
	}
	return provider.TEENone
}
