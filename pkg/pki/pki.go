// Package pki keeps the cluster's agent CA: the authority behind the mutual TLS
// between caa's agent relay and the forwarder inside each pod VM.
//
// Layout on disk (dir is the ledger's directory, so the CA lives and dies with
// the node's ledger but is never inside it, invariant I7):
//
//	<dir>/agent-ca.pem           current CA: certificate and private key, mode 0600
//	<dir>/agent-ca-previous.pem  optional: the CA before a rotation, same format
//
// Every pod VM gets, in its user data, a server certificate for its name signed
// by the current CA and the CA's certificate as the only client CA it trusts. caa
// presents a client certificate signed by the same CA. The CA survives restarts,
// so a restarted caa still authenticates to the VMs it created before (upstream's
// adaptor makes a fresh CA per process and cannot: see proxy/factory.go in
// confidential-containers/cloud-api-adaptor, read 2026-08).
//
// Lifetimes: the CA lives 10 years. caa's client certificates live
// Options.ClientTTL (default DefaultClientTTL, days, not years) and are
// renewed while caa runs once half of that life is gone, so a copy of the
// relay daemon's file that leaks stops opening the node's VMs within days.
// A VM's server certificate cannot be renewed (its key is in the user data,
// which the forwarder reads once at boot), so it is issued for as long as
// the VM may live: until the CA itself expires (IssueServer caps the life
// there).
//
// A lost agent-ca.pem is never replaced silently: Load refuses to create a
// CA while the ledger has sandboxes whose VMs trust the old one
// (Options.InUse), naming the file and the fix.
//
// Rotation: stop caa, rename agent-ca.pem to agent-ca-previous.pem, start caa.
// It creates a new CA for new VMs and keeps trusting and authenticating to the
// VMs signed by the previous one: its client presents, per connection, the
// certificate issued by whichever CA the VM asks for. Once no VM from before
// the rotation is left (caa ledger list), delete agent-ca-previous.pem.
package pki

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// File names inside the CA's directory.
const (
	CurrentFile  = "agent-ca.pem"
	PreviousFile = "agent-ca-previous.pem"
)

const (
	caValidity = 10 * 365 * 24 * time.Hour
	// DefaultClientTTL is the life of caa's client certificates: short,
	// so a stale copy of the relay daemon's file opens no VM for long,
	// and long enough that a caa down for a day leaves the relay daemon
	// (which reads the file caa wrote) with a valid one.
	DefaultClientTTL = 3 * 24 * time.Hour
	// MinClientTTL is the shortest client certificate life Load accepts:
	// the relay daemon needs time to read a renewed file.
	MinClientTTL = time.Hour
	// ServerLifetime is the life to ask IssueServer for when a VM's
	// certificate must last as long as the VM (it cannot be renewed):
	// IssueServer caps it at the CA's own expiry.
	ServerLifetime = caValidity
	// clockSkew backdates NotBefore so a VM whose clock is slightly behind the
	// node's accepts a certificate issued a moment ago.
	clockSkew = 5 * time.Minute
)

// CA is a loaded agent CA. Its methods are safe for concurrent use.
type CA struct {
	cert    *x509.Certificate
	key     crypto.Signer
	certPEM []byte

	// previous is the CA before a rotation, if its file is present.
	previous *CA

	clientTTL time.Duration
	now       func() time.Time

	mu sync.Mutex
	// clients holds caa's client certificate from each CA (current first).
	clients []tls.Certificate
	// generation counts the renewals of clients, for whoever keeps a copy.
	generation uint64
}

// Options are Load's settings; the zero value is LoadOrCreateCA's.
type Options struct {
	// InUse counts the ledger's sandboxes whose VMs trust the CA in dir.
	// When it is positive, a missing CA file is an error naming the file,
	// never a new CA: a new one would cut caa off from every such VM.
	InUse int
	// AllowNew creates a new CA even with InUse > 0: the operator knows
	// the old one is lost for good and accepts that those VMs' agents
	// stay unreachable (their sandboxes are reported silent).
	AllowNew bool
	// ClientTTL is the life of caa's client certificates (default
	// DefaultClientTTL, at least MinClientTTL).
	ClientTTL time.Duration
	// Now is the clock (default time.Now); tests move it.
	Now func() time.Time
}

// ErrCALost is wrapped by Load's error when the CA file is missing while
// sandboxes trust it.
var ErrCALost = errors.New("the agent CA that running pod VMs trust is missing")

// LoadOrCreateCA is Load with the default Options (nothing in use).
func LoadOrCreateCA(dir string) (*CA, error) { return Load(dir, Options{}) }

