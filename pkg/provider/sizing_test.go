package provider

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// known stands for a cloud's table of type sizes.
var known = []InstanceType{
	{Name: "m.small", VCPUs: 2, MemoryMiB: 8192},
	{Name: "m.large", VCPUs: 8, MemoryMiB: 32768},
	{Name: "g.t4", VCPUs: 4, MemoryMiB: 16384, GPUs: 1, GPUModel: "t4"},
	{Name: "g.a100", VCPUs: 24, MemoryMiB: 225280, GPUs: 1, GPUModel: "a100"},
	{Name: "g.a100x4", VCPUs: 96, MemoryMiB: 900000, GPUs: 4, GPUModel: "a100"},
}

// limits is what kata's Go shim sends for a pod with limits under
// static_sandbox_resource_mgmt: every key, zeros and empties for what the
// pod does not ask (virtcontainers/remote.go).
func limits(vcpus, mem, gpus, model string) map[string]string {
	return map[string]string{
		AnnotationMachineType: "", AnnotationImage: "", AnnotationVCPUs: vcpus, AnnotationMemory: mem,
		AnnotationGPUs: gpus, AnnotationGPUModel: model,
	}
}

func TestPodWithLimitsAndNoListGetsTheDefaultTypeWithANotice(t *testing.T) {
	cfg := SpecConfig{DefaultType: "m.small", DefaultImage: "img", Known: known}

	sel, err := cfg.Select(limits("2", "4096", "0", ""))
	require.NoError(t, err)
	assert.Equal(t, Selection{InstanceType: "m.small", Image: "img"}, sel, "within the default type: no notice")

	sel, err = cfg.Select(limits("4", "16384", "0", ""))
	require.NoError(t, err)
	assert.Equal(t, "m.small", sel.InstanceType)
	for _, w := range []string{"4 vCPUs, 16384 MiB", "m.small (2 vCPUs, 8192 MiB)", "--instance-types is empty"} {
		assert.Contains(t, sel.Notice, w)
	}

	cfg.DefaultType = "custom.unknown"
	sel, err = cfg.Select(limits("4", "16384", "0", ""))
	require.NoError(t, err)
	assert.Equal(t, Selection{InstanceType: "custom.unknown", Image: "img"}, sel, "a default of unknown size: no claim about it")
}

func TestGPURequestWithNoListIsRefusedUnlessTheDefaultHasIt(t *testing.T) {
	cfg := SpecConfig{DefaultType: "m.small", DefaultImage: "img", Known: known}
	_, err := cfg.Select(limits("0", "0", "1", "a100"))
	require.ErrorIs(t, err, ErrInvalidSpec)
	for _, w := range []string{"1 a100 GPU", "m.small", "--instance-types", "g.t4, g.a100"} {
		assert.Contains(t, err.Error(), w)
	}
	cfg.DefaultType = "g.a100"
	sel, err := cfg.Select(limits("0", "0", "1", "A100"))
	require.NoError(t, err)
	assert.Equal(t, Selection{InstanceType: "g.a100", Image: "img"}, sel)
}

func TestSizingPicksTheSmallestFittingTypeOfTheList(t *testing.T) {
	cfg := SpecConfig{DefaultType: "m.small", DefaultImage: "img", Known: known, Types: known}
	for _, c := range []struct {
		name string
		ann  map[string]string
		want string
	}{
		{"no request: the default", limits("0", "0", "0", ""), "m.small"},
		{"vCPUs", limits("3", "0", "0", ""), "m.large"},
		{"memory alone", limits("0", "9000", "0", ""), "m.large"},
		{"a GPU type is never spent on a pod without GPUs", limits("4", "16384", "0", ""), "m.large"},
		{"any GPU model", limits("1", "1024", "1", ""), "g.t4"},
		{"the model named, any case", limits("1", "1024", "1", "A100"), "g.a100"},
		{"a model with no count asks for one", limits("0", "0", "0", "a100"), "g.a100"},
		{"more GPUs", limits("1", "1024", "2", "a100"), "g.a100x4"},
		{"machine_type wins", map[string]string{AnnotationMachineType: "g.t4", AnnotationVCPUs: "64"}, "g.t4"},
	} {
		t.Run(c.name, func(t *testing.T) {
			sel, err := cfg.Select(c.ann)
			require.NoError(t, err)
			assert.Equal(t, c.want, sel.InstanceType)
			assert.Empty(t, sel.Notice)
		})
	}
}

