package pki_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/pkg/pki"
)

// serveOnce answers one TLS connection as a pod VM's forwarder would: the
// server certificate from IssueServer, client certificates required from the
// client CA.
func serveOnce(t *testing.T, certPEM, keyPEM, clientCA []byte) (addr string, result <-chan error) {
	t.Helper()
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	require.NoError(t, err)
	pool := x509.NewCertPool()
	require.True(t, pool.AppendCertsFromPEM(clientCA))
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{
		MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert},
		ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: pool,
	})
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	ch := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			ch <- err
			return
		}
		defer c.Close()
		if err := c.(*tls.Conn).Handshake(); err != nil {
			ch <- err
			return
		}
		_, err = c.Write([]byte("ok"))
		ch <- err
	}()
	return ln.Addr().String(), ch
}

func dial(t *testing.T, addr string, cfg *tls.Config) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := (&tls.Dialer{Config: cfg}).DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	buf := make([]byte, 2)
	_, err = io.ReadFull(c, buf)
	return err
}

func TestMutualTLSWithIssuedCertificates(t *testing.T) {
	ca, err := pki.LoadOrCreateCA(t.TempDir())
	require.NoError(t, err)
	certPEM, keyPEM, serial, err := ca.IssueServer([]net.IP{net.ParseIP("127.0.0.1")}, nil, time.Hour)
	require.NoError(t, err)
	require.NotEmpty(t, serial)
	addr, res := serveOnce(t, certPEM, keyPEM, ca.CertPEM())
	cfg, err := ca.ClientTLS()
	require.NoError(t, err)
	require.NoError(t, dial(t, addr, cfg), "caa's client must reach a VM whose certificate its CA issued")
	require.NoError(t, <-res)
}

func TestAnotherCAIsRefusedBothWays(t *testing.T) {
	mine, err := pki.LoadOrCreateCA(t.TempDir())
	require.NoError(t, err)
	other, err := pki.LoadOrCreateCA(t.TempDir())
	require.NoError(t, err)
	certPEM, keyPEM, _, err := mine.IssueServer([]net.IP{net.ParseIP("127.0.0.1")}, nil, time.Hour)
	require.NoError(t, err)

	t.Run("client from another CA", func(t *testing.T) {
		addr, res := serveOnce(t, certPEM, keyPEM, mine.CertPEM())
		cfg, err := other.ClientTLS()
		require.NoError(t, err)
		cfg.RootCAs.AppendCertsFromPEM(mine.CertPEM()) // it trusts the VM; the VM must not trust it
		require.Error(t, dial(t, addr, cfg))
		require.Error(t, <-res, "the forwarder must refuse a client certificate from another CA")
	})
	t.Run("server from another CA", func(t *testing.T) {
		otherCert, otherKey, _, err := other.IssueServer([]net.IP{net.ParseIP("127.0.0.1")}, nil, time.Hour)
		require.NoError(t, err)
		addr, _ := serveOnce(t, otherCert, otherKey, mine.CertPEM())
		cfg, err := mine.ClientTLS()
		require.NoError(t, err)
		err = dial(t, addr, cfg)
		var unknown x509.UnknownAuthorityError
		require.ErrorAs(t, err, &unknown, "caa must not talk to a VM its CA did not certify")
	})
	t.Run("wrong IP", func(t *testing.T) {
		c2, k2, _, err := mine.IssueServer([]net.IP{net.ParseIP("10.1.2.3")}, nil, time.Hour)
		require.NoError(t, err)
		addr, _ := serveOnce(t, c2, k2, mine.CertPEM())
		cfg, err := mine.ClientTLS()
		require.NoError(t, err)
		var host x509.HostnameError
		require.ErrorAs(t, dial(t, addr, cfg), &host, "a certificate for another VM's IP must not pass")
	})
}

func TestCASurvivesRestartAndKeyIsPrivate(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ledger")
	ca1, err := pki.LoadOrCreateCA(dir)
	require.NoError(t, err)
	fi, err := os.Stat(filepath.Join(dir, pki.CurrentFile))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	di, err := os.Stat(dir)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o700), di.Mode().Perm())

	// A VM created before the "restart".
	certPEM, keyPEM, _, err := ca1.IssueServer([]net.IP{net.ParseIP("127.0.0.1")}, nil, time.Hour)
	require.NoError(t, err)

	ca2, err := pki.LoadOrCreateCA(dir)
	require.NoError(t, err)
	require.Equal(t, ca1.CertPEM(), ca2.CertPEM())
	addr, res := serveOnce(t, certPEM, keyPEM, ca1.CertPEM())
	cfg, err := ca2.ClientTLS()
	require.NoError(t, err)
	require.NoError(t, dial(t, addr, cfg), "a restarted caa must still authenticate to its old VMs")
	require.NoError(t, <-res)
}

