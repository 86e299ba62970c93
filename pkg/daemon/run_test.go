package daemon

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/internal/clouds"
	"github.com/caa-project/caa/pkg/health"
	"github.com/caa-project/caa/pkg/ledger"
	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/pkg/reconcile"
)

func TestRunFlagsCheck(t *testing.T) {
	good := Options{clouds: clouds.Compiled(), node: "n", providerName: "aws", runtimeClasses: []string{"kata-remote"}, resync: time.Minute,
		gcGrace: time.Minute, confirmMissing: time.Second, shutdownGrace: time.Second, bootTimeout: time.Minute, concurrency: 1, createRate: 1,
		createBurst: 1, logFormat: "json", logLevel: "info", instanceTypes: "small:2:4096, large:8:32768",
		retention: time.Hour, cloudTimeout: time.Minute, readRate: 1, readBurst: 1}
	require.NoError(t, good.check())

	tests := []struct {
		name string
		mod  func(*Options)
		want string
	}{
		{"no node", func(f *Options) { f.node = "" }, "NODE_NAME"},
		{"bad provider", func(f *Options) { f.providerName = "gcp" }, `--provider "gcp"`},
		{"no runtime class", func(f *Options) { f.runtimeClasses = nil }, "--runtime-class"},
		{"zero resync", func(f *Options) { f.resync = 0 }, "--resync"},
		{"zero boot timeout", func(f *Options) { f.bootTimeout = 0 }, "--boot-timeout"},
		{"zero retention", func(f *Options) { f.retention = 0 }, "--history-retention"},
		{"negative audit", func(f *Options) { f.audit = -time.Second }, "--audit-interval"},
		{"zero read rate", func(f *Options) { f.readRate = 0 }, "--read-rate"},
		{"zero cloud timeout", func(f *Options) { f.cloudTimeout = 0 }, "--cloud-timeout"},
		{"zero rate", func(f *Options) { f.createRate = 0 }, "--create-rate"},
		{"bad types", func(f *Options) { f.instanceTypes = "small:two:4096" }, `"small:two:4096"`},
		{"bad log format", func(f *Options) { f.logFormat = "xml" }, "--log-format"},
		{"bad log level", func(f *Options) { f.logLevel = "loud" }, "--log-level"},
		{"bad adaptor mode", func(f *Options) { f.av.mode = "delete" }, `--adaptor-vms="delete"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := good
			tc.mod(&f)
			assert.ErrorContains(t, f.check(), tc.want)
		})
	}
}

func TestInstanceTypesNameTheCloudsTypes(t *testing.T) {
	f := Options{clouds: clouds.Compiled(), providerName: "aws", instanceTypes: "m6a.large, g5.xlarge, small:2:4096"}
	types, err := f.types()
	require.NoError(t, err)
	assert.Equal(t, []provider.InstanceType{{Name: "m6a.large", VCPUs: 2, MemoryMiB: 8192},
		{Name: "g5.xlarge", VCPUs: 4, MemoryMiB: 16384, GPUs: 1, GPUModel: "a10g"}, {Name: "small", VCPUs: 2, MemoryMiB: 4096}}, types)
	f.instanceTypes = "bx2-2x8"
	_, err = f.types()
	assert.ErrorContains(t, err, `--instance-types: caa does not know the size of "bx2-2x8"`, "an IBM profile is not an EC2 type")
	f.providerName = "ibmcloud"
	_, err = f.types()
	require.NoError(t, err)
	for _, bad := range []string{"small:0:1", ":1:1", "a:1:b", "a:1:1:1"} {
		f.instanceTypes = bad
		_, err := f.types()
		assert.ErrorContains(t, err, "--instance-types", bad)
	}
}

// TestCloudTypeTablesAreWellFormed checks each cloud's table: positive
// sizes, unique names, a GPU model exactly when there are GPUs, and the
// cloud's default type among them.
func TestCloudTypeTablesAreWellFormed(t *testing.T) {
	defaults := map[string]string{"aws": "m6a.large", "azure": "Standard_DC2as_v5", "ibmcloud": "bx3dc-2x10"}
	for _, c := range clouds.Compiled() {
		seen := map[string]bool{}
		for _, ty := range c.Types() {
			assert.True(t, ty.VCPUs > 0 && ty.MemoryMiB > 0, "%s %s", c.Name, ty)
			assert.Equal(t, ty.GPUs > 0, ty.GPUModel != "", "%s %s", c.Name, ty)
			assert.False(t, seen[ty.Name], "%s lists %s twice", c.Name, ty.Name)
			seen[ty.Name] = true
		}
		assert.True(t, seen[defaults[c.Name]], "%s: the table lacks %s", c.Name, defaults[c.Name])
	}
}

func TestToHealthPass(t *testing.T) {
	res := reconcile.PassResult{
		Actions: map[reconcile.Kind]int{reconcile.KindCreate: 2},
		Pending: []reconcile.PodStatus{{UID: "u", Pod: "ns/a", Reason: "Creating"}},
		Failed:  []reconcile.PodStatus{{UID: "v", Pod: "ns/b", Reason: "InvalidSpec"}},
		Records: map[ledger.Phase]int{ledger.PhaseRunning: 3},
		Err:     errors.Join(reconcile.ErrDaemon, provider.ErrAuth),
	}
	p := toHealthPass(res, true)
	assert.Equal(t, 2, p.Actions["Create"])
	assert.Equal(t, "ns/a", p.Pending[0].Pod)
	assert.Equal(t, "InvalidSpec", p.Failed[0].Reason)
	assert.Equal(t, 3, p.Records[ledger.PhaseRunning])
	assert.NotEmpty(t, p.Blocked, "a daemon-level error blocks readiness")
	assert.Nil(t, p.VMs, "a pass without records keeps the last list")

	// Each recorded VM is reported with its confidential type; an
	// ordinary VM names the opt-out on a node that made it.
	res.VMs = []reconcile.RecordedVM{{Pod: "ns/a", ID: "i-1", TEE: provider.TEESEVSNP}, {Pod: "ns/b", ID: "i-2"}}
	assert.Equal(t, []health.VMNote{{Pod: "ns/a", ID: "i-1", Confidential: "sev-snp"}, {Pod: "ns/b", ID: "i-2", Confidential: "none"}},
		toHealthPass(res, true).VMs)
	assert.Equal(t, "off (--confidential=false)", toHealthPass(res, false).VMs[1].Confidential)
}
