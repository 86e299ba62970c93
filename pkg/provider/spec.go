package provider

import (
	"fmt"
	"slices"
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

// SpecConfig is the operator's policy for VM shapes on this node.
type SpecConfig struct {
	DefaultType  string
	DefaultImage string
	// Types is the operator's --instance-types list that sizing requests
	// are fitted to, any order. Empty: every pod gets DefaultType, as
	// upstream's adaptor does with no list.
	Types []InstanceType
	// Known is the cloud's table of type sizes; it tells whether
	// DefaultType meets a request when Types is empty.
	Known []InstanceType
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
	// UserDataLimit is the cloud's cap on a VM's user data in bytes
	// (UserDataLimitOf the provider); 0: none known.
	UserDataLimit int
}

// Selection is the instance type and image chosen for one pod.
type Selection struct {
	InstanceType string
	Image        string
	// Notice, when set, says the pod asked for more than InstanceType
	// offers (no --instance-types list to fit it to); the caller tells
	// the pod.
	Notice string
}

// Select picks the instance type and image for a pod from its annotations:
// an explicit machine_type (which must be allowed) wins; otherwise a
// request for vCPUs, memory or GPUs gets the smallest allowed type of
// Types that fits it, or, with no Types, DefaultType with a Notice when
// that type is known to be smaller than asked; otherwise DefaultType. The
// image annotation overrides DefaultImage. A bad value, or a request
// nothing fits, is ErrInvalidSpec naming the annotation or the flag.
func (c SpecConfig) Select(annotations map[string]string) (Selection, error) {
	allowed := c.allowed()
	var sel Selection
	req, err := ReadRequest(annotations)
	if err != nil {
		return Selection{}, err
	}

	if v := strings.TrimSpace(annotations[AnnotationMachineType]); v != "" {
		if !slices.Contains(allowed, v) {
			return Selection{}, fmt.Errorf("%w: annotation %s=%q: instance type not allowed on this node (allowed: %s)",
				ErrInvalidSpec, AnnotationMachineType, v, strings.Join(allowed, ", "))
		}
		sel.InstanceType = v
	} else if !req.empty() && len(c.Types) > 0 {
		t, ok := c.smallestFit(req, allowed)
		if !ok {
			kind := "type"
			if c.Confidential {
				kind = "confidential-capable type"
			}
			return Selection{}, fmt.Errorf("%w: the pod asks for %s and no %s of --instance-types allowed here has that (largest: %s); "+
				"add a %s that large to --instance-types, or lower the pod's limits", ErrInvalidSpec, req, kind, c.largest(req, allowed), kind)
		}
		sel.InstanceType = t.Name
	} else {
		sel.InstanceType = c.DefaultType
		if !req.empty() && sel.InstanceType != "" {
			if sel.Notice, err = c.defaultFor(req); err != nil {
				return Selection{}, err
			}
		}
	}
	if sel.InstanceType == "" {
		return Selection{}, fmt.Errorf("%w: the pod names no instance type (annotation %s) and no default type is configured",
			ErrInvalidSpec, AnnotationMachineType)
	}

	sel.Image = c.DefaultImage
	// An empty image is none named: kata's shims send "" when the pod
	// names no image.
	if v := strings.TrimSpace(annotations[AnnotationImage]); v != "" {
		if len(v) > 1024 || strings.IndexFunc(v, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) >= 0 {
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

// defaultFor checks a request against DefaultType when there is no list to
// fit it to. caa gives the default type then, and says so on the pod when
// the type is known to be smaller (upstream's adaptor refuses a request of
// both vCPUs and memory the default cannot meet: docs/design.md, Sizing). A
// GPU request is refused unless the default type is known to have it: a
// VM without the GPU cannot run the pod at all.
func (c SpecConfig) defaultFor(req Request) (string, error) {
	def, known := c.lookup(c.DefaultType)
	if req.GPUs > 0 && (!known || !def.fits(req)) {
		has := "caa does not know its size"
		if known {
			has = "it offers " + strings.TrimPrefix(def.String(), def.Name+" ")
		}
		return "", fmt.Errorf("%w: the pod asks for %s but --instance-types is empty, so it would get the default type %s (%s); "+
			"list GPU types in --instance-types (for example %s)", ErrInvalidSpec, req, c.DefaultType, has, gpuExamples(c.Known))
	}
	if !known || def.VCPUs >= req.VCPUs && def.MemoryMiB >= req.MemoryMiB {
		return "", nil
	}
	return fmt.Sprintf("the pod asks for %s; it gets the default type %s, which is smaller, because --instance-types is empty "+
		"(list larger types there to have them fitted)", req, def), nil
}

// lookup finds a type's size in Types, then in Known.
func (c SpecConfig) lookup(name string) (InstanceType, bool) {
	for _, table := range [][]InstanceType{c.Types, c.Known} {
		if i := slices.IndexFunc(table, func(t InstanceType) bool { return t.Name == name }); i >= 0 {
			return table[i], true
		}
	}
	return InstanceType{}, false
}

func gpuExamples(known []InstanceType) string {
	var out []string
	for _, t := range known {
		if t.GPUs > 0 && len(out) < 3 {
			out = append(out, t.Name)
		}
	}
	if len(out) == 0 {
		return "name:vcpus:memoryMiB:gpus:model"
	}
	return strings.Join(out, ", ")
}

// smallestFit orders by GPUs, vCPUs, memory, then name, so the choice is
// the same on every node whatever the list's order.
func (c SpecConfig) smallestFit(req Request, allowed []string) (InstanceType, bool) {
	fits := slices.DeleteFunc(slices.Clone(c.Types), func(t InstanceType) bool {
		return !c.candidate(t, allowed) || !t.fits(req)
	})
	if len(fits) == 0 {
		return InstanceType{}, false
	}
	return slices.MinFunc(fits, compareTypes), true
}

// largest is the largest allowed type of the kind asked (with or without
// GPUs), for the refusal's text.
func (c SpecConfig) largest(req Request, allowed []string) string {
	var best *InstanceType
	for i, t := range c.Types {
		if c.candidate(t, allowed) && (t.GPUs > 0) == (req.GPUs > 0) && (best == nil || compareTypes(t, *best) > 0) {
			best = &c.Types[i]
		}
	}
	if best == nil {
		kind := "type without GPUs"
		if req.GPUs > 0 {
			kind = "GPU type"
		}
		if c.Confidential {
			kind = "confidential-capable " + kind
		}
		return "the list has no " + kind
	}
	return best.String()
}

// candidate reports whether sizing may pick t: allowed on this node and,
// with --confidential on, able to run a confidential VM (an ordinary
// type is never picked only to be refused by SelectTEE).
func (c SpecConfig) candidate(t InstanceType, allowed []string) bool {
	return slices.Contains(allowed, t.Name) && (!c.Confidential || c.Capable(t.Name))
}

func compareTypes(a, b InstanceType) int {
	if a.GPUs != b.GPUs {
		return a.GPUs - b.GPUs
	}
	if a.VCPUs != b.VCPUs {
		return a.VCPUs - b.VCPUs
	}
	if a.MemoryMiB != b.MemoryMiB {
		return a.MemoryMiB - b.MemoryMiB
	}
	return strings.Compare(a.Name, b.Name)
}