// Load loads the CA from dir, creating it (and dir, 0700) on first use. The
// file is written atomically (temporary file, fsync, rename, fsync of the
// directory), so a crash leaves either no CA or a whole one. A file with a
// mode wider than 0600, or one that does not parse, is refused, and so is a
// missing file while opts.InUse sandboxes trust it (unless opts.AllowNew):
// caa never silently replaces a CA that running VMs trust.
func Load(dir string, opts Options) (*CA, error) {
	if dir == "" {
		return nil, errors.New("pki: empty CA directory: pass the ledger's directory")
	}
	if opts.ClientTTL == 0 {
		opts.ClientTTL = DefaultClientTTL
	}
	if opts.ClientTTL < MinClientTTL {
		return nil, fmt.Errorf("pki: client certificate life %s: must be at least %s (the relay daemon needs time to read a renewed one)", opts.ClientTTL, MinClientTTL)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("pki: create CA directory %s: %w", dir, err)
	}
	cur := filepath.Join(dir, CurrentFile)
	ca, err := loadFile(cur)
	if errors.Is(err, os.ErrNotExist) && opts.InUse > 0 && !opts.AllowNew {
		return nil, fmt.Errorf("pki: %w: %s does not exist, but the ledger has %d sandboxes whose VMs were given certificates from it; "+
			"restore %s (owner-only, mode 0600) from a backup and start caa again. If it is lost for good, those VMs cannot be reached "+
			"with any new CA: start caa once with --agent-ca-replace-lost to create a new CA for new VMs (the old sandboxes are then "+
			"reported silent; delete their pods to recreate them)", ErrCALost, cur, opts.InUse, cur)
	}
	if errors.Is(err, os.ErrNotExist) {
		if ca, err = newCA(opts.Now()); err != nil {
			return nil, err
		}
		if err := writeAtomic(cur, ca.filePEM()); err != nil {
			return nil, err
		}
		// Read back what is on disk: if another process won the race the
		// file is theirs and the whole node must use one CA.
		ca, err = loadFile(cur)
	}
	if err != nil {
		return nil, err
	}
	prev, err := loadFile(filepath.Join(dir, PreviousFile))
	switch {
	case err == nil:
		ca.previous = prev
	case !errors.Is(err, os.ErrNotExist):
		return nil, err
	}
	ca.clientTTL, ca.now = opts.ClientTTL, opts.Now
	clients, err := ca.issueClients()
	if err != nil {
		return nil, err
	}
	ca.clients = clients
	return ca, nil
}

// issueClients issues a client certificate from each trusted CA, current
// first.
func (ca *CA) issueClients() ([]tls.Certificate, error) {
	var out []tls.Certificate
	for _, c := range []*CA{ca, ca.previous} {
		if c == nil {
			continue
		}
		cl, err := c.issueClient(ca.now(), ca.clientTTL)
		if err != nil {
			return nil, err
		}
		out = append(out, cl)
	}
	return out, nil
}

// ClientTTL is the life of the client certificates this CA issues caa.
func (ca *CA) ClientTTL() time.Duration { return ca.clientTTL }

// NotAfter is when the CA expires; no certificate it issues outlives it.
func (ca *CA) NotAfter() time.Time { return ca.cert.NotAfter }

// RenewClients issues caa new client certificates once half the current
// ones' life is gone (or they are already expired), and reports whether it
// did. It is called periodically while caa runs, and by every handshake
// of caa's own relays; whoever keeps a copy (the relay daemon's file)
// watches Generation.
func (ca *CA) RenewClients() (renewed bool, err error) {
	ca.mu.Lock()
	defer ca.mu.Unlock()
	return ca.renewLocked()
}

func (ca *CA) renewLocked() (bool, error) {
	now := ca.now()
	leaf := ca.clients[0].Leaf
	if now.Before(leaf.NotAfter.Add(-ca.clientTTL / 2)) {
		return false, nil
	}
	clients, err := ca.issueClients()
	if err != nil {
		return false, fmt.Errorf("pki: renew caa's client certificates (the current ones expire %s): %w", leaf.NotAfter.UTC().Format(time.RFC3339), err)
	}
	ca.clients = clients
	ca.generation++
	return true, nil
}

// Generation counts the client certificate renewals so far (0 at Load).
func (ca *CA) Generation() uint64 {
	ca.mu.Lock()
	defer ca.mu.Unlock()
	return ca.generation
}

// currentClients returns the client certificates, renewed first if due. A
// failed renewal keeps the current ones (they have half their life left
// when renewal starts).
func (ca *CA) currentClients() []tls.Certificate {
	ca.mu.Lock()
	defer ca.mu.Unlock()
	_, _ = ca.renewLocked()
	return ca.clients
}

// CertPEM returns the CA's certificate, the client CA a pod VM's forwarder
// trusts (apf.json's tls-client-ca).
func (ca *CA) CertPEM() []byte { return bytes.Clone(ca.certPEM) }

