package reconcile

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/pkg/ledger"
	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/test/mocks/cloud"
)

// flaky hides chosen VMs from List and Get (a lagging or lying listing)
// and can lose the reply of the next create (the VM is made).
type flaky struct {
	provider.Provider
	mu       sync.Mutex
	hidden   map[string]bool
	loseNext bool
}

func (p *flaky) hide(id string, on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.hidden[id] = on
}

func (p *flaky) List(ctx context.Context, sel provider.Selector) ([]provider.VM, error) {
	vms, err := p.Provider.List(ctx, sel)
	p.mu.Lock()
	defer p.mu.Unlock()
	out := vms[:0]
	for _, vm := range vms {
		if !p.hidden[vm.ID] {
			out = append(out, vm)
		}
	}
	return out, err
}

func (p *flaky) Get(ctx context.Context, id string) (provider.VM, error) {
	p.mu.Lock()
	hidden := p.hidden[id]
	p.mu.Unlock()
	if hidden {
		return provider.VM{}, fmt.Errorf("get %s: %w", id, provider.ErrNotFound)
	}
	return p.Provider.Get(ctx, id)
}

func (p *flaky) Create(ctx context.Context, spec provider.Spec) (provider.VM, error) {
	vm, err := p.Provider.Create(ctx, spec)
	p.mu.Lock()
	defer p.mu.Unlock()
	if err == nil && p.loseNext {
		p.loseNext = false
		p.hidden[vm.ID] = true // and the listing does not show it yet
		return provider.VM{}, errors.New("connection reset")
	}
	return vm, err
}

// TestAnAdoptedOtherAttemptKeepsNoSecondVM (issue 17.3): VM a1 reads
// NotFound past --confirm-missing; caa recreates with key a2, whose reply
// is lost while the VM lands unlisted; a1 shows again and is adopted. The
// record must take a1's key and keep naming a2, so that when a2's VM shows
// it is deleted at once as the pod's duplicate: one live VM per pod (I1).
func TestAnAdoptedOtherAttemptKeepsNoSecondVM(t *testing.T) {
	f := newPassFixture(t, time.Hour)
	ctx := context.Background()
	fp := &flaky{Provider: f.rec.Exec.Provider, hidden: map[string]bool{}}
	f.rec.Exec.Provider = fp
	pods := peerPods(1)
	require.True(t, f.rec.Pass(ctx, pods, true).Converged())
	a1 := f.cloud.Live()[0].ID

	// a1 goes missing for longer than the confirmation window.
	fp.hide(a1, true)
	f.rec.Pass(ctx, pods, true)
	f.clock.Advance(time.Minute)
	fp.mu.Lock()
	fp.loseNext = true
	fp.mu.Unlock()
	res := f.rec.Pass(ctx, pods, true)
	require.Equal(t, 1, res.Actions[KindCreate], "recreated once the NotFound lasted")
	require.Len(t, f.cloud.Live(), 2, "a2's VM landed, its reply lost")
	rec, err := f.ledger.Get(pods[0].UID)
	require.NoError(t, err)
	require.Equal(t, ledger.PhaseCreating, rec.Phase)
	require.Equal(t, Key(pods[0].UID, 2), rec.Key)

	// a1 shows again before a2 is listed: adopted, under its own key.
	fp.hide(a1, false)
	f.clock.Advance(time.Minute)
	res = f.rec.Pass(ctx, pods, true)
	require.NoError(t, res.Err)
	rec, err = f.ledger.Get(pods[0].UID)
	require.NoError(t, err)
	assert.Equal(t, ledger.PhaseRunning, rec.Phase)
	assert.Equal(t, a1, rec.VMID)
	assert.Equal(t, Key(pods[0].UID, 1), rec.Key, "the record's key is the adopted VM's")
	assert.Equal(t, []string{Key(pods[0].UID, 2)}, rec.OpenKeys, "a2's VM may exist")
	assert.Equal(t, 2, rec.Attempt, "the next attempt is 3")

	// a2's VM shows: it is the pod's duplicate, deleted now (no grace).
	var a2 string
	for _, in := range f.cloud.Live() {
		if in.ID != a1 {
			a2 = in.ID
		}
	}
	fp.hide(a2, false)
	f.clock.Advance(time.Second)
	f.cloud.ResetCounters()
	res = f.rec.Pass(ctx, pods, true)
	require.NoError(t, res.Err)
	live := f.cloud.Live()
	require.Len(t, live, 1, "one live VM per pod (I1)")
	assert.Equal(t, a1, live[0].ID)
	assert.Equal(t, int64(1), f.cloud.Counters()[cloud.OpDelete])
	assert.Contains(t, f.events.reasons(), EventDuplicateDeleted)
	rec, err = f.ledger.Get(pods[0].UID)
	require.NoError(t, err)
	assert.Empty(t, rec.OpenKeys, "a2's VM is gone: the record no longer names its key")
	assert.True(t, f.rec.Pass(ctx, pods, true).Converged())
}
