package ibmcloud_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/go-sdk-core/v5/core"
	"github.com/IBM/vpc-go-sdk/vpcv1"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/pkg/provider/ibmcloud"
	"github.com/caa-project/caa/test/conformance"
	"github.com/caa-project/caa/test/mocks/cloud"
	vpcfake "github.com/caa-project/caa/test/mocks/ibmcloud"
)

// meter wraps the fake and counts what crosses the wire: requests, the
// response bytes, and the search queries sent.
type meter struct {
	next http.Handler

	mu       sync.Mutex
	calls    int
	bytes    int
	queries  []string
	attaches int
}

func (m *meter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/v3/tags/attach" {
		// A write, counted apart from a listing's reads.
		m.next.ServeHTTP(w, r)
		m.mu.Lock()
		m.attaches++
		m.mu.Unlock()
		return
	}
	if r.URL.Path == "/v3/resources/search" {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		var req struct {
			Query string `json:"query"`
		}
		_ = json.Unmarshal(body, &req)
		m.mu.Lock()
		m.queries = append(m.queries, req.Query)
		m.mu.Unlock()
	}
	cw := &countingWriter{ResponseWriter: w}
	m.next.ServeHTTP(cw, r)
	m.mu.Lock()
	defer m.mu.Unlock()
	m.calls++
	m.bytes += cw.n
}

func (m *meter) reset() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.calls, m.bytes, m.queries, m.attaches = 0, 0, nil, 0
}

func (m *meter) read() (calls, bytes int, queries []string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.calls, m.bytes, append([]string(nil), m.queries...)
}

type countingWriter struct {
	http.ResponseWriter
	n int
}

func (c *countingWriter) Write(b []byte) (int, error) {
	n, err := c.ResponseWriter.Write(b)
	c.n += n
	return n, err
}

// meteredFake is a provider on a fake (pages of up to 100, VPC's largest)
// behind a meter.
func meteredFake(t *testing.T, fakeOpts ...vpcfake.Option) (*ibmcloud.Provider, *cloud.Cloud, *meter, string) {
	t.Helper()
	opts := conformance.Options(&conformance.Clock{})
	opts.PageSize = 100
	c := cloud.New(opts)
	m := &meter{next: vpcfake.NewServer(c, append([]vpcfake.Option{vpcfake.WithAPIKey(testAPIKey), vpcfake.WithAccessToken(testAccessToken)}, fakeOpts...)...)}
	srv := httptest.NewServer(m)
	t.Cleanup(srv.Close)
	t.Setenv(ibmcloud.EnvAPIKey, testAPIKey)
	p, err := ibmcloud.New(context.Background(), testConfig(srv.URL))
	require.NoError(t, err)
	return p, c, m, srv.URL
}

// seed puts n VMs of node straight into the core (no HTTP), tagged as caa
// tags them (the names are plain, so the user tags need no escaping).
func seed(t *testing.T, c *cloud.Cloud, node string, n int) {
	t.Helper()
	for i := range n {
		_, err := c.Create(cloud.CreateRequest{
			Name: fmt.Sprintf("seed-%s-%d", node, i), InstanceType: conformance.TypeSmall, Image: conformance.ImageGood,
			Tags: map[string]string{
				provider.TagManagedBy: provider.ManagedByValue, provider.TagCluster: conformance.Cluster,
				provider.TagNode: node, provider.TagPodUID: fmt.Sprintf("uid-%s-%d", node, i), provider.TagKey: fmt.Sprintf("k-%s-%d", node, i),
			},
		})
		require.NoError(t, err)
	}
}

type listingCost struct{ calls, bytes int }

