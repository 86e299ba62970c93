package ec2fake

import (
	"net/http"
	"strings"
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
