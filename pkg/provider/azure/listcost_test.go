package azure_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/test/conformance"
	armfake "github.com/caa-project/caa/test/mocks/azure"
	"github.com/caa-project/caa/test/mocks/cloud"
)

// wireMeter counts the requests a handler served and the bytes of its
// responses' bodies.
type wireMeter struct {
	mu       sync.Mutex
	requests int
	bytes    int64
	paths    map[string]int
}

func (m *wireMeter) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cw := &countingWriter{ResponseWriter: w}
		next.ServeHTTP(cw, r)
		m.mu.Lock()
		defer m.mu.Unlock()
		m.requests++
		m.bytes += cw.n
		if m.paths == nil {
			m.paths = map[string]int{}
		}
		m.paths[r.Method+" "+pathShape(r.URL.Path)]++
	})
}

func (m *wireMeter) reset() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.requests, m.bytes, m.paths = 0, 0, nil
}

func (m *wireMeter) read() (int, int64, map[string]int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	paths := map[string]int{}
	for k, v := range m.paths {
		paths[k] = v
	}
	return m.requests, m.bytes, paths
}

// pathShape drops the resource name from a path, so that calls group by kind.
func pathShape(p string) string {
	parts := strings.Split(p, "/")
	if n := len(parts); n > 9 {
		parts[n-1] = "{name}"
	}
	return strings.Join(parts, "/")
}

type countingWriter struct {
	http.ResponseWriter
	n int64
}

func (c *countingWriter) Write(b []byte) (int, error) {
	n, err := c.ResponseWriter.Write(b)
	c.n += int64(n)
	return n, err
}

// seedOtherNodes puts n VMs of other nodes (each with its NIC, as caa makes
// them) straight into the core: no HTTP call, no per-VM scan.
func seedOtherNodes(t testing.TB, c *cloud.Cloud, n int) {
	t.Helper()
	for i := range n {
		spec := conformance.Spec(100000+i, fmt.Sprintf("node-other-%03d", i%100))
		name := fmt.Sprintf("caa-other-%05d", i)
		nicID := strings.ToLower(fmt.Sprintf("/subscriptions/%s/resourceGroups/%s/providers/Microsoft.Network/networkInterfaces/%s-nic",
			armfake.DefaultSubscription, armfake.DefaultResourceGroup, name))
		c.PutResource(cloud.Resource{ID: nicID, Kind: "Microsoft.Network/networkInterfaces", Name: name + "-nic", Tags: spec.Tags(),
			Props: map[string]string{"location": armfake.DefaultLocation, "ipConfiguration": "ipconfig1", "subnet": subnetID, "allocation": "Dynamic"}})
		_, err := c.Create(cloud.CreateRequest{Name: name, Tags: spec.Tags(), InstanceType: conformance.TypeSmall, Image: conformance.ImageGood,
			Resources: []string{nicID}, DeleteWith: []string{nicID}})
		require.NoError(t, err)
	}
}

// TestListCostDoesNotGrowWithOtherNodes lists one node's three VMs in a
// resource group that also holds 0, then 5,000 VMs of other nodes: the
// listing costs the same HTTP calls and about the same bytes either way.
func TestListCostDoesNotGrowWithOtherNodes(t *testing.T) {
	type cost struct {
		calls int
		bytes int64
		paths map[string]int
	}
	measure := func(others int) cost {
		clock := newTestClock()
		opts := cloud.Options{Images: []string{conformance.ImageGood}, Types: []string{conformance.TypeSmall}, Now: clock.Now, PageSize: 50}
		m := &wireMeter{}
		h, _ := newHarness(t, opts, staticToken(testToken), m.wrap)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		seedOtherNodes(t, h.Cloud, others)
		for i := range 3 {
			_, err := h.Provider.Create(ctx, conformance.Spec(i, "node-a"))
			require.NoError(t, err)
		}
		m.reset()
		vms, err := h.Provider.List(ctx, provider.Selector{Cluster: conformance.Cluster, Node: "node-a"})
		require.NoError(t, err)
		require.Len(t, vms, 3)
		for _, vm := range vms {
			assert.Equal(t, provider.StateRunning, vm.State, vm.Name)
			assert.NotEmpty(t, vm.IPs, vm.Name)
		}
		calls, bytes, paths := m.read()
		return cost{calls, bytes, paths}
	}
	alone, crowded := measure(0), measure(5000)
	t.Logf("one node's listing: %d calls, %d bytes alone; %d calls, %d bytes beside 5,000 VMs of other nodes (%v)",
		alone.calls, alone.bytes, crowded.calls, crowded.bytes, crowded.paths)
	assert.Equal(t, alone.calls, crowded.calls, "calls: %v vs %v", alone.paths, crowded.paths)
	assert.InDelta(t, alone.bytes, crowded.bytes, float64(alone.bytes)/10, "response bytes within 10%%")
}
