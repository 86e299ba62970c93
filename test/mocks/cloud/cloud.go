// Package cloud is the in-memory core shared by caa's fake clouds: VMs with
// states and boot delay, tags, stable pagination, side resources (NICs,
// disks, volumes), call counters and fault injection. The EC2, Azure and
// IBM VPC front ends translate their wire protocols onto it; the memory
// provider calls it directly.
package cloud

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/caa-project/caa/pkg/provider"
)

// Errors the core returns; each front end turns them into its cloud's codes.
var (
	ErrNotFound            = errors.New("instance not found")
	ErrIdempotencyMismatch = errors.New("idempotency token reused with different parameters")
	ErrNameConflict        = errors.New("name already in use")
	ErrQuota               = errors.New("instance quota exceeded")
	ErrCapacity            = errors.New("insufficient capacity")
	ErrBadImage            = errors.New("image not found")
	ErrBadType             = errors.New("instance type not offered")
	ErrResourceNotFound    = errors.New("resource not found")
	ErrResourceInUse       = errors.New("resource in use")
)

// Operation names under which front ends count the four provider calls
// (other calls, such as NIC or volume operations, count under their own).
const (
	OpCreate = "create"
	OpGet    = "get"
	OpList   = "list"
	OpDelete = "delete"
)

// FaultKind is what Admit decided a call should suffer.
type FaultKind int

// Fault kinds.
const (
	FaultNone FaultKind = iota
	FaultThrottle
	FaultServerError
	FaultAuth
)

// Fault is Admit's verdict for one call.
type Fault struct {
	Kind       FaultKind
	RetryAfter time.Duration
}

// Faults are the knobs a test (or the control endpoint) turns.
type Faults struct {
	Latency time.Duration `json:"latency"`
	// ThrottleEvery throttles every Nth call (0: off).
	ThrottleEvery int `json:"throttleEvery"`
	// ThrottleRate and ThrottleBurst throttle calls above a token bucket of
	// that many calls per second (0: off). WriteOnly limits it to creates
	// and deletes, as clouds meter mutating calls apart.
	ThrottleRate      float64 `json:"throttleRate"`
	ThrottleBurst     int     `json:"throttleBurst"`
	ThrottleWriteOnly bool    `json:"throttleWriteOnly"`
	// RetryAfter is what a throttled reply asks for.
	RetryAfter time.Duration `json:"retryAfter"`
	// ServerErrorRate is the fraction of calls that fail with a 5xx.
	ServerErrorRate float64 `json:"serverErrorRate"`
	// InvisibleFor hides a new instance from get and list for this long.
	InvisibleFor time.Duration `json:"invisibleFor"`
	// QuotaLimit caps instances that are not terminated (0: no cap).
	QuotaLimit int `json:"quotaLimit"`
	// CapacityFailures makes the next N creates fail for capacity.
	CapacityFailures int `json:"capacityFailures"`
	// BootDelay keeps a new instance Pending this long.
	BootDelay time.Duration `json:"bootDelay"`
	// DenyAuth rejects every call as unauthorised.
	DenyAuth bool `json:"denyAuth"`
}

// Options configure a Cloud.
type Options struct {
	// IDPrefix starts every instance id ("i-", "vm-", ...).
	IDPrefix string
	// PageSize caps a list page (default 50).
	PageSize int
	// Images and Types, when set, are all that Create accepts.
	Images []string
	Types  []string
	// Zone is reported on every instance.
	Zone string
	// KeepTerminated keeps terminated instances visible this long
	// (EC2 shows them for about an hour; Azure and VPC do not).
	KeepTerminated time.Duration
	// Now is the clock (default time.Now).
	Now func() time.Time
	// Seed makes fault draws repeatable.
	Seed uint64
}

