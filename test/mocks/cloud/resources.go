package cloud

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/caa-project/caa/pkg/provider"
)

// Resource is a side object: a NIC, a disk, a boot volume.
type Resource struct {
	ID    string            `json:"id"`
	Kind  string            `json:"kind"`
	Name  string            `json:"name"`
	Tags  map[string]string `json:"tags,omitempty"`
	Owner string            `json:"owner,omitempty"` // instance id using it
	Props map[string]string `json:"props,omitempty"`
}

// PutResource creates or replaces a side resource (idempotent by id).
func (c *Cloud) PutResource(r Resource) Resource {
	c.mu.Lock()
	defer c.mu.Unlock()
	if old, ok := c.resources[r.ID]; ok {
		r.Owner = old.Owner
		c.unindexResource(old)
	}
	r.Tags = maps.Clone(r.Tags)
	r.Props = maps.Clone(r.Props)
	c.resources[r.ID] = &r
	c.indexResource(&r)
	c.changed(time.Time{})
	return r
}

// GetResource returns a side resource or ErrResourceNotFound.
func (c *Cloud) GetResource(id string) (Resource, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	r, ok := c.resources[id]
	if !ok {
		return Resource{}, fmt.Errorf("%w: %s", ErrResourceNotFound, id)
	}
	return *r, nil
}

// DeleteResource removes a side resource; one still attached is
// ErrResourceInUse, a missing one ErrResourceNotFound.
func (c *Cloud) DeleteResource(id string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	r, ok := c.resources[id]
	if !ok {
		return fmt.Errorf("%w: %s", ErrResourceNotFound, id)
	}
	if r.Owner != "" {
		if in, ok := c.instances[r.Owner]; ok && in.State != provider.StateTerminated {
			return fmt.Errorf("%w: %s is attached to %s", ErrResourceInUse, id, r.Owner)
		}
	}
	c.unindexResource(r)
	delete(c.resources, id)
	c.changed(time.Time{})
	return nil
}

// Resources lists side resources of a kind ("" for all), sorted by id.
func (c *Cloud) Resources(kind string) []Resource {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.resourcesLocked(kind)
}

func (c *Cloud) resourcesLocked(kind string) []Resource {
	var out []Resource
	for _, r := range c.resources {
		if kind == "" || r.Kind == kind {
			out = append(out, *r)
		}
	}
	slices.SortFunc(out, func(a, b Resource) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// ResourceIndex is every side resource by id: a snapshot like Resources,
// without the sort a lookup table does not need.
func (c *Cloud) ResourceIndex() map[string]Resource {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]Resource, len(c.resources))
	for id, r := range c.resources {
		out[id] = *r
	}
	return out
}
