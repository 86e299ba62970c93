package cloud

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/pkg/provider"
)

type testClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *testClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *testClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func newTestCloud(opts Options) (*Cloud, *testClock) {
	clk := &testClock{now: time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC)}
	opts.Now = clk.Now
	return New(opts), clk
}

func TestListPagesAreStableWhileInstancesComeAndGo(t *testing.T) {
	c, _ := newTestCloud(Options{PageSize: 3})
	for range 7 {
		_, err := c.Create(CreateRequest{InstanceType: "t", Image: "i"})
		require.NoError(t, err)
	}
	page1, next, err := c.List(nil, "", 0)
	require.NoError(t, err)
	require.Len(t, page1, 3)
	require.NotEmpty(t, next)

	// A delete of a listed instance and a new instance between pages
	// neither repeat nor skip anything that was there throughout.
	require.NoError(t, c.Kill(page1[0].ID))
	_, err = c.Create(CreateRequest{InstanceType: "t", Image: "i"})
	require.NoError(t, err)

	seen := map[string]bool{}
	for _, in := range page1 {
		seen[in.ID] = true
	}
	for next != "" {
		var page []Instance
		page, next, err = c.List(nil, next, 0)
		require.NoError(t, err)
		for _, in := range page {
			assert.False(t, seen[in.ID], "%s listed twice", in.ID)
			seen[in.ID] = true
		}
	}
	assert.Len(t, seen, 8)

	_, _, err = c.List(nil, "not-a-token", 0)
	assert.Error(t, err)
}

func TestCreateHonoursTokensNamesAndLimits(t *testing.T) {
	c, _ := newTestCloud(Options{Images: []string{"img"}, Types: []string{"small", "large"}})
	first, err := c.Create(CreateRequest{Token: "k1", Name: "a", InstanceType: "small", Image: "img", UserData: []byte("#cloud-config")})
	require.NoError(t, err)
	assert.Equal(t, []byte("#cloud-config"), first.UserData())
	assert.Equal(t, 13, first.UserDataLen)
	again, err := c.Create(CreateRequest{Token: "k1", Name: "a", InstanceType: "small", Image: "img"})
	require.NoError(t, err)
	assert.Equal(t, first.ID, again.ID)
	_, err = c.Create(CreateRequest{Token: "k1", InstanceType: "large", Image: "img"})
	assert.ErrorIs(t, err, ErrIdempotencyMismatch)

	_, err = c.Create(CreateRequest{Name: "a", UniqueName: true, InstanceType: "small", Image: "img"})
	assert.ErrorIs(t, err, ErrNameConflict)
	_, err = c.Create(CreateRequest{InstanceType: "small", Image: "other"})
	assert.ErrorIs(t, err, ErrBadImage)
	_, err = c.Create(CreateRequest{InstanceType: "huge", Image: "img"})
	assert.ErrorIs(t, err, ErrBadType)

	c.SetFaults(Faults{QuotaLimit: 1})
	_, err = c.Create(CreateRequest{InstanceType: "small", Image: "img"})
	assert.ErrorIs(t, err, ErrQuota)
	c.SetFaults(Faults{CapacityFailures: 1})
	_, err = c.Create(CreateRequest{InstanceType: "small", Image: "img"})
	assert.ErrorIs(t, err, ErrCapacity)
	_, err = c.Create(CreateRequest{InstanceType: "small", Image: "img"})
	assert.NoError(t, err, "only the next N creates fail for capacity")
	assert.Equal(t, int64(2), c.Counters()["created"])
}

