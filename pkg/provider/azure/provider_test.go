package azure_test

import (
	"context"
	"encoding/base64"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/arm"
	azcloud "github.com/Azure/azure-sdk-for-go/sdk/azcore/cloud"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/runtime"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/network/armnetwork/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/pkg/provider/azure"
	"github.com/caa-project/caa/test/conformance"
	armfake "github.com/caa-project/caa/test/mocks/azure"
	"github.com/caa-project/caa/test/mocks/cloud"
)

const vmIDPrefix = "/subscriptions/" + armfake.DefaultSubscription + "/resourceGroups/" + armfake.DefaultResourceGroup +
	"/providers/Microsoft.Compute/virtualMachines/"

// env is one provider on one fake, with the suite's cloud options and a
// clock that stands still.
type env struct {
	conformance.Harness
	ctx context.Context
	url string
}

func newEnv(t *testing.T, fakeOpts ...armfake.Option) env {
	t.Helper()
	opts := conformance.Options(&conformance.Clock{})
	now := time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)
	opts.Now = func() time.Time { return now }
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	h, url := newHarnessOn(t, opts, staticToken(testToken), fakeOpts, nil)
	return env{Harness: h, ctx: ctx, url: url}
}

func TestCreateSendsTheSpec(t *testing.T) {
	e := newEnv(t)
	e.Cloud.SetFaults(cloud.Faults{BootDelay: time.Minute})
	spec := conformance.Spec(1, "node-a")
	vm, err := e.Provider.Create(e.ctx, spec)
	require.NoError(t, err)

	live := e.Cloud.Live()
	require.Len(t, live, 1)
	in := live[0]
	assert.True(t, strings.HasPrefix(vm.Name, "caa-uid-0001-a1-"), "readable name: %s", vm.Name)
	assert.Equal(t, vmIDPrefix+vm.Name, vm.ID)
	assert.Equal(t, vm.Name, in.Name)
	// The core's views strip user data (Instance.UserData is always nil
	// outside the core), so its length is what can be checked here.
	assert.Equal(t, len(spec.UserData), in.UserDataLen, "user data reaches the VM through properties.userData")
	// The VM reads it where the pod VM image does: IMDS compute/userData.
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodGet, armfake.IMDSUserDataPath+"?api-version=2021-01-01&format=text", nil)
	req.Header.Set("Metadata", "true")
	armfake.IMDS(e.Cloud, in.ID).ServeHTTP(rec, req)
	require.Equal(t, http.StatusOK, rec.Code)
	assert.Equal(t, base64.StdEncoding.EncodeToString(spec.UserData), rec.Body.String(), "IMDS serves the user data")
	assert.Equal(t, spec.Image, in.Image)
	assert.Equal(t, spec.InstanceType, in.InstanceType)
	assert.Equal(t, provider.StatePending, vm.State)
	assert.Equal(t, armfake.DefaultLocation, vm.Zone)
	assert.Equal(t, "peerpods", vm.Tags["team"], "configured extra tags")
	assert.Equal(t, "cc-42", vm.Tags["cost-center"], "spec extra tags")

	res := e.Cloud.Resources("")
	require.Len(t, res, 2, "a NIC and an OS disk")
	for _, r := range res {
		assert.Equal(t, in.ID, r.Owner, "%s is attached", r.Name)
		assert.Contains(t, []string{vm.Name + "-nic", vm.Name + "-osdisk"}, r.Name)
		assert.Equal(t, spec.PodUID, r.Tags[provider.TagPodUID], "%s is tagged", r.Name)
	}
}

