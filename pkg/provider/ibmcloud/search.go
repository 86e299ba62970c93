package ibmcloud

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/IBM/go-sdk-core/v5/core"
	"github.com/IBM/platform-services-go-sdk/globalsearchv2"
	"github.com/IBM/vpc-go-sdk/vpcv1"

	"github.com/caa-project/caa/pkg/provider"
)

const (
	// searchLimit is the page List asks Global Search for: the API's
	// largest. Only the CRN comes back per hit, so a full page is small.
	searchLimit = 1000
	// readConcurrency bounds the reads by id a listing has in flight.
	readConcurrency = 4
)

// searchFields are the fields List asks Global Search for, per hit: the
// CRN, type and tags of every hit, and of an instance's document (the
// index keeps the instance's VPC JSON under doc) the parts List needs to
// answer without reading VPC: status, creation time, shape, placement,
// scope (VPC, resource group), boot volume, address and confidential
// compute mode (the TEE: without it a confidential VM would read as an
// ordinary one, and be refused as not confidential).
var searchFields = []string{
	"crn", "type", "name", "tags",
	"doc.status", "doc.created_at", "doc.profile.name", "doc.image.id", "doc.zone.name", "doc.confidential_compute_mode",
	"doc.vpc.id", "doc.resource_group.id", "doc.boot_volume_attachment.volume.id",
	"doc.primary_network_attachment.primary_ip.address", "doc.primary_network_interface.primary_ip.address",
}

// searchAPI is the part of globalsearchv2.GlobalSearchV2 the provider uses.
type searchAPI interface {
	SearchWithContext(context.Context, *globalsearchv2.SearchOptions) (*globalsearchv2.ScanResult, *core.DetailedResponse, error)
}

// searchQuery is the Global Search query for sel's VMs: VPC resources
// (the instances, tagged through Global Tagging, and their boot volumes,
// tagged at create) whose user tags hold caa's managed-by tag and the
// (first piece of the) encoded cluster tag and, unless sel.Node is empty
// (the cluster's listing), node tag. Each tag is a quoted phrase; encoded
// tags are drawn from [a-z0-9_.:-], and quote escapes whatever else a tag
// could hold, so a node name cannot change the query's shape.
func searchQuery(sel provider.Selector) string {
	terms := []string{
		"family:is",
		"tags:" + quoteTerm(firstTag(provider.TagManagedBy, provider.ManagedByValue)),
		"tags:" + quoteTerm(firstTag(provider.TagCluster, sel.Cluster)),
	}
	if sel.Node != "" {
		terms = append(terms, "tags:"+quoteTerm(firstTag(provider.TagNode, sel.Node)))
	}
	return strings.Join(terms, " AND ")
}

// matches reports whether tags put a VM in sel: its cluster and node, or
// with no node in sel, its cluster only; caa must be its manager.
func matches(sel provider.Selector, tags map[string]string) bool {
	if sel.Node == "" {
		return tags[provider.TagManagedBy] == provider.ManagedByValue && sel.Cluster != "" && tags[provider.TagCluster] == sel.Cluster
	}
	return sel.Matches(tags)
}

// firstTag is the user tag of key=value as Create writes it, or its first
// piece when it is cut.
func firstTag(key, value string) string {
	t, err := encodeTag(key, value)
	if err != nil || len(t) == 0 {
		// Unreachable: caa's keys are short, constant and not empty.
		return escape(key) + ":"
	}
	return t[0]
}

