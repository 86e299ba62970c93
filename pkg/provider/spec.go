package provider

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode"
)

// The pod annotations peer-pod users already write to choose their VM.
const (
	AnnotationMachineType = "io.katacontainers.config.hypervisor.machine_type"
	AnnotationImage       = "io.katacontainers.config.hypervisor.image"
	AnnotationVCPUs       = "io.katacontainers.config.hypervisor.default_vcpus"
	AnnotationMemory      = "io.katacontainers.config.hypervisor.default_memory" // MiB
)

// InstanceType is one row of the configured table used to fit vCPU and
// memory requests.
type InstanceType struct {
	Name      string
	VCPUs     int
	MemoryMiB int
}

// SpecConfig is the operator's policy for VM shapes on this node.
type SpecConfig struct {
	DefaultType  string
	DefaultImage string
	// Types is the table for fitting vCPU/memory requests, any order.
	Types []InstanceType
	// AllowedTypes limits what a pod may ask for. Empty: the names in Types
	// plus DefaultType.
	AllowedTypes []string
	// AllowedImages limits the images a pod may ask for with the image
	// annotation. The user data, which may hold secrets, goes to every VM,
	// so only images the operator trusts may boot (invariant I7). Empty:
	// DefaultImage only.
	AllowedImages []string
	// Confidential asks every VM to be a confidential one (--confidential,
	// default on), of a TEE that TEEs offers on its type: see SelectTEE.
	Confidential bool
	TEEs         func(instanceType string) []TEE
}

// Selection is the instance type and image chosen for one pod.
type Selection struct {
	InstanceType string
	Image        string
}

// Select picks the instance type and image for a pod from its annotations:
// an explicit machine_type (which must be allowed) wins; otherwise the
// smallest allowed type in the table that fits default_vcpus and
// default_memory; otherwise DefaultType. The image annotation overrides
// DefaultImage. A bad value is ErrInvalidSpec naming the annotation, the
// value and what is allowed.
func (c SpecConfig) Select(annotations map[string]string) (Selection, error) {
	allowed := c.allowed()
	var sel Selection

	if v, ok := annotations[AnnotationMachineType]; ok {
		v = strings.TrimSpace(v)
		if !slices.Contains(allowed, v) {
			return Selection{}, fmt.Errorf("%w: annotation %s=%q: instance type not allowed on this node (allowed: %s)",
				ErrInvalidSpec, AnnotationMachineType, v, strings.Join(allowed, ", "))
		}
		sel.InstanceType = v
	} else {
		vcpus, err := positiveInt(annotations, AnnotationVCPUs)
		if err != nil {
			return Selection{}, err
		}
		mem, err := positiveInt(annotations, AnnotationMemory)
		if err != nil {
			return Selection{}, err
		}
		if vcpus > 0 || mem > 0 {
			t, ok := c.smallestFit(vcpus, mem, allowed)
			if !ok {
				return Selection{}, fmt.Errorf("%w: annotations %s=%d, %s=%d MiB: no allowed instance type is that large (largest: %s)",
					ErrInvalidSpec, AnnotationVCPUs, vcpus, AnnotationMemory, mem, c.largest(allowed))
			}
			sel.InstanceType = t.Name
		} else {
			sel.InstanceType = c.DefaultType
		}
	}
	if sel.InstanceType == "" {
		return Selection{}, fmt.Errorf("%w: the pod names no instance type (annotation %s) and no default type is configured",
			ErrInvalidSpec, AnnotationMachineType)
	}

	sel.Image = c.DefaultImage
	if v, ok := annotations[AnnotationImage]; ok {
		v = strings.TrimSpace(v)
		if v == "" || len(v) > 1024 || strings.IndexFunc(v, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) >= 0 {
			return Selection{}, fmt.Errorf("%w: annotation %s=%q: want an image id with no spaces, at most 1024 bytes",
				ErrInvalidSpec, AnnotationImage, v)
		}
		if allowedImages := c.allowedImages(); !slices.Contains(allowedImages, v) {
			list := "none: this node allows no image but its default"
			if len(allowedImages) > 0 {
				list = strings.Join(allowedImages, ", ")
			}
			return Selection{}, fmt.Errorf("%w: annotation %s=%q: image not allowed on this node (allowed: %s); "+
				"the operator can add it to --allowed-images", ErrInvalidSpec, AnnotationImage, v, list)
		}
		sel.Image = v
	}
	if sel.Image == "" {
		return Selection{}, fmt.Errorf("%w: the pod names no image (annotation %s) and no default image is configured",
			ErrInvalidSpec, AnnotationImage)
	}
	return sel, nil
}

func (c SpecConfig) allowedImages() []string {
	if len(c.AllowedImages) > 0 {
		return c.AllowedImages
	}
	if c.DefaultImage != "" {
		return []string{c.DefaultImage}
	}
	return nil
}

func (c SpecConfig) allowed() []string {
	if len(c.AllowedTypes) > 0 {
		return c.AllowedTypes
	}
	var names []string
	for _, t := range c.Types {
		names = append(names, t.Name)
	}
	if c.DefaultType != "" && !slices.Contains(names, c.DefaultType) {
		names = append(names, c.DefaultType)
	}
	return names
}

// smallestFit orders by vCPUs, then memory, then name, so the choice is
// the same on every node whatever the table's order.
func (c SpecConfig) smallestFit(vcpus, mem int, allowed []string) (InstanceType, bool) {
	fits := slices.DeleteFunc(slices.Clone(c.Types), func(t InstanceType) bool {
		return !slices.Contains(allowed, t.Name) || t.VCPUs < vcpus || t.MemoryMiB < mem
	})
	if len(fits) == 0 {
		return InstanceType{}, false
	}
	return slices.MinFunc(fits, compareTypes), true
}

func (c SpecConfig) largest(allowed []string) string {
	var best *InstanceType
	for i, t := range c.Types {
		if slices.Contains(allowed, t.Name) && (best == nil || compareTypes(t, *best) > 0) {
			best = &c.Types[i]
		}
	}
	if best == nil {
		return "none in the table"
	}
	return fmt.Sprintf("%s with %d vCPUs and %d MiB", best.Name, best.VCPUs, best.MemoryMiB)
}

func compareTypes(a, b InstanceType) int {
	if a.VCPUs != b.VCPUs {
		return a.VCPUs - b.VCPUs
	}
	if a.MemoryMiB != b.MemoryMiB {
		return a.MemoryMiB - b.MemoryMiB
	}
	return strings.Compare(a.Name, b.Name)
}

// positiveInt reads an optional positive integer annotation; absent is 0.
func positiveInt(annotations map[string]string, key string) (int, error) {
	v, ok := annotations[key]
	if !ok {
		return 0, nil
	}
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil || n <= 0 || n > 1<<20 {
		return 0, fmt.Errorf("%w: annotation %s=%q: want a whole number from 1 to %d", ErrInvalidSpec, key, v, 1<<20)
	}
	return n, nil
}
