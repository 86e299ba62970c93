package aws

import "github.com/caa-project/caa/pkg/provider"

// InstanceTypes are the EC2 instance types whose size caa knows, from
// AWS's published instance type tables: --instance-types may name them
// without their size. A suitable list for peer pods:
// m6a.large,m6a.xlarge,m6a.2xlarge,m6a.4xlarge, with g5.xlarge,g5.2xlarge
// or g4dn.xlarge for GPU pods. Other types are written
// name:vcpus:memoryMiB[:gpus:model].
func InstanceTypes() []provider.InstanceType {
	return []provider.InstanceType{
		// General purpose, AMD (upstream's default type is m6a.large).
		{Name: "m6a.large", VCPUs: 2, MemoryMiB: 8 << 10},
		{Name: "m6a.xlarge", VCPUs: 4, MemoryMiB: 16 << 10},
		{Name: "m6a.2xlarge", VCPUs: 8, MemoryMiB: 32 << 10},
		{Name: "m6a.4xlarge", VCPUs: 16, MemoryMiB: 64 << 10},
		{Name: "m6a.8xlarge", VCPUs: 32, MemoryMiB: 128 << 10},
		// General purpose, Intel.
		{Name: "m6i.large", VCPUs: 2, MemoryMiB: 8 << 10},
		{Name: "m6i.xlarge", VCPUs: 4, MemoryMiB: 16 << 10},
		{Name: "m6i.2xlarge", VCPUs: 8, MemoryMiB: 32 << 10},
		// Compute optimised.
		{Name: "c6a.large", VCPUs: 2, MemoryMiB: 4 << 10},
		{Name: "c6a.xlarge", VCPUs: 4, MemoryMiB: 8 << 10},
		{Name: "c6a.2xlarge", VCPUs: 8, MemoryMiB: 16 << 10},
		// Memory optimised.
		{Name: "r6a.large", VCPUs: 2, MemoryMiB: 16 << 10},
		{Name: "r6a.xlarge", VCPUs: 4, MemoryMiB: 32 << 10},
		// Burstable.
		{Name: "t3.small", VCPUs: 2, MemoryMiB: 2 << 10},
		{Name: "t3.medium", VCPUs: 2, MemoryMiB: 4 << 10},
		{Name: "t3.large", VCPUs: 2, MemoryMiB: 8 << 10},
		// GPU.
		{Name: "g4dn.xlarge", VCPUs: 4, MemoryMiB: 16 << 10, GPUs: 1, GPUModel: "t4"},
		{Name: "g4dn.2xlarge", VCPUs: 8, MemoryMiB: 32 << 10, GPUs: 1, GPUModel: "t4"},
		{Name: "g4dn.12xlarge", VCPUs: 48, MemoryMiB: 192 << 10, GPUs: 4, GPUModel: "t4"},
		{Name: "g5.xlarge", VCPUs: 4, MemoryMiB: 16 << 10, GPUs: 1, GPUModel: "a10g"},
		{Name: "g5.2xlarge", VCPUs: 8, MemoryMiB: 32 << 10, GPUs: 1, GPUModel: "a10g"},
		{Name: "g5.12xlarge", VCPUs: 48, MemoryMiB: 192 << 10, GPUs: 4, GPUModel: "a10g"},
		{Name: "p4d.24xlarge", VCPUs: 96, MemoryMiB: 1152 << 10, GPUs: 8, GPUModel: "a100"},
		{Name: "p5.48xlarge", VCPUs: 192, MemoryMiB: 2048 << 10, GPUs: 8, GPUModel: "h100"},
	}
}