func TestRotationKeepsOldVMsReachable(t *testing.T) {
	dir := t.TempDir()
	old, err := pki.LoadOrCreateCA(dir)
	require.NoError(t, err)
	oldCert, oldKey, _, err := old.IssueServer([]net.IP{net.ParseIP("127.0.0.1")}, nil, time.Hour)
	require.NoError(t, err)
	oldCA := old.CertPEM()

	require.NoError(t, os.Rename(filepath.Join(dir, pki.CurrentFile), filepath.Join(dir, pki.PreviousFile)))
	rotated, err := pki.LoadOrCreateCA(dir)
	require.NoError(t, err)
	require.True(t, rotated.HasPrevious())
	require.NotEqual(t, oldCA, rotated.CertPEM())
	newCert, newKey, _, err := rotated.IssueServer([]net.IP{net.ParseIP("127.0.0.1")}, nil, time.Hour)
	require.NoError(t, err)

	cfg, err := rotated.ClientTLS()
	require.NoError(t, err)
	addr, res := serveOnce(t, oldCert, oldKey, oldCA)
	require.NoError(t, dial(t, addr, cfg), "a VM from before the rotation")
	require.NoError(t, <-res)
	addr, res = serveOnce(t, newCert, newKey, rotated.CertPEM())
	require.NoError(t, dial(t, addr, cfg.Clone()), "a VM from after the rotation")
	require.NoError(t, <-res)
}

func TestBadFilesAreRefusedNotReplaced(t *testing.T) {
	t.Run("too open", func(t *testing.T) {
		dir := t.TempDir()
		_, err := pki.LoadOrCreateCA(dir)
		require.NoError(t, err)
		p := filepath.Join(dir, pki.CurrentFile)
		require.NoError(t, os.Chmod(p, 0o644))
		_, err = pki.LoadOrCreateCA(dir)
		require.ErrorContains(t, err, "chmod 600")
	})
	t.Run("garbage", func(t *testing.T) {
		dir := t.TempDir()
		p := filepath.Join(dir, pki.CurrentFile)
		require.NoError(t, os.WriteFile(p, []byte("not a CA"), 0o600))
		_, err := pki.LoadOrCreateCA(dir)
		require.ErrorContains(t, err, "CERTIFICATE")
		b, rerr := os.ReadFile(p)
		require.NoError(t, rerr)
		require.Equal(t, "not a CA", string(b), "a damaged CA file must be left for the operator, never overwritten")
	})
	t.Run("empty dir", func(t *testing.T) {
		_, err := pki.LoadOrCreateCA("")
		require.Error(t, err)
	})
}

func TestConcurrentCreationAgreesOnOneCA(t *testing.T) {
	dir := t.TempDir()
	const n = 4
	pems := make(chan string, n)
	errs := make(chan error, n)
	for range n {
		go func() {
			ca, err := pki.LoadOrCreateCA(dir)
			if err != nil {
				errs <- err
				return
			}
			pems <- string(ca.CertPEM())
		}()
	}
	first := ""
	for range n {
		select {
		case err := <-errs:
			t.Fatal(err)
		case p := <-pems:
			if first == "" {
				first = p
			}
			require.Equal(t, first, p)
		}
	}
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	for _, e := range entries {
		require.False(t, strings.HasSuffix(e.Name(), ".tmp"), "temporary file left: %s", e.Name())
	}
}

func TestIssueServerRejectsBadInput(t *testing.T) {
	ca, err := pki.LoadOrCreateCA(t.TempDir())
	require.NoError(t, err)
	_, _, _, err = ca.IssueServer(nil, nil, time.Hour)
	require.Error(t, err)
	_, _, _, err = ca.IssueServer([]net.IP{net.ParseIP("10.0.0.1")}, nil, 0)
	require.Error(t, err)
	_, keyPEM, _, err := ca.IssueServer(nil, []string{"podvm-x"}, time.Hour)
	require.NoError(t, err)
	require.True(t, strings.Contains(string(keyPEM), "PRIVATE KEY"))
	require.False(t, errors.Is(err, os.ErrNotExist))
}

func TestServerCertificateForTheVMsName(t *testing.T) {
	ca, err := pki.LoadOrCreateCA(t.TempDir())
	require.NoError(t, err)
	certPEM, keyPEM, _, err := ca.IssueServer(nil, []string{"podvm-a"}, time.Hour)
	require.NoError(t, err)
	for name, wantOK := range map[string]bool{"podvm-a": true, "podvm-b": false} {
		addr, _ := serveOnce(t, certPEM, keyPEM, ca.CertPEM())
		cfg, err := ca.ClientTLS()
		require.NoError(t, err)
		cfg.ServerName = name
		err = dial(t, addr, cfg)
		if wantOK {
			require.NoError(t, err, name)
		} else {
			require.Error(t, err, "a certificate for another VM's name must not pass")
		}
	}
}
