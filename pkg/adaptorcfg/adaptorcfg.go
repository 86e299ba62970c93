// Package adaptorcfg reads the settings of upstream's cloud-api-adaptor,
// the ConfigMap peer-pods-cm and the Secret peer-pods-secret, mounted as
// directories (one file per key), and maps each key to caa's own flag. A
// user switching from the adaptor keeps their ConfigMap and Secret.
//
// Nothing is ignored silently: every key is mapped to a flag or to the
// cloud SDK's environment, accepted because its value asks for what caa
// does anyway (reported as such), or reported by name as unknown,
// belonging to another cloud, or unsupported with the value it has (with
// what to change). Any of the last three refuses the whole configuration.
package adaptorcfg

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
)

// Entry is one key as read from a mounted directory.
type Entry struct {
	Value string
	// Path is the key's file, for the keys caa reads as files.
	Path string
	// Dir is the directory it came from, for the messages.
	Dir string
}

// maxValue bounds one key's file: a ConfigMap holds at most 1 MiB in all.
const maxValue = 1 << 20

// ReadDirs reads every key of the given directories (a ConfigMap or Secret
// volume: one regular file per key; the kubelet's ..data links and other
// dot entries are skipped). A key found in two directories is an error.
func ReadDirs(dirs ...string) (map[string]Entry, error) {
	out := map[string]Entry{}
	for _, dir := range dirs {
		ents, err := os.ReadDir(dir)
		if err != nil {
			return nil, fmt.Errorf("adaptor settings: %w", err)
		}
		for _, e := range ents {
			name := e.Name()
			if strings.HasPrefix(name, ".") {
				continue
			}
			path := filepath.Join(dir, name)
			info, err := os.Stat(path) // follows the kubelet's links
			if err != nil {
				return nil, fmt.Errorf("adaptor settings: %w", err)
			}
			if info.IsDir() {
				return nil, fmt.Errorf("adaptor settings: %s is a directory, not a key: give the directory of a mounted ConfigMap or Secret", path)
			}
			if info.Size() > maxValue {
				return nil, fmt.Errorf("adaptor settings: key %s (%s) holds %d bytes, more than a ConfigMap can", name, path, info.Size())
			}
			if prev, ok := out[name]; ok {
				return nil, fmt.Errorf("adaptor settings: key %s is in both %s and %s: keep one", name, prev.Dir, dir)
			}
			b, err := os.ReadFile(path)
			if err != nil {
				return nil, fmt.Errorf("adaptor settings: %w", err)
			}
			out[name] = Entry{Value: strings.TrimSpace(string(b)), Path: path, Dir: dir}
		}
	}
	return out, nil
}

// Setting is a key mapped to caa: a flag's value, or an environment
// variable of the cloud SDK.
type Setting struct {
	Key  string
	Flag string // without "--"; empty when Env is set
	Env  string
	// Value is what the flag or variable gets; for a file key, its path.
	Value string
	// Secret: never print Value (credentials).
	Secret bool
	// Default: the key was absent or empty; Value is upstream's default.
	Default bool
}

// Note is a key that needs nothing from caa, and why.
type Note struct{ Key, Value, Why string }

// Problem is a key caa refuses, by name, with what to do.
type Problem struct{ Key, Value, Why string }

func (p Problem) Error() string {
	if p.Value == "" {
		return fmt.Sprintf("%s: %s", p.Key, p.Why)
	}
	return fmt.Sprintf("%s=%q: %s", p.Key, p.Value, p.Why)
}

// Result is the whole configuration as caa understands it.
type Result struct {
	Cloud    string
	Settings []Setting
	Accepted []Note
	Problems []Problem
}

// Err is nil when every key was understood, else one error naming each
// refused key.
func (r Result) Err() error {
	if len(r.Problems) == 0 {
		return nil
	}
	msgs := make([]string, len(r.Problems))
	for i, p := range r.Problems {
		msgs[i] = p.Error()
	}
	return fmt.Errorf("adaptor settings refused: %s", strings.Join(msgs, "; "))
}

