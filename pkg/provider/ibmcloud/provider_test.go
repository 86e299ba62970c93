package ibmcloud_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/IBM/go-sdk-core/v5/core"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/pkg/provider/ibmcloud"
	"github.com/caa-project/caa/test/conformance"
	"github.com/caa-project/caa/test/mocks/cloud"
	vpcfake "github.com/caa-project/caa/test/mocks/ibmcloud"
)

// fixture is a provider on a fresh fake with the suite's images and types.
type fixture struct {
	p   *ibmcloud.Provider
	c   *cloud.Cloud
	url string
	ctx context.Context
}

func newFixture(t *testing.T, edit func(*ibmcloud.Config)) fixture {
	t.Helper()
	clock := &conformance.Clock{}
	c := cloud.New(conformance.Options(clock))
	srv := serve(t, c)
	cfg := testConfig(srv.URL)
	if edit != nil {
		edit(&cfg)
	}
	p, err := ibmcloud.New(context.Background(), cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return fixture{p: p, c: c, url: srv.URL, ctx: ctx}
}

// providerError digs the *provider.Error out of err.
func providerError(t *testing.T, err error) *provider.Error {
	t.Helper()
	var pe *provider.Error
	require.ErrorAs(t, err, &pe)
	return pe
}

func TestCreateWritesWhatDeleteRemoves(t *testing.T) {
	f := newFixture(t, func(c *ibmcloud.Config) {
		c.Tags = map[string]string{"team": "infra", provider.TagNode: "overridden"}
	})
	spec := conformance.Spec(1, "node-a")
	vm, err := f.p.Create(f.ctx, spec)
	require.NoError(t, err)
	assert.Equal(t, "infra", vm.Tags["team"], "the configured tags are added")
	assert.Equal(t, "node-a", vm.Tags[provider.TagNode], "below the identity")
	assert.True(t, strings.HasPrefix(vm.Name, "caa-uid-0001-a1-"), vm.Name)
	assert.Equal(t, "us-south-1", vm.Zone)

	live := f.c.Live()
	require.Len(t, live, 1)
	assert.Equal(t, len(conformance.UserDataSecret), live[0].UserDataLen)
	res := f.c.Resources("")
	require.Len(t, res, 2)
	kinds := map[string]cloud.Resource{}
	for _, r := range res {
		kinds[r.Kind] = r
	}
	require.Contains(t, kinds, vpcfake.KindVNI)
	require.Contains(t, kinds, vpcfake.KindVolume)
	assert.Equal(t, vpcfake.DefaultSubnet, kinds[vpcfake.KindVNI].Props["subnet"])
	assert.Equal(t, "r006-sg-1", kinds[vpcfake.KindVNI].Props["security_groups"])
	assert.Equal(t, "caa", kinds[vpcfake.KindVolume].Tags["caa-managed-by"], "tags live on the boot volume")
	assert.Equal(t, "team_2fpod-1", kinds[vpcfake.KindVolume].Tags["caa-pod"], "escaped for IBM's tag alphabet")

	got, err := f.p.Get(f.ctx, vm.ID)
	require.NoError(t, err)
	assert.Equal(t, vm.Tags, got.Tags, "Get reads back every tag")

	require.NoError(t, f.p.Delete(f.ctx, vm.ID))
	assert.Empty(t, f.c.Resources(""), "volume and interface went with the instance")
	assert.Empty(t, f.c.Live())
}

func TestConfiguredDefaultsFillTheSpec(t *testing.T) {
	f := newFixture(t, func(c *ibmcloud.Config) { c.Image, c.InstanceType = conformance.ImageGood, conformance.TypeLarge })
	spec := conformance.Spec(2, "node-a")
	spec.Image, spec.InstanceType = "", ""
	vm, err := f.p.Create(f.ctx, spec)
	require.NoError(t, err)
	assert.Equal(t, conformance.ImageGood, vm.Image)
	assert.Equal(t, conformance.TypeLarge, vm.InstanceType)
}

func TestLongIdentityRoundTrips(t *testing.T) {
	f := newFixture(t, nil)
	node := strings.Repeat("worker-", 20) + "z.example.com"
	spec := conformance.Spec(3, node)
	spec.PodNamespace = strings.Repeat("n", 63)
	spec.PodName = strings.Repeat("deployment-", 20) + "7d9f8c-x2x9q"
	spec.ExtraTags = map[string]string{"Owner": "Ünïcode Team/Platform: on-call", "note": strings.Repeat("lorem ipsum ", 40)}
	vm, err := f.p.Create(f.ctx, spec)
	require.NoError(t, err, "the fake refuses any user tag over 128 characters")

	got, err := f.p.Get(f.ctx, vm.ID)
	require.NoError(t, err)
	assert.Equal(t, spec.Tags(), got.Tags)
	assert.Equal(t, provider.PodTag(spec.PodNamespace, spec.PodName), got.Owner().Pod)
	assert.True(t, strings.HasPrefix(got.Owner().Pod, spec.PodNamespace+"/deployment-"), got.Owner().Pod)

	vms, err := f.p.List(f.ctx, provider.Selector{Cluster: conformance.Cluster, Node: node})
	require.NoError(t, err)
	require.Len(t, vms, 1)
	assert.Equal(t, vm.ID, vms[0].ID)
	vms, err = f.p.List(f.ctx, provider.Selector{Cluster: conformance.Cluster, Node: node[:len(node)-1]})
	require.NoError(t, err)
	assert.Empty(t, vms, "a node sharing the first piece of the tag is another node")
}

func TestListIsScopedToTheVPC(t *testing.T) {
	f := newFixture(t, nil)
	other, err := ibmcloud.New(context.Background(), func() ibmcloud.Config {
		c := testConfig(f.url)
		c.VPCID = "r006-other-vpc"
		return c
	}())
	require.NoError(t, err)
	elsewhere, err := other.Create(f.ctx, conformance.Spec(4, "node-a"))
	require.NoError(t, err)
	here, err := f.p.Create(f.ctx, conformance.Spec(5, "node-a"))
	require.NoError(t, err)

	sel := provider.Selector{Cluster: conformance.Cluster, Node: "node-a"}
	vms, err := f.p.List(f.ctx, sel)
	require.NoError(t, err)
	require.Len(t, vms, 1)
	assert.Equal(t, here.ID, vms[0].ID)
	vms, err = other.List(f.ctx, sel)
	require.NoError(t, err)
	require.Len(t, vms, 1)
	assert.Equal(t, elsewhere.ID, vms[0].ID)
}

func TestCreateRefusesAnInstanceItDidNotMake(t *testing.T) {
	f := newFixture(t, nil)
	spec := conformance.Spec(6, "node-a")
	vm, err := f.p.Create(f.ctx, spec)
	require.NoError(t, err)
	require.NoError(t, f.p.Delete(f.ctx, vm.ID))
	// Someone else's instance under the very name caa would use.
	_, err = f.c.Create(cloud.CreateRequest{Name: vm.Name, InstanceType: spec.InstanceType, Image: spec.Image,
		Tags: map[string]string{provider.TagKey: "someone-else"}})
	require.NoError(t, err)

	_, err = f.p.Create(f.ctx, spec)
	require.ErrorIs(t, err, provider.ErrConflict)
	pe := providerError(t, err)
	assert.Equal(t, "idempotency_mismatch", pe.Code)
	assert.Contains(t, pe.Message, "someone-else")
	assert.Len(t, f.c.Live(), 1, "no second instance")
}

func TestStoppedInstance(t *testing.T) {
	f := newFixture(t, nil)
	vm, err := f.p.Create(f.ctx, conformance.Spec(7, "node-a"))
	require.NoError(t, err)
	require.NoError(t, f.c.Stop(vm.ID))
	got, err := f.p.Get(f.ctx, vm.ID)
	require.NoError(t, err)
	assert.Equal(t, provider.StateStopped, got.State)
}

func TestIAMRefusesTheKey(t *testing.T) {
	f := newFixture(t, nil)
	t.Setenv(ibmcloud.EnvAPIKey, "not-the-key-5150")
	p, err := ibmcloud.New(context.Background(), testConfig(f.url))
	require.NoError(t, err, "New makes no call")
	calls := map[string]func() error{
		"create": func() error { _, err := p.Create(f.ctx, conformance.Spec(8, "node-a")); return err },
		"get":    func() error { _, err := p.Get(f.ctx, "0717_x"); return err },
		"list":   func() error { _, err := p.List(f.ctx, provider.Selector{Cluster: "c", Node: "n"}); return err },
		"delete": func() error { return p.Delete(f.ctx, "0717_x") },
	}
	for op, call := range calls {
		t.Run(op, func(t *testing.T) {
			err := call()
			require.ErrorIs(t, err, provider.ErrAuth)
			pe := providerError(t, err)
			assert.Equal(t, "BXNIM0415E", pe.Code)
			assert.Equal(t, 400, pe.Status)
			assert.NotContains(t, fmt.Sprintf("%v %+v", err, err), "not-the-key-5150")
			assert.True(t, provider.Terminal(err))
		})
	}
	assert.Zero(t, f.c.Counters()[cloud.OpCreate]+f.c.Counters()[cloud.OpGet]+f.c.Counters()[cloud.OpDelete],
		"no VPC call without a token")
}

func TestThrottlingIsSurfacedAtOnce(t *testing.T) {
	f := newFixture(t, nil)
	vm, err := f.p.Create(f.ctx, conformance.Spec(9, "node-a"))
	require.NoError(t, err)
	f.c.SetFaults(cloud.Faults{ThrottleEvery: 1, RetryAfter: 4 * time.Second})
	f.c.ResetCounters()
	_, err = f.p.List(f.ctx, provider.Selector{Cluster: conformance.Cluster, Node: "node-a"})
	require.ErrorIs(t, err, provider.ErrThrottled)
	pe := providerError(t, err)
	assert.Equal(t, "rate_limit_exceeded", pe.Code)
	assert.Equal(t, 4*time.Second, pe.RetryAfter)
	assert.LessOrEqual(t, f.c.Counters()["total"], int64(2), "one call per listing, none retried")

	f.c.ResetCounters()
	require.ErrorIs(t, f.p.Delete(f.ctx, vm.ID), provider.ErrThrottled)
	assert.Equal(t, int64(1), f.c.Counters()[cloud.OpDelete])
}

func TestServerErrorsAreRetriedThenSurface(t *testing.T) {
	f := newFixture(t, nil)
	vm, err := f.p.Create(f.ctx, conformance.Spec(10, "node-a"))
	require.NoError(t, err)
	f.c.SetFaults(cloud.Faults{ServerErrorRate: 1})
	f.c.ResetCounters()
	_, err = f.p.Get(f.ctx, vm.ID)
	require.Error(t, err)
	pe := providerError(t, err)
	assert.Nil(t, pe.Kind, "transient")
	assert.Equal(t, 500, pe.Status)
	assert.Equal(t, "internal_error", pe.Code)
	assert.Equal(t, int64(3), f.c.Counters()[cloud.OpGet], "three attempts, no more")

	f.c.SetFaults(cloud.Faults{ServerErrorRate: 0.5})
	for range 10 {
		if err := f.p.Delete(f.ctx, vm.ID); err == nil {
			break
		}
	}
	f.c.SetFaults(cloud.Faults{})
	assert.Empty(t, f.c.Live(), "the retries got the delete through")
}

func TestBadUserDataAndContext(t *testing.T) {
	f := newFixture(t, nil)
	spec := conformance.Spec(11, "node-a")
	spec.UserData = []byte{0xff, 0xfe, 's', 'e', 'c', 'r', 'e', 't'}
	_, err := f.p.Create(f.ctx, spec)
	require.ErrorIs(t, err, provider.ErrInvalidSpec)
	assert.NotContains(t, err.Error(), "secret")
	assert.Zero(t, f.c.Counters()["total"], "refused before any call")

	ctx, cancel := context.WithCancel(f.ctx)
	cancel()
	_, err = f.p.Get(ctx, "0717_x")
	require.ErrorIs(t, err, context.Canceled)
	assert.Equal(t, "request_failed", providerError(t, err).Code)
}

func TestNewRefusesDebugLoggingAndBadConfig(t *testing.T) {
	f := newFixture(t, nil)
	prev := core.GetLogger()
	t.Cleanup(func() { core.SetLogger(prev) })
	core.SetLogger(core.NewLogger(core.LevelDebug, nil, nil))
	_, err := ibmcloud.New(context.Background(), testConfig(f.url))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "debug")

	core.SetLogger(prev)
	cfg := testConfig(f.url)
	cfg.SubnetID = ""
	_, err = ibmcloud.New(context.Background(), cfg)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "--ibmcloud-subnet-id")
	assert.False(t, errors.Is(err, provider.ErrAuth))
}

func TestEveryCallHasADeadline(t *testing.T) {
	f := newFixture(t, func(c *ibmcloud.Config) { c.ReadTimeout, c.WriteTimeout = 100*time.Millisecond, 200*time.Millisecond })
	conformance.Deadlines(t, conformance.Harness{Provider: f.p, Cloud: f.c}, 5*time.Second)
}