func TestCreateOnlyCreates(t *testing.T) {
	var mu sync.Mutex
	var ifNoneMatch []string
	watch := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodPut && strings.Contains(r.URL.Path, "/virtualMachines/") {
				mu.Lock()
				ifNoneMatch = append(ifNoneMatch, r.Header.Get("If-None-Match"))
				mu.Unlock()
			}
			next.ServeHTTP(w, r)
		})
	}
	h, _ := newHarness(t, conformance.Options(&conformance.Clock{}), staticToken(testToken), watch)
	ctx := context.Background()
	spec := conformance.Spec(8, "node-a")
	vm, err := h.Provider.Create(ctx, spec)
	require.NoError(t, err)
	require.NoError(t, h.Provider.Delete(ctx, vm.ID))

	// Another creator's VM for the same key, not readable yet: the GET
	// misses it, and the PUT must not turn into an update of it.
	h.Cloud.SetFaults(cloud.Faults{InvisibleFor: time.Hour})
	_, err = h.Cloud.Create(cloud.CreateRequest{Name: vm.Name, UniqueName: true, Tags: spec.Tags(), InstanceType: spec.InstanceType, Image: spec.Image})
	require.NoError(t, err)
	_, err = h.Provider.Create(ctx, spec)
	require.ErrorIs(t, err, provider.ErrConflict)
	var pe *provider.Error
	require.ErrorAs(t, err, &pe)
	assert.Equal(t, http.StatusPreconditionFailed, pe.Status)
	assert.Len(t, h.Cloud.Live(), 1)
	assert.Equal(t, []string{"*", "*"}, ifNoneMatch)
}

func TestCreateRefusesAVMOfAnotherKey(t *testing.T) {
	e := newEnv(t)
	spec := conformance.Spec(2, "node-a")
	vm, err := e.Provider.Create(e.ctx, spec)
	require.NoError(t, err)
	require.NoError(t, e.Provider.Delete(e.ctx, vm.ID))
	// Someone else's VM now has the name.
	_, err = e.Cloud.Create(cloud.CreateRequest{Name: vm.Name, UniqueName: true, Tags: map[string]string{provider.TagKey: "other"},
		InstanceType: spec.InstanceType, Image: spec.Image})
	require.NoError(t, err)
	created := e.Cloud.Counters()["created"]

	_, err = e.Provider.Create(e.ctx, spec)
	require.ErrorIs(t, err, provider.ErrConflict)
	assert.Contains(t, err.Error(), `"other"`)
	assert.Equal(t, created, e.Cloud.Counters()["created"])
}

func TestRefusedCreatesLeaveNothing(t *testing.T) {
	tests := []struct {
		name   string
		faults cloud.Faults
		edit   func(*provider.Spec)
		kind   error
		code   string
		status int
	}{
		{"bad image", cloud.Faults{}, func(s *provider.Spec) { s.Image = conformance.ImageBad }, provider.ErrInvalidSpec, "InvalidParameter", 400},
		{"bad platform image", cloud.Faults{}, func(s *provider.Spec) { s.Image = "Canonical:ubuntu:24_04-lts:latest" }, provider.ErrInvalidSpec, "ImageNotFound", 404},
		{"bad size", cloud.Faults{}, func(s *provider.Spec) { s.InstanceType = conformance.TypeBad }, provider.ErrInvalidSpec, "InvalidParameter", 400},
		// Allocation fails in the operation, whose status reply is a 200.
		{"capacity", cloud.Faults{CapacityFailures: 1}, func(*provider.Spec) {}, provider.ErrCapacity, "AllocationFailed", 200},
		{"quota", cloud.Faults{QuotaLimit: 1}, func(*provider.Spec) {}, provider.ErrQuota, "OperationNotAllowed", 409},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			if tc.faults.QuotaLimit > 0 {
				_, err := e.Provider.Create(e.ctx, conformance.Spec(9, "node-a"))
				require.NoError(t, err)
			}
			before := len(e.Cloud.Resources(""))
			e.Cloud.SetFaults(tc.faults)
			spec := conformance.Spec(3, "node-a")
			tc.edit(&spec)
			_, err := e.Provider.Create(e.ctx, spec)
			require.ErrorIs(t, err, tc.kind)
			var pe *provider.Error
			require.ErrorAs(t, err, &pe)
			assert.Equal(t, tc.code, pe.Code)
			assert.Equal(t, tc.status, pe.Status)
			assert.Equal(t, "create", pe.Op)
			assert.NotEmpty(t, pe.Message)
			if tc.faults.CapacityFailures == 0 {
				assert.Len(t, e.Cloud.Resources(""), before, "the NIC made for the refused VM is gone")
				return
			}
			// Azure refused the VM after taking it: the NIC stays reserved
			// for the failed VM and its delete is refused (fidelity.go).
			// The listing shows it as a leftover, for the reconciler to
			// collect once the reservation is over.
			assert.Len(t, e.Cloud.Resources(""), before+1, "the reserved NIC stays")
			sel := provider.Selector{Cluster: conformance.Cluster, Node: "node-a"}
			_, err = e.Provider.List(e.ctx, sel)
			require.NoError(t, err)
			left := e.Provider.(*azure.Provider).Leftovers(sel)
			require.Len(t, left, 1)
			assert.Equal(t, spec.PodUID, left[0].Owner().PodUID)
			assert.Error(t, e.Provider.Delete(e.ctx, left[0].ID), "reserved")
		})
	}
}

