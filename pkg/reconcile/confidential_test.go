package reconcile

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/caa-project/caa/pkg/ledger"
	"github.com/caa-project/caa/pkg/provider"
)

func confidentialCfg() Config {
	c := cfg
	c.Spec.Confidential = true
	c.Spec.TEEs = func(t string) []provider.TEE {
		if t == "small" {
			return []provider.TEE{provider.TEESEVSNP}
		}
		return nil
	}
	return c
}

// TestDecideNeverServesADowngradedVM: a VM the cloud reports as not the
// TEE its record asked for is neither kept nor adopted; it is replaced
// and deleted (OldVMID) as a dead VM is.
func TestDecideNeverServesADowngradedVM(t *testing.T) {
	c := confidentialCfg()
	asked := rec(ledger.PhaseRunning, "vm-1", 1)
	asked.Confidential = string(provider.TEESEVSNP)
	plain := keyed("vm-1", provider.StateRunning, 1)

	a := Decide(Input{Pod: pod, Record: asked, VM: plain, Now: t0, CacheSynced: true}, c)
	assert.Equal(t, KindCreate, a.Kind)
	assert.Equal(t, ReasonNotConfidential, a.Reason)
	assert.Equal(t, "vm-1", a.OldVMID)
	assert.Equal(t, provider.TEESEVSNP, a.TEE)
	assert.Equal(t, 2, a.Attempt)
	assert.Contains(t, a.Message, "not confidential")

	// A create resumed after a crash finds, by its key, a VM that is not
	// confidential: it is not adopted either.
	creating := rec(ledger.PhaseCreating, "", 1)
	creating.Confidential = string(provider.TEESEVSNP)
	a = Decide(Input{Pod: pod, Record: creating, VM: plain, Now: t0, CacheSynced: true}, c)
	assert.Equal(t, ReasonNotConfidential, a.Reason)
	assert.Equal(t, "vm-1", a.OldVMID)

	// No record (a lost ledger) and confidential on: an ordinary VM is
	// not adopted.
	a = Decide(Input{Pod: pod, VM: plain, Now: t0, CacheSynced: true}, c)
	assert.Equal(t, ReasonNotConfidential, a.Reason)
	assert.Equal(t, "vm-1", a.OldVMID)

	// The VM the cloud reports as asked is kept.
	snp := keyed("vm-1", provider.StateRunning, 1)
	snp.TEE = provider.TEESEVSNP
	a = Decide(Input{Pod: pod, Record: asked, VM: snp, Now: t0, CacheSynced: true}, c)
	assert.Equal(t, KindNone, a.Kind)

	// A record from before the field (nothing asked) keeps its VM.
	old := rec(ledger.PhaseRunning, "vm-1", 1)
	a = Decide(Input{Pod: pod, Record: old, VM: plain, Now: t0, CacheSynced: true}, c)
	assert.Equal(t, KindNone, a.Kind)
}

// TestDecideCreateAsksForTheTypesTEE, and fails a pod whose type cannot
// be confidential with the fix named.
func TestDecideCreateAsksForTheTypesTEE(t *testing.T) {
	c := confidentialCfg()
	a := Decide(Input{Pod: pod, Now: t0, CacheSynced: true}, c)
	assert.Equal(t, KindCreate, a.Kind)
	assert.Equal(t, provider.TEESEVSNP, a.TEE)

	c.Spec.DefaultType = "plain"
	a = Decide(Input{Pod: pod, Now: t0, CacheSynced: true}, c)
	assert.Equal(t, KindFail, a.Kind)
	assert.Contains(t, a.Message, "--confidential=false")

	a = Decide(Input{Pod: pod, Now: t0, CacheSynced: true}, cfg)
	assert.Equal(t, KindCreate, a.Kind)
	assert.Equal(t, provider.TEENone, a.TEE)
}
