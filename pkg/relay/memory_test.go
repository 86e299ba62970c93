package relay_test

import (
	"context"
	"crypto/tls"
	"net"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/containerd/ttrpc"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/internal/agentproto"
	"github.com/caa-project/caa/pkg/relay"
)

// heapInUse is the live heap after a collection.
func heapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}

// A node runs one relay per sandbox, each holding its shim's connection
// open for the sandbox's life (bench S11: under 200 KiB a sandbox in caa
// relay). What the relay itself keeps per idle connection is read as the
// live heap of n relayed connections less that of n direct mutual-TLS
// connections to the same forwarder (the VM's side and the client's TLS
// state are in both). io.Copy's two 32 KiB buffers made it 64 KiB and more;
// 8 KiB buffers, about 30.
func TestRelayHeapPerIdleConnection(t *testing.T) {
	f := newFixture(t)
	vm := boot(t, f, "")
	tc, err := f.ca.ClientTLS()
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const n = 40
	var clients []*ttrpc.Client
	defer func() {
		for _, c := range clients {
			_ = c.Close()
		}
	}()
	open := func(viaRelay bool) {
		for range n {
			var c net.Conn
			if viaRelay {
				sock := filepath.Join(t.TempDir(), "agent.ttrpc")
				r, err := relay.Start(ctx, relay.Config{SocketPath: sock, Addr: vm.Addr().String(), TLS: tc, DialTimeout: 2 * time.Second})
				require.NoError(t, err)
				t.Cleanup(func() { r.Close() })
				c, err = net.Dial("unix", sock)
				require.NoError(t, err)
			} else {
				dc := tc.Clone()
				dc.ServerName = "127.0.0.1"
				c, err = (&tls.Dialer{Config: dc}).DialContext(ctx, "tcp", vm.Addr().String())
				require.NoError(t, err)
			}
			cl := ttrpc.NewClient(c)
			clients = append(clients, cl)
			_, err := agentproto.Check(ctx, cl) // one answer: every buffer on the path is in use
			require.NoError(t, err)
		}
	}
	base := heapInUse()
	open(false)
	direct := heapInUse()
	open(true)
	relayed := heapInUse()
	perDirect := (float64(direct) - float64(base)) / n / 1024
	perRelay := (float64(relayed) - float64(direct)) / n / 1024
	t.Logf("live heap per connection: direct %.1f KiB, relayed %.1f KiB (the relay's own: %.1f KiB)", perDirect, perRelay, perRelay-perDirect)
	require.Less(t, perRelay-perDirect, 40.0, "KiB of live heap the relay keeps per idle connection")
}