func TestSizingRefusalNamesTheFlag(t *testing.T) {
	cfg := SpecConfig{DefaultType: "m.small", DefaultImage: "img", Known: known, Types: known[:2]}
	_, err := cfg.Select(limits("16", "0", "0", ""))
	require.ErrorIs(t, err, ErrInvalidSpec)
	assert.Contains(t, err.Error(), "16 vCPUs")
	assert.Contains(t, err.Error(), "largest: m.large (8 vCPUs, 32768 MiB)")
	assert.Contains(t, err.Error(), "--instance-types")

	_, err = cfg.Select(limits("0", "0", "1", "h100"))
	require.ErrorIs(t, err, ErrInvalidSpec)
	assert.Contains(t, err.Error(), "1 h100 GPU")
	assert.Contains(t, err.Error(), "the list has no GPU type")

	for _, bad := range []map[string]string{
		limits("-1", "0", "0", ""), limits("0", "lots", "0", ""), limits("0", "0", "x", ""), limits("0", "0", "1", "a 100"),
	} {
		_, err := cfg.Select(bad)
		assert.ErrorIs(t, err, ErrInvalidSpec, "%v", bad)
	}
}

func TestParseInstanceTypes(t *testing.T) {
	got, err := ParseInstanceTypes("m.small, g.t4, x.big:32:131072, x.gpu:8:65536:2:L4", known)
	require.NoError(t, err)
	assert.Equal(t, []InstanceType{known[0], known[2], {Name: "x.big", VCPUs: 32, MemoryMiB: 131072},
		{Name: "x.gpu", VCPUs: 8, MemoryMiB: 65536, GPUs: 2, GPUModel: "l4"}}, got)

	for in, want := range map[string]string{
		"nope":            `caa does not know the size of "nope": write it as nope:vcpus:memoryMiB`,
		"a:1":             `"a:1" is not name`,
		"a:0:1024":        "positive numbers",
		"a:1:1024:0:t4":   "positive numbers",
		"m.small,m.small": "listed twice",
	} {
		_, err := ParseInstanceTypes(in, known)
		require.Error(t, err, in)
		assert.Contains(t, err.Error(), "--instance-types: ")
		assert.Contains(t, err.Error(), want, in)
	}
}

// TestSizingPicksAmongConfidentialTypesOnly: with --confidential on, a
// request is fitted to the capable types of the list only, even where an
// ordinary type is smaller; a request only ordinary types meet is refused
// naming confidential-capable types; off, every listed type is a
// candidate again.
func TestSizingPicksAmongConfidentialTypesOnly(t *testing.T) {
	types := []InstanceType{
		{Name: "t.medium", VCPUs: 4, MemoryMiB: 8192},
		{Name: "c.large", VCPUs: 4, MemoryMiB: 16384},
		{Name: "t.huge", VCPUs: 64, MemoryMiB: 262144},
		{Name: "c.xlarge", VCPUs: 8, MemoryMiB: 32768},
	}
	tees := func(name string) []TEE {
		if name[0] == 'c' {
			return []TEE{TEESEVSNP}
		}
		return nil
	}
	cfg := SpecConfig{DefaultType: "c.large", DefaultImage: "img", Types: types, Known: types, Confidential: true, TEEs: tees}
	sel, err := cfg.Select(limits("3", "4096", "0", ""))
	require.NoError(t, err)
	assert.Equal(t, "c.large", sel.InstanceType, "t.medium is smaller but cannot run a confidential VM")
	tee, err := cfg.SelectTEE(nil, sel.InstanceType)
	require.NoError(t, err)
	assert.Equal(t, TEESEVSNP, tee)

	_, err = cfg.Select(limits("32", "0", "0", ""))
	require.ErrorIs(t, err, ErrInvalidSpec)
	assert.Contains(t, err.Error(), "no confidential-capable type of --instance-types")
	assert.Contains(t, err.Error(), "largest: c.xlarge", "t.huge is never offered")

	cfg.Confidential = false
	sel, err = cfg.Select(limits("3", "4096", "0", ""))
	require.NoError(t, err)
	assert.Equal(t, "t.medium", sel.InstanceType)
	sel, err = cfg.Select(limits("32", "0", "0", ""))
	require.NoError(t, err)
	assert.Equal(t, "t.huge", sel.InstanceType)
}
