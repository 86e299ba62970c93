package cloud

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// listAll pages through a listing to its end.
func listAll(t *testing.T, list func(token string) ([]Instance, string, error)) []string {
	t.Helper()
	var ids []string
	token := ""
	for {
		page, next, err := list(token)
		require.NoError(t, err)
		for _, in := range page {
			ids = append(ids, in.ID)
		}
		if next == "" {
			return ids
		}
		token = next
	}
}

// exact is a term's test as a front end applies it: case-sensitive.
func exact(terms []TagTerm) func(Instance) bool {
	return func(in Instance) bool {
		for _, t := range terms {
			v, ok := in.Tags[t.Key]
			if !ok || !slices.Contains(t.Values, v) {
				return false
			}
		}
		return true
	}
}

// A listing narrowed by the tag index answers exactly what the walk of
// every instance with the same test answers, page by page, whatever the
// terms' form, with instances booting, invisible, terminated and still
// shown, and terminated and gone.
func TestListTaggedAnswersAsTheWalk(t *testing.T) {
	c, clk := newTestCloud(Options{PageSize: 4, KeepTerminated: time.Minute})
	for i := range 60 {
		tags := map[string]string{"node": fmt.Sprintf("n%d", i%3), "cluster": "c"}
		switch i % 5 {
		case 1:
			tags["node"] = strings.ToUpper(tags["node"]) // same value, other case
		case 2:
			delete(tags, "cluster")
		case 3:
			tags["Node"] = "n0" // same key, other case
		}
		if i == 40 {
			c.SetFaults(Faults{BootDelay: time.Minute, InvisibleFor: 30 * time.Second})
		}
		in, err := c.Create(CreateRequest{Tags: tags, InstanceType: "t", Image: "i"})
		require.NoError(t, err)
		if i%7 == 0 {
			require.NoError(t, c.Kill(in.ID)) // Delete refuses an invisible one
		}
		if i == 20 {
			clk.Advance(2 * time.Minute) // the ones deleted so far are gone
		}
	}
	for _, terms := range [][]TagTerm{
		{{Key: "node", Values: []string{"n0"}}},
		{{Key: "node", Values: []string{"N0"}}},
		{{Key: "Node", Values: []string{"n0"}}},
		{{Key: "node", Values: []string{"n0", "n2", "N1"}}},
		{{Key: "node", Values: []string{"n1"}}, {Key: "cluster", Values: []string{"c"}}},
		{{Key: "cluster", Values: []string{"c"}}, {Key: "node", Values: []string{"n0", "n0"}}},
		{{Key: "node", Values: []string{"nobody"}}},
		{{Key: "nokey", Values: []string{"n0"}}},
		{{Key: "node"}},
		nil,
	} {
		t.Run(fmt.Sprint(terms), func(t *testing.T) {
			for _, size := range []int{1, 3, 0} {
				want := listAll(t, func(tok string) ([]Instance, string, error) { return c.List(exact(terms), tok, size) })
				got := listAll(t, func(tok string) ([]Instance, string, error) {
					return c.ListTagged(terms, exact(terms), tok, size)
				})
				assert.Equal(t, want, got, "page size %d", size)
			}
			// The index narrows only: a match that accepts anything
			// still gets only what holds the terms, without case.
			got := listAll(t, func(tok string) ([]Instance, string, error) { return c.ListTagged(terms, nil, tok, 0) })
			want := listAll(t, func(tok string) ([]Instance, string, error) {
				return c.List(func(in Instance) bool {
					return !slices.ContainsFunc(terms, func(t TagTerm) bool { return !holds(in.Tags, t) })
				}, tok, 0)
			})
			assert.Equal(t, want, got)
		})
	}
	// The booting, invisible ones show up on the clock, through the index.
	terms := []TagTerm{{Key: "node", Values: []string{"n1"}}}
	before := listAll(t, func(tok string) ([]Instance, string, error) { return c.ListTagged(terms, exact(terms), tok, 0) })
	clk.Advance(time.Minute)
	after := listAll(t, func(tok string) ([]Instance, string, error) { return c.ListTagged(terms, exact(terms), tok, 0) })
	assert.Greater(t, len(after), len(before), "instances past their invisibility show")
	assert.Equal(t, listAll(t, func(tok string) ([]Instance, string, error) { return c.List(exact(terms), tok, 0) }), after)
}

