package aws

import (
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/test/lifetest"
	ec2fake "github.com/caa-project/caa/test/mocks/aws"
	"github.com/caa-project/caa/test/mocks/cloud"
)

// These tests run caa's reconciler in-process (test/lifetest), with this
// provider through the SDK, against a fake EC2 that enforces the shipped
// IAM policy: the whole life of a node's VMs under exactly that policy,
// and what each missing permission does to it.

const (
	lifeCluster = "cluster-life"
	lifeNode    = "node-a"
)

// lifeConfig is one node on a fake EC2 whose policy the test can change,
// starting with policy.
func lifeConfig(t *testing.T, policy *ec2fake.Policy) lifetest.Config {
	var cur atomic.Pointer[ec2fake.Policy]
	cur.Store(policy)
	f := newPolicyFake(t, cur.Load, nil)
	return lifetest.Config{
		Provider: f.provider, Cloud: f.cloud, Name: Name,
		Cluster: lifeCluster, Node: lifeNode, Type: policyType, Image: policyImage,
		// EC2 keeps a terminated instance a while: the orphan's is still there to get.
		Orphan: func(t *testing.T) string {
			s := provider.Spec{Key: "orphan-key", Cluster: lifeCluster, Node: lifeNode, PodUID: "uid-gone", PodNamespace: "team", PodName: "gone"}
			in, err := f.cloud.Create(cloud.CreateRequest{Token: "orphan", Image: policyImage, InstanceType: policyType, Tags: s.Tags()})
			require.NoError(t, err)
			return in.ID
		},
		AfterOrphanGC: func(t *testing.T, id string) {
			_, err := f.cloud.Get(id)
			require.NoError(t, err)
		},
		Deny:    func(action string) { cur.Store(policy.Without(action)) },
		Restore: func() { cur.Store(policy) },
	}
}

// TestWholeLifeUnderTheShippedPolicy: start and create, restart and adopt,
// recreate a killed VM, delete a gone pod's VM, collect an orphan, and
// rebuild the ledger from the cloud, every call under exactly the policy
// in deploy/overlays/aws/iam-policy.json, none refused. The preflight runs
// once caa's instances are there.
func TestWholeLifeUnderTheShippedPolicy(t *testing.T) {
	lifetest.WholeLife(t, lifeConfig(t, shippedPolicy(t)))
}

// TestEachMissingPermissionStopsTheNodeAndLosesNothing takes each action
// out of the policy in turn, at the step of the life that needs it: the
// first pass fails with a daemon-blocking error that names the action,
// nothing crashes, no VM is deleted or made twice and no record lost; once
// the permission is given back, the same reconciler converges.
func TestEachMissingPermissionStopsTheNodeAndLosesNothing(t *testing.T) {
	full := shippedPolicy(t)
	var perms []lifetest.Permission
	for _, action := range full.Actions() {
		perms = append(perms, lifetest.Permission{Name: action})
	}
	lifetest.EachMissing(t, perms, lifetest.Missing{
		Noun:   "permission",
		Passes: 1, // the very first pass fails
		Denied: func(t *testing.T, action string, before, now map[string]string) {
			if action == "ec2:TerminateInstances" {
				assert.Equal(t, before["uid-1"], now["uid-1"], "the gone pod's VM is still there, to be deleted later")
			}
		},
	}, func(t *testing.T) lifetest.Config { return lifeConfig(t, full) })
}
