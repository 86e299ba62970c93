// Package clouds is the set of cloud providers built into this caa binary
// (chosen by build tags), each with its command-line settings and how to
// open its provider; every caa command that talks to a cloud picks one here.
package clouds

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"

	"github.com/spf13/pflag"
	"k8s.io/client-go/kubernetes"

	"github.com/caa-project/caa/pkg/provider"
)

// Known are every provider caa has; a build may leave some out.
var Known = []string{"aws", "azure", "ibmcloud"}

// Cloud is one provider compiled into this binary: its settings and how to
// build it. Build tags pick the clouds (aws.go, azure.go, ibmcloud.go): all
// of them by default; `-tags caa_aws` (or caa_azure, caa_ibmcloud, or
// several) builds only those, which makes a third of the binary and, since
// the SDKs' code is what the kernel pages in, much less resident memory
// (make build CLOUDS=aws).
type Cloud struct {
	Name     string
	AddFlags func(fs *pflag.FlagSet)
	// Types is the cloud's table of instance type sizes (the provider
	// package's InstanceTypes), which --instance-types names pick from.
	Types func() []provider.InstanceType
	// TEEs is the cloud's table of the TEEs each instance type offers
	// (the provider package's TEEs): none means the type cannot run a
	// confidential VM.
	TEEs func(instanceType string) []provider.TEE
	// Configured reads the configured default type and image from the
	// cloud's flags, before the provider is built (the confidential
	// preflight checks them); TypeFlag and ImageFlag name their flags.
	Configured          func() Defaults
	TypeFlag, ImageFlag string
	// Open validates the cloud's flags and builds its provider.
	Open func(ctx context.Context, log *slog.Logger) (provider.Provider, Defaults, error)
	// UseCluster, when set, hands the cloud the apiserver client and the
	// node's name before Open, for what it reads from the cluster (IBM
	// Cloud: the node's placement labels, the cluster's security group).
	// A command that makes VMs calls it; without it Open reads nothing
	// from the cluster.
	UseCluster func(client kubernetes.Interface, node string)
}

// Defaults are a cloud's answers for pods that name no type or image.
type Defaults struct {
	InstanceType, Image string
}

// Compiled returns the clouds built into this binary, each with
// settings of its own (one set per command, none shared).
func Compiled() []*Cloud {
	var out []*Cloud
	for _, c := range []*Cloud{awsCloud(), azureCloud(), ibmcloudCloud()} {
		if c != nil {
			out = append(out, c)
		}
	}
	return out
}

// Names lists the compiled clouds for help and error text.
func Names(clouds []*Cloud) string {
	names := make([]string, len(clouds))
	for i, c := range clouds {
		names[i] = c.Name
	}
	switch len(names) {
	case 0:
		return "none"
	case 1:
		return names[0]
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}

// Find returns the compiled cloud called name, or an error that says
// whether the name is unknown or only left out of this build.
func Find(clouds []*Cloud, name string) (*Cloud, error) {
	for _, c := range clouds {
		if c.Name == name {
			return c, nil
		}
	}
	if slices.Contains(Known, name) {
		return nil, fmt.Errorf("--provider %q: this caa was built without %s (build tags); use a build that includes it (make build CLOUDS=%s, or the default build with every cloud)",
			name, name, name)
	}
	return nil, fmt.Errorf("--provider %q: want %s (env CAA_PROVIDER)", name, Names(clouds))
}
