package realnode

import (
	"context"
	"encoding/json"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestNodeRunsARuncPod checks the node itself, before any kata or kubelet:
// containerd's CRI runs a pod sandbox and a container with runc, the pod
// gets an address of the bridge network, and the pod goes away cleanly.
func TestNodeRunsARuncPod(t *testing.T) {
	n := Start(t, Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	pod := WriteJSON(t, "pod.json", map[string]any{
		"metadata":      map[string]any{"name": "runc-pod", "namespace": "default", "uid": "uid-runc-pod", "attempt": 0},
		"log_directory": t.TempDir(),
		"linux":         map[string]any{},
	})
	ctr := WriteJSON(t, "ctr.json", map[string]any{
		"metadata": map[string]any{"name": "sleeper"},
		"image":    map[string]any{"image": PauseImage},
		"log_path": "sleeper.log",
		"linux":    map[string]any{},
	})
	podID := strings.TrimSpace(must(t)(n.Crictl(ctx, "runp", pod)))
	ctrID := strings.TrimSpace(must(t)(n.Crictl(ctx, "create", podID, ctr, pod)))
	must(t)(n.Crictl(ctx, "start", ctrID))

	var inspect struct {
		Status struct {
			State   string `json:"state"`
			Network struct {
				IP string `json:"ip"`
			} `json:"network"`
		} `json:"status"`
	}
	if err := json.Unmarshal([]byte(must(t)(n.Crictl(ctx, "inspectp", podID))), &inspect); err != nil {
		t.Fatal(err)
	}
	if inspect.Status.State != "SANDBOX_READY" {
		t.Errorf("pod state %q, want SANDBOX_READY", inspect.Status.State)
	}
	ip, err := netip.ParseAddr(inspect.Status.Network.IP)
	if err != nil || !n.Subnet.Contains(ip) {
		t.Errorf("pod IP %q, want one of %s (%v)", inspect.Status.Network.IP, n.Subnet, err)
	}
	state := must(t)(n.Crictl(ctx, "ps", "--id", ctrID, "--output", "json"))
	if !strings.Contains(state, `"CONTAINER_RUNNING"`) {
		t.Errorf("container not running: %s", state)
	}
	must(t)(n.Crictl(ctx, "stopp", podID))
	must(t)(n.Crictl(ctx, "rmp", podID))
	if left := must(t)(n.Crictl(ctx, "pods", "--quiet")); strings.TrimSpace(left) != "" {
		t.Errorf("pods left after rmp: %q", left)
	}
}

// WriteJSON writes v as JSON to a file of t's temporary directory and
// returns its path: crictl's pod and container configs.
func WriteJSON(t testing.TB, name string, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// must fails t on a command's error and returns its output.
func must(t testing.TB) func(string, error) string {
	return func(out string, err error) string {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
}