func TestServerErrorsAreRetriedAFewTimes(t *testing.T) {
	e := newEnv(t)
	vm, err := e.Provider.Create(e.ctx, conformance.Spec(4, "node-a"))
	require.NoError(t, err)
	e.Cloud.SetFaults(cloud.Faults{ServerErrorRate: 1})
	e.Cloud.ResetCounters()
	_, err = e.Provider.Get(e.ctx, vm.ID)
	require.Error(t, err)
	assert.False(t, provider.Terminal(err))
	var pe *provider.Error
	require.ErrorAs(t, err, &pe)
	assert.Equal(t, "InternalServerError", pe.Code)
	assert.Equal(t, 500, pe.Status)
	assert.Equal(t, int64(1+azure.DefaultMaxRetries), e.Cloud.Counters()[cloud.OpGet], "one try and the default retries")
}

func TestThrottlingIsNotRetried(t *testing.T) {
	e := newEnv(t)
	e.Cloud.SetFaults(cloud.Faults{ThrottleEvery: 1})
	_, err := e.Provider.List(e.ctx, provider.Selector{Cluster: conformance.Cluster, Node: "node-a"})
	require.ErrorIs(t, err, provider.ErrThrottled)
	_, ok := provider.RetryAfter(err)
	assert.False(t, ok, "no Retry-After sent, none reported")
	assert.Equal(t, int64(1), e.Cloud.Counters()[cloud.OpList])
}

func TestIDsOutsideTheResourceGroupAreRefused(t *testing.T) {
	e := newEnv(t)
	for _, id := range []string{
		"/subscriptions/" + armfake.DefaultSubscription + "/resourceGroups/elsewhere/providers/Microsoft.Compute/virtualMachines/caa-x",
		"/subscriptions/00000000-0000-0000-0000-000000000001/resourceGroups/" + armfake.DefaultResourceGroup + "/providers/Microsoft.Compute/virtualMachines/caa-x",
		"/subscriptions/" + armfake.DefaultSubscription + "/resourceGroups/" + armfake.DefaultResourceGroup + "/providers/Microsoft.Network/networkInterfaces/caa-x-nic",
		"/subscriptions/" + armfake.DefaultSubscription + "/resourceGroups/elsewhere/providers/Microsoft.Network/networkInterfaces/caa-x-nic",
		"/subscriptions/" + armfake.DefaultSubscription + "/resourceGroups/" + armfake.DefaultResourceGroup + "/providers/Microsoft.Network/networkInterfaces/other",
		"caa-x",
		"vm-000000000001",
	} {
		_, err := e.Provider.Get(e.ctx, id)
		assert.ErrorIs(t, err, provider.ErrInvalidSpec, "get %s", id)
		assert.NotErrorIs(t, err, provider.ErrNotFound, "get %s", id)
		if strings.HasSuffix(id, "/networkInterfaces/caa-x-nic") && strings.Contains(id, armfake.DefaultResourceGroup) {
			continue // a leftover NIC of caa's: Delete takes it (see below)
		}
		err = e.Provider.Delete(e.ctx, id)
		assert.ErrorIs(t, err, provider.ErrInvalidSpec, "delete %s", id)
	}
	assert.Zero(t, e.Cloud.Counters()["total"], "refused before any call")
	// The id of a NIC caa made in its group is a leftover's: Delete deletes
	// that NIC, and nothing else (here it is gone already).
	require.NoError(t, e.Provider.Delete(e.ctx,
		"/subscriptions/"+armfake.DefaultSubscription+"/resourceGroups/"+armfake.DefaultResourceGroup+"/providers/Microsoft.Network/networkInterfaces/caa-x-nic"))
	assert.Equal(t, map[string]int64{armfake.OpNICDelete: 1}, nonZero(e.Cloud.Counters(), armfake.OpNICDelete, cloud.OpDelete, cloud.OpGet))
}

