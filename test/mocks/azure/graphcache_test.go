package armfake_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/pkg/provider"
	armfake "github.com/caa-project/caa/test/mocks/azure"
	"github.com/caa-project/caa/test/mocks/cloud"
)

// The Resource Graph fake narrows a query by its tag conditions through the
// core's tag index. A fake whose index lags by a nanosecond renders the
// whole group for every query (a lagging index observes everything), so,
// on the same core with the clock moved past the lag, it is the walk the
// narrowed answers must equal, row for row, for every form of condition.
func TestGraphTagIndexAnswersAsTheWalk(t *testing.T) {
	clk := &clock{now: time.Date(2026, 9, 10, 11, 12, 13, 0, time.UTC)}
	c := cloud.New(cloud.Options{PageSize: 7, Images: []string{image}, Types: []string{size}, Now: clk.Now})
	serve := func(opts ...armfake.Option) *fake {
		srv := httptest.NewServer(armfake.NewServer(c, append([]armfake.Option{armfake.WithBearerToken(token), armfake.WithClock(clk.Now),
			armfake.WithGraphPageSize(5)}, opts...)...))
		t.Cleanup(srv.Close)
		return &fake{t: t, cloud: c, url: srv.URL}
	}
	indexed, walked := serve(), serve(armfake.WithSearchLag(time.Nanosecond))
	for i := range 40 {
		tags := map[string]string{provider.TagManagedBy: provider.ManagedByValue, provider.TagCluster: "c1", provider.TagNode: fmt.Sprintf("n%d", i%4)}
		switch i % 6 {
		case 1:
			tags[provider.TagNode] = "N1" // another case
		case 2:
			delete(tags, provider.TagCluster)
		case 3:
			tags["CAA-NODE"] = "n1" // the key in another case
		}
		name := fmt.Sprintf("vm-%02d", i)
		id := "/subscriptions/" + armfake.DefaultSubscription + "/resourcegroups/" + armfake.DefaultResourceGroup + "/providers/microsoft.network/networkinterfaces/" + name + "-nic"
		c.PutResource(cloud.Resource{ID: id, Kind: "Microsoft.Network/networkInterfaces", Name: name + "-nic", Tags: tags,
			Props: map[string]string{"location": armfake.DefaultLocation}})
		in, err := c.Create(cloud.CreateRequest{Name: name, Image: image, InstanceType: size, Tags: tags,
			Resources: []string{id}, DeleteWith: []string{id}})
		require.NoError(t, err)
		switch i % 5 {
		case 1:
			require.NoError(t, c.Kill(in.ID))
		case 2:
			require.NoError(t, c.Stop(in.ID))
		}
	}
	clk.Advance(time.Second)
	walked.do(http.MethodGet, group, nil) // the lagging index sees the core
	clk.Advance(time.Second)
	all := func(f *fake, q string) []any {
		var rows []any
		opts := map[string]any{}
		for range 50 {
			r := f.do(http.MethodPost, graphURL, query(q, opts))
			require.Equal(t, http.StatusOK, r.status, r.raw)
			rows = append(rows, r.body["data"].([]any)...)
			next, _ := r.body["$skipToken"].(string)
			if next == "" {
				return rows
			}
			opts = map[string]any{"$skipToken": next}
		}
		t.Fatal("no last page")
		return nil
	}
	for _, cond := range []string{
		`tags['caa-node'] == 'n1'`,
		`tags['caa-node'] =~ 'n1'`,
		`tags['CAA-NODE'] == 'n1'`,
		`tags['caa-node'] != 'n1'`,
		`tags['caa-node'] !~ 'n1'`,
		`tags['caa-node'] in ('n1', 'n2', 'N1')`,
		`tags['caa-node'] in~ ('n1', 'n3')`,
		`tags['caa-managed-by'] == 'caa' and tags['caa-cluster'] == 'c1' and tags['caa-node'] == 'n2'`,
		`tags['caa-cluster'] == 'c1' and tags['caa-node'] != 'n2'`,
		`tags['caa-node'] == 'nobody'`,
		`type =~ 'Microsoft.Compute/virtualMachines'`,
	} {
		for _, q := range []string{
			"Resources\n| where " + cond + "\n| project id, name, type, tags",
			"Resources\n| where type =~ 'Microsoft.Compute/virtualMachines'\n| where " + cond +
				"\n| extend power = tostring(properties.extended.instanceView.powerState.code)\n| project id, name, power",
			"Resources\n| where " + cond + "\n| summarize n = count() by type",
		} {
			want := all(walked, q)
			assert.Equal(t, want, all(indexed, q), q)
			assert.Equal(t, want, all(indexed, q), "asked again: %s", q)
		}
	}
}