// Instance is one VM as the fake cloud holds it.
type Instance struct {
	ID           string            `json:"id"`
	Name         string            `json:"name"`
	State        provider.State    `json:"state"`
	Tags         map[string]string `json:"tags,omitempty"`
	InstanceType string            `json:"instanceType"`
	Image        string            `json:"image"`
	Zone         string            `json:"zone"`
	IPs          []string          `json:"ips,omitempty"`
	Token        string            `json:"token,omitempty"`
	UserDataLen  int               `json:"userDataBytes"`
	// Deallocated marks a Stopped instance whose compute was released
	// (Azure's PowerState/deallocated, as against PowerState/stopped);
	// clouds without the distinction show both as stopped.
	Deallocated bool `json:"deallocated,omitempty"`
	// TEE is the confidential computing the instance runs with, as the
	// cloud reports it ("sev-snp", "tdx", "sgx"; empty: an ordinary VM).
	// Front ends check a request's TEE against their type and image
	// before Create; SetTEE changes it behind the daemon's back.
	TEE string `json:"tee,omitempty"`
	// Unreachable, when set, says why the instance's pod VM never answers
	// the worker although the cloud shows it running: the front end saw
	// a launch the real cloud would take but whose VM the worker cannot
	// reach or that never boots (an EC2 instance in the VPC's default
	// security group only, an Azure VM with secure boot on from an
	// unsigned image). The pod VM fleet boots no VM for it.
	Unreachable string `json:"unreachable,omitempty"`
	// Resources are side resources that live and die with the instance
	// unless the front end deletes them apart (e.g. Azure NICs).
	Resources []string  `json:"resources,omitempty"`
	CreatedAt time.Time `json:"createdAt"`
	// EndedAt is when the instance was terminated (zero while it is not).
	EndedAt    time.Time `json:"endedAt,omitzero"`
	bootAt     time.Time
	visibleAt  time.Time
	endedAt    time.Time
	seq        int
	userData   []byte
	deleteWith []string
}

// UserData is what the instance was created with.
func (i Instance) UserData() []byte { return slices.Clone(i.userData) }

// CreateRequest is a front end's create call, already parsed.
type CreateRequest struct {
	Name         string
	Token        string // idempotency token; empty for none
	UniqueName   bool   // refuse a name already used by a live instance
	Tags         map[string]string
	InstanceType string
	Image        string
	TEE          string // as Instance.TEE, checked by the front end
	Unreachable  string // as Instance.Unreachable
	UserData     []byte
	// Resources are existing side resources to attach; DeleteWith those of
	// them the cloud deletes along with the instance.
	Resources  []string
	DeleteWith []string
}

// Cloud is the shared in-memory cloud. Safe for concurrent use.
type Cloud struct {
	opts Options

	mu        sync.Mutex
	faults    Faults
	instances map[string]*Instance
	// order holds the instances in creation order (ascending seq), so a
	// page of a large listing costs its own length, not a sort of all.
	order     []*Instance
	resources map[string]*Resource
	seq       int
	calls     int
	counters  map[string]int64
	rng       *rand.Rand
	tokens    float64
	lastFill  time.Time
	// byTag and resByTag index instances and side resources by tag
	// (tagindex.go); gen and quietAt are what Version reports.
	byTag    map[string][]*Instance
	resByTag map[string]map[string]*Resource
	gen      uint64
	quietAt  time.Time
}

// New returns an empty cloud.
func New(opts Options) *Cloud {
	if opts.PageSize <= 0 {
		opts.PageSize = 50
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.IDPrefix == "" {
		opts.IDPrefix = "vm-"
	}
	if opts.Zone == "" {
		opts.Zone = "zone-1"
	}
	return &Cloud{
		opts:      opts,
		instances: map[string]*Instance{},
		resources: map[string]*Resource{},
		counters:  map[string]int64{},
		rng:       rand.New(rand.NewPCG(opts.Seed, opts.Seed^0x5eed)),
	}
}

// Now is the time on the cloud's clock (Options.Now).
func (c *Cloud) Now() time.Time { return c.opts.Now() }

// PageSize is the largest page List returns.
func (c *Cloud) PageSize() int { return c.opts.PageSize }

// SetFaults replaces the fault knobs.
func (c *Cloud) SetFaults(f Faults) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.faults = f
	c.changed(time.Time{})
	c.tokens = float64(f.ThrottleBurst)
	c.lastFill = c.opts.Now()
}

// Faults returns the current knobs.
func (c *Cloud) Faults() Faults {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.faults
}

