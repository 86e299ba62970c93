package adaptorvm

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/caa-project/caa/pkg/provider"
)

// Modes of --adaptor-vms.
const (
	ModeOff     = "off"     // never look
	ModeReport  = "report"  // look and report; delete nothing (the default)
	ModeCollect = "collect" // also delete what was judged dead twice a grace apart
)

// ParseMode checks a --adaptor-vms value.
func ParseMode(s string) (string, error) {
	switch s {
	case ModeOff, ModeReport, ModeCollect:
		return s, nil
	}
	return "", fmt.Errorf("--adaptor-vms=%q: want %s (look, delete nothing), %s (also delete the adaptor's VMs judged dead) or %s",
		s, ModeReport, ModeCollect, ModeOff)
}

// Actions, as the report names them.
const (
	ActionDeleted     = "deleted"      // deleted by this scan
	ActionWouldDelete = "would-delete" // dead twice a grace apart; the mode is report
	ActionWait        = "wait"         // dead; waiting for a second sighting past the grace
	ActionKeep        = "keep"
	ActionReport      = "report" // untied: reported, never deleted
	ActionGone        = "gone"
	ActionFailed      = "delete-failed"
)

// Item is one adaptor VM in a report.
type Item struct {
	ID      string         `json:"id"`
	Name    string         `json:"name"`
	State   provider.State `json:"state"`
	Created time.Time      `json:"created,omitzero"`
	Tie     TieKind        `json:"tie"`
	// Sandbox and Pod are the adaptor's record on this node that ties it.
	Sandbox string `json:"sandbox,omitempty"`
	Pod     string `json:"pod,omitempty"`
	Action  string `json:"action"`
	Why     string `json:"why"`
	// DeadSince is this caa's first sighting of the VM as dead.
	DeadSince time.Time `json:"deadSince,omitzero"`
}

// Report is one scan: what caa found of the adaptor's VMs and what it does
// with each.
type Report struct {
	At   time.Time `json:"at"`
	Mode string    `json:"mode"`
	// Sandboxes is how many sandbox records of the adaptor this node has.
	Sandboxes int      `json:"sandboxes"`
	Items     []Item   `json:"items"`
	Problems  []string `json:"problems,omitempty"`
	Error     string   `json:"error,omitempty"`
	// Skipped says why the cloud was not listed, when it was not.
	Skipped string `json:"skipped,omitempty"`
}

// Tied reports whether any VM of the report is tied to this node and not
// gone: only those can change verdict, so only they are scanned again.
func (r Report) Tied() bool {
	return slices.ContainsFunc(r.Items, func(it Item) bool { return it.Tie == Tied && it.Action != ActionGone && it.Action != ActionDeleted })
}

// Collector scans the adaptor's VMs and, in collect mode, deletes those
// Decide judged dead in two scans at least Grace apart (its own sightings,
// like caa's orphans: one listing or one answer decides nothing alone).
type Collector struct {
	Mode  string
	Cloud interface {
		provider.AdaptorLister
		Delete(ctx context.Context, id string) error
	}
	// Pod reads a pod from the apiserver itself (not a cache).
	Pod              func(ctx context.Context, namespace, name string) Pod
	PodsDir, KataDir string
	Grace            time.Duration
	// Wait is called before each delete (the node's write budget); nil:
	// no wait.
	Wait func(ctx context.Context) error
	Now  func() time.Time
	Log  *slog.Logger

	firstDead map[string]time.Time
	said      map[string]string
}

