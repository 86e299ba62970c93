package main

import (
	"fmt"
	"strings"

	"github.com/caa-project/caa/pkg/provider"
	armfake "github.com/caa-project/caa/test/mocks/azure"
	"github.com/caa-project/caa/test/mocks/cloud"
)

// s6OtherNodes is how many nodes the seeded VMs are spread over.
const s6OtherNodes = 100

// seedShapes are the instance type, image and TEE of seeded VMs: the ones
// the bench configures caa with (fakes.go), confidential as caa's default
// makes them, so they render as caa's would.
var seedShapes = map[string][3]string{
	"aws":      {"m6a.large", "ami-0123456789abcdef0", string(provider.TEESEVSNP)},
	"azure":    {"Standard_DC2as_v5", "Canonical:ubuntu-24_04-lts:server:latest", string(provider.TEESEVSNP)},
	"ibmcloud": {"bx3dc-2x10", "r006-bench-image", string(provider.TEETDX)},
}

// seedOthers puts VMs of other nodes of the same cluster straight into the
// fake's core until it holds want of them (have already there), with the
// tags caa gives its own VMs and, on Azure, a NIC each, as caa makes them.
// No front end sees a call: the core's Create is what the fakes' handlers
// call, without the wire. On IBM the core's tags show on the instance's
// implicit boot volume and the instance sits in the fake's default VPC
// and resource group, the ones caa is configured with.
func seedOthers(f *fakeCloud, clusterID string, have, want int) error {
	for i := have; i < want; i++ {
		node := fmt.Sprintf("other-%03d", i%s6OtherNodes)
		uid := fmt.Sprintf("00000000-0000-4000-8000-%012d", i)
		spec := provider.Spec{Cluster: clusterID, Node: node, PodUID: uid, PodNamespace: "others",
			PodName: fmt.Sprintf("p-%06d", i), Key: uid + "-a1"}
		name := fmt.Sprintf("seed-%06d", i)
		shape := seedShapes[f.name]
		req := cloud.CreateRequest{Name: name, Tags: spec.Tags(), InstanceType: shape[0], Image: shape[1], TEE: shape[2]}
		if f.name == "azure" {
			nic := name + "-nic"
			id := strings.ToLower(fmt.Sprintf("/subscriptions/%s/resourceGroups/%s/providers/Microsoft.Network/networkInterfaces/%s",
				armfake.DefaultSubscription, armfake.DefaultResourceGroup, nic))
			f.core.PutResource(cloud.Resource{ID: id, Kind: "Microsoft.Network/networkInterfaces", Name: nic, Tags: spec.Tags(),
				Props: map[string]string{"location": armfake.DefaultLocation}})
			req.Resources, req.DeleteWith = []string{id}, []string{id}
		}
		if _, err := f.core.Create(req); err != nil {
			return fmt.Errorf("seed VM %d of other nodes: %w", i, err)
		}
	}
	return nil
}