// Admit is called by a front end at the start of every request: it counts
// the call under op, waits the injected latency, and decides the fault the
// call suffers. write marks mutating calls (for write-only throttling).
func (c *Cloud) Admit(ctx context.Context, op string, write bool) (Fault, error) {
	c.mu.Lock()
	c.counters[op]++
	c.counters["total"]++
	c.calls++
	f := c.faults
	verdict := Fault{}
	switch {
	case f.DenyAuth:
		verdict.Kind = FaultAuth
	case f.ThrottleEvery > 0 && c.calls%f.ThrottleEvery == 0:
		verdict = Fault{Kind: FaultThrottle, RetryAfter: f.RetryAfter}
	case f.ThrottleRate > 0 && (write || !f.ThrottleWriteOnly) && !c.takeToken(f):
		verdict = Fault{Kind: FaultThrottle, RetryAfter: f.RetryAfter}
	case f.ServerErrorRate > 0 && c.rng.Float64() < f.ServerErrorRate:
		verdict.Kind = FaultServerError
	}
	switch verdict.Kind {
	case FaultThrottle:
		c.counters["throttled"]++
	case FaultServerError:
		c.counters["serverErrors"]++
	}
	c.mu.Unlock()
	if f.Latency > 0 {
		t := time.NewTimer(f.Latency)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return verdict, ctx.Err()
		case <-t.C:
		}
	}
	return verdict, nil
}

// takeToken refills the bucket for the time passed and takes one token.
func (c *Cloud) takeToken(f Faults) bool {
	now := c.opts.Now()
	c.tokens += now.Sub(c.lastFill).Seconds() * f.ThrottleRate
	c.lastFill = now
	if burst := float64(max(f.ThrottleBurst, 1)); c.tokens > burst {
		c.tokens = burst
	}
	if c.tokens < 1 {
		return false
	}
	c.tokens--
	return true
}

// CountThrottled counts, under "throttled", a throttling reply a front end
// gave for a reason of its own (a Budget's refusal), so that the counter
// holds every throttling reply the cloud sent.
func (c *Cloud) CountThrottled() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.counters["throttled"]++
}

// Counters returns calls by operation, plus "total", "throttled",
// "serverErrors", "created" and "deleted".
func (c *Cloud) Counters() map[string]int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.counters)
}

// ResetCounters zeroes every counter.
func (c *Cloud) ResetCounters() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.counters = map[string]int64{}
}

// CheckSpec answers what Create would of image and instanceType alone:
// ErrBadImage or ErrBadType when the options restrict them and they are not
// offered, else nil. A front end's dry run uses it, and its catalog reads
// ask about one of the two: an empty image or type is not asked about.
func (c *Cloud) CheckSpec(image, instanceType string) error {
	if image != "" && len(c.opts.Images) > 0 && !slices.Contains(c.opts.Images, image) {
		return fmt.Errorf("%w: %s", ErrBadImage, image)
	}
	if instanceType != "" && len(c.opts.Types) > 0 && !slices.Contains(c.opts.Types, instanceType) {
		return fmt.Errorf("%w: %s", ErrBadType, instanceType)
	}
	return nil
}