// An identical query asked again is answered as the first time only while
// nothing changed: a change made on the core behind the fake's back, a
// boot that the clock finishes, a write through the fake and a control
// call each show in the very next answer.
func TestGraphRepeatedQuerySeesEveryChange(t *testing.T) {
	f, clk := newGraphFake(t, armfake.WithGraphPageSize(100))
	q := query(`Resources | where type =~ 'microsoft.compute/virtualmachines' | where tags['caa-node'] == 'n1' | extend power = tostring(properties.extended.instanceView.powerState.code), state = tostring(properties.provisioningState) | project name, power, state`, nil)
	look := func() map[string]string {
		r := f.do(http.MethodPost, graphURL, q)
		require.Equal(t, http.StatusOK, r.status, r.raw)
		out := map[string]string{}
		for _, d := range r.body["data"].([]any) {
			out[str(d, "name")] = str(d, "power") + " " + str(d, "state")
		}
		return out
	}
	a := seedVM(t, f.cloud, "vm-a", "n1")
	b := seedVM(t, f.cloud, "vm-b", "n1")
	want := map[string]string{"vm-a": "PowerState/running Succeeded", "vm-b": "PowerState/running Succeeded"}
	assert.Equal(t, want, look())
	assert.Equal(t, want, look(), "nothing changed")

	require.NoError(t, f.cloud.Stop(a.ID)) // behind the fake's back
	want["vm-a"] = "PowerState/stopped Succeeded"
	assert.Equal(t, want, look(), "a stop on the core")
	require.NoError(t, f.cloud.Kill(b.ID))
	delete(want, "vm-b")
	assert.Equal(t, want, look(), "a kill on the core")

	f.cloud.SetFaults(cloud.Faults{BootDelay: time.Minute})
	seedVM(t, f.cloud, "vm-c", "n1")
	want["vm-c"] = "PowerState/starting Succeeded"
	assert.Equal(t, want, look(), "booting")
	assert.Equal(t, want, look(), "still booting")
	clk.Advance(time.Minute)
	want["vm-c"] = "PowerState/running Succeeded"
	assert.Equal(t, want, look(), "the clock finished the boot, with no other change")

	f.cloud.SetFaults(cloud.Faults{InvisibleFor: time.Minute})
	seedVM(t, f.cloud, "vm-d", "n1")
	assert.Equal(t, want, look(), "not visible yet")
	assert.Equal(t, want, look(), "still not visible")
	clk.Advance(time.Minute)
	want["vm-d"] = "PowerState/running Succeeded"
	assert.Equal(t, want, look(), "visible on the clock alone")

	c := f.cloud.Live()[1]
	require.Equal(t, "vm-c", c.Name)
	r := f.do(http.MethodPost, armfake.ControlFailExtension+"?id="+c.ID, nil)
	require.Equal(t, http.StatusOK, r.status, r.raw)
	want["vm-c"] = "PowerState/running Failed"
	assert.Equal(t, want, look(), "a control call of the fake's own")

	assert.Equal(t, http.StatusAccepted, f.do(http.MethodDelete, vms+"/vm-a", nil).status)
	delete(want, "vm-a")
	assert.Equal(t, want, look(), "a delete through the fake")
}

// The pages of one query are cut from the rows the first page made only
// while nothing changed: a VM killed on the core between two pages is not
// on the next one, as when every page was answered afresh.
func TestGraphNextPageSeesAChangeBetweenPages(t *testing.T) {
	f, _ := newGraphFake(t, armfake.WithGraphPageSize(2))
	var ins []cloud.Instance
	for i := range 6 {
		ins = append(ins, seedVM(t, f.cloud, fmt.Sprintf("vm-%d", i), "n1"))
	}
	q := `Resources | where tags['caa-node'] == 'n1' | project name`
	first := f.do(http.MethodPost, graphURL, query(q, nil))
	require.Equal(t, http.StatusOK, first.status, first.raw)
	assert.Equal(t, []string{"vm-0", "vm-1"}, names(first))
	next := map[string]any{"$skipToken": first.body["$skipToken"]}
	again := f.do(http.MethodPost, graphURL, query(q, next))
	assert.Equal(t, []string{"vm-2", "vm-3"}, names(again), "nothing changed")
	require.NoError(t, f.cloud.Kill(ins[2].ID))
	r := f.do(http.MethodPost, graphURL, query(q, next))
	require.Equal(t, http.StatusOK, r.status, r.raw)
	assert.Equal(t, []string{"vm-3", "vm-4"}, names(r), "the killed VM is gone from the next page")
}
