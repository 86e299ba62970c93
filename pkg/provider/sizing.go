package provider

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// InstanceType is one instance type (EC2 type, Azure VM size, IBM VPC
// profile) with the size caa fits pod requests against. Each cloud package
// has a table of the types it knows (InstanceTypes there); --instance-types
// picks from it by name or describes a type the table lacks. New per-type
// properties (such as being able to run a confidential VM) are new fields
// here and a column in each table.
type InstanceType struct {
	Name      string
	VCPUs     int
	MemoryMiB int
	// GPUs is the number of GPUs the type has, GPUModel their model in
	// lower case ("t4", "a10g", "a100", "h100"), empty without GPUs.
	GPUs     int
	GPUModel string
}

func (t InstanceType) String() string {
	s := fmt.Sprintf("%s (%d vCPUs, %d MiB", t.Name, t.VCPUs, t.MemoryMiB)
	if t.GPUs > 0 {
		s += fmt.Sprintf(", %d %s GPU", t.GPUs, t.GPUModel)
		if t.GPUs > 1 {
			s += "s"
		}
	}
	return s + ")"
}

// fits reports whether t meets r. A request without GPUs fits only types
// without GPUs (a GPU type is never spent on a pod that did not ask for
// one); a request for GPUs needs at least that many of the model, if named.
func (t InstanceType) fits(r Request) bool {
	if t.VCPUs < r.VCPUs || t.MemoryMiB < r.MemoryMiB {
		return false
	}
	if r.GPUs == 0 {
		return t.GPUs == 0
	}
	return t.GPUs >= r.GPUs && (r.GPUModel == "" || strings.EqualFold(t.GPUModel, r.GPUModel))
}

// The sizing annotations kata's shims send with CreateVM. Both shims send
// every key, "0" or "" for a setting they do not have (kata's
// virtcontainers/remote.go and runtime-rs's hypervisor/src/remote/inner.rs;
// the keys are in virtcontainers/pkg/annotations/annotations.go, read at
// kata 7c6ba40c). With static_sandbox_resource_mgmt, which kata's remote
// configuration turns on, vCPUs and memory are the pod's limits added to
// default_vcpus and default_memory (both 0 there), so any pod with limits
// sends them.
const (
	AnnotationGPUs     = "io.katacontainers.config.hypervisor.default_gpus"
	AnnotationGPUModel = "io.katacontainers.config.hypervisor.default_gpu_model"
)

// Request is what a pod asks of its VM's size.
type Request struct {
	VCPUs, MemoryMiB, GPUs int
	GPUModel               string
}

func (r Request) empty() bool { return r == Request{} }

func (r Request) String() string {
	var parts []string
	if r.VCPUs > 0 {
		parts = append(parts, fmt.Sprintf("%d vCPUs", r.VCPUs))
	}
	if r.MemoryMiB > 0 {
		parts = append(parts, fmt.Sprintf("%d MiB", r.MemoryMiB))
	}
	if r.GPUs > 0 {
		gpu := fmt.Sprintf("%d GPU", r.GPUs)
		if r.GPUModel != "" {
			gpu = fmt.Sprintf("%d %s GPU", r.GPUs, r.GPUModel)
		}
		if r.GPUs > 1 {
			gpu += "s"
		}
		parts = append(parts, gpu)
	}
	return strings.Join(parts, ", ")
}

// ReadRequest reads the sizing annotations. "0" and "" mean not asked (the
// shims send them for settings they do not have). A GPU model with no
// count asks for one GPU of that model.
func ReadRequest(annotations map[string]string) (Request, error) {
	var r Request
	var err error
	if r.VCPUs, err = count(annotations, AnnotationVCPUs); err != nil {
		return r, err
	}
	if r.MemoryMiB, err = count(annotations, AnnotationMemory); err != nil {
		return r, err
	}
	if r.GPUs, err = count(annotations, AnnotationGPUs); err != nil {
		return r, err
	}
	if m := strings.TrimSpace(annotations[AnnotationGPUModel]); m != "" {
		if len(m) > 64 || strings.ContainsFunc(m, func(c rune) bool { return c <= ' ' || c == ',' || c == ':' || c > '~' }) {
			return r, fmt.Errorf("%w: annotation %s=%q: want a GPU model name such as a100 (no spaces, at most 64 bytes)",
				ErrInvalidSpec, AnnotationGPUModel, m)
		}
		r.GPUModel = strings.ToLower(m)
		r.GPUs = max(r.GPUs, 1)
	}
	return r, nil
}

// count reads an optional whole-number annotation; absent, empty and "0"
// are 0.
func count(annotations map[string]string, key string) (int, error) {
	v := strings.TrimSpace(annotations[key])
	if v == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 || n > 1<<20 {
		return 0, fmt.Errorf("%w: annotation %s=%q: want a whole number from 0 to %d", ErrInvalidSpec, key, v, 1<<20)
	}
	return n, nil
}

// ParseInstanceTypes reads the --instance-types list: each item is a type
// name the cloud's table (known) has, or name:vcpus:memoryMiB[:gpus:model]
// for a type it lacks (a name the table has may be described too: the
// description wins). Errors name the flag, the item and the fix.
func ParseInstanceTypes(s string, known []InstanceType) ([]InstanceType, error) {
	var out []InstanceType
	for _, item := range SplitList(s) {
		t, err := parseType(item, known)
		if err != nil {
			return nil, fmt.Errorf("--instance-types: %w", err)
		}
		if slices.ContainsFunc(out, func(o InstanceType) bool { return o.Name == t.Name }) {
			return nil, fmt.Errorf("--instance-types: %q is listed twice", t.Name)
		}
		out = append(out, t)
	}
	return out, nil
}

func parseType(item string, known []InstanceType) (InstanceType, error) {
	parts := strings.Split(item, ":")
	if len(parts) == 1 {
		if i := slices.IndexFunc(known, func(t InstanceType) bool { return t.Name == item }); i >= 0 {
			return known[i], nil
		}
		return InstanceType{}, fmt.Errorf("caa does not know the size of %q: write it as %s:vcpus:memoryMiB (or %s:vcpus:memoryMiB:gpus:model), "+
			"or pick a type caa knows: %s", item, item, item, names(known))
	}
	if len(parts) != 3 && len(parts) != 5 {
		return InstanceType{}, fmt.Errorf("%q is not name, name:vcpus:memoryMiB or name:vcpus:memoryMiB:gpus:model", item)
	}
	t := InstanceType{Name: parts[0]}
	var err1, err2, err3 error
	t.VCPUs, err1 = strconv.Atoi(parts[1])
	t.MemoryMiB, err2 = strconv.Atoi(parts[2])
	if len(parts) == 5 {
		t.GPUs, err3 = strconv.Atoi(parts[3])
		t.GPUModel = strings.ToLower(strings.TrimSpace(parts[4]))
		if err3 == nil && (t.GPUs <= 0 || t.GPUModel == "") {
			err3 = fmt.Errorf("want a positive GPU count and a model")
		}
	}
	if err1 != nil || err2 != nil || err3 != nil || t.VCPUs <= 0 || t.MemoryMiB <= 0 || t.Name == "" {
		return InstanceType{}, fmt.Errorf("%q is not name:vcpus:memoryMiB[:gpus:model] with positive numbers", item)
	}
	return t, nil
}

func names(types []InstanceType) string {
	if len(types) == 0 {
		return "none for this cloud"
	}
	out := make([]string, len(types))
	for i, t := range types {
		out[i] = t.Name
	}
	return strings.Join(out, ", ")
}