// TestListCostDoesNotGrowWithOtherNodes lists one node's 3 VMs in a VPC
// holding nothing else, then 5,000 VMs of other nodes besides: the
// listing makes the same calls and reads about the same bytes. It logs,
// for comparison, what the listing before Global Search read (the node's
// volumes by tag and every instance of the VPC).
func TestListCostDoesNotGrowWithOtherNodes(t *testing.T) {
	sel := provider.Selector{Cluster: conformance.Cluster, Node: "node-mine"}
	measure := func(others int) (after, before listingCost) {
		p, c, m, url := meteredFake(t)
		seed(t, c, sel.Node, 3)
		for i := range others / 100 {
			seed(t, c, fmt.Sprintf("node-other-%d", i), 100)
		}
		_, err := p.List(context.Background(), provider.Selector{Cluster: conformance.Cluster, Node: "warm-up"})
		require.NoError(t, err) // the IAM token, once
		m.reset()
		vms, err := p.List(context.Background(), sel)
		require.NoError(t, err)
		require.Len(t, vms, 3)
		after.calls, after.bytes, _ = m.read()

		m.reset()
		n := oldListing(t, url, sel.Node)
		require.Equal(t, 3, n)
		before.calls, before.bytes, _ = m.read()
		return after, before
	}
	after0, before0 := measure(0)
	after5k, before5k := measure(5000)
	t.Logf("search listing: %d calls %d bytes with no other VMs; %d calls %d bytes with 5,000 of other nodes",
		after0.calls, after0.bytes, after5k.calls, after5k.bytes)
	t.Logf("old listing (volumes by tag + every instance of the VPC): %d calls %d bytes; %d calls %d bytes",
		before0.calls, before0.bytes, before5k.calls, before5k.bytes)

	assert.Equal(t, 1, after0.calls, "one search: the index shows the instances running")
	assert.Equal(t, after0.calls, after5k.calls, "the calls do not grow with other nodes' VMs")
	assert.InEpsilon(t, after0.bytes, after5k.bytes, 0.05, "nor do the bytes read")
	assert.Greater(t, before5k.calls, 10*before0.calls, "the old listing did grow (the measurement works)")
}

// oldListing replays the listing before Global Search through the VPC
// SDK: every volume with the node's tag and every instance of the VPC. It
// returns how many instances have a tagged boot volume.
func oldListing(t *testing.T, url, node string) int {
	t.Helper()
	svc, err := vpcv1.NewVpcV1(&vpcv1.VpcV1Options{URL: url + "/v1", Authenticator: &core.BearerTokenAuthenticator{BearerToken: testAccessToken}})
	require.NoError(t, err)
	vp, err := svc.NewVolumesPager(&vpcv1.ListVolumesOptions{Tag: core.StringPtr("caa-node:" + node), Limit: core.Int64Ptr(100)})
	require.NoError(t, err)
	vols, err := vp.GetAll()
	require.NoError(t, err)
	ip, err := svc.NewInstancesPager(&vpcv1.ListInstancesOptions{VPCID: core.StringPtr(vpcfake.DefaultVPC), Limit: core.Int64Ptr(100)})
	require.NoError(t, err)
	ins, err := ip.GetAll()
	require.NoError(t, err)
	boots := map[string]bool{}
	for _, v := range vols {
		for _, a := range v.VolumeAttachments {
			boots[*a.Instance.ID] = true
		}
	}
	n := 0
	for _, in := range ins {
		if boots[*in.ID] {
			n++
		}
	}
	return n
}

// TestHostileNodeNameCannotChangeTheQuery lists for node names that
// would rewrite a naively built query: each query keeps its four terms
// and finds only that node's VM.
func TestHostileNodeNameCannotChangeTheQuery(t *testing.T) {
	p, _, m, _ := meteredFake(t)
	ctx := context.Background()
	hostile := []string{
		`x" OR tags:"caa-managed-by:caa`,
		`x\" OR family:is OR "`,
		`*`,
		`node-a) OR (type:instance`,
		"NODE-A",
	}
	for i, node := range append([]string{"node-a"}, hostile...) {
		_, err := p.Create(ctx, conformance.Spec(i, node))
		require.NoError(t, err, node)
	}
	for _, node := range hostile {
		m.reset()
		vms, err := p.List(ctx, provider.Selector{Cluster: conformance.Cluster, Node: node})
		require.NoError(t, err, "the fake parsed the query for %q", node)
		require.Len(t, vms, 1, node)
		assert.Equal(t, node, vms[0].Owner().Node)
		_, _, queries := m.read()
		require.Len(t, queries, 1)
		q := queries[0]
		assert.Equal(t, 3, strings.Count(q, " AND "), "four terms: %s", q)
		assert.NotContains(t, q, " OR ")
		assert.True(t, strings.HasPrefix(q, `family:is AND tags:"caa-managed-by:caa" AND tags:"caa-cluster:`), q)
	}
}

