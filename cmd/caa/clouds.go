package main

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"

	"github.com/spf13/pflag"

	"github.com/caa-project/caa/pkg/provider"
)

// knownClouds are every provider caa has; a build may leave some out.
var knownClouds = []string{"aws", "azure", "ibmcloud"}

// cloud is one provider compiled into this binary: its settings and how to
// build it. Build tags pick the clouds (cloud_*.go): all of them by default;
// `-tags caa_aws` (or caa_azure, caa_ibmcloud, or several) builds only
// those, which makes a third of the binary and, since the SDKs' code is
// what the kernel pages in, much less resident memory (make build CLOUDS=aws).
type cloud struct {
	name     string
	addFlags func(fs *pflag.FlagSet)
	// types is the cloud's table of instance type sizes (the provider
	// package's InstanceTypes), which --instance-types names pick from.
	types func() []provider.InstanceType
	// tees is the cloud's table of the TEEs each instance type offers
	// (the provider package's TEEs): none means the type cannot run a
	// confidential VM.
	tees func(instanceType string) []provider.TEE
	// defaults reads the configured default type and image from the
	// cloud's flags, before the provider is built (the confidential
	// preflight checks them); typeFlag and imageFlag name their flags.
	defaults            func() cloudDefaults
	typeFlag, imageFlag string
	open                func(ctx context.Context, log *slog.Logger) (provider.Provider, cloudDefaults, error)
}

// cloudDefaults are a cloud's answers for pods that name no type or image.
type cloudDefaults struct {
	instanceType, image string
}

// compiledClouds returns the clouds built into this binary, each with
// settings of its own (one set per command, none shared).
func compiledClouds() []*cloud {
	var out []*cloud
	for _, c := range []*cloud{awsCloud(), azureCloud(), ibmcloudCloud()} {
		if c != nil {
			out = append(out, c)
		}
	}
	return out
}

// cloudNames lists the compiled clouds for help and error text.
func cloudNames(clouds []*cloud) string {
	names := make([]string, len(clouds))
	for i, c := range clouds {
		names[i] = c.name
	}
	switch len(names) {
	case 0:
		return "none"
	case 1:
		return names[0]
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}

// findCloud returns the compiled cloud called name, or an error that says
// whether the name is unknown or only left out of this build.
func findCloud(clouds []*cloud, name string) (*cloud, error) {
	for _, c := range clouds {
		if c.name == name {
			return c, nil
		}
	}
	if slices.Contains(knownClouds, name) {
		return nil, fmt.Errorf("--provider %q: this caa was built without %s (build tags); use a build that includes it (make build CLOUDS=%s, or the default build with every cloud)",
			name, name, name)
	}
	return nil, fmt.Errorf("--provider %q: want %s (env CAA_PROVIDER)", name, cloudNames(clouds))
}
