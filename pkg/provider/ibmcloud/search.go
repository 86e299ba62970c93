package ibmcloud

import (
	"context"
	"errors"
	"fmt"
	"net/http"
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

// searchFields are the only fields List asks Global Search for: the CRN,
// which names the volume. Tags and states come from VPC reads by id.
var searchFields = []string{"crn"}

// searchAPI is the part of globalsearchv2.GlobalSearchV2 the provider uses.
type searchAPI interface {
	SearchWithContext(context.Context, *globalsearchv2.SearchOptions) (*globalsearchv2.ScanResult, *core.DetailedResponse, error)
}

// searchQuery is the Global Search query for the boot volumes of sel's
// VMs: VPC volumes whose user tags hold caa's managed-by tag and the
// (first piece of the) encoded cluster and node tags. Each tag is a quoted
// phrase; encoded tags are drawn from [a-z0-9_.:-], and quote escapes
// whatever else a tag could hold, so a node name cannot change the query's
// shape.
func searchQuery(sel provider.Selector) string {
	terms := []string{
		"family:is",
		"type:volume",
		"tags:" + quoteTerm(firstTag(provider.TagManagedBy, provider.ManagedByValue)),
		"tags:" + quoteTerm(firstTag(provider.TagCluster, sel.Cluster)),
		"tags:" + quoteTerm(firstTag(provider.TagNode, sel.Node)),
	}
	return strings.Join(terms, " AND ")
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

// searchVolumes asks Global Search for the volumes tagged for sel and
// returns their ids, following the cursor to the end. The service hands
// out a live cursor on every page, the last one included, so the end is a
// page with fewer hits than the limit (or an empty one, or one without a
// cursor): waiting for the empty page would cost every listing one more
// search. A CRN on two pages is a pagination loop.
func (p *Provider) searchVolumes(ctx context.Context, sel provider.Selector) ([]string, error) {
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
	seen := map[string]bool{}
	var ids []string
	for {
		res, resp, err := call(ctx, p.cfg.ReadTimeout, provider.DefaultReadTimeout, func(ctx context.Context) (*globalsearchv2.ScanResult, *core.DetailedResponse, error) {
			return p.search.SearchWithContext(ctx, opts)
		})
		if err != nil {
			return nil, classify(opList, resp, fmt.Errorf("global search for the volumes of node %s: %w", sel.Node, err))
		}
		for _, item := range res.Items {
			crn := str(item.CRN)
			if seen[crn] {
				return nil, &provider.Error{Provider: providerName, Op: opList, Code: "pagination_loop",
					Message: fmt.Sprintf("global search returned %s on a later page", crn)}
			}
			seen[crn] = true
			if id := volumeIDOfCRN(crn); id != "" {
				ids = append(ids, id)
			}
		}
		cursor := str(res.SearchCursor)
		if len(res.Items) < limit || cursor == "" {
			return ids, nil
		}
		// With a cursor, the API ignores every other field of the body.
		opts = &globalsearchv2.SearchOptions{SearchCursor: ptr(cursor), Limit: opts.Limit, AccountID: opts.AccountID}
	}
}

// vmOfVolume reads, from VPC, the volume id and the instance it is the
// boot volume of, and returns that VM when its tags put it in sel (and in
// the configured VPC and resource group). found is false when either is
// gone (the index lags behind deletes) or is not sel's.
func (p *Provider) vmOfVolume(ctx context.Context, sel provider.Selector, id string) (vm provider.VM, found bool, err error) {
	vopts := &vpcv1.GetVolumeOptions{ID: ptr(id)}
	vol, resp, err := call(ctx, p.cfg.ReadTimeout, provider.DefaultReadTimeout, func(ctx context.Context) (*vpcv1.Volume, *core.DetailedResponse, error) {
		return p.api.GetVolumeWithContext(ctx, vopts)
	})
	if err != nil {
		if resp != nil && resp.StatusCode == http.StatusNotFound {
			return provider.VM{}, false, nil
		}
		return provider.VM{}, false, classify(opList, resp, fmt.Errorf("read volume %s: %w", id, err))
	}
	tags := decodeUserTags(vol.UserTags)
	if !sel.Matches(tags) {
		return provider.VM{}, false, nil
	}
	instanceID := ""
	for _, a := range vol.VolumeAttachments {
		if str(a.Type) == "boot" && a.Instance != nil {
			instanceID = str(a.Instance.ID)
		}
	}
	if instanceID == "" {
		return provider.VM{}, false, nil
	}
	iopts := &vpcv1.GetInstanceOptions{ID: ptr(instanceID)}
	in, resp, err := call(ctx, p.cfg.ReadTimeout, provider.DefaultReadTimeout, func(ctx context.Context) (*vpcv1.Instance, *core.DetailedResponse, error) {
		return p.api.GetInstanceWithContext(ctx, iopts)
	})
	if err != nil {
		if resp != nil && resp.StatusCode == http.StatusNotFound {
			return provider.VM{}, false, nil
		}
		return provider.VM{}, false, classify(opList, resp, fmt.Errorf("read instance %s: %w", instanceID, err))
	}
	if bootVolumeID(in) != id || !p.inScope(in) {
		return provider.VM{}, false, nil
	}
	return vmOf(in, tags), true, nil
}

// inScope reports whether the instance is in the configured VPC and
// resource group (either unset: any).
func (p *Provider) inScope(in *vpcv1.Instance) bool {
	if p.cfg.VPCID != "" && (in.VPC == nil || str(in.VPC.ID) != p.cfg.VPCID) {
		return false
	}
	if p.cfg.ResourceGroupID != "" && (in.ResourceGroup == nil || str(in.ResourceGroup.ID) != p.cfg.ResourceGroupID) {
		return false
	}
	return true
}

// throttleRetries bounds how often one read of a listing is tried again
// after the cloud refused it for rate.
const throttleRetries = 5

// vmOfVolumePatiently is vmOfVolume, tried again after the wait the cloud
// asks for when it refuses a read for rate. A listing is many reads; if
// one refusal failed the whole listing, a fleet starting at once would
// retry whole listings into an empty bucket and none would ever finish.
func (p *Provider) vmOfVolumePatiently(ctx context.Context, sel provider.Selector, id string) (provider.VM, bool, error) {
	vm, ok, err := p.vmOfVolume(ctx, sel, id)
	for try := 1; try < throttleRetries && errors.Is(err, provider.ErrThrottled); try++ {
		wait, given := provider.RetryAfter(err)
		if !given {
			wait = time.Second
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return vm, ok, err
		case <-t.C:
		}
		vm, ok, err = p.vmOfVolume(ctx, sel, id)
	}
	return vm, ok, err
}

// readVMs reads the VMs of the volumes ids, readConcurrency at a time,
// in the order of ids; the first failure cancels the rest and is returned.
func (p *Provider) readVMs(ctx context.Context, sel provider.Selector, ids []string) ([]provider.VM, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		once  sync.Once
		first error
		wg    sync.WaitGroup
		next  = make(chan int)
		vms   = make([]provider.VM, len(ids))
		found = make([]bool, len(ids))
	)
	for range min(readConcurrency, len(ids)) {
		wg.Go(func() {
			for i := range next {
				vm, ok, err := p.vmOfVolumePatiently(ctx, sel, ids[i])
				if err != nil {
					once.Do(func() { first = err; cancel() })
					continue
				}
				vms[i], found[i] = vm, ok
			}
		})
	}
feed:
	for i := range ids {
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
	out := make([]provider.VM, 0, len(ids))
	seen := map[string]bool{}
	for i, vm := range vms {
		if found[i] && !seen[vm.ID] {
			seen[vm.ID] = true
			out = append(out, vm)
		}
	}
	return out, nil
}
