package hypervisor

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/caa-project/caa/pkg/hypervisor/hypervisorpb"
	"github.com/caa-project/caa/pkg/ledger"
	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/pkg/reconcile"
	"github.com/caa-project/caa/pkg/sandbox"
	"github.com/caa-project/caa/test/mocks/cloud"
	"github.com/caa-project/caa/test/mocks/memory"
)

// TestForgedCreateVMFieldsAreRefusedAndNotStored sends what a node's root
// can send on the hypervisor socket: a network namespace path anywhere, of
// any length, and oversized annotations. Each is refused with
// InvalidArgument naming the field, before anything is recorded; a good
// path is stored cleaned.
func TestForgedCreateVMFieldsAreRefusedAndNotStored(t *testing.T) {
	dir, err := os.MkdirTemp("", "hva")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	led, err := ledger.Open(ledger.Options{Path: filepath.Join(dir, "ledger.db"), Node: "node-1", Cluster: "c1", Timeout: time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = led.Close() })
	pods := &onePodCache{pods: []*reconcile.Pod{{UID: "uid-web", Namespace: "shop", Name: "web-0", RuntimeClass: "kata-remote"}}}
	m := sandbox.New(sandbox.Config{
		Ledger: led, Provider: memory.New(cloud.New(cloud.Options{})), Pods: pods,
		Spec:    provider.SpecConfig{DefaultType: "t3.small", DefaultImage: "ami-0123456789abcdef0"},
		Cluster: "c1", Node: "node-1", SocketDir: filepath.Join(dir, "pods"), PodWait: time.Second,
	})
	t.Cleanup(func() { m.Close(); m.Wait() })
	sh := shim{serve(t, m)}
	ctx := context.Background()
	ann := func(extra map[string]string) map[string]string {
		a := map[string]string{sandbox.AnnotationSandboxName: "web-0", sandbox.AnnotationSandboxNamespace: "shop"}
		for k, v := range extra {
			a[k] = v
		}
		return a
	}
	huge := "/var/run/netns/" + strings.Repeat("n", 3<<20)
	for i, tc := range []struct {
		name  string
		netns string
		ann   map[string]string
		says  []string
	}{
		{"a 3 MB path", huge, ann(nil), []string{"networkNamespacePath is 3145743 bytes, the limit is 4096"}},
		{"a path just over the bound", "/run/netns/" + strings.Repeat("n", sandbox.MaxNetNSPath), ann(nil), []string{"networkNamespacePath", "the limit is 4096"}},
		{"no path", "", ann(nil), []string{"networkNamespacePath is empty"}},
		{"a relative path", "netns/cni-1", ann(nil), []string{"networkNamespacePath", "not an absolute path"}},
		{"outside the runtime's directories", "/etc/shadow", ann(nil), []string{"networkNamespacePath", "/var/run/netns or /run/netns"}},
		{"escaping by ..", "/var/run/netns/../../../etc/shadow", ann(nil), []string{"networkNamespacePath", "/var/run/netns or /run/netns"}},
		{"the directory itself", "/run/netns/", ann(nil), []string{"networkNamespacePath", "directly in"}},
		{"below a namespace", "/run/netns/cni-1/x", ann(nil), []string{"networkNamespacePath", "directly in"}},
		{"the worker's own, through /proc", "/proc/1/ns/net", ann(nil), []string{"networkNamespacePath"}},
		{"control characters", "/run/netns/cni\n1", ann(nil), []string{"networkNamespacePath", "control characters"}},
		{"a huge pod name", "/run/netns/cni-1", ann(map[string]string{sandbox.AnnotationSandboxName: strings.Repeat("a", 1<<20)}),
			[]string{sandbox.AnnotationSandboxName, "1048576 bytes, the limit is 4096"}},
		{"a huge image", "/run/netns/cni-1", ann(map[string]string{provider.AnnotationImage: strings.Repeat("i", 1<<20)}),
			[]string{provider.AnnotationImage, "1048576 bytes"}},
		{"a huge machine type", "/run/netns/cni-1", ann(map[string]string{provider.AnnotationMachineType: strings.Repeat("t", 5000)}),
			[]string{provider.AnnotationMachineType, "5000 bytes"}},
		{"a huge TEE", "/run/netns/cni-1", ann(map[string]string{provider.AnnotationTEE: strings.Repeat("t", 5000)}),
			[]string{provider.AnnotationTEE, "5000 bytes"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := fmt.Sprintf("%064x", 100+i)
			c, done := sh.client(t)
			defer done()
			_, err := c.CreateVM(ctx, &hypervisorpb.CreateVMRequest{Id: id, Annotations: tc.ann, NetworkNamespacePath: tc.netns})
			require.Error(t, err)
			assert.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
			msg := status.Convert(err).Message()
			for _, s := range tc.says {
				assert.Contains(t, msg, s)
			}
			assert.Less(t, len(msg), 2*sandbox.MaxNetNSPath, "the refusal does not echo a huge value")
			_, err = led.GetSandbox(id)
			assert.ErrorIs(t, err, ledger.ErrNotFound, "nothing recorded")
		})
	}

	id := fmt.Sprintf("%064x", 1)
	c, done := sh.client(t)
	defer done()
	_, err = c.CreateVM(ctx, &hypervisorpb.CreateVMRequest{Id: id, Annotations: ann(nil), NetworkNamespacePath: "/var/run/netns//cni-1"})
	require.NoError(t, err)
	rec, err := led.GetSandbox(id)
	require.NoError(t, err)
	assert.Equal(t, "/var/run/netns/cni-1", rec.NetNS, "stored cleaned")
}
