package cluster

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestRequiredVersion(t *testing.T) {
	gomod := []byte(`module example.com/w

go 1.26.0

tool k8s.io/kubernetes/cmd/kube-apiserver

require k8s.io/single v1.2.3

require (
	k8s.io/api v0.37.2 // indirect
	k8s.io/kubernetes v1.37.2 // indirect
)

replace k8s.io/api => k8s.io/api v0.37.2
`)
	for path, want := range map[string]string{
		"k8s.io/kubernetes": "v1.37.2",
		"k8s.io/single":     "v1.2.3",
		"k8s.io/api":        "v0.37.2",
		"k8s.io/missing":    "",
	} {
		if got := requiredVersion(gomod, path); got != want {
			t.Errorf("requiredVersion(%s) = %q, want %q", path, got, want)
		}
	}
}

func TestKubeVersionLDFlags(t *testing.T) {
	flags := kubeVersionLDFlags("v1.37.2")
	for _, want := range []string{"version.gitVersion=v1.37.2", "version.gitMajor=1", "version.gitMinor=37"} {
		if !strings.Contains(flags, want) {
			t.Errorf("ldflags %q lack %q", flags, want)
		}
	}
}

// TestWrapperPins reads the real wrapper modules: the versions the harness
// names its cache entries after must be the ones the issue pinned.
func TestWrapperPins(t *testing.T) {
	tools, err := toolsDir()
	if err != nil {
		t.Fatal(err)
	}
	for _, pin := range []struct {
		c    component
		want string
	}{
		{etcdComponent, "v3.7.3"},
		{apiserverComponent, "v1.37.2"},
		{kubeComponent("kube-controller-manager"), "v1.37.2"},
		{kubeComponent("kube-scheduler"), "v1.37.2"},
		{kubeComponent("kubectl"), "v1.37.2"},
		{kwokComponent, "v0.8.0"},
	} {
		version, key, err := pin.c.identity(filepath.Join(tools, pin.c.module))
		if err != nil {
			t.Fatal(err)
		}
		if version != pin.want || len(key) != 12 {
			t.Errorf("%s: version %q key %q, want %s and a 12-digit key", pin.c.name, version, key, pin.want)
		}
	}
}

func TestSelectedBinaries(t *testing.T) {
	for _, tt := range []struct {
		only    string
		want    []string // nil: every binary
		wantErr string
	}{
		{"", nil, ""},
		{"  ", nil, ""},
		{"etcd,kube-apiserver", []string{"etcd", "kube-apiserver"}, ""},
		{" kwok , kubectl,", []string{"kubectl", "kwok"}, ""},
		{"etcd,apiserver", nil, `no binary named "apiserver" (known: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, kwok)`},
	} {
		got, err := selected(tt.only)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("selected(%q) error %v, want one containing %q", tt.only, err, tt.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("selected(%q): %v", tt.only, err)
			continue
		}
		var names []string
		for _, tg := range (&Binaries{}).targets() {
			if got[tg.c.name] {
				names = append(names, tg.c.name)
			}
		}
		if (got == nil) != (tt.want == nil) || strings.Join(names, ",") != strings.Join(tt.want, ",") {
			t.Errorf("selected(%q) = %v, want %v", tt.only, got, tt.want)
		}
	}
}

func TestLockFileExcludesAndHonoursContext(t *testing.T) {
	path := filepath.Join(t.TempDir(), "lock")
	unlock, err := lockFile(t.Context(), path, func(string) { t.Error("first lock waited") })
	if err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	var holder string
	if _, err := lockFile(ctx, path, func(h string) { holder = h }); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("second lock while held: %v, want deadline exceeded", err)
	}
	if !strings.HasPrefix(holder, "pid ") {
		t.Errorf("waiting told holder %q, want a pid", holder)
	}

	unlock()
	unlock2, err := lockFile(t.Context(), path, func(string) { t.Error("lock waited after unlock") })
	if err != nil {
		t.Fatal(err)
	}
	unlock2()
}

// TestNodeWrapperPins: the node's programs are named after the versions
// the issue pinned, and runc alone is built with cgo and seccomp.
func TestNodeWrapperPins(t *testing.T) {
	tools, err := toolsDir()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"containerd": "v2.4.2", "ctr": "v2.4.2", "containerd-shim-runc-v2": "v2.4.2", "runc": "v1.5.3",
		"bridge": "v1.10.0", "host-local": "v1.10.0", "loopback": "v1.10.0", "portmap": "v1.10.0",
		"crictl": "v1.37.0", "kubelet": "v1.37.2",
	}
	targets := (&NodeBinaries{}).nodeTargets()
	if len(targets) != len(want) {
		t.Fatalf("%d node targets, want %d", len(targets), len(want))
	}
	for _, tg := range targets {
		version, _, err := tg.c.identity(filepath.Join(tools, tg.c.module))
		if err != nil {
			t.Fatal(err)
		}
		if version != want[tg.c.name] {
			t.Errorf("%s: version %q, want %q", tg.c.name, version, want[tg.c.name])
		}
		if cgo := tg.c.name == "runc"; tg.c.cgo != cgo || (tg.c.tags == "seccomp") != cgo {
			t.Errorf("%s: cgo %t tags %q", tg.c.name, tg.c.cgo, tg.c.tags)
		}
	}
}
