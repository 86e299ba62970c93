package vpcfake

import (
	"errors"
	"net/http"
	"slices"
	"strings"

	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/test/mocks/cloud"
)

// listVolumes is GET /v1/volumes, with the tag filter. It lists the boot
// volumes of visible instances, in the instances' order and with their
// pagination; a volume left behind by a deleted instance is reachable by
// id only.
func (s *Server) listVolumes(w http.ResponseWriter, r *http.Request) {
	q, ok := pageQuery(w, r, "tag")
	if !ok {
		return
	}
	if !s.permit(w, r, Access{Type: "volume", Verb: "list", Group: anyGroup}) {
		return
	}
	byID := s.resourcesByID()
	tag := strings.ToLower(q.filters["tag"])
	visible := s.visibleTo(r, "volume")
	match := func(in cloud.Instance) bool {
		if in.State == provider.StateTerminated {
			return false
		}
		b := bootVolumeOf(in, byID)
		return (tag == "" || slices.Contains(formatUserTags(b.tags), tag)) && visible(b.id, b.group)
	}
	page, next, total, ok := s.page(w, match, q)
	if !ok {
		return
	}
	base := baseURL(r)
	out := volumeCollection{Volumes: []volumeView{}, Limit: q.limit, TotalCount: total}
	out.First, out.Next = q.links(base+"/v1/volumes", next)
	for _, in := range page {
		out.Volumes = append(out.Volumes, volumeViewOf(base, bootVolumeOf(in, byID), &in))
	}
	writeJSON(w, http.StatusOK, out)
}

// getVolume is GET /v1/volumes/{id}. A volume is as visible as the instance
// it is attached to.
func (s *Server) getVolume(w http.ResponseWriter, r *http.Request) {
	b, owner, err := s.volume(r.PathValue("id"))
	if !s.permit(w, r, Access{Type: "volume", Verb: "read", ID: r.PathValue("id"), Group: groupOrAny(b.group, err)}) {
		return
	}
	if err != nil {
		writeCoreError(w, err, "Volume")
		return
	}
	writeJSON(w, http.StatusOK, volumeViewOf(baseURL(r), b, owner))
}

// deleteVolume is DELETE /v1/volumes/{id}: refused while attached.
func (s *Server) deleteVolume(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	b, owner, err := s.volume(id)
	if !s.permit(w, r, Access{Type: "volume", Verb: "delete", ID: id, Group: groupOrAny(b.group, err)}) {
		return
	}
	switch {
	case err != nil:
	case owner != nil:
		err = cloud.ErrResourceInUse
	default:
		err = s.cloud.DeleteResource(id)
	}
	if err != nil {
		writeCoreError(w, err, "Volume")
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// volume finds a boot volume by id: a core resource, or the implicit boot
// volume of a seeded instance. owner is nil for a detached volume.
func (s *Server) volume(id string) (bootVolume, *cloud.Instance, error) {
	res, err := s.cloud.GetResource(id)
	if err == nil && res.Kind != KindVolume {
		err = cloud.ErrResourceNotFound
	}
	if err == nil {
		if res.Owner == "" {
			return volumeFromResource(res), nil, nil
		}
		in, err := s.liveInstance(res.Owner)
		if errors.Is(err, cloud.ErrNotFound) {
			return bootVolume{}, nil, cloud.ErrResourceNotFound
		}
		return volumeFromResource(res), &in, err
	}
	instanceID, ok := strings.CutSuffix(id, "-boot")
	if !ok {
		return bootVolume{}, nil, err
	}
	in, err := s.liveInstance(instanceID)
	if err != nil || len(in.Resources) > 0 {
		return bootVolume{}, nil, cloud.ErrResourceNotFound
	}
	return bootVolumeOf(in, nil), &in, nil
}

// liveInstance is a visible instance that is not terminated.
func (s *Server) liveInstance(id string) (cloud.Instance, error) {
	in, err := s.cloud.Get(id)
	if err == nil && in.State == provider.StateTerminated {
		err = cloud.ErrNotFound
	}
	return in, err
}