// IssueServer issues a server certificate for a pod VM: its IPs and DNS names
// become SANs. The user data is built before the cloud gives the VM an IP, so
// usually the VM's name is the SAN and the relay verifies it
// (relay.Config.ServerName), as upstream's proxy does with the instance name.
// The VM cannot renew it: give ttl the longest life a pod VM may have
// (ServerLifetime); the certificate never outlives the CA, so a longer ttl
// is cut at the CA's expiry.
// serial is the certificate's serial number in hex, for the ledger; keyPEM is
// the VM's private key, which belongs in its user data only, never in the
// ledger or a log.
func (ca *CA) IssueServer(ips []net.IP, dnsNames []string, ttl time.Duration) (certPEM, keyPEM []byte, serial string, err error) {
	if len(ips) == 0 && len(dnsNames) == 0 {
		return nil, nil, "", errors.New("pki: a server certificate needs at least one IP or DNS name")
	}
	if ttl <= 0 {
		return nil, nil, "", fmt.Errorf("pki: server certificate ttl %s: must be positive", ttl)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, "", fmt.Errorf("pki: generate server key: %w", err)
	}
	cn := "caa-podvm"
	if len(dnsNames) > 0 {
		cn = dnsNames[0]
	} else if len(ips) > 0 {
		cn = ips[0].String()
	}
	now := ca.clock()
	tmpl, sn, err := leafTemplate(cn, now, ttl, x509.ExtKeyUsageServerAuth)
	if err != nil {
		return nil, nil, "", err
	}
	if tmpl.NotAfter.After(ca.cert.NotAfter) {
		tmpl.NotAfter = ca.cert.NotAfter
	}
	tmpl.IPAddresses = ips
	tmpl.DNSNames = dnsNames
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, key.Public(), ca.key)
	if err != nil {
		return nil, nil, "", fmt.Errorf("pki: sign server certificate: %w", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, "", fmt.Errorf("pki: encode server key: %w", err)
	}
	return pemBlock("CERTIFICATE", der), pemBlock("PRIVATE KEY", keyDER), sn.Text(16), nil
}

// ClientTLS returns the TLS configuration of caa's side of the relay: caa's
// client certificate (from the CA the VM asks for, so VMs from before a
// rotation still accept it), the current and previous CA as roots, TLS 1.2 at
// least (the floor the forwarder enforces too). Set ServerName per VM (the
// name its certificate was issued for), or leave it empty to verify the
// dialled IP.
func (ca *CA) ClientTLS() (*tls.Config, error) {
	roots := x509.NewCertPool()
	roots.AddCert(ca.cert)
	if ca.previous != nil {
		roots.AddCert(ca.previous.cert)
	}
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		RootCAs:    roots,
		// Looked up per handshake: a renewal reaches the next connection.
		GetClientCertificate: func(info *tls.CertificateRequestInfo) (*tls.Certificate, error) {
			clients := ca.currentClients()
			for i := range clients {
				if info.SupportsCertificate(&clients[i]) == nil {
					return &clients[i], nil
				}
			}
			// None matches what the server asked for: offer the current one
			// and let the server say no, so the error names the real cause.
			return &clients[0], nil
		},
	}, nil
}

// HasPrevious reports whether a CA from before a rotation is still trusted.
func (ca *CA) HasPrevious() bool { return ca.previous != nil }

// clock is the CA's clock (a loaded CA's Options.Now, else time.Now).
func (ca *CA) clock() time.Time {
	if ca.now != nil {
		return ca.now()
	}
	return time.Now()
}

func (ca *CA) issueClient(now time.Time, ttl time.Duration) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("pki: generate client key: %w", err)
	}
	// Short-lived: its key is copied into the relay daemon's file, and a
	// stale copy must stop opening VMs soon. RenewClients replaces it.
	tmpl, _, err := leafTemplate("caa", now, ttl, x509.ExtKeyUsageClientAuth)
	if err != nil {
		return tls.Certificate{}, err
	}
	if tmpl.NotAfter.After(ca.cert.NotAfter) {
		tmpl.NotAfter = ca.cert.NotAfter
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, key.Public(), ca.key)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("pki: sign client certificate: %w", err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("pki: parse client certificate: %w", err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, nil
}

func newCA(now time.Time) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("pki: generate CA key: %w", err)
	}
	sn, err := randomSerial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: sn,
		// The serial in the subject keeps two CAs apart even when made in
		// the same second: a client picks its certificate by issuer name.
		Subject:               pkix.Name{CommonName: "caa agent CA " + now.UTC().Format("2006-01-02T15:04:05Z"), SerialNumber: sn.Text(16)},
		NotBefore:             now.Add(-clockSkew),
		NotAfter:              now.Add(caValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("pki: self-sign CA: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("pki: parse CA: %w", err)
	}
	return &CA{cert: cert, key: key, certPEM: pemBlock("CERTIFICATE", der)}, nil
}

