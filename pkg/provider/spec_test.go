package provider

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var testTypes = SpecConfig{
	DefaultType:  "m.small",
	DefaultImage: "img-default",
	Types: []InstanceType{
		{Name: "m.large", VCPUs: 4, MemoryMiB: 16384},
		{Name: "m.small", VCPUs: 2, MemoryMiB: 4096},
		{Name: "c.large", VCPUs: 4, MemoryMiB: 8192},
		{Name: "m.xlarge", VCPUs: 8, MemoryMiB: 32768},
	},
}

func TestSelect(t *testing.T) {
	tests := []struct {
		name    string
		cfg     SpecConfig
		ann     map[string]string
		want    Selection
		wantErr []string // substrings of an ErrInvalidSpec message
	}{
		{name: "defaults", cfg: testTypes, want: Selection{InstanceType: "m.small", Image: "img-default"}},
		{name: "explicit type and the default image by name", cfg: testTypes,
			ann:  map[string]string{AnnotationMachineType: "m.large", AnnotationImage: "img-default"},
			want: Selection{InstanceType: "m.large", Image: "img-default"}},
		{name: "another image only when the operator allows it", cfg: withImages("img-default", "ami-123"),
			ann:  map[string]string{AnnotationMachineType: "m.large", AnnotationImage: "ami-123"},
			want: Selection{InstanceType: "m.large", Image: "ami-123"}},
		{name: "an image not allowed gets no VM (and no user data)", cfg: testTypes,
			ann:     map[string]string{AnnotationImage: "ami-attacker"},
			wantErr: []string{AnnotationImage, `"ami-attacker"`, "not allowed", "allowed: img-default", "--allowed-images"}},
		{name: "an allow-list without the default still names what it allows", cfg: withImages("ami-1", "ami-2"),
			ann:     map[string]string{AnnotationImage: "ami-3"},
			wantErr: []string{"allowed: ami-1, ami-2"}},
		{name: "explicit type beats sizing", cfg: testTypes,
			ann:  map[string]string{AnnotationMachineType: "m.small", AnnotationVCPUs: "8"},
			want: Selection{InstanceType: "m.small", Image: "img-default"}},
		{name: "type not allowed", cfg: testTypes,
			ann:     map[string]string{AnnotationMachineType: "gpu.huge"},
			wantErr: []string{AnnotationMachineType, `"gpu.huge"`, "m.large, m.small, c.large, m.xlarge"}},
		{name: "allow-list narrows the table", cfg: SpecConfig{DefaultType: "m.small", DefaultImage: "i", Types: testTypes.Types, AllowedTypes: []string{"m.small", "m.xlarge"}},
			ann:  map[string]string{AnnotationVCPUs: "3"},
			want: Selection{InstanceType: "m.xlarge", Image: "i"}},
		{name: "vcpus picks smallest fit, ties by memory", cfg: testTypes,
			ann:  map[string]string{AnnotationVCPUs: "3"},
			want: Selection{InstanceType: "c.large", Image: "img-default"}},
		{name: "memory pushes up", cfg: testTypes,
			ann:  map[string]string{AnnotationVCPUs: "3", AnnotationMemory: "9000"},
			want: Selection{InstanceType: "m.large", Image: "img-default"}},
		{name: "memory alone", cfg: testTypes,
			ann:  map[string]string{AnnotationMemory: "4096"},
			want: Selection{InstanceType: "m.small", Image: "img-default"}},
		{name: "nothing large enough", cfg: testTypes,
			ann:     map[string]string{AnnotationVCPUs: "64"},
			wantErr: []string{"64 vCPUs", "m.xlarge (8 vCPUs, 32768 MiB)", "--instance-types"}},
		{name: "vcpus not a number", cfg: testTypes,
			ann:     map[string]string{AnnotationVCPUs: "two"},
			wantErr: []string{AnnotationVCPUs, `"two"`, "whole number"}},
		{name: "memory negative", cfg: testTypes,
			ann:     map[string]string{AnnotationMemory: "-1"},
			wantErr: []string{AnnotationMemory, `"-1"`}},
		{name: "the shim's zeros and empties ask for nothing", cfg: testTypes,
			ann: map[string]string{AnnotationVCPUs: "0", AnnotationMemory: "0", AnnotationGPUs: "0", AnnotationGPUModel: "",
				AnnotationMachineType: "", AnnotationImage: "img-default"},
			want: Selection{InstanceType: "m.small", Image: "img-default"}},
		{name: "image with spaces", cfg: testTypes,
			ann:     map[string]string{AnnotationImage: "ami 1"},
			wantErr: []string{AnnotationImage, `"ami 1"`}},
		{name: "an empty image annotation names none (kata's shims send it empty)", cfg: testTypes,
			ann:  map[string]string{AnnotationImage: " "},
			want: Selection{InstanceType: "m.small", Image: "img-default"}},
		{name: "no default type", cfg: SpecConfig{DefaultImage: "i", AllowedTypes: []string{"a"}},
			wantErr: []string{"no default type"}},
		{name: "no default image", cfg: SpecConfig{DefaultType: "a"},
			wantErr: []string{"no default image"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.cfg.Select(tc.ann)
			if tc.wantErr != nil {
				require.ErrorIs(t, err, ErrInvalidSpec)
				for _, w := range tc.wantErr {
					assert.Contains(t, err.Error(), w)
				}
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

func withImages(images ...string) SpecConfig {
	c := testTypes
	c.AllowedImages = images
	return c
}

func TestSelectIgnoresTableOrder(t *testing.T) {
	rev := testTypes
	rev.Types = []InstanceType{testTypes.Types[3], testTypes.Types[2], testTypes.Types[1], testTypes.Types[0],
		{Name: "b.large", VCPUs: 4, MemoryMiB: 8192}}
	got, err := rev.Select(map[string]string{AnnotationVCPUs: "4"})
	require.NoError(t, err)
	assert.Equal(t, "b.large", got.InstanceType, "equal shapes break ties by name")
}

func TestSpecNeverPrintsUserData(t *testing.T) {
	s := Spec{Key: "k", PodNamespace: "ns", PodName: "p", UserData: []byte("password=hunter2")}
	for _, out := range []string{s.String(), fmt.Sprintf("%v", s), fmt.Sprintf("%+v", s), fmt.Sprintf("%#v", s), fmt.Sprint(s)} {
		assert.NotContains(t, out, "hunter2")
		assert.Contains(t, out, "16 bytes")
	}
}

func TestSpecTagsAndSelector(t *testing.T) {
	s := Spec{Key: "uid-1-a1", Cluster: "c", Node: "n", PodUID: "uid-1", PodNamespace: "ns", PodName: "p",
		ExtraTags: map[string]string{"team": "x", TagNode: "spoofed"}}
	tags := s.Tags()
	assert.Equal(t, map[string]string{"team": "x", TagCluster: "c", TagNode: "n", TagPodUID: "uid-1",
		TagPod: "ns/p", TagKey: "uid-1-a1", TagManagedBy: "caa"}, tags)
	assert.True(t, Selector{Cluster: "c", Node: "n"}.Matches(tags))
	assert.False(t, Selector{Cluster: "c", Node: "other"}.Matches(tags))
	assert.Equal(t, Owner{Cluster: "c", Node: "n", PodUID: "uid-1", Pod: "ns/p", Key: "uid-1-a1", Managed: true}, VM{Tags: tags}.Owner())
}

func TestSpecValidate(t *testing.T) {
	ok := Spec{Key: "k", Cluster: "c", Node: "n", PodUID: "u", PodNamespace: "ns", PodName: "p", InstanceType: "t", Image: "i"}
	require.NoError(t, ok.Validate())
	bad := ok
	bad.Image = ""
	err := bad.Validate()
	require.ErrorIs(t, err, ErrInvalidSpec)
	assert.Contains(t, err.Error(), "Image")
}

func TestErrorKinds(t *testing.T) {
	sdk := errors.New("sdk said no")
	err := fmt.Errorf("create pod x: %w", &Error{Kind: ErrThrottled, Provider: "aws", Op: "create",
		Code: "RequestLimitExceeded", RetryAfter: 3e9, Err: sdk})
	assert.ErrorIs(t, err, ErrThrottled)
	assert.ErrorIs(t, err, sdk)
	assert.NotErrorIs(t, err, ErrQuota)
	d, ok := RetryAfter(err)
	assert.True(t, ok)
	assert.Equal(t, "3s", d.String())
	assert.Equal(t, "create pod x: aws create: throttled: RequestLimitExceeded (retry after 3s)", err.Error())
	assert.False(t, Terminal(err))
	assert.True(t, Terminal(&Error{Kind: ErrAuth}))
	_, ok = RetryAfter(sdk)
	assert.False(t, ok)
	assert.True(t, StateRunning.Alive())
	assert.True(t, StateTerminated.Gone())
	assert.False(t, StateStopped.Alive())
}
