package adaptorvm

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// Where the adaptor and kata keep their state on a node (confirmed in
// their sources; see docs/design.md).
const (
	// DefaultPodsDir is the adaptor's pods directory: one directory per
	// sandbox it created, named by the sandbox id, holding apf.json (the
	// forwarder's configuration it also sent to the VM). It is on /run, so
	// a reboot empties it.
	DefaultPodsDir = "/run/peerpod/pods"
	// DefaultKataDir is where kata's runtime keeps one directory per
	// sandbox that exists on the node, named by its id.
	DefaultKataDir = "/run/vc/sbs"
	// apfFile is the adaptor's record of a sandbox in its directory.
	apfFile = "apf.json"
	// maxAPF bounds what is read of one apf.json.
	maxAPF = 1 << 20
)

// Sandbox is the adaptor's record of one sandbox it created on this node.
type Sandbox struct {
	ID        string `json:"id"`
	Namespace string `json:"namespace"`
	Pod       string `json:"pod"`
}

// apf is the part of the adaptor's apf.json caa reads: the pod's name and
// namespace. The file also holds the VM's TLS key; those fields are never
// decoded, kept or printed.
type apf struct {
	PodNamespace string `json:"pod-namespace"`
	PodName      string `json:"pod-name"`
}

// ReadSandboxes reads the adaptor's pods directory. A missing directory is
// no sandbox (the adaptor never ran here since the last boot), and so is a
// directory without apf.json (caa's own sandboxes in the kata mode share
// the directory). An apf.json that cannot be read or names no pod is
// skipped and returned among the problems, which say which file and why;
// it ties no VM.
func ReadSandboxes(dir string) ([]Sandbox, []error, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("reading the adaptor's pods directory %s: %w", dir, err)
	}
	var out []Sandbox
	var problems []error
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		path := filepath.Join(dir, e.Name(), apfFile)
		sb, err := readAPF(path)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			problems = append(problems, err)
			continue
		}
		sb.ID = e.Name()
		out = append(out, sb)
	}
	return out, problems, nil
}

func readAPF(path string) (Sandbox, error) {
	f, err := os.Open(path)
	if err != nil {
		return Sandbox{}, fmt.Errorf("adaptor sandbox record %s: %w", path, err)
	}
	defer f.Close()
	var a apf
	if err := json.NewDecoder(io.LimitReader(f, maxAPF)).Decode(&a); err != nil {
		return Sandbox{}, fmt.Errorf("adaptor sandbox record %s: not the adaptor's JSON: %w", path, err)
	}
	if a.PodName == "" || a.PodNamespace == "" {
		return Sandbox{}, fmt.Errorf("adaptor sandbox record %s: names no pod (pod-name and pod-namespace must both be set)", path)
	}
	return Sandbox{Namespace: a.PodNamespace, Pod: a.PodName}, nil
}

// KataSandboxes returns the ids of the sandboxes kata's runtime has on
// this node: the names of the directories in dir. A missing directory is
// none, and seen is false (kata has run no sandbox since the boot, or the
// directory is not mounted into caa's pod: the caller says so). Any other
// error is returned: without this read no VM may be judged dead.
func KataSandboxes(dir string) (ids map[string]bool, seen bool, err error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return map[string]bool{}, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("reading kata's sandbox directory %s: %w", dir, err)
	}
	out := make(map[string]bool, len(entries))
	for _, e := range entries {
		if e.IsDir() {
			out[e.Name()] = true
		}
	}
	return out, true, nil
}
