package pki_test

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/pkg/pki"
)

// clock is a settable clock for the CA.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time  { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Set(t time.Time) { c.mu.Lock(); defer c.mu.Unlock(); c.t = t }

// clientPair is the first client certificate and key ClientPEM gives: what
// a copy of the relay daemon's file holds.
func clientPair(t *testing.T, ca *pki.CA) tls.Certificate {
	t.Helper()
	certs, keys, _, err := ca.ClientPEM()
	require.NoError(t, err)
	pair, err := tls.X509KeyPair(certs[0], keys[0])
	require.NoError(t, err)
	return pair
}

func leafOf(t *testing.T, c tls.Certificate) *x509.Certificate {
	t.Helper()
	l, err := x509.ParseCertificate(c.Certificate[0])
	require.NoError(t, err)
	return l
}

// TestStaleClientCopyStopsOpeningVMs: a copy of caa's client certificate
// (relay-client.pem) taken days ago no longer opens a VM; the CA-long
// certificates of before opened every VM of the node for ten years.
func TestStaleClientCopyStopsOpeningVMs(t *testing.T) {
	realNow := time.Now()
	clk := &clock{t: realNow.Add(-4 * 24 * time.Hour)} // the copy was taken four days ago
	ca, err := pki.Load(t.TempDir(), pki.Options{Now: clk.Now})
	require.NoError(t, err)
	stale := clientPair(t, ca)
	assert.WithinDuration(t, clk.Now().Add(pki.DefaultClientTTL), leafOf(t, stale).NotAfter, time.Minute,
		"a client certificate lives days, not as long as the CA")

	certPEM, keyPEM, _, err := ca.IssueServer(nil, []string{"podvm-a"}, pki.ServerLifetime)
	require.NoError(t, err)
	cfg, err := ca.ClientTLS()
	require.NoError(t, err)
	cfg.ServerName = "podvm-a"
	cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &stale, nil }
	addr, res := serveOnce(t, certPEM, keyPEM, ca.CertPEM())
	_ = dial(t, addr, cfg)
	require.ErrorContains(t, <-res, "expired", "the VM refuses the stale copy")

	// caa itself, running meanwhile, renewed its certificate: it still gets in.
	clk.Set(realNow)
	own, err := ca.ClientTLS()
	require.NoError(t, err)
	own.ServerName = "podvm-a"
	addr, res = serveOnce(t, certPEM, keyPEM, ca.CertPEM())
	require.NoError(t, dial(t, addr, own))
	require.NoError(t, <-res)
}

// TestClientCertificatesRenewAtHalfLife: RenewClients replaces the client
// certificates once half their life is gone, never before; the handshake
// of caa's own relays and ClientPEM (the relay daemon's file) give the new
// one, and Generation tells the file's keeper to write it.
func TestClientCertificatesRenewAtHalfLife(t *testing.T) {
	realNow := time.Now()
	ttl := 4 * time.Hour
	clk := &clock{t: realNow.Add(-3 * time.Hour)}
	ca, err := pki.Load(t.TempDir(), pki.Options{Now: clk.Now, ClientTTL: ttl})
	require.NoError(t, err)
	first := leafOf(t, clientPair(t, ca))
	require.Equal(t, uint64(0), ca.Generation())

	clk.Set(first.NotAfter.Add(-ttl/2 - time.Minute))
	renewed, err := ca.RenewClients()
	require.NoError(t, err)
	assert.False(t, renewed, "more than half the life left: no renewal")

	clk.Set(realNow) // one hour of life left
	certPEM, keyPEM, _, err := ca.IssueServer(nil, []string{"podvm-a"}, time.Hour)
	require.NoError(t, err)
	cfg, err := ca.ClientTLS() // a config made before the renewal
	require.NoError(t, err)
	cfg.ServerName = "podvm-a"
	var sent *x509.Certificate
	get := cfg.GetClientCertificate
	cfg.GetClientCertificate = func(i *tls.CertificateRequestInfo) (*tls.Certificate, error) {
		c, err := get(i)
		if err == nil {
			sent = leafOf(t, *c)
		}
		return c, err
	}
	addr, res := serveOnce(t, certPEM, keyPEM, ca.CertPEM())
	require.NoError(t, dial(t, addr, cfg))
	require.NoError(t, <-res)
	require.NotNil(t, sent)
	assert.NotEqual(t, first.SerialNumber, sent.SerialNumber, "the handshake renewed the certificate past half its life")
	assert.WithinDuration(t, realNow.Add(ttl), sent.NotAfter, time.Minute)
	assert.Equal(t, uint64(1), ca.Generation())
	assert.Equal(t, sent.SerialNumber, leafOf(t, clientPair(t, ca)).SerialNumber, "the relay daemon's file gets the renewed one")

	renewed, err = ca.RenewClients()
	require.NoError(t, err)
	assert.False(t, renewed, "just renewed")
}

func TestClientTTLBelowMinimumIsRefused(t *testing.T) {
	_, err := pki.Load(t.TempDir(), pki.Options{ClientTTL: time.Minute})
	require.ErrorContains(t, err, "at least 1h")
}

// TestServerCertificateLastsAsLongAsTheCA: a VM cannot renew its server
// certificate, so it is issued until the CA expires (it was a year, and a
// VM older than that went silent).
func TestServerCertificateLastsAsLongAsTheCA(t *testing.T) {
	clk := &clock{t: time.Now().Add(-30 * 24 * time.Hour)} // the CA is a month old
	ca, err := pki.Load(t.TempDir(), pki.Options{Now: clk.Now})
	require.NoError(t, err)
	clk.Set(time.Now())
	certPEM, _, _, err := ca.IssueServer(nil, []string{"podvm-a"}, pki.ServerLifetime)
	require.NoError(t, err)
	blk, _ := pem.Decode(certPEM)
	leaf, err := x509.ParseCertificate(blk.Bytes)
	require.NoError(t, err)
	assert.Equal(t, ca.NotAfter(), leaf.NotAfter, "as long as the CA, and never longer")
	assert.Greater(t, time.Until(leaf.NotAfter), 9*365*24*time.Hour)
}

// TestLostCAWithSandboxesIsRefused: with sandboxes in the ledger whose VMs
// trust the CA, a missing agent-ca.pem is an error naming the file and the
// fix; no new CA is written. Before, a new CA was made silently and every
// such VM refused caa.
func TestLostCAWithSandboxesIsRefused(t *testing.T) {
	dir := t.TempDir()
	_, err := pki.LoadOrCreateCA(dir)
	require.NoError(t, err)
	file := filepath.Join(dir, pki.CurrentFile)
	require.NoError(t, os.Remove(file))

	_, err = pki.Load(dir, pki.Options{InUse: 2})
	require.ErrorIs(t, err, pki.ErrCALost)
	assert.ErrorContains(t, err, file)
	assert.ErrorContains(t, err, "restore")
	assert.ErrorContains(t, err, "--agent-ca-replace-lost")
	assert.NoFileExists(t, file, "no CA was made in its place")

	ca, err := pki.Load(dir, pki.Options{InUse: 2, AllowNew: true})
	require.NoError(t, err, "the operator's explicit choice makes a new CA")
	assert.FileExists(t, file)
	again, err := pki.Load(dir, pki.Options{InUse: 2})
	require.NoError(t, err, "a present CA loads whatever the ledger holds")
	assert.Equal(t, ca.CertPEM(), again.CertPEM())
}
