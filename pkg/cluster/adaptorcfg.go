package cluster

import (
	"os"

	"github.com/spf13/pflag"

	"github.com/caa-project/caa/internal/cli"
	"github.com/caa-project/caa/pkg/adaptorcfg"
	"github.com/caa-project/caa/pkg/provider"
)

// addAdaptorConfigFlag gives `caa cluster` the --adaptor-config-dir of
// `caa run`: upstream's peer-pods-cm (and peer-pods-secret) mounted as
// directories. The cluster scope takes from them what it has flags for
// (the cloud, its region and account, its credentials); the node's
// settings among them (pod VM sizes, images, ...) are `caa run`'s and
// are left alone here. Unknown keys are refused as `caa run` refuses them,
// so both read the same ConfigMap the same way.
func (f *Options) addAdaptorConfigFlag(fs *pflag.FlagSet) {
	fs.StringSliceVar(&f.adaptorDirs, "adaptor-config-dir", provider.SplitList(os.Getenv("CAA_ADAPTOR_CONFIG_DIR")),
		"directories of upstream cloud-api-adaptor's settings (the ConfigMap peer-pods-cm and the Secret peer-pods-secret mounted "+
			"as volumes), as caa run reads them: the cloud's keys set this command's flags, the node's keys are ignored, caa's own "+
			"flags and variables win (env CAA_ADAPTOR_CONFIG_DIR, comma-separated)")
}

// applyAdaptorConfig sets the flags the --adaptor-config-dir keys map to,
// among those `caa cluster` has.
func (f *Options) applyAdaptorConfig() ([]adaptorcfg.Applied, error) {
	if len(f.adaptorDirs) == 0 {
		return nil, nil
	}
	applied, err := adaptorcfg.ApplyDirs(f.flags, f.adaptorDirs, func(s adaptorcfg.Setting) bool {
		return s.Env != "" || f.flags.Lookup(s.Flag) != nil
	})
	if err != nil {
		return nil, cli.UsageError{Err: err}
	}
	return applied, nil
}