// nonZero is the counters among names that are not zero.
func nonZero(counters map[string]int64, names ...string) map[string]int64 {
	out := map[string]int64{}
	for _, n := range names {
		if counters[n] != 0 {
			out[n] = counters[n]
		}
	}
	return out
}

func TestGetReadsPowerStateAndIP(t *testing.T) {
	e := newEnv(t)
	vm, err := e.Provider.Create(e.ctx, conformance.Spec(5, "node-a"))
	require.NoError(t, err)
	in := e.Cloud.Live()[0]

	got, err := e.Provider.Get(e.ctx, vm.ID)
	require.NoError(t, err)
	assert.Equal(t, provider.StateRunning, got.State)
	assert.Equal(t, in.IPs, got.IPs)
	assert.Equal(t, in.CreatedAt, got.CreatedAt)

	require.NoError(t, e.Cloud.Stop(in.ID))
	got, err = e.Provider.Get(e.ctx, vm.ID)
	require.NoError(t, err)
	assert.Equal(t, provider.StateStopped, got.State)

	require.NoError(t, e.Cloud.Kill(in.ID))
	_, err = e.Provider.Get(e.ctx, vm.ID)
	assert.ErrorIs(t, err, provider.ErrNotFound)
	require.NoError(t, e.Provider.Delete(e.ctx, vm.ID), "deleting a VM killed behind caa's back")
	assert.Empty(t, e.Cloud.Resources(""))
}

func TestListReadsIPsAndStatesInOneQuery(t *testing.T) {
	e := newEnv(t, armfake.WithGraphPageSize(100))
	want := map[string][]string{}
	for i := range 3 {
		vm, err := e.Provider.Create(e.ctx, conformance.Spec(10+i, "node-a"))
		require.NoError(t, err)
		want[vm.ID] = nil
	}
	for _, in := range e.Cloud.Live() {
		want[vmIDPrefix+in.Name] = in.IPs
	}
	e.Cloud.ResetCounters()
	vms, err := e.Provider.List(e.ctx, provider.Selector{Cluster: conformance.Cluster, Node: "node-a"})
	require.NoError(t, err)
	require.Len(t, vms, 3)
	for _, vm := range vms {
		assert.Equal(t, want[vm.ID], vm.IPs, vm.ID)
		assert.NotEmpty(t, vm.IPs)
		assert.Equal(t, provider.StateRunning, vm.State)
		assert.Equal(t, conformance.TypeSmall, vm.InstanceType)
		assert.Equal(t, conformance.ImageGood, vm.Image)
		assert.Equal(t, armfake.DefaultLocation, vm.Zone)
		assert.False(t, vm.CreatedAt.IsZero())
	}
	c := e.Cloud.Counters()
	assert.Equal(t, int64(1), c[cloud.OpList], "one query: VMs, power states and NIC addresses")
	assert.Equal(t, int64(1), c["total"])

	e.Cloud.ResetCounters()
	none, err := e.Provider.List(e.ctx, provider.Selector{Cluster: conformance.Cluster, Node: "node-z"})
	require.NoError(t, err)
	assert.Empty(t, none)
	assert.Equal(t, int64(1), e.Cloud.Counters()["total"])
}