// Scan lists the adaptor's VMs, judges each and, in collect mode, deletes
// those dead past the grace. A failed read (the pods directory, kata's,
// the listing) fails the scan: nothing is judged without it.
func (c *Collector) Scan(ctx context.Context) Report {
	now := c.now()
	rep := Report{At: now, Mode: c.Mode, Items: []Item{}}
	sandboxes, problems, err := ReadSandboxes(c.PodsDir)
	if err != nil {
		rep.Error = err.Error()
		return rep
	}
	rep.Sandboxes = len(sandboxes)
	for _, p := range problems {
		rep.Problems = append(rep.Problems, p.Error())
	}
	if len(sandboxes) == 0 {
		// Nothing on this node could tie a VM, so every VM would only be
		// reported: the listing (a VPC's every instance, on IBM Cloud)
		// is not worth a start of every node.
		rep.Skipped = fmt.Sprintf("no sandbox record of the adaptor's in %s: it has not run on this node since the boot, "+
			"so nothing here can tie a VM to this node; the cloud is not listed", c.PodsDir)
		return rep
	}
	kata, seen, err := KataSandboxes(c.KataDir)
	if err != nil {
		rep.Error = err.Error()
		return rep
	}
	if !seen && len(sandboxes) > 0 {
		rep.Problems = append(rep.Problems, fmt.Sprintf("kata's sandbox directory %s is not there: kata ran no sandbox since the boot, "+
			"or it is not mounted into caa's pod (mount it read-only, or --adaptor-kata-dir); the apiserver's word alone decides", c.KataDir))
	}
	vms, err := c.Cloud.ListAdaptorVMs(ctx)
	if err != nil {
		rep.Error = fmt.Sprintf("listing the adaptor's VMs: %v", err)
		return rep
	}
	if c.firstDead == nil {
		c.firstDead, c.said = map[string]time.Time{}, map[string]string{}
	}
	listed := map[string]bool{}
	for _, vm := range vms {
		listed[vm.ID] = true
		e := Evidence{VM: vm, Tie: TieOf(vm.Name, sandboxes), Now: now, Grace: c.Grace}
		it := Item{ID: vm.ID, Name: vm.Name, State: vm.State, Created: vm.CreatedAt, Tie: e.Tie.Kind}
		if e.Tie.Kind != Untied {
			it.Sandbox, it.Pod = e.Tie.Sandbox.ID, e.Tie.Sandbox.Namespace+"/"+e.Tie.Sandbox.Pod
		}
		if e.Tie.Kind == Tied && (vm.State.Alive() || vm.State.Dead()) {
			e.KataHas = kata[e.Tie.Sandbox.ID]
			if !e.KataHas {
				e.Pod = c.Pod(ctx, e.Tie.Sandbox.Namespace, e.Tie.Sandbox.Pod)
			}
		}
		v := Decide(e)
		it.Why = v.Why
		switch v.Judgement {
		case Keep:
			it.Action = ActionKeep
		case ReportOnly:
			it.Action = ActionReport
		case Gone:
			it.Action = ActionGone
		case Dead:
			c.dead(ctx, vm, now, &it)
		}
		if v.Judgement != Dead {
			delete(c.firstDead, vm.ID)
		}
		c.say(it)
		rep.Items = append(rep.Items, it)
	}
	for id := range c.firstDead {
		if !listed[id] {
			delete(c.firstDead, id)
		}
	}
	return rep
}

// dead applies the second-sighting rule and the mode to a VM judged dead.
func (c *Collector) dead(ctx context.Context, vm provider.VM, now time.Time, it *Item) {
	first, ok := c.firstDead[vm.ID]
	if !ok || now.Before(first) {
		first = now
		c.firstDead[vm.ID] = now
	}
	it.DeadSince = first
	if now.Sub(first) < c.Grace {
		it.Action = ActionWait
		it.Why += fmt.Sprintf("; first judged dead at %s, judged again after %s", first.UTC().Format(time.RFC3339), c.Grace)
		return
	}
	if c.Mode != ModeCollect {
		it.Action = ActionWouldDelete
		it.Why += "; --adaptor-vms=collect would delete it"
		return
	}
	if c.Wait != nil {
		if err := c.Wait(ctx); err != nil {
			it.Action, it.Why = ActionFailed, it.Why+"; delete not sent: "+err.Error()
			return
		}
	}
	if err := c.Cloud.Delete(ctx, vm.ID); err != nil {
		it.Action, it.Why = ActionFailed, it.Why+"; delete failed: "+err.Error()
		return
	}
	it.Action = ActionDeleted
	delete(c.firstDead, vm.ID)
}

// say logs a VM's action and reason when they change.
func (c *Collector) say(it Item) {
	if c.Log == nil {
		return
	}
	// The reason's timestamps change nothing worth a line.
	key := it.Action + "|" + strings.SplitN(it.Why, ";", 2)[0]
	if c.said[it.ID] == key {
		return
	}
	c.said[it.ID] = key
	level := slog.LevelInfo
	if it.Action == ActionDeleted || it.Action == ActionFailed || it.Action == ActionWouldDelete {
		level = slog.LevelWarn
	}
	c.Log.Log(context.Background(), level, "adaptor VM", "vm", it.ID, "name", it.Name, "state", it.State, "tie", it.Tie,
		"sandbox", it.Sandbox, "pod", it.Pod, "action", it.Action, "why", it.Why)
}

func (c *Collector) now() time.Time {
	if c.Now != nil {
		return c.Now()
	}
	return time.Now()
}

// Run scans at once, then every interval while some VM is tied to this
// node and not yet gone (only those can change), handing each report to
// publish. It returns when ctx ends or nothing is left to watch.
func (c *Collector) Run(ctx context.Context, interval time.Duration, publish func(Report)) {
	for {
		rep := c.Scan(ctx)
		if ctx.Err() != nil {
			return
		}
		publish(rep)
		if rep.Error == "" && !rep.Tied() {
			return
		}
		t := time.NewTimer(interval)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}
