package azure

import "github.com/caa-project/caa/pkg/provider"

// InstanceTypes are the Azure VM sizes whose size caa knows, from Azure's
// published size tables: --instance-types may name them without their
// size. A suitable list for peer pods (confidential sizes, upstream's
// default being Standard_DC2as_v5):
// Standard_DC2as_v5,Standard_DC4as_v5,Standard_DC8as_v5, with
// Standard_NC4as_T4_v3 or Standard_NCC40ads_H100_v5 for GPU pods. Other
// sizes are written name:vcpus:memoryMiB[:gpus:model].
func InstanceTypes() []provider.InstanceType {
	return []provider.InstanceType{
		// Confidential (AMD SEV-SNP) general purpose.
		{Name: "Standard_DC2as_v5", VCPUs: 2, MemoryMiB: 8 << 10},
		{Name: "Standard_DC4as_v5", VCPUs: 4, MemoryMiB: 16 << 10},
		{Name: "Standard_DC8as_v5", VCPUs: 8, MemoryMiB: 32 << 10},
		{Name: "Standard_DC16as_v5", VCPUs: 16, MemoryMiB: 64 << 10},
		{Name: "Standard_DC2ads_v5", VCPUs: 2, MemoryMiB: 8 << 10},
		{Name: "Standard_DC4ads_v5", VCPUs: 4, MemoryMiB: 16 << 10},
		// Confidential memory optimised.
		{Name: "Standard_EC2as_v5", VCPUs: 2, MemoryMiB: 16 << 10},
		{Name: "Standard_EC4as_v5", VCPUs: 4, MemoryMiB: 32 << 10},
		// Confidential (Intel TDX): the DCesv5 and ECesv5 series, sizes as
		// Microsoft's generated AKS size list gives them (Aspire's
		// AksNodeVmSizes.cs: StandardDCEV5, StandardECEV5).
		{Name: "Standard_DC2es_v5", VCPUs: 2, MemoryMiB: 8 << 10},
		{Name: "Standard_DC4es_v5", VCPUs: 4, MemoryMiB: 16 << 10},
		{Name: "Standard_DC8es_v5", VCPUs: 8, MemoryMiB: 32 << 10},
		{Name: "Standard_DC16es_v5", VCPUs: 16, MemoryMiB: 64 << 10},
		{Name: "Standard_DC32es_v5", VCPUs: 32, MemoryMiB: 128 << 10},
		{Name: "Standard_DC48es_v5", VCPUs: 48, MemoryMiB: 192 << 10},
		{Name: "Standard_DC64es_v5", VCPUs: 64, MemoryMiB: 256 << 10},
		{Name: "Standard_DC96es_v5", VCPUs: 96, MemoryMiB: 384 << 10},
		{Name: "Standard_EC2es_v5", VCPUs: 2, MemoryMiB: 16 << 10},
		{Name: "Standard_EC4es_v5", VCPUs: 4, MemoryMiB: 32 << 10},
		{Name: "Standard_EC8es_v5", VCPUs: 8, MemoryMiB: 64 << 10},
		{Name: "Standard_EC16es_v5", VCPUs: 16, MemoryMiB: 128 << 10},
		{Name: "Standard_EC32es_v5", VCPUs: 32, MemoryMiB: 256 << 10},
		{Name: "Standard_EC48es_v5", VCPUs: 48, MemoryMiB: 384 << 10},
		{Name: "Standard_EC64es_v5", VCPUs: 64, MemoryMiB: 512 << 10},
		{Name: "Standard_EC128es_v5", VCPUs: 128, MemoryMiB: 768 << 10},
		// General purpose.
		{Name: "Standard_D2as_v5", VCPUs: 2, MemoryMiB: 8 << 10},
		{Name: "Standard_D4as_v5", VCPUs: 4, MemoryMiB: 16 << 10},
		{Name: "Standard_D8as_v5", VCPUs: 8, MemoryMiB: 32 << 10},
		{Name: "Standard_B2s", VCPUs: 2, MemoryMiB: 4 << 10},
		// GPU.
		{Name: "Standard_NC4as_T4_v3", VCPUs: 4, MemoryMiB: 28 << 10, GPUs: 1, GPUModel: "t4"},
		{Name: "Standard_NC8as_T4_v3", VCPUs: 8, MemoryMiB: 56 << 10, GPUs: 1, GPUModel: "t4"},
		{Name: "Standard_NC64as_T4_v3", VCPUs: 64, MemoryMiB: 440 << 10, GPUs: 4, GPUModel: "t4"},
		{Name: "Standard_NC24ads_A100_v4", VCPUs: 24, MemoryMiB: 220 << 10, GPUs: 1, GPUModel: "a100"},
		{Name: "Standard_NC48ads_A100_v4", VCPUs: 48, MemoryMiB: 440 << 10, GPUs: 2, GPUModel: "a100"},
		{Name: "Standard_NCC40ads_H100_v5", VCPUs: 40, MemoryMiB: 320 << 10, GPUs: 1, GPUModel: "h100"},
	}
}
