package ibmcloud

import "github.com/caa-project/caa/pkg/provider"

// InstanceTypes are the IBM Cloud VPC instance profiles whose size caa
// knows, from IBM's published profile tables: --instance-types may name
// them without their size. A suitable list for confidential peer pods (the
// default profile being bx3dc-2x10, Intel TDX):
// bx3dc-2x10,bx3dc-4x20,bx3dc-8x40,bx3dc-16x80. Other profiles are
// written name:vcpus:memoryMiB[:gpus:model].
func InstanceTypes() []provider.InstanceType {
	return []provider.InstanceType{
		// Confidential computing (Intel TDX; see TEEs).
		{Name: "bx3dc-2x10", VCPUs: 2, MemoryMiB: 10 << 10},
		{Name: "bx3dc-4x20", VCPUs: 4, MemoryMiB: 20 << 10},
		{Name: "bx3dc-8x40", VCPUs: 8, MemoryMiB: 40 << 10},
		{Name: "bx3dc-16x80", VCPUs: 16, MemoryMiB: 80 << 10},
		{Name: "cx3dc-2x5", VCPUs: 2, MemoryMiB: 5 << 10},
		{Name: "cx3dc-4x10", VCPUs: 4, MemoryMiB: 10 << 10},
		{Name: "mx3dc-2x20", VCPUs: 2, MemoryMiB: 20 << 10},
		{Name: "mx3dc-4x40", VCPUs: 4, MemoryMiB: 40 << 10},
		// Balanced.
		{Name: "bx2-2x8", VCPUs: 2, MemoryMiB: 8 << 10},
		{Name: "bx2-4x16", VCPUs: 4, MemoryMiB: 16 << 10},
		{Name: "bx2-8x32", VCPUs: 8, MemoryMiB: 32 << 10},
		{Name: "bx2-16x64", VCPUs: 16, MemoryMiB: 64 << 10},
		// Compute.
		{Name: "cx2-2x4", VCPUs: 2, MemoryMiB: 4 << 10},
		{Name: "cx2-4x8", VCPUs: 4, MemoryMiB: 8 << 10},
		{Name: "cx2-8x16", VCPUs: 8, MemoryMiB: 16 << 10},
		// Memory.
		{Name: "mx2-2x16", VCPUs: 2, MemoryMiB: 16 << 10},
		{Name: "mx2-4x32", VCPUs: 4, MemoryMiB: 32 << 10},
		// s390x with IBM Secure Execution.
		{Name: "bz2e-2x8", VCPUs: 2, MemoryMiB: 8 << 10},
		{Name: "bz2e-4x16", VCPUs: 4, MemoryMiB: 16 << 10},
		// GPU.
		{Name: "gx2-8x64x1v100", VCPUs: 8, MemoryMiB: 64 << 10, GPUs: 1, GPUModel: "v100"},
		{Name: "gx2-16x128x2v100", VCPUs: 16, MemoryMiB: 128 << 10, GPUs: 2, GPUModel: "v100"},
		{Name: "gx3-16x80x1l4", VCPUs: 16, MemoryMiB: 80 << 10, GPUs: 1, GPUModel: "l4"},
		{Name: "gx3-32x160x2l4", VCPUs: 32, MemoryMiB: 160 << 10, GPUs: 2, GPUModel: "l4"},
		{Name: "gx3-24x120x1l40s", VCPUs: 24, MemoryMiB: 120 << 10, GPUs: 1, GPUModel: "l40s"},
	}
}