// Create makes an instance, or returns the one an earlier call with the same
// token made.
func (c *Cloud) Create(req CreateRequest) (Instance, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.opts.Now()
	if req.Token != "" {
		for _, in := range c.instances {
			if in.Token != req.Token {
				continue
			}
			if in.Image != req.Image || in.InstanceType != req.InstanceType || in.TEE != req.TEE {
				return Instance{}, ErrIdempotencyMismatch
			}
			return c.view(in, now), nil
		}
	}
	if len(c.opts.Images) > 0 && !slices.Contains(c.opts.Images, req.Image) {
		return Instance{}, fmt.Errorf("%w: %s", ErrBadImage, req.Image)
	}
	if len(c.opts.Types) > 0 && !slices.Contains(c.opts.Types, req.InstanceType) {
		return Instance{}, fmt.Errorf("%w: %s", ErrBadType, req.InstanceType)
	}
	if req.UniqueName {
		for _, in := range c.instances {
			if in.Name == req.Name && c.view(in, now).State != provider.StateTerminated {
				return c.view(in, now), ErrNameConflict
			}
		}
	}
	if c.faults.QuotaLimit > 0 && c.liveCount(now) >= c.faults.QuotaLimit {
		return Instance{}, ErrQuota
	}
	if c.faults.CapacityFailures > 0 {
		c.changed(time.Time{})
		c.faults.CapacityFailures--
		return Instance{}, ErrCapacity
	}
	for _, r := range req.Resources {
		res, ok := c.resources[r]
		if !ok {
			return Instance{}, fmt.Errorf("%w: %s", ErrResourceNotFound, r)
		}
		if res.Owner != "" {
			return Instance{}, fmt.Errorf("%w: %s is attached to %s", ErrResourceInUse, r, res.Owner)
		}
	}
	c.seq++
	in := &Instance{
		ID:           fmt.Sprintf("%s%012x", c.opts.IDPrefix, c.seq),
		Name:         req.Name,
		State:        provider.StatePending,
		Tags:         maps.Clone(req.Tags),
		InstanceType: req.InstanceType,
		Image:        req.Image,
		TEE:          req.TEE,
		Unreachable:  req.Unreachable,
		Zone:         c.opts.Zone,
		IPs:          []string{"10." + strconv.Itoa(c.seq>>16&255) + "." + strconv.Itoa(c.seq>>8&255) + "." + strconv.Itoa(c.seq&255)},
		Token:        req.Token,
		UserDataLen:  len(req.UserData),
		Resources:    slices.Clone(req.Resources),
		CreatedAt:    now,
		bootAt:       now.Add(c.faults.BootDelay),
		visibleAt:    now.Add(c.faults.InvisibleFor),
		seq:          c.seq,
		userData:     slices.Clone(req.UserData),
		deleteWith:   slices.Clone(req.DeleteWith),
	}
	if in.Name == "" {
		in.Name = in.ID
	}
	for _, r := range req.Resources {
		c.resources[r].Owner = in.ID
	}
	c.instances[in.ID] = in
	c.order = append(c.order, in)
	c.indexInstance(in)
	c.changed(in.bootAt)
	c.changed(in.visibleAt)
	c.counters["created"]++
	return c.view(in, now), nil
}

func (c *Cloud) liveCount(now time.Time) int {
	n := 0
	for _, in := range c.instances {
		if c.view(in, now).State != provider.StateTerminated {
			n++
		}
	}
	return n
}

// view advances an instance's state by the clock and returns a copy.
func (c *Cloud) view(in *Instance, now time.Time) Instance {
	out := c.peek(in, now)
	out.Tags = maps.Clone(in.Tags)
	out.IPs = slices.Clone(in.IPs)
	out.Resources = slices.Clone(in.Resources)
	out.userData = slices.Clone(in.userData)
	return out
}

// peek is view without the copies of tags, addresses, resources and user
// data: for a match function to read under the lock, never to keep. A
// large listing matched most of the cloud for a page of it.
func (c *Cloud) peek(in *Instance, now time.Time) Instance {
	if in.State == provider.StatePending && !now.Before(in.bootAt) {
		in.State = provider.StateRunning
	}
	out := *in
	out.EndedAt = in.endedAt
	return out
}

// visible reports whether get and list may show the instance now.
func (c *Cloud) visible(in *Instance, now time.Time) bool {
	if now.Before(in.visibleAt) {
		return false
	}
	if in.State == provider.StateTerminated && now.Sub(in.endedAt) >= c.opts.KeepTerminated {
		return false
	}
	return true
}

// Get returns a visible instance or ErrNotFound.
func (c *Cloud) Get(id string) (Instance, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.opts.Now()
	in, ok := c.instances[id]
	if !ok || !c.visible(in, now) {
		return Instance{}, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	return c.view(in, now), nil
}

// List returns one page of the visible instances that match, in creation
// order, and the token of the next page ("" at the end). size <= 0 or above
// the cloud's page size means the cloud's page size. match reads the
// instance under the cloud's lock and must not keep or change it.
func (c *Cloud) List(match func(Instance) bool, token string, size int) ([]Instance, string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.listFrom(c.order, match, token, size)
}

func errBadToken(token string) error { return fmt.Errorf("bad page token %q", token) }

// Count is how many visible instances match, in one pass (a front end's
// total count, without paging through every page).
func (c *Cloud) Count(match func(Instance) bool) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.opts.Now()
	n := 0
	for _, in := range c.order {
		if c.visible(in, now) && (match == nil || match(c.peek(in, now))) {
			n++
		}
	}
	return n
}

