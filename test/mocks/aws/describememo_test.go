package ec2fake

import (
	"encoding/xml"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/test/mocks/cloud"
)

// A listing served from its encoded items is, byte for byte, the listing
// encoded from its items.
func TestEncodedItemsAreTheItems(t *testing.T) {
	c := cloud.New(CloudOptions(cloud.Options{}))
	s := &server{cloud: c, launches: map[string]*launch{}}
	for i := range 3 {
		_, err := c.Create(cloud.CreateRequest{Name: fmt.Sprint(i), Image: goodImage, InstanceType: goodType,
			Tags: map[string]string{"caa-node": "n1", "Name": fmt.Sprintf("<vm & %d>", i)}})
		require.NoError(t, err)
	}
	page, _, err := c.List(nil, "", 0)
	require.NoError(t, err)
	items := describeInstancesResponse{RequestID: "r", Reservations: s.reservations(page), NextToken: "n"}
	enc, err := encodeItems(items.Reservations.Items)
	require.NoError(t, err)
	encoded := describeInstancesResponse{RequestID: "r", Reservations: reservationSet{Encoded: enc}, NextToken: "n"}
	want, err := xml.Marshal(items)
	require.NoError(t, err)
	got, err := xml.Marshal(encoded)
	require.NoError(t, err)
	assert.Equal(t, string(want), string(got))
}

// The same DescribeInstances listing asked again sees every change in its
// very next answer: a change on the core behind the API's back, a boot and
// a visibility the clock finishes, a terminated instance shown for its hour
// and then gone, a RunInstances through the API, and a change between the
// pages of one listing.
func TestRepeatedDescribeSeesEveryChange(t *testing.T) {
	now := time.Date(2026, 9, 10, 11, 12, 13, 0, time.UTC)
	clk := func() time.Time { return now }
	c, base := newRawServer(t, cloud.Options{Now: clk})
	look := func(kv ...string) (map[string]string, string) {
		t.Helper()
		args := append([]string{"Filter.1.Name", "tag:caa-node", "Filter.1.Value.1", "n1"}, kv...)
		r := post(t, base, form("DescribeInstances", args...), unverifiedAuth)
		require.Equal(t, http.StatusOK, r.status, r.body)
		var doc describeInstancesResponse
		require.NoError(t, xml.Unmarshal([]byte(r.body), &doc))
		out := map[string]string{}
		for _, res := range doc.Reservations.Items {
			for _, in := range res.Instances {
				out[in.InstanceID] = in.State.Name
			}
		}
		return out, doc.NextToken
	}
	seed := func() string {
		in, err := c.Create(cloud.CreateRequest{Image: goodImage, InstanceType: goodType, Tags: map[string]string{"caa-node": "n1"}})
		require.NoError(t, err)
		return in.ID
	}
	a, b := seed(), seed()
	_, err := c.Create(cloud.CreateRequest{Image: goodImage, InstanceType: goodType, Tags: map[string]string{"caa-node": "n2"}})
	require.NoError(t, err)
	want := map[string]string{a: "running", b: "running"}
	got, _ := look()
	assert.Equal(t, want, got)
	got, _ = look()
	assert.Equal(t, want, got, "nothing changed")

	require.NoError(t, c.Stop(a))
	want[a] = "stopped"
	got, _ = look()
	assert.Equal(t, want, got, "a stop on the core")

	require.NoError(t, c.Kill(b))
	want[b] = "terminated"
	got, _ = look()
	assert.Equal(t, want, got, "a kill on the core, shown terminated")
	got, _ = look()
	assert.Equal(t, want, got)
	now = now.Add(time.Hour)
	delete(want, b)
	got, _ = look()
	assert.Equal(t, want, got, "gone an hour later, on the clock alone")

	c.SetFaults(cloud.Faults{BootDelay: time.Minute, InvisibleFor: 10 * time.Second})
	d := seed()
	got, _ = look()
	assert.Equal(t, want, got, "not visible yet")
	now = now.Add(10 * time.Second)
	want[d] = "pending"
	got, _ = look()
	assert.Equal(t, want, got, "visible on the clock alone, booting")
	got, _ = look()
	assert.Equal(t, want, got)
	now = now.Add(time.Minute)
	want[d] = "running"
	got, _ = look()
	assert.Equal(t, want, got, "booted on the clock alone")

	c.SetFaults(cloud.Faults{})
	r := post(t, base, runForm("TagSpecification.1.ResourceType", "instance", "TagSpecification.1.Tag.1.Key", "caa-node",
		"TagSpecification.1.Tag.1.Value", "n1"), unverifiedAuth)
	require.Equal(t, http.StatusOK, r.status, r.body)
	got, _ = look()
	assert.Len(t, got, len(want)+1, "a RunInstances through the API")
	for _, in := range c.Live() {
		if in.Tags["caa-node"] == "n1" && in.State == provider.StateRunning {
			want[in.ID] = "running"
		}
	}
	assert.Equal(t, want, got)

	for range 6 {
		want[seed()] = "running"
	}
	first, next := look("MaxResults", "5")
	require.NotEmpty(t, next, "%v", first)
	page2, _ := look("MaxResults", "5", "NextToken", next)
	page2Again, _ := look("MaxResults", "5", "NextToken", next)
	assert.Equal(t, page2, page2Again, "nothing changed")
	for id := range page2 {
		require.NoError(t, c.Stop(id))
		want[id] = "stopped"
	}
	page2Again, _ = look("MaxResults", "5", "NextToken", next)
	for id := range page2 {
		assert.Equal(t, "stopped", page2Again[id], "a change between the pages")
	}
}