// secretKeys are peer-pods-secret's keys: their values are never shown.
var secretKeys = []string{"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
	"AZURE_CLIENT_ID", "AZURE_CLIENT_SECRET", "AZURE_TENANT_ID", "IBMCLOUD_API_KEY", "IBMCLOUD_IAM_PROFILE_ID"}

// Map maps every key. CLOUD_PROVIDER decides which cloud's keys apply.
func Map(keys map[string]Entry) Result {
	var r Result
	cloud := keys["CLOUD_PROVIDER"].Value
	if !slices.Contains(Clouds, cloud) {
		why := "missing: peer-pods-cm names the cloud in CLOUD_PROVIDER (aws, azure or ibmcloud)"
		if cloud != "" {
			why = "caa runs on aws, azure or ibmcloud"
		}
		r.Problems = append(r.Problems, Problem{Key: "CLOUD_PROVIDER", Value: cloud, Why: why})
		return r
	}
	r.Cloud = cloud
	rules := common(cloud)
	names := make([]string, 0, len(rules)+len(keys))
	for k := range rules {
		names = append(names, k)
	}
	for k := range keys {
		if _, ok := rules[k]; !ok {
			names = append(names, k)
		}
	}
	sort.Strings(names)
	for _, k := range names {
		e, present := keys[k]
		rule, known := rules[k]
		if !known {
			why := "unknown: not a key of upstream's cloud-api-adaptor (misspelt?)"
			if other := cloudOfKey(k); other != "" {
				why = fmt.Sprintf("a key of %s, but CLOUD_PROVIDER is %s", other, cloud)
			}
			r.Problems = append(r.Problems, Problem{Key: k, Value: shown(k, e.Value), Why: why})
			continue
		}
		v := e.Value
		def := false
		if v == "" {
			if rule.def == "" {
				if present && rule.flag == "" && rule.env == "" {
					r.Accepted = append(r.Accepted, Note{Key: k, Why: "empty: nothing asked"})
				}
				continue
			}
			v, def = rule.def, true
		}
		if rule.flag == "" && rule.env == "" {
			if slices.Contains(rule.same, v) {
				r.Accepted = append(r.Accepted, Note{Key: k, Value: v, Why: rule.why})
				continue
			}
			why := "unsupported: " + rule.why
			if len(rule.same) > 0 {
				why += fmt.Sprintf(" (remove the key or set it to %s)", strings.Join(rule.same, " or "))
			} else {
				why += " (remove the key or leave it empty)"
			}
			r.Problems = append(r.Problems, Problem{Key: k, Value: shown(k, v), Why: why})
			continue
		}
		if rule.conv != nil {
			c, err := rule.conv(v)
			if err != nil {
				r.Problems = append(r.Problems, Problem{Key: k, Value: shown(k, v), Why: err.Error()})
				continue
			}
			v = c
		}
		s := Setting{Key: k, Flag: rule.flag, Env: rule.env, Value: v, Default: def, Secret: slices.Contains(secretKeys, k)}
		if rule.file {
			s.Value = e.Path
		}
		r.Settings = append(r.Settings, s)
	}
	r.Settings = append(r.Settings, derived(cloud, r.Settings)...)
	return r
}

// derived are settings caa needs that upstream infers: IBM Cloud's region
// from the zone (us-south-1 is in us-south).
func derived(cloud string, set []Setting) []Setting {
	if cloud != "ibmcloud" {
		return nil
	}
	for _, s := range set {
		if s.Flag == "ibmcloud-zone" {
			if i := strings.LastIndex(s.Value, "-"); i > 0 {
				return []Setting{{Key: "IBMCLOUD_ZONE", Flag: "ibmcloud-region", Value: s.Value[:i]}}
			}
		}
	}
	return nil
}

func shown(key, v string) string {
	if slices.Contains(secretKeys, key) && v != "" {
		return "(secret)"
	}
	return v
}

// ErrNoFlag: the mapping names a flag this caa does not have.
var ErrNoFlag = errors.New("no such flag")
