package daemon

import (
	"fmt"
	"slices"
	"strings"

	"github.com/caa-project/caa/internal/cli"
	"github.com/caa-project/caa/internal/clouds"
	"github.com/caa-project/caa/pkg/provider"
)

// The confidential preflight: with --confidential on (the default) every
// type a pod can get without naming one must be able to run a confidential
// VM, else caa refuses to start, naming the flag and the fix. It reads the
// cloud's compiled table of TEEs per type (no cloud call), so it runs with
// the other flag checks, before anything else: a node never runs a caa
// whose default VM would be refused, or worse, made ordinary. The image is
// the cloud's to judge: it refuses a confidential VM from an image that
// cannot boot one at create (the pod's event names the cloud's message).

// confidentialMode names the node's setting for logs and /status.
func (f *Options) confidentialMode() string {
	if f.confidential {
		return "on"
	}
	return "off (--confidential=false)"
}

// checkConfidential refuses a default type, --instance-types entries and
// --allowed-types entries that cannot run a confidential VM, when
// --confidential is on.
func (f *Options) checkConfidential() error {
	if !f.confidential {
		return nil
	}
	c, err := clouds.Find(f.clouds, f.providerName)
	if err != nil || c.TEEs == nil {
		return nil // the provider's own error is reported on its own
	}
	capable := func(name string) bool { return len(c.TEEs(name)) > 0 }
	var errs []error
	if c.Configured != nil {
		if def := c.Configured().InstanceType; def != "" && !capable(def) {
			errs = append(errs, fmt.Errorf("%s %s cannot run %s; use %s or set --confidential=false to run ordinary VMs",
				c.TypeFlag, def, teesOffered(c), suggestType(c, def)))
		}
	}
	types, _ := f.types()
	var bad []string
	for _, t := range types {
		if !capable(t.Name) {
			bad = append(bad, t.Name)
		}
	}
	if len(bad) > 0 {
		errs = append(errs, fmt.Errorf("--instance-types lists %s, which cannot run %s; list only confidential-capable types (such as %s) "+
			"or set --confidential=false", strings.Join(bad, ", "), teesOffered(c), capableExamples(c)))
	}
	bad = nil
	for _, name := range f.allowedTypes {
		if !capable(name) {
			bad = append(bad, name)
		}
	}
	if len(bad) > 0 {
		errs = append(errs, fmt.Errorf("--allowed-types lists %s, which cannot run %s; allow only confidential-capable types (such as %s) "+
			"or set --confidential=false", strings.Join(bad, ", "), teesOffered(c), capableExamples(c)))
	}
	return cli.JoinLine(errs)
}

// teesOffered names the TEEs the cloud's table offers: "AMD SEV-SNP",
// "AMD SEV-SNP or Intel TDX".
func teesOffered(c *clouds.Cloud) string {
	var names []string
	if c.Types != nil {
		for _, t := range c.Types() {
			for _, tee := range c.TEEs(t.Name) {
				if !slices.Contains(names, tee.Long()) {
					names = append(names, tee.Long())
				}
			}
		}
	}
	if len(names) == 0 {
		return "a confidential VM"
	}
	return "a confidential VM (" + strings.Join(names, " or ") + ")"
}

// suggestType is the first confidential-capable type of the cloud's table
// (which lists the usual peer-pod types first) at least as large as the
// type named (when the table knows its size), else the first capable one.
func suggestType(c *clouds.Cloud, name string) string {
	if c.Types == nil {
		return "a confidential-capable type"
	}
	table := c.Types()
	var want provider.InstanceType
	if i := slices.IndexFunc(table, func(t provider.InstanceType) bool { return t.Name == name }); i >= 0 {
		want = table[i]
	}
	for _, t := range table {
		if len(c.TEEs(t.Name)) > 0 && t.GPUs == 0 && t.VCPUs >= want.VCPUs && t.MemoryMiB >= want.MemoryMiB {
			return t.Name
		}
	}
	if want.Name != "" {
		return suggestType(c, "")
	}
	return "a confidential-capable type"
}

// capableExamples names up to three confidential-capable types of the
// cloud's table.
func capableExamples(c *clouds.Cloud) string {
	var out []string
	if c.Types != nil {
		for _, t := range c.Types() {
			if len(c.TEEs(t.Name)) > 0 && t.GPUs == 0 && len(out) < 3 {
				out = append(out, t.Name)
			}
		}
	}
	if len(out) == 0 {
		return "the cloud's confidential types"
	}
	return strings.Join(out, ", ")
}