// TestABigNodeIsListedTheCheaperWay: a node of more than 50 VMs whose
// instances carry no tags (made before caa tagged instances) is read VM
// by VM when the VPC is large, and from VPC's two listings when they cost
// fewer calls; either way each such instance is tagged once, and the next
// listing is one search.
func TestABigNodeIsListedTheCheaperWay(t *testing.T) {
	sel := provider.Selector{Cluster: conformance.Cluster, Node: "node-big"}
	list := func(others int) int {
		p, c, m, _ := meteredFake(t, vpcfake.WithUntaggedSeeds())
		seed(t, c, sel.Node, 60)
		for i := range others / 100 {
			seed(t, c, fmt.Sprintf("node-other-%d", i), 100)
		}
		_, err := p.List(context.Background(), provider.Selector{Cluster: conformance.Cluster, Node: "warm-up"})
		require.NoError(t, err)
		m.reset()
		vms, err := p.List(context.Background(), sel)
		require.NoError(t, err)
		require.Len(t, vms, 60)
		for _, vm := range vms {
			require.Equal(t, sel.Node, vm.Owner().Node)
			require.Equal(t, provider.StateRunning, vm.State)
		}
		calls, _, _ := m.read()
		m.mu.Lock()
		attaches := m.attaches
		m.mu.Unlock()
		assert.Equal(t, 60, attaches, "each untagged instance is tagged once")
		m.reset()
		vms, err = p.List(context.Background(), sel)
		require.NoError(t, err)
		require.Len(t, vms, 60)
		again, _, _ := m.read()
		assert.Equal(t, 1, again, "once tagged, one search lists them")
		return calls
	}
	assert.Equal(t, 1+1+1, list(0), "search, then at once the first (and only) page of instances, whose count decides, and one page of volumes")
	big := list(15000)
	assert.GreaterOrEqual(t, big, 1+1+2*60, "search, first page of instances (151 pages would cost more), two reads per VM")
	assert.LessOrEqual(t, big, 1+1+1+2*60, "and at most the volume page that went out beside the first page of instances")
}

// TestOneSearchPerListing counts the Global Search requests of listings
// against a fake that, as the real service, hands back a cursor on every
// page: a page with fewer hits than the limit ends the listing, and only
// a node whose VMs fill the last page exactly pays for an empty one.
func TestOneSearchPerListing(t *testing.T) {
	for _, tc := range []struct {
		vms, limit, searches int
	}{
		{0, 1000, 1},
		{3, 1000, 1},
		// Two hits per VM: its instance and its boot volume.
		{5, 2, 6},
		{4, 2, 5},
		{1, 1, 3},
	} {
		t.Run(fmt.Sprintf("%d VMs, pages of %d", tc.vms, tc.limit), func(t *testing.T) {
			p, c, m, _ := meteredFake(t)
			ibmcloud.SetSearchLimit(p, tc.limit)
			sel := provider.Selector{Cluster: conformance.Cluster, Node: "node-mine"}
			seed(t, c, sel.Node, tc.vms)
			seed(t, c, "node-other", 7)
			_, err := p.List(context.Background(), provider.Selector{Cluster: conformance.Cluster, Node: "warm-up"})
			require.NoError(t, err) // the IAM token, once
			m.reset()
			vms, err := p.List(context.Background(), sel)
			require.NoError(t, err)
			assert.Len(t, vms, tc.vms)
			_, _, searches := m.read()
			assert.Len(t, searches, tc.searches, "search requests for one listing")
		})
	}
}

// TestAListingOutlastsRefusalsForRate lists a node's VMs (untagged
// instances, found by their boot volumes and read by id) against a read
// bucket far smaller than the listing's reads: the refused reads wait the
// Retry-After and go again, so the listing finishes, where failing on the
// first refusal would leave a fleet starting at once retrying whole
// listings into an empty bucket.
func TestAListingOutlastsRefusalsForRate(t *testing.T) {
	opts := conformance.Options(&conformance.Clock{})
	opts.PageSize = 100
	c := cloud.New(opts)
	budget := cloud.NewBudget(time.Now, map[string]cloud.Limit{vpcfake.ClassRead: cloud.PerSecond(6, 50)})
	srv := httptest.NewServer(vpcfake.NewServer(c, vpcfake.WithAPIKey(testAPIKey), vpcfake.WithAccessToken(testAccessToken), vpcfake.WithBudget(budget), vpcfake.WithUntaggedSeeds()))
	t.Cleanup(srv.Close)
	t.Setenv(ibmcloud.EnvAPIKey, testAPIKey)
	p, err := ibmcloud.New(context.Background(), testConfig(srv.URL))
	require.NoError(t, err)
	sel := provider.Selector{Cluster: conformance.Cluster, Node: "node-mine"}
	seed(t, c, sel.Node, 10)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	vms, err := p.List(ctx, sel)
	require.NoError(t, err)
	assert.Len(t, vms, 10)
	assert.Positive(t, budget.Throttled(), "the bucket did refuse reads (the test works)")
}