// Delete terminates an instance and deletes its DeleteWith resources,
// detaching the others. Deleting a terminated or missing one is
// ErrNotFound, as clouds answer; front ends decide what that means.
func (c *Cloud) Delete(id string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.opts.Now()
	in, ok := c.instances[id]
	if !ok || !c.visible(in, now) {
		return fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	if in.State == provider.StateTerminated {
		return nil
	}
	c.terminate(in, now)
	c.counters["deleted"]++
	return nil
}

func (c *Cloud) terminate(in *Instance, now time.Time) {
	in.State = provider.StateTerminated
	in.endedAt = now
	c.changed(now.Add(c.opts.KeepTerminated))
	for _, r := range in.Resources {
		if slices.Contains(in.deleteWith, r) {
			if res, ok := c.resources[r]; ok {
				c.unindexResource(res)
			}
			delete(c.resources, r)
		} else if res, ok := c.resources[r]; ok {
			res.Owner = ""
		}
	}
}

// Kill terminates an instance behind the daemon's back (no counter moves).
func (c *Cloud) Kill(id string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	in, ok := c.instances[id]
	if !ok {
		return fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	c.terminate(in, c.opts.Now())
	return nil
}

// Stop stops an instance behind the daemon's back. It stays listed, as
// Stopped, until it is deleted or killed.
func (c *Cloud) Stop(id string) error { return c.setDead(id, provider.StateStopped, false) }

// Deallocate stops an instance and releases its compute behind the
// daemon's back, as Azure's deallocate does: Stopped, and shown as
// deallocated where the cloud tells the two apart.
func (c *Cloud) Deallocate(id string) error { return c.setDead(id, provider.StateStopped, true) }

// Fail puts an instance in the Failed state behind the daemon's back, as a
// cloud does when provisioning or the host fails: it stays listed, with its
// side resources, until it is deleted. Nothing but a delete (or Kill) takes
// it out of that state.
func (c *Cloud) Fail(id string) error { return c.setDead(id, provider.StateFailed, false) }

func (c *Cloud) setDead(id string, st provider.State, deallocated bool) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	in, ok := c.instances[id]
	if !ok || in.State == provider.StateTerminated {
		return fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	in.State, in.Deallocated = st, deallocated
	c.changed(time.Time{})
	return nil
}

// SetTEE changes what the cloud reports of an instance's confidential
// computing behind the daemon's back ("" for an ordinary VM): a test's
// stand-in for a cloud that made, or now reports, another VM than asked.
func (c *Cloud) SetTEE(id, tee string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	in, ok := c.instances[id]
	if !ok || in.State == provider.StateTerminated {
		return fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	in.TEE = tee
	c.changed(time.Time{})
	return nil
}

// Backdate moves an instance's creation time (its launch time, as the
// clouds report it) to at, and its boot with it: a test's stand-in for a
// VM that another program made before the test began, such as one the
// cloud-api-adaptor left.
func (c *Cloud) Backdate(id string, at time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	in, ok := c.instances[id]
	if !ok {
		return fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	shift := in.CreatedAt.Sub(at)
	in.CreatedAt = at
	in.bootAt = in.bootAt.Add(-shift)
	in.visibleAt = in.visibleAt.Add(-shift)
	c.changed(time.Time{})
	return nil
}

// Instances returns every instance the cloud holds, visible or not,
// terminated ones included, in creation order.
func (c *Cloud) Instances() []Instance {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.opts.Now()
	out := make([]Instance, 0, len(c.order))
	for _, in := range c.order {
		out = append(out, c.view(in, now))
	}
	return out
}

// Live returns the instances that are not terminated.
func (c *Cloud) Live() []Instance {
	return slices.DeleteFunc(c.Instances(), func(i Instance) bool { return i.State == provider.StateTerminated })
}