// quoteTerm makes s one Lucene phrase: in double quotes, with backslash
// and double quote escaped.
func quoteTerm(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		if r == '"' || r == '\\' {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	b.WriteByte('"')
	return b.String()
}

// volumeIDOfCRN is the resource id at the end of a VPC volume CRN
// (crn:v1:...:is:<zone>:a/<account>::volume:<id>), "" for any other CRN.
func volumeIDOfCRN(crn string) string {
	parts := strings.Split(crn, ":")
	if len(parts) != 10 || parts[0] != "crn" || parts[4] != "is" || parts[8] != "volume" {
		return ""
	}
	return parts[9]
}

// searchIndex asks Global Search for sel's instances and boot volumes
// and returns the hits, following the cursor to the end. The service
// hands out a live cursor on every page, the last one included, so the
// end is a page with fewer hits than the limit (or an empty one, or one
// without a cursor): waiting for the empty page would cost every listing
// one more search. A CRN on two pages is a pagination loop.
func (p *Provider) searchIndex(ctx context.Context, sel provider.Selector) ([]globalsearchv2.ResultItem, error) {
	limit := p.searchLimit
	if limit <= 0 {
		limit = searchLimit
	}
	opts := &globalsearchv2.SearchOptions{
		Query:  ptr(searchQuery(sel)),
		Fields: searchFields,
		Limit:  ptr(int64(limit)),
	}
	if p.cfg.AccountID != "" {
		opts.AccountID = ptr(p.cfg.AccountID)
	}
	what := "node " + sel.Node
	if sel.Node == "" {
		what = "cluster " + sel.Cluster
	}
	seen := map[string]bool{}
	var items []globalsearchv2.ResultItem
	for {
		res, resp, err := call(ctx, p.cfg.ReadTimeout, provider.DefaultReadTimeout, func(ctx context.Context) (*globalsearchv2.ScanResult, *core.DetailedResponse, error) {
			return p.search.SearchWithContext(ctx, opts)
		})
		if err != nil {
			return nil, classify(opList, resp, fmt.Errorf("global search for the VMs of %s: %w", what, err))
		}
		for _, item := range res.Items {
			crn := str(item.CRN)
			if seen[crn] {
				return nil, &provider.Error{Provider: providerName, Op: opList, Code: "pagination_loop",
					Message: fmt.Sprintf("global search returned %s on a later page", crn)}
			}
			seen[crn] = true
			items = append(items, item)
		}
		cursor := str(res.SearchCursor)
		if len(res.Items) < limit || cursor == "" {
			return items, nil
		}
		// With a cursor, the API ignores every other field of the body.
		opts = &globalsearchv2.SearchOptions{SearchCursor: ptr(cursor), Limit: opts.Limit, AccountID: opts.AccountID}
	}
}

// readVM is a VM read from VPC, with its instance's CRN.
type readVM struct {
	vm  provider.VM
	crn string
}

// vmOfVolume reads, from VPC, the volume id and the instance it is the
// boot volume of, and returns that VM when its tags put it in sel (and in
// the configured VPC and resource group). found is false when either is
// gone (the index lags behind deletes) or is not sel's.
func (p *Provider) vmOfVolume(ctx context.Context, sel provider.Selector, id string) (readVM, bool, error) {
	vopts := &vpcv1.GetVolumeOptions{ID: ptr(id)}
	vol, resp, err := call(ctx, p.cfg.ReadTimeout, provider.DefaultReadTimeout, func(ctx context.Context) (*vpcv1.Volume, *core.DetailedResponse, error) {
		return p.api.GetVolumeWithContext(ctx, vopts)
	})
	if err != nil {
		if resp != nil && resp.StatusCode == http.StatusNotFound {
			return readVM{}, false, nil
		}
		return readVM{}, false, classify(opList, resp, fmt.Errorf("read volume %s: %w", id, err))
	}
	tags := decodeUserTags(vol.UserTags)
	if !matches(sel, tags) {
		return readVM{}, false, nil
	}
	instanceID := ""
	for _, a := range vol.VolumeAttachments {
		if str(a.Type) == "boot" && a.Instance != nil {
			instanceID = str(a.Instance.ID)
		}
	}
	if instanceID == "" {
		return readVM{}, false, nil
	}
	in, found, err := p.readInstance(ctx, instanceID)
	if err != nil || !found || bootVolumeID(in) != id || !p.inScope(in) {
		return readVM{}, false, err
	}
	return readVM{vmOf(in, tags), str(in.CRN)}, true, nil
}

// readInstance reads an instance for a listing; found is false once VPC
// shows it no more.
func (p *Provider) readInstance(ctx context.Context, id string) (*vpcv1.Instance, bool, error) {
	iopts := &vpcv1.GetInstanceOptions{ID: ptr(id)}
	in, resp, err := call(ctx, p.cfg.ReadTimeout, provider.DefaultReadTimeout, func(ctx context.Context) (*vpcv1.Instance, *core.DetailedResponse, error) {
		return p.api.GetInstanceWithContext(ctx, iopts)
	})
	if err != nil {
		if resp != nil && resp.StatusCode == http.StatusNotFound {
			return nil, false, nil
		}
		return nil, false, classify(opList, resp, fmt.Errorf("read instance %s: %w", id, err))
	}
	return in, true, nil
}

// inScope reports whether the instance is in the configured VPC and
// resource group (either unset: any).
func (p *Provider) inScope(in *vpcv1.Instance) bool {
	vpc, group := "", ""
	if in.VPC != nil {
		vpc = str(in.VPC.ID)
	}
	if in.ResourceGroup != nil {
		group = str(in.ResourceGroup.ID)
	}
	return p.inScopeIDs(vpc, group)
}

// inScopeIDs is inScope on the ids of a VM's VPC and resource group.
func (p *Provider) inScopeIDs(vpc, group string) bool {
	return (p.cfg.VPCID == "" || vpc == p.cfg.VPCID) && (p.cfg.ResourceGroupID == "" || group == p.cfg.ResourceGroupID)
}

// throttleRetries bounds how often one read of a listing is tried again
// after the cloud refused it for rate.
const throttleRetries = 5

// patiently runs read, and again after the wait the cloud asks for when it
// refuses the read for rate. A listing is many reads; if one refusal
// failed the whole listing, a fleet starting at once would retry whole
// listings into an empty bucket and none would ever finish.
func patiently[T any](ctx context.Context, read func() (T, bool, error)) (T, bool, error) {
	v, ok, err := read()
	for try := 1; try < throttleRetries && errors.Is(err, provider.ErrThrottled); try++ {
		wait, given := provider.RetryAfter(err)
		if !given {
			wait = time.Second
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return v, ok, err
		case <-t.C:
		}
		v, ok, err = read()
	}
	return v, ok, err
}

// readAll runs read(i) for i in [0, n), readConcurrency at a time (each
// patiently), and returns what the reads found, in the order of i; the
// first failure cancels the rest and is returned.
func readAll[T any](ctx context.Context, n int, read func(ctx context.Context, i int) (T, bool, error)) ([]T, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		once  sync.Once
		first error
		wg    sync.WaitGroup
		next  = make(chan int)
		got   = make([]T, n)
		found = make([]bool, n)
	)
	for range min(readConcurrency, n) {
		wg.Go(func() {
			for i := range next {
				v, ok, err := patiently(ctx, func() (T, bool, error) { return read(ctx, i) })
				if err != nil {
					once.Do(func() { first = err; cancel() })
					continue
				}
				got[i], found[i] = v, ok
			}
		})
	}
feed:
	for i := range n {
		select {
		case next <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	if first != nil {
		return nil, first
	}
	if err := ctx.Err(); err != nil {
		return nil, &provider.Error{Provider: providerName, Op: opList, Code: "request_failed", Message: err.Error(), Err: err}
	}
	out := make([]T, 0, n)
	for i, v := range got {
		if found[i] {
			out = append(out, v)
		}
	}
	return out, nil
}

// readVMs reads the VMs of the volumes ids, readConcurrency at a time,
// in the order of ids, each VM once.
func (p *Provider) readVMs(ctx context.Context, sel provider.Selector, ids []string) ([]readVM, error) {
	got, err := readAll(ctx, len(ids), func(ctx context.Context, i int) (readVM, bool, error) {
		return p.vmOfVolume(ctx, sel, ids[i])
	})
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	return slices.DeleteFunc(got, func(r readVM) bool {
		dup := seen[r.vm.ID]
		seen[r.vm.ID] = true
		return dup
	}), nil
}