// TestListConfirmsDeadVMsWithARead: a VM the index shows stopped,
// deallocated or failed is read directly (VM and NIC) before List calls it
// dead; live VMs cost no read.
func TestListConfirmsDeadVMsWithARead(t *testing.T) {
	e := newEnv(t, armfake.WithGraphPageSize(100))
	var ids []string
	for i := range 4 {
		vm, err := e.Provider.Create(e.ctx, conformance.Spec(20+i, "node-a"))
		require.NoError(t, err)
		ids = append(ids, vm.ID)
	}
	live := e.Cloud.Live()
	require.NoError(t, e.Cloud.Stop(live[1].ID))
	require.NoError(t, e.Cloud.Deallocate(live[2].ID))
	require.NoError(t, e.Cloud.Fail(live[3].ID))
	e.Cloud.ResetCounters()

	vms, err := e.Provider.List(e.ctx, provider.Selector{Cluster: conformance.Cluster, Node: "node-a"})
	require.NoError(t, err)
	got := map[string]provider.State{}
	for _, vm := range vms {
		got[vm.ID] = vm.State
	}
	assert.Equal(t, map[string]provider.State{ids[0]: provider.StateRunning, ids[1]: provider.StateStopped,
		ids[2]: provider.StateStopped, ids[3]: provider.StateFailed}, got)
	c := e.Cloud.Counters()
	assert.Equal(t, int64(1), c[cloud.OpList])
	assert.Equal(t, int64(3), c[cloud.OpGet], "one read per dead VM, none for the live one")
	assert.Equal(t, int64(3), c[armfake.OpNICGet])
}

func TestLongRunningOperationsWaitWhatARMAsks(t *testing.T) {
	// Every operation runs for three polls and asks for 20ms between them;
	// the configured interval, an hour, applies only when ARM asks nothing.
	h, _ := newHarnessOn(t, conformance.Options(&conformance.Clock{}), staticToken(testToken),
		[]armfake.Option{armfake.WithSlowOperations(3, 20*time.Millisecond)},
		func(c *azure.Config) { c.PollInterval = time.Hour })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	start := time.Now()
	vm, err := h.Provider.Create(ctx, conformance.Spec(40, "node-a"))
	require.NoError(t, err)
	require.NoError(t, h.Provider.Delete(ctx, vm.ID))
	assert.Empty(t, h.Cloud.Live())
	assert.Empty(t, h.Cloud.Resources(""))
	// At least the VM's PUT and DELETE ran to their end, four polls each
	// (the NIC's PUT reply already shows it provisioned, and the NIC went
	// with the VM).
	assert.GreaterOrEqual(t, h.Cloud.Counters()[armfake.OpOperation], int64(2*4))
	assert.Less(t, time.Since(start), 10*time.Second, "the waits were ARM's Retry-After, not the poll interval")
}

func TestEventuallyConsistentCreateReturnsTheAcceptedVM(t *testing.T) {
	e := newEnv(t)
	e.Cloud.SetFaults(cloud.Faults{InvisibleFor: time.Hour})
	vm, err := e.Provider.Create(e.ctx, conformance.Spec(6, "node-a"))
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(vm.ID, vmIDPrefix))
	assert.Equal(t, provider.StatePending, vm.State)
	_, err = e.Provider.Get(e.ctx, vm.ID)
	assert.ErrorIs(t, err, provider.ErrNotFound, "reported as the cloud shows it")
}

