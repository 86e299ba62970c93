package daemon

import (
	"io"
	"os"

	"github.com/spf13/pflag"

	"github.com/caa-project/caa/internal/cli"
	"github.com/caa-project/caa/pkg/adaptorcfg"
	"github.com/caa-project/caa/pkg/provider"
)

// addAdaptorConfigFlag gives `caa run` --adaptor-config-dir: upstream's
// peer-pods-cm (and peer-pods-secret) mounted as directories, each key
// mapped to caa's flag (pkg/adaptorcfg; README, "Coming from
// cloud-api-adaptor"). A directory and not the environment, because in a
// directory every file is a key of the ConfigMap, so an unknown or
// misspelt key can be reported by name; envFrom would mix the keys into
// the container's own environment.
func (f *Options) addAdaptorConfigFlag(fs *pflag.FlagSet) {
	fs.StringSliceVar(&f.adaptorDirs, "adaptor-config-dir", provider.SplitList(os.Getenv("CAA_ADAPTOR_CONFIG_DIR")),
		"directories of upstream cloud-api-adaptor's settings: the ConfigMap peer-pods-cm and the Secret peer-pods-secret "+
			"mounted as volumes; each key becomes caa's flag, unknown and unsupported keys are refused by name, and caa's own "+
			"flags and variables win (env CAA_ADAPTOR_CONFIG_DIR, comma-separated)")
}

// applyAdaptorConfig sets the flags the --adaptor-config-dir keys map to.
// caa's own flags and CAA_* variables win over the mapping. A key refused
// stops caa before it starts, naming it; the mapping applied is logged
// once the flags check out.
func (f *Options) applyAdaptorConfig(stderr io.Writer) error {
	if len(f.adaptorDirs) == 0 {
		return nil
	}
	applied, err := adaptorcfg.ApplyDirs(f.flags, f.adaptorDirs, nil)
	if err != nil {
		return cli.UsageError{Err: err}
	}
	if f.check() != nil {
		return nil
	}
	log, err := cli.NewLogger(stderr, f.logFormat, f.logLevel)
	if err != nil {
		return nil
	}
	for _, a := range applied {
		attrs := []any{"key", a.Key, "setting", a.String()}
		if a.Flag != "" && !a.Secret {
			// What the flag holds now, read back.
			attrs = append(attrs, "flag", "--"+a.Flag, "value", f.flags.Lookup(a.Flag).Value.String())
		}
		log.Info("adaptor setting", attrs...)
	}
	return nil
}