func TestStatesFollowTheClock(t *testing.T) {
	c, clk := newTestCloud(Options{KeepTerminated: time.Hour})
	c.SetFaults(Faults{BootDelay: time.Minute, InvisibleFor: 10 * time.Second})
	in, err := c.Create(CreateRequest{InstanceType: "t", Image: "i"})
	require.NoError(t, err)
	assert.Equal(t, provider.StatePending, in.State)

	_, err = c.Get(in.ID)
	assert.ErrorIs(t, err, ErrNotFound, "invisible at first")
	page, _, _ := c.List(nil, "", 0)
	assert.Empty(t, page)

	clk.Advance(11 * time.Second)
	got, err := c.Get(in.ID)
	require.NoError(t, err)
	assert.Equal(t, provider.StatePending, got.State)
	clk.Advance(time.Minute)
	got, _ = c.Get(in.ID)
	assert.Equal(t, provider.StateRunning, got.State)

	require.NoError(t, c.Delete(in.ID))
	got, err = c.Get(in.ID)
	require.NoError(t, err, "terminated instances stay visible for KeepTerminated")
	assert.Equal(t, provider.StateTerminated, got.State)
	require.NoError(t, c.Delete(in.ID), "deleting a terminated instance is fine")
	clk.Advance(time.Hour)
	_, err = c.Get(in.ID)
	assert.ErrorIs(t, err, ErrNotFound)
	assert.ErrorIs(t, c.Delete(in.ID), ErrNotFound)
	assert.Len(t, c.Instances(), 1, "the cloud still remembers it")
	assert.Empty(t, c.Live())
}

func TestAdmitThrottlesByCountAndByRate(t *testing.T) {
	c, clk := newTestCloud(Options{})
	ctx := context.Background()
	c.SetFaults(Faults{ThrottleEvery: 3, RetryAfter: 2 * time.Second})
	var kinds []FaultKind
	for range 6 {
		f, err := c.Admit(ctx, OpGet, false)
		require.NoError(t, err)
		kinds = append(kinds, f.Kind)
	}
	assert.Equal(t, []FaultKind{FaultNone, FaultNone, FaultThrottle, FaultNone, FaultNone, FaultThrottle}, kinds)

	c.SetFaults(Faults{ThrottleRate: 2, ThrottleBurst: 2, ThrottleWriteOnly: true})
	admit := func(write bool) FaultKind {
		f, err := c.Admit(ctx, OpCreate, write)
		require.NoError(t, err)
		return f.Kind
	}
	assert.Equal(t, FaultNone, admit(true))
	assert.Equal(t, FaultNone, admit(true))
	assert.Equal(t, FaultThrottle, admit(true), "burst spent")
	assert.Equal(t, FaultNone, admit(false), "reads are not metered")
	clk.Advance(500 * time.Millisecond)
	assert.Equal(t, FaultNone, admit(true), "one token back after 1/rate")
	assert.Equal(t, FaultThrottle, admit(true))
	assert.Equal(t, int64(4), c.Counters()["throttled"], "two by count, two by rate")

	c.SetFaults(Faults{DenyAuth: true, ThrottleEvery: 1})
	assert.Equal(t, FaultAuth, admit(false), "auth wins over throttling")
}

func TestAdmitLatencyHonoursContext(t *testing.T) {
	c, _ := newTestCloud(Options{})
	c.SetFaults(Faults{Latency: time.Hour})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := c.Admit(ctx, OpGet, false)
	assert.ErrorIs(t, err, context.Canceled)
}

func TestResourcesLiveAndDieWithTheirInstance(t *testing.T) {
	c, _ := newTestCloud(Options{})
	c.PutResource(Resource{ID: "nic-1", Kind: "nic"})
	c.PutResource(Resource{ID: "disk-1", Kind: "disk"})
	in, err := c.Create(CreateRequest{InstanceType: "t", Image: "i", Resources: []string{"nic-1", "disk-1"}, DeleteWith: []string{"disk-1"}})
	require.NoError(t, err)
	_, err = c.Create(CreateRequest{InstanceType: "t", Image: "i", Resources: []string{"nic-1"}})
	assert.ErrorIs(t, err, ErrResourceInUse)
	assert.ErrorIs(t, c.DeleteResource("nic-1"), ErrResourceInUse)

	require.NoError(t, c.Delete(in.ID))
	_, err = c.GetResource("disk-1")
	assert.ErrorIs(t, err, ErrResourceNotFound, "deleted with the instance")
	nic, err := c.GetResource("nic-1")
	require.NoError(t, err)
	assert.Empty(t, nic.Owner, "detached, left for its owner to delete")
	require.NoError(t, c.DeleteResource("nic-1"))
	assert.Empty(t, c.Resources(""))
}

