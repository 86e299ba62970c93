package aws

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/test/conformance"
)

// The node's root holds the node's credential and can read a pod's key on
// its VM's tags, so it can launch an instance with another pod's client
// token and key tag. Create must not take such an instance for the pod's:
// it names the tags that differ and neither adopts nor deletes it.
func TestCreateRefusesAnInstanceForgedWithTheClientToken(t *testing.T) {
	victim := specFor(7)
	victim.Cluster, victim.Node = "cluster-a", "node-a"
	for _, tc := range []struct {
		name  string
		forge func(*provider.Spec)
		want  []string
	}{
		{"another node", func(s *provider.Spec) { s.Node = "node-b" }, []string{`tag caa-node is "node-b", want "node-a"`}},
		{"another cluster", func(s *provider.Spec) { s.Cluster = "cluster-b" }, []string{`tag caa-cluster is "cluster-b", want "cluster-a"`}},
		{"another pod", func(s *provider.Spec) { s.PodUID, s.PodName = "uid-forged", "forged" },
			[]string{`tag caa-pod-uid is "uid-forged"`, `tag caa-pod is "team/forged"`}},
		// Other launch parameters: EC2 answers the token's replay with
		// IdempotentParameterMismatch, and the lookup finds the forgery.
		{"another pod of another type", func(s *provider.Spec) { s.PodUID, s.InstanceType = "uid-forged", conformance.TypeLarge },
			[]string{`tag caa-pod-uid is "uid-forged"`}},
	} {
		// Whether the create looks the token up first (the key may have
		// been sent) or EC2 replays it (a fresh key), the answer is the same.
		for _, maybeSent := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s, MaybeSent %v", tc.name, maybeSent), func(t *testing.T) {
				ctx := context.Background()
				f := newFakeEC2(t, suiteOptions(), nil)
				forged := victim
				tc.forge(&forged)
				forgedTags := instanceTags(nil, forged)
				forgedTags[provider.TagKey] = victim.Key
				out, err := f.provider.api.RunInstances(ctx, f.provider.runInput(forged, clientToken(victim.Key), forgedTags))
				require.NoError(t, err, "the forger's launch")
				forgedID := *out.Instances[0].InstanceId

				spec := victim
				spec.MaybeSent = maybeSent
				_, err = f.provider.Create(ctx, spec)
				require.Error(t, err)
				assert.ErrorIs(t, err, provider.ErrConflict)
				assert.Contains(t, err.Error(), forgedID)
				assert.Contains(t, err.Error(), "left alone")
				for _, w := range tc.want {
					assert.Contains(t, err.Error(), w)
				}
				live := f.cloud.Live()
				require.Len(t, live, 1, "nothing launched, nothing deleted")
				assert.Equal(t, forgedID, live[0].ID)
			})
		}
	}

	t.Run("its own instance is still taken", func(t *testing.T) {
		ctx := context.Background()
		f := newFakeEC2(t, suiteOptions(), nil)
		first, err := f.provider.Create(ctx, victim)
		require.NoError(t, err)
		again, err := f.provider.Create(ctx, victim)
		require.NoError(t, err)
		assert.Equal(t, first.ID, again.ID)
		assert.Len(t, f.cloud.Live(), 1)
	})
}