// Side resources found by tag follow every change: a replacement with
// other tags, a delete, and a delete with the instance that owned them.
func TestResourcesTaggedFollowChanges(t *testing.T) {
	c, _ := newTestCloud(Options{})
	walk := func(kind string, terms []TagTerm) []Resource {
		return slices.DeleteFunc(c.Resources(kind), func(r Resource) bool {
			return slices.ContainsFunc(terms, func(t TagTerm) bool { return !holds(r.Tags, t) })
		})
	}
	for i := range 12 {
		c.PutResource(Resource{ID: fmt.Sprintf("nic-%02d", i), Kind: []string{"nic", "disk"}[i%2],
			Tags: map[string]string{"node": fmt.Sprintf("n%d", i%3)}})
	}
	in, err := c.Create(CreateRequest{InstanceType: "t", Image: "i", Resources: []string{"nic-00", "nic-03"}, DeleteWith: []string{"nic-00"}})
	require.NoError(t, err)
	c.PutResource(Resource{ID: "nic-06", Kind: "nic", Tags: map[string]string{"node": "n2"}}) // was n0
	require.NoError(t, c.DeleteResource("nic-09"))
	require.NoError(t, c.Delete(in.ID)) // takes nic-00 with it
	for _, kind := range []string{"nic", "disk", ""} {
		for _, terms := range [][]TagTerm{
			{{Key: "node", Values: []string{"n0"}}},
			{{Key: "NODE", Values: []string{"N2"}}},
			{{Key: "node", Values: []string{"n0", "n1"}}},
			{{Key: "other", Values: []string{"n0"}}},
			nil,
		} {
			want, got := walk(kind, terms), c.ResourcesTagged(kind, terms)
			if len(want) == 0 {
				assert.Empty(t, got, "kind %q terms %v", kind, terms)
				continue
			}
			assert.Equal(t, want, got, "kind %q terms %v", kind, terms)
		}
	}
	assert.NotContains(t, c.ResourcesTagged("", []TagTerm{{Key: "node", Values: []string{"n0"}}}), Resource{ID: "nic-00"})
}

// Version's generation moves with every change, and it is not quiet while
// the clock alone may still change an answer: booting, invisible, or a
// terminated instance still shown.
func TestVersionMovesWithEveryChange(t *testing.T) {
	c, clk := newTestCloud(Options{KeepTerminated: time.Minute})
	gen, quiet := c.Version()
	require.True(t, quiet)
	moved := func(what string) {
		t.Helper()
		g, _ := c.Version()
		assert.NotEqual(t, gen, g, "%s moves the generation", what)
		gen = g
	}
	in, err := c.Create(CreateRequest{InstanceType: "t", Image: "i"})
	require.NoError(t, err)
	moved("a create")
	_, quiet = c.Version()
	assert.True(t, quiet, "nothing pending without a boot delay or invisibility")
	c.SetFaults(Faults{BootDelay: time.Minute})
	moved("new faults")
	_, err = c.Create(CreateRequest{InstanceType: "t", Image: "i"})
	require.NoError(t, err)
	moved("a booting create")
	_, quiet = c.Version()
	assert.False(t, quiet, "a boot is pending")
	clk.Advance(time.Minute)
	_, quiet = c.Version()
	assert.True(t, quiet, "booted")
	c.SetFaults(Faults{InvisibleFor: time.Minute, CapacityFailures: 1})
	moved("new faults")
	_, err = c.Create(CreateRequest{InstanceType: "t", Image: "i"})
	require.ErrorIs(t, err, ErrCapacity)
	moved("a capacity failure used up")
	_, err = c.Create(CreateRequest{InstanceType: "t", Image: "i"})
	require.NoError(t, err)
	moved("an invisible create")
	_, quiet = c.Version()
	assert.False(t, quiet, "a VM is still invisible")
	clk.Advance(time.Minute)
	require.NoError(t, c.Stop(in.ID))
	moved("a stop")
	require.NoError(t, c.Fail(in.ID))
	moved("a failure")
	require.NoError(t, c.Delete(in.ID))
	moved("a delete")
	_, quiet = c.Version()
	assert.False(t, quiet, "a terminated VM is shown until KeepTerminated")
	clk.Advance(time.Minute)
	_, quiet = c.Version()
	assert.True(t, quiet)
	c.PutResource(Resource{ID: "r", Kind: "nic"})
	moved("a new resource")
	require.NoError(t, c.DeleteResource("r"))
	moved("a resource deleted")
	in2, err := c.Create(CreateRequest{InstanceType: "t", Image: "i"})
	require.NoError(t, err)
	moved("a create")
	clk.Advance(time.Minute)
	require.NoError(t, c.Kill(in2.ID))
	moved("a kill")
	g, _ := c.Version()
	_, _, err = c.List(nil, "", 0)
	require.NoError(t, err)
	_, _ = c.Get(in2.ID)
	g2, _ := c.Version()
	assert.Equal(t, g, g2, "reads change nothing")
}
