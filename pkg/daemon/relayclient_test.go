package daemon

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/pkg/pki"
	"github.com/caa-project/caa/pkg/relayd"
	"github.com/caa-project/caa/pkg/relayd/relaydtest"
	"github.com/caa-project/caa/test/lifetest"
)

// TestRelayDaemonGetsRenewedClientCertificates runs `caa relay` (its Run,
// with its own directory, as deploy/components/relay mounts it: not the
// agent CA's) beside caa's side of the client file. Once the clock of the
// CA and of the VMs passes the client certificates' life, a new sandbox's
// relay still reaches its VM: caa renewed the certificates and wrote them
// where the relay daemon reads them. Written to the CA's directory (the
// bug), the daemon kept the first ones and every new sandbox failed.
func TestRelayDaemonGetsRenewedClientCertificates(t *testing.T) {
	clock := lifetest.NewClock(time.Now()) // the time of caa's CA and of the VMs' forwarders
	caDir := t.TempDir()
	ca, err := pki.Load(caDir, pki.Options{ClientTTL: pki.MinClientTTL, Now: clock.Now})
	require.NoError(t, err)
	relayDir, err := os.MkdirTemp("", "rly") // socket paths are capped at 108 bytes
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(relayDir) })
	control := filepath.Join(relayDir, "relay", "relay.sock")

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	log := slog.New(slog.DiscardHandler)
	require.NoError(t, startRelayClientFile(ctx, log, ca, control, 5*time.Millisecond))

	opts := relayd.NewOptions("test")
	fs := pflag.NewFlagSet("relay", pflag.ContinueOnError)
	opts.AddFlags(fs)
	require.NoError(t, fs.Parse([]string{"--socket", control, "--refresh", "5ms"}))
	relayCtx, stopRelay := context.WithCancel(ctx)
	relayDone := make(chan error, 1)
	go func() { relayDone <- relayd.Run(relayCtx, opts, os.Stderr) }()
	t.Cleanup(func() { stopRelay(); <-relayDone })

	fw := relaydtest.StartForwarderAt(t, ca, clock.Now, "podvm-a")
	client := &relayd.Client{Socket: control}
	reach := func(sandbox string) error {
		cctx, ccancel := context.WithTimeout(ctx, 2*time.Second)
		defer ccancel()
		if _, err := client.Serve(cctx, sandbox, filepath.Join(relayDir, "pods", sandbox, "agent.ttrpc"), fw.Addr(), "podvm-a"); err != nil {
			return err
		}
		return client.Reach(cctx, sandbox)
	}
	require.Eventually(t, func() bool { return reach("sb1") == nil }, 20*time.Second, 20*time.Millisecond,
		"the first sandbox reaches its VM")

	clock.Advance(pki.MinClientTTL + time.Minute) // the first client certificates have expired
	var last error
	ok := assert.Eventually(t, func() bool { last = reach("sb2"); return last == nil }, 20*time.Second, 50*time.Millisecond,
		"a sandbox started after the first certificates expired reaches its VM")
	if !ok {
		t.Logf("last error: %v", last)
	}
	assert.Positive(t, ca.Generation(), "the client certificates were renewed")
	_, err = os.Stat(filepath.Join(caDir, relayd.ClientFile))
	assert.ErrorIs(t, err, os.ErrNotExist, "nothing written for the relay in the CA's directory")
}