func (ca *CA) filePEM() []byte {
	keyDER, err := x509.MarshalPKCS8PrivateKey(ca.key)
	if err != nil {
		// An ECDSA P-256 key always marshals.
		panic(fmt.Sprintf("pki: marshal CA key: %v", err))
	}
	return append(bytes.Clone(ca.certPEM), pemBlock("PRIVATE KEY", keyDER)...)
}

func loadFile(path string) (*CA, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("pki: %w", err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("pki: %s has mode %o: the CA key must be readable by its owner only; run chmod 600 %s", path, fi.Mode().Perm(), path)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("pki: %w", err)
	}
	var certDER, keyDER []byte
	for rest := data; ; {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		switch b.Type {
		case "CERTIFICATE":
			certDER = b.Bytes
		case "PRIVATE KEY":
			keyDER = b.Bytes
		}
	}
	if certDER == nil || keyDER == nil {
		return nil, fmt.Errorf("pki: %s must hold one CERTIFICATE and one PRIVATE KEY PEM block; restore it from a backup (deleting it cuts caa off from every running pod VM)", path)
	}
	cert, err := x509.ParseCertificate(certDER)
	if err != nil {
		return nil, fmt.Errorf("pki: %s: parse certificate: %w", path, err)
	}
	k, err := x509.ParsePKCS8PrivateKey(keyDER)
	if err != nil {
		return nil, fmt.Errorf("pki: %s: parse key: %w", path, err)
	}
	signer, ok := k.(crypto.Signer)
	if !ok || !publicKeysEqual(signer.Public(), cert.PublicKey) {
		return nil, fmt.Errorf("pki: %s: the key does not belong to the certificate", path)
	}
	if !cert.IsCA {
		return nil, fmt.Errorf("pki: %s: the certificate is not a CA", path)
	}
	return &CA{cert: cert, key: signer, certPEM: pemBlock("CERTIFICATE", certDER)}, nil
}

func publicKeysEqual(a, b crypto.PublicKey) bool {
	type equaler interface{ Equal(crypto.PublicKey) bool }
	e, ok := a.(equaler)
	return ok && e.Equal(b)
}

// writeAtomic creates path with data, mode 0600, unless it exists already.
func writeAtomic(path string, data []byte) error {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, ".agent-ca-*.tmp")
	if err != nil {
		return fmt.Errorf("pki: %w", err)
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return fmt.Errorf("pki: %w", err)
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("pki: write %s: %w", tmp.Name(), err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("pki: fsync %s: %w", tmp.Name(), err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("pki: %w", err)
	}
	// Link, not rename: never replace a CA another process wrote meanwhile.
	if err := os.Link(tmp.Name(), path); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("pki: install %s: %w", path, err)
	}
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("pki: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("pki: fsync %s: %w", dir, err)
	}
	return nil
}

func leafTemplate(cn string, now time.Time, ttl time.Duration, usage x509.ExtKeyUsage) (*x509.Certificate, *big.Int, error) {
	sn, err := randomSerial()
	if err != nil {
		return nil, nil, err
	}
	return &x509.Certificate{
		SerialNumber: sn,
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    now.Add(-clockSkew),
		NotAfter:     now.Add(ttl),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
	}, sn, nil
}

func randomSerial() (*big.Int, error) {
	sn, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("pki: serial: %w", err)
	}
	return sn.Add(sn, big.NewInt(1)), nil
}

func pemBlock(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}

// ClientPEM returns caa's current client certificates (one per trusted CA,
// current first; renewed first if due) with their private keys, and the trusted CAs' certificates, in PEM:
// what a relay process outside caa (pkg/relayd) needs to authenticate to
// the VMs exactly as caa does. The keys are the in-memory client keys, never
// a CA's key; the caller keeps them in a 0600 file beside the CA, never in
// the ledger.
func (ca *CA) ClientPEM() (certs, keys [][]byte, roots [][]byte, err error) {
	for _, c := range ca.currentClients() {
		keyDER, err := x509.MarshalPKCS8PrivateKey(c.PrivateKey)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("pki: marshal client key: %w", err)
		}
		certs = append(certs, pemBlock("CERTIFICATE", c.Certificate[0]))
		keys = append(keys, pemBlock("PRIVATE KEY", keyDER))
	}
	roots = append(roots, ca.CertPEM())
	if ca.previous != nil {
		roots = append(roots, ca.previous.CertPEM())
	}
	return certs, keys, roots, nil
}