func TestControlEndpoint(t *testing.T) {
	c, _ := newTestCloud(Options{})
	in, err := c.Create(CreateRequest{InstanceType: "t", Image: "i"})
	require.NoError(t, err)
	srv := httptest.NewServer(ControlHandler(c))
	t.Cleanup(srv.Close)
	do := func(method, path, body string) int {
		req, err := http.NewRequest(method, srv.URL+ControlPrefix+path, strings.NewReader(body))
		require.NoError(t, err)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	assert.Equal(t, 200, do("PUT", "faults", `{"latency":"50ms","throttleEvery":4,"retryAfter":"3s"}`))
	assert.Equal(t, Faults{Latency: 50 * time.Millisecond, ThrottleEvery: 4, RetryAfter: 3 * time.Second}, c.Faults())
	assert.Equal(t, 200, do("PUT", "faults", `{"bootDelay":"10s"}`))
	assert.Equal(t, Faults{Latency: 50 * time.Millisecond, ThrottleEvery: 4, RetryAfter: 3 * time.Second, BootDelay: 10 * time.Second},
		c.Faults(), "knobs left out keep their value")
	assert.Equal(t, 400, do("PUT", "faults", `{"latency":"fast"}`))
	assert.Equal(t, 400, do("PUT", "faults", `{"serverErrorRate":2}`))
	assert.Equal(t, 400, do("PUT", "faults", `{"bogus":1}`))
	assert.Equal(t, 200, do("POST", "kill?id="+in.ID, ""))
	assert.Empty(t, c.Live())
	assert.Equal(t, 404, do("POST", "kill?id=nope", ""))
	assert.Equal(t, 200, do("GET", "counters", ""))
	assert.Equal(t, 200, do("GET", "instances", ""))
}

func TestDeadInstancesStayListedUntilDeleted(t *testing.T) {
	c, clk := newTestCloud(Options{KeepTerminated: time.Minute})
	c.SetFaults(Faults{BootDelay: time.Minute})
	srv := httptest.NewServer(ControlHandler(c))
	t.Cleanup(srv.Close)
	post := func(path string) int {
		resp, err := http.Post(srv.URL+ControlPrefix+path, "", nil)
		require.NoError(t, err)
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	var ids []string
	for i := range 3 {
		c.PutResource(Resource{ID: fmt.Sprintf("disk-%d", i), Kind: "disk"})
		in, err := c.Create(CreateRequest{InstanceType: "t", Image: "i",
			Resources: []string{fmt.Sprintf("disk-%d", i)}, DeleteWith: []string{fmt.Sprintf("disk-%d", i)}})
		require.NoError(t, err)
		ids = append(ids, in.ID)
	}
	require.NoError(t, c.Fail(ids[0]), "a pending instance can fail")
	assert.Equal(t, 200, post("stop?id="+ids[1]))
	assert.Equal(t, 200, post("deallocate?id="+ids[2]))
	assert.Equal(t, 404, post("fail?id=nope"))

	clk.Advance(time.Hour) // past boot and any retention
	want := []struct {
		state       provider.State
		deallocated bool
	}{{provider.StateFailed, false}, {provider.StateStopped, false}, {provider.StateStopped, true}}
	page, _, err := c.List(nil, "", 0)
	require.NoError(t, err)
	require.Len(t, page, 3, "dead instances stay listed")
	for i, in := range page {
		assert.Equal(t, want[i].state, in.State, in.ID)
		assert.Equal(t, want[i].deallocated, in.Deallocated, in.ID)
		got, err := c.Get(in.ID)
		require.NoError(t, err)
		assert.Equal(t, want[i].state, got.State, "the clock moves no dead instance")
	}
	assert.Len(t, c.Live(), 3)
	assert.Len(t, c.Resources(""), 3, "their disks are still there")

	for _, id := range ids {
		require.NoError(t, c.Delete(id))
	}
	assert.Empty(t, c.Live())
	assert.Empty(t, c.Resources(""), "deleting a dead instance deletes what goes with it")
	assert.Equal(t, int64(3), c.Counters()["deleted"])
	assert.ErrorIs(t, c.Fail(ids[0]), ErrNotFound, "a terminated instance cannot fail")
}
