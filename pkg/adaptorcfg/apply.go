package adaptorcfg

import (
	"fmt"
	"os"
	"regexp"
	"strings"

	"github.com/spf13/pflag"
)

// Applied is what Apply did with one setting.
type Applied struct {
	Setting
	// Kept is non-empty when caa's own setting was given and wins: it says
	// which (the flag, or the environment variable).
	Kept string
}

func (a Applied) String() string {
	target := "--" + a.Flag
	if a.Env != "" {
		target = "$" + a.Env
	}
	value := a.Value
	if a.Secret {
		value = "(secret)"
	}
	from := a.Key
	if a.Default {
		from += " absent: upstream's default"
	}
	if a.Kept != "" {
		return fmt.Sprintf("%s kept, given as %s (%s=%s not applied)", target, a.Kept, from, value)
	}
	return fmt.Sprintf("%s=%s (from %s)", target, value, from)
}

// ApplyDirs reads upstream's settings from dirs (ReadDirs), maps them
// (Map), keeps the settings keep accepts (all when keep is nil) and
// applies those to fs and the process environment (Apply). It is what
// --adaptor-config-dir does for `caa run`, which keeps every setting, and
// for `caa cluster`, which keeps those it has flags for.
func ApplyDirs(fs *pflag.FlagSet, dirs []string, keep func(Setting) bool) ([]Applied, error) {
	keys, err := ReadDirs(dirs...)
	if err != nil {
		return nil, err
	}
	r := Map(keys)
	if keep != nil {
		kept := r.Settings[:0:0]
		for _, s := range r.Settings {
			if keep(s) {
				kept = append(kept, s)
			}
		}
		r.Settings = kept
	}
	return Apply(fs, r, os.Getenv, os.Setenv)
}

// envClause finds the environment variables a flag's help names: caa's
// flags say "(env CAA_X)" or "(env CAA_X, then X)".
var (
	envClause = regexp.MustCompile(`\(env ([^)]*)\)`)
	envName   = regexp.MustCompile(`\b[A-Z][A-Z0-9_]*[A-Z0-9]\b`)
)

// Apply sets each mapped flag on fs, and each credential variable through
// setenv, unless caa's own setting was given: a flag on the command line,
// or an environment variable the flag reads (named in its help), or the
// credential variable already set. caa's own settings win, so a deployment
// can override one key without editing the adaptor's ConfigMap. A mapping
// to a flag fs does not have is an error naming the key.
func Apply(fs *pflag.FlagSet, r Result, getenv func(string) string, setenv func(k, v string) error) ([]Applied, error) {
	if err := r.Err(); err != nil {
		return nil, err
	}
	// Decide everything first, so a refused mapping changes nothing.
	var out []Applied
	var problems []string
	for _, s := range r.Settings {
		a := Applied{Setting: s}
		switch {
		case s.Env != "":
			if getenv(s.Env) != "" {
				a.Kept = "$" + s.Env
			}
		case fs.Lookup(s.Flag) == nil:
			problems = append(problems, fmt.Sprintf("%s maps to --%s, which this caa has not got: %v", s.Key, s.Flag, ErrNoFlag))
			continue
		default:
			a.Kept = given(fs.Lookup(s.Flag), getenv)
		}
		out = append(out, a)
	}
	if len(problems) > 0 {
		return nil, fmt.Errorf("adaptor settings refused: %s", strings.Join(problems, "; "))
	}
	for _, a := range out {
		if a.Kept != "" {
			continue
		}
		var err error
		if a.Env != "" {
			err = setenv(a.Env, a.Value)
		} else {
			err = fs.Set(a.Flag, a.Value)
		}
		if err != nil {
			value := a.Value
			if a.Secret {
				value = "(secret)"
			}
			problems = append(problems, fmt.Sprintf("%s=%s: %v", a.Key, value, err))
		}
	}
	if len(problems) > 0 {
		return nil, fmt.Errorf("adaptor settings refused: %s", strings.Join(problems, "; "))
	}
	return out, nil
}

// given says how caa's own setting of f was given, or "" when it was not:
// on the command line, or in a variable its help names.
func given(f *pflag.Flag, getenv func(string) string) string {
	if f.Changed {
		return "--" + f.Name
	}
	for _, m := range envClause.FindAllStringSubmatch(f.Usage, -1) {
		for _, name := range envName.FindAllString(m[1], -1) {
			if getenv(name) != "" {
				return "$" + name
			}
		}
	}
	return ""
}
