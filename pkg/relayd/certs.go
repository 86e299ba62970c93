package relayd

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/caa-project/caa/internal/unixsock"
	"github.com/caa-project/caa/pkg/pki"
)

// ClientFile is the name, in the relay daemon's directory, of the file caa
// writes for the relay daemon: caa's client certificates with their keys
// and the CA certificates the VMs' server certificates chain to. It never
// holds a CA's key, and it is never in the ledger (invariant I7).
const ClientFile = "relay-client.pem"

// PEM block headers that tell the file's blocks apart.
const (
	roleHeader = "Role"
	roleClient = "client"
	roleRoot   = "root"
)

// WriteClientFile writes caa's client side of the agent TLS into
// dir/ClientFile (dir made 0700 if missing; caa passes its --relay-socket's
// directory, the relay's own, never the CA's), mode 0600, atomically (temporary file, fsync, rename,
// fsync of dir), so the relay daemon reads a whole file or the old one. caa
// calls it at every start: its client key lives in memory only and is new
// each time, and after a CA rotation the file carries both CAs.
func WriteClientFile(dir string, ca *pki.CA) error {
	certs, keys, roots, err := ca.ClientPEM()
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	for i := range certs {
		for _, b := range [][]byte{certs[i], keys[i]} {
			blk, _ := pem.Decode(b)
			if blk == nil {
				return errors.New("relayd: client certificate: not PEM")
			}
			blk.Headers = map[string]string{roleHeader: roleClient}
			if err := pem.Encode(&buf, blk); err != nil {
				return fmt.Errorf("relayd: encode client certificate: %w", err)
			}
		}
	}
	for _, r := range roots {
		blk, _ := pem.Decode(r)
		if blk == nil {
			return errors.New("relayd: CA certificate: not PEM")
		}
		blk.Headers = map[string]string{roleHeader: roleRoot}
		if err := pem.Encode(&buf, blk); err != nil {
			return fmt.Errorf("relayd: encode CA certificate: %w", err)
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("relayd: the client file's directory: %w", err)
	}
	return writeAtomic(filepath.Join(dir, ClientFile), buf.Bytes())
}

func writeAtomic(path string, data []byte) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("relayd: %w", err)
	}
	tmp := f.Name()
	defer os.Remove(tmp) // a no-op once renamed
	if err := f.Chmod(0o600); err != nil {
		f.Close()
		return fmt.Errorf("relayd: %w", err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("relayd: write %s: %w", tmp, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("relayd: fsync %s: %w", tmp, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("relayd: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("relayd: %w", err)
	}
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("relayd: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("relayd: fsync %s: %w", dir, err)
	}
	return nil
}

// credentials is one reading of the client file.
type credentials struct {
	clients []tls.Certificate
	roots   *x509.CertPool
}

func parseClientFile(data []byte) (*credentials, error) {
	cr := &credentials{roots: x509.NewCertPool()}
	var certDER []byte
	nroots := 0
	for {
		var blk *pem.Block
		blk, data = pem.Decode(data)
		if blk == nil {
			break
		}
		switch role := blk.Headers[roleHeader]; {
		case role == roleRoot && blk.Type == "CERTIFICATE":
			c, err := x509.ParseCertificate(blk.Bytes)
			if err != nil {
				return nil, fmt.Errorf("CA certificate: %w", err)
			}
			cr.roots.AddCert(c)
			nroots++
		case role == roleClient && blk.Type == "CERTIFICATE":
			certDER = blk.Bytes
		case role == roleClient && blk.Type == "PRIVATE KEY":
			if certDER == nil {
				return nil, errors.New("a client key without its certificate before it")
			}
			pair, err := tls.X509KeyPair(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: certDER}),
				pem.EncodeToMemory(&pem.Block{Type: blk.Type, Bytes: blk.Bytes}))
			if err != nil {
				return nil, fmt.Errorf("client certificate: %w", err)
			}
			cr.clients = append(cr.clients, pair)
			certDER = nil
		default:
			return nil, fmt.Errorf("unexpected PEM block %q with %s %q", blk.Type, roleHeader, role)
		}
	}
	if len(cr.clients) == 0 || nroots == 0 {
		return nil, fmt.Errorf("it holds %d client certificates and %d CA certificates; want at least one of each", len(cr.clients), nroots)
	}
	return cr, nil
}

// certStore serves the relays' TLS from the client file and reads it again
// when it changes (caa restarted, CA rotated), so connections made after
// that use the new certificates; connections open at the time keep theirs.
type certStore struct {
	path string

	mu      sync.Mutex
	cur     *credentials
	modTime time.Time
	size    int64
	ino     unixsock.FileID
}

func newCertStore(path string) *certStore { return &certStore{path: path} }

// refresh reads the file again if it changed. A file that is missing or
// bad keeps the credentials read before (and is an error only when there
// are none yet).
func (s *certStore) refresh() (changed bool, err error) {
	fi, err := os.Stat(s.path)
	if err != nil {
		return false, fmt.Errorf("relayd: caa's client file %s: %w (caa writes it at start with --relay-socket)", s.path, err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return false, fmt.Errorf("relayd: %s has mode %v: it holds private keys, make it 0600", s.path, fi.Mode().Perm())
	}
	ino, _ := unixsock.Inode(fi)
	s.mu.Lock()
	same := s.cur != nil && fi.ModTime().Equal(s.modTime) && fi.Size() == s.size && ino == s.ino
	s.mu.Unlock()
	if same {
		return false, nil
	}
	data, err := os.ReadFile(s.path)
	if err != nil {
		return false, fmt.Errorf("relayd: %w", err)
	}
	cr, err := parseClientFile(data)
	if err != nil {
		return false, fmt.Errorf("relayd: %s: %w", s.path, err)
	}
	s.mu.Lock()
	s.cur, s.modTime, s.size, s.ino = cr, fi.ModTime(), fi.Size(), ino
	s.mu.Unlock()
	return true, nil
}

func (s *certStore) current() *credentials {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur
}

// tlsConfig is the client side of one relay, whose forwarder must show a
// certificate issued for expect (the VM's name, or its IP). The
// certificates are looked up per handshake, so a refresh reaches new
// connections at once. Go's own verification is replaced by the same chain
// check against the current roots (tls.Config.RootCAs is fixed per
// config) and a name check against expect, which is pinned here and never
// read from the connection: Go leaves ConnectionState.ServerName empty when
// it dials an IP, and an empty name would let any certificate of the CA
// (another sandbox's VM) pass.
func (s *certStore) tlsConfig(expect string) (*tls.Config, error) {
	if expect == "" {
		return nil, errors.New("relayd: no name to check the forwarder's certificate against: pass the VM's name (server_name) or an address")
	}
	return &tls.Config{
		MinVersion:         tls.VersionTLS12,
		InsecureSkipVerify: true, // verified in VerifyConnection against the current roots
		GetClientCertificate: func(info *tls.CertificateRequestInfo) (*tls.Certificate, error) {
			cr := s.current()
			if cr == nil {
				return nil, errors.New("relayd: no client certificate loaded")
			}
			for i := range cr.clients {
				if info.SupportsCertificate(&cr.clients[i]) == nil {
					return &cr.clients[i], nil
				}
			}
			return &cr.clients[0], nil
		},
		VerifyConnection: func(cs tls.ConnectionState) error {
			cr := s.current()
			if cr == nil {
				return errors.New("relayd: no CA certificate loaded")
			}
			if len(cs.PeerCertificates) == 0 {
				return errors.New("relayd: the forwarder sent no certificate")
			}
			inter := x509.NewCertPool()
			for _, c := range cs.PeerCertificates[1:] {
				inter.AddCert(c)
			}
			_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{
				DNSName: expect, Roots: cr.roots, Intermediates: inter,
				KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
			})
			if err != nil {
				return fmt.Errorf("relayd: forwarder certificate (want one issued for %s): %w", expect, err)
			}
			return nil
		},
	}, nil
}
