package main

import (
	"os"

	"github.com/spf13/cobra"

	"github.com/caa-project/caa/pkg/adaptorcfg"
	"github.com/caa-project/caa/pkg/provider"
)

// withAdaptorConfig gives `caa run` --adaptor-config-dir: upstream's
// peer-pods-cm (and peer-pods-secret) mounted as directories, each key
// mapped to caa's flag (pkg/adaptorcfg; README, "Coming from
// cloud-api-adaptor"). A directory and not the environment, because in a
// directory every file is a key of the ConfigMap, so an unknown or
// misspelt key can be reported by name; envFrom would mix the keys into
// the container's own environment. caa's own flags and CAA_* variables
// win over the mapping. A key refused stops caa before it starts, naming
// it; the mapping applied is logged once the flags check out.
func withAdaptorConfig(cmd *cobra.Command, f *runFlags) {
	fs := cmd.Flags()
	dirs := fs.StringSlice("adaptor-config-dir", provider.SplitList(os.Getenv("CAA_ADAPTOR_CONFIG_DIR")),
		"directories of upstream cloud-api-adaptor's settings: the ConfigMap peer-pods-cm and the Secret peer-pods-secret "+
			"mounted as volumes; each key becomes caa's flag, unknown and unsupported keys are refused by name, and caa's own "+
			"flags and variables win (env CAA_ADAPTOR_CONFIG_DIR, comma-separated)")
	run := cmd.RunE
	cmd.RunE = func(c *cobra.Command, args []string) error {
		if len(*dirs) == 0 {
			return run(c, args)
		}
		keys, err := adaptorcfg.ReadDirs(*dirs...)
		if err != nil {
			return usageError{err}
		}
		applied, err := adaptorcfg.Apply(fs, adaptorcfg.Map(keys), os.Getenv, os.Setenv)
		if err != nil {
			return usageError{err}
		}
		if f.check() == nil {
			if log, err := newLogger(c.ErrOrStderr(), f.logFormat, f.logLevel); err == nil {
				for _, a := range applied {
					attrs := []any{"key", a.Key, "setting", a.String()}
					if a.Flag != "" && !a.Secret {
						// What the flag holds now, read back.
						attrs = append(attrs, "flag", "--"+a.Flag, "value", fs.Lookup(a.Flag).Value.String())
					}
					log.Info("adaptor setting", attrs...)
				}
			}
		}
		return run(c, args)
	}
}
