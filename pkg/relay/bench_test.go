package relay_test

import (
	"context"
	"crypto/tls"
	"net"
	"testing"
	"time"

	"github.com/containerd/ttrpc"

	"github.com/caa-project/caa/internal/agentproto"
	"github.com/caa-project/caa/pkg/relay"
)

// The relay's cost is read as a ratio: a health check through the agent
// socket and the relay against the same check made straight over mutual TLS
// to the forwarder (the latency-only bound). Run:
//
//	go test -run '^$' -bench Check -benchtime 2000x ./pkg/relay
func benchClient(b *testing.B, viaRelay bool) *ttrpc.Client {
	b.Helper()
	f := newFixture(b)
	vm := boot(b, f, "")
	tc, err := f.ca.ClientTLS()
	if err != nil {
		b.Fatal(err)
	}
	var c net.Conn
	if viaRelay {
		sock := b.TempDir() + "/agent.ttrpc"
		r, err := relay.Start(context.Background(), relay.Config{SocketPath: sock, Addr: vm.Addr().String(), TLS: tc})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { r.Close() })
		c, err = net.Dial("unix", sock)
		if err != nil {
			b.Fatal(err)
		}
	} else {
		tc.ServerName = "127.0.0.1"
		c, err = (&tls.Dialer{Config: tc}).DialContext(context.Background(), "tcp", vm.Addr().String())
		if err != nil {
			b.Fatal(err)
		}
	}
	cl := ttrpc.NewClient(c)
	b.Cleanup(func() { cl.Close() })
	return cl
}

func benchCheck(b *testing.B, viaRelay bool) {
	cl := benchClient(b, viaRelay)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := agentproto.Check(ctx, cl); err != nil { // connection set up outside the timing
		b.Fatal(err)
	}
	b.ResetTimer()
	for b.Loop() {
		if _, err := agentproto.Check(ctx, cl); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkCheckDirect(b *testing.B)   { benchCheck(b, false) }
func BenchmarkCheckViaRelay(b *testing.B) { benchCheck(b, true) }