func TestDeleteRemovesALeftoverNIC(t *testing.T) {
	e := newEnv(t)
	vm, err := e.Provider.Create(e.ctx, conformance.Spec(7, "node-a"))
	require.NoError(t, err)
	require.NoError(t, e.Provider.Delete(e.ctx, vm.ID))
	require.Empty(t, e.Cloud.Resources(""))

	// A NIC of that VM's name, as a create that died before its VM leaves.
	nics := networkClient(t, e)
	poller, err := nics.BeginCreateOrUpdate(e.ctx, armfake.DefaultResourceGroup, vm.Name+"-nic", armnetwork.Interface{
		Location: new(armfake.DefaultLocation),
		Properties: &armnetwork.InterfacePropertiesFormat{IPConfigurations: []*armnetwork.InterfaceIPConfiguration{{
			Name: new("ipconfig1"), Properties: &armnetwork.InterfaceIPConfigurationPropertiesFormat{Subnet: &armnetwork.Subnet{ID: new(subnetID)}},
		}}},
	}, nil)
	require.NoError(t, err)
	_, err = poller.PollUntilDone(e.ctx, &runtime.PollUntilDoneOptions{Frequency: time.Millisecond})
	require.NoError(t, err)
	require.Len(t, e.Cloud.Resources(""), 1)

	require.NoError(t, e.Provider.Delete(e.ctx, vm.ID))
	assert.Empty(t, e.Cloud.Resources(""))
}

// networkClient is a bare SDK client on the harness's fake, for setting
// up what the provider would not make.
func networkClient(t *testing.T, e env) *armnetwork.InterfacesClient {
	t.Helper()
	c, err := armnetwork.NewInterfacesClient(armfake.DefaultSubscription, staticToken(testToken), &arm.ClientOptions{
		ClientOptions: policy.ClientOptions{
			Cloud: azcloud.Configuration{Services: map[azcloud.ServiceName]azcloud.ServiceConfiguration{
				azcloud.ResourceManager: {Endpoint: e.url, Audience: "https://management.core.windows.net/"},
			}},
			InsecureAllowCredentialWithHTTP: true,
		},
		DisableRPRegistration: true,
	})
	require.NoError(t, err)
	return c
}

type failingCredential struct{}

func (failingCredential) GetToken(context.Context, policy.TokenRequestOptions) (azcore.AccessToken, error) {
	return azcore.AccessToken{}, errors.New("ManagedIdentityCredential: no identity endpoint reachable")
}

func TestCredentialFailureIsAuth(t *testing.T) {
	h, _ := newHarness(t, cloud.Options{}, failingCredential{})
	_, err := h.Provider.Get(context.Background(), vmIDPrefix+"caa-x")
	require.ErrorIs(t, err, provider.ErrAuth)
	assert.True(t, provider.Terminal(err))
	assert.Contains(t, err.Error(), "no identity endpoint")
	assert.Zero(t, h.Cloud.Counters()["total"], "no request left without a token")
}

func TestCancelledCallsAreNotClassified(t *testing.T) {
	e := newEnv(t)
	e.Cloud.SetFaults(cloud.Faults{Latency: time.Minute})
	ctx, cancel := context.WithTimeout(e.ctx, 20*time.Millisecond)
	defer cancel()
	_, err := e.Provider.Get(ctx, vmIDPrefix+"caa-x")
	require.ErrorIs(t, err, context.DeadlineExceeded)
	var pe *provider.Error
	assert.False(t, errors.As(err, &pe), "not the cloud's answer: %v", err)
}

func TestEveryCallHasADeadline(t *testing.T) {
	h, _ := newHarnessOn(t, conformance.Options(&conformance.Clock{}), staticToken(testToken), nil,
		func(c *azure.Config) { c.ReadTimeout, c.WriteTimeout = 100*time.Millisecond, 200*time.Millisecond })
	conformance.Deadlines(t, h, 5*time.Second)
}
