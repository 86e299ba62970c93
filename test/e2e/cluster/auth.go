package cluster

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// adminUser is the token file's only user; its group system:masters passes
// every authorizer.
const adminUser = "e2e-admin"

// credentials are the files the apiserver reads at start.
type credentials struct {
	saKey    string // service-account signing key (private)
	saPub    string // service-account verification key
	tokens   string // static token file
	adminTok string
	// clientCA signs client certificates (--client-ca-file), as a
	// cluster's CA signs its kubelets' (NodeKubeconfig).
	clientCA    string
	clientCAKey string
}

// writeCredentials makes a fresh service-account key pair and a token file
// with a random admin token in dir.
func writeCredentials(dir string) (credentials, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return credentials{}, fmt.Errorf("generate service-account key: %w", err)
	}
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return credentials{}, fmt.Errorf("encode service-account key: %w", err)
	}
	pubDER, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return credentials{}, fmt.Errorf("encode service-account public key: %w", err)
	}
	secret := make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		return credentials{}, fmt.Errorf("generate admin token: %w", err)
	}
	c := credentials{
		saKey:       filepath.Join(dir, "sa.key"),
		saPub:       filepath.Join(dir, "sa.pub"),
		tokens:      filepath.Join(dir, "tokens.csv"),
		adminTok:    hex.EncodeToString(secret),
		clientCA:    filepath.Join(dir, "client-ca.crt"),
		clientCAKey: filepath.Join(dir, "client-ca.key"),
	}
	caPEM, caKeyPEM, err := newClientCA()
	if err != nil {
		return credentials{}, err
	}
	files := []struct {
		path string
		data []byte
	}{
		{c.saKey, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der})},
		{c.saPub, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER})},
		// token,user,uid,"group[,group...]"
		{c.tokens, fmt.Appendf(nil, "%s,%s,%s,\"system:masters\"\n", c.adminTok, adminUser, adminUser)},
		{c.clientCA, caPEM},
		{c.clientCAKey, caKeyPEM},
	}
	for _, f := range files {
		if err := os.WriteFile(f.path, f.data, 0o600); err != nil {
			return credentials{}, fmt.Errorf("write %s: %w", f.path, err)
		}
	}
	return c, nil
}

// servingCA returns, PEM-encoded, the CA that signed the apiserver's
// self-generated serving certificate: the last certificate of the bundle it
// writes into --cert-dir. The apiserver reuses that bundle when it restarts
// with the same --cert-dir, so the CA stays valid across restarts.
func servingCA(certDir string) ([]byte, error) {
	path := filepath.Join(certDir, "apiserver.crt")
	bundle, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read serving certificate: %w", err)
	}
	var last *pem.Block
	for rest := bundle; ; {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		if block.Type == "CERTIFICATE" {
			last = block
		}
	}
	if last == nil {
		return nil, fmt.Errorf("%s holds no certificate (yet)", path)
	}
	cert, err := x509.ParseCertificate(last.Bytes)
	if err != nil {
		return nil, fmt.Errorf("parse serving CA from %s: %w", path, err)
	}
	if !cert.IsCA {
		return nil, errors.New("the last certificate of " + path + " is not a CA")
	}
	return pem.EncodeToMemory(last), nil
}

// writeKubeconfig writes a self-contained kubeconfig (CA and token inline)
// for a client in another process, such as `caa run --kubeconfig`.
func writeKubeconfig(path string, cfg *rest.Config) error {
	const name = "caa-e2e"
	kc := clientcmdapi.NewConfig()
	kc.Clusters[name] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos[adminUser] = &clientcmdapi.AuthInfo{Token: cfg.BearerToken}
	kc.Contexts[name] = &clientcmdapi.Context{Cluster: name, AuthInfo: adminUser}
	kc.CurrentContext = name
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		return fmt.Errorf("write kubeconfig: %w", err)
	}
	return nil
}

// newClientCA makes the CA of --client-ca-file, PEM-encoded with its key.
func newClientCA() (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generate client CA key: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "caa-e2e-client-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, fmt.Errorf("sign client CA: %w", err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, fmt.Errorf("encode client CA key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), nil
}

// ClientCAFile is the path of the CA certificate the apiserver admits
// client certificates of (--client-ca-file); a kubelet admits the
// apiserver's with it.
func (c *Cluster) ClientCAFile() string { return c.creds.clientCA }

// WriteClientCertificate writes to path a client certificate of the client
// CA for user cn in groups orgs, and its key, in one PEM file.
func (c *Cluster) WriteClientCertificate(path, cn string, orgs ...string) error {
	caPEM, err := os.ReadFile(c.creds.clientCA)
	if err != nil {
		return fmt.Errorf("read client CA: %w", err)
	}
	caKeyPEM, err := os.ReadFile(c.creds.clientCAKey)
	if err != nil {
		return fmt.Errorf("read client CA key: %w", err)
	}
	caBlock, _ := pem.Decode(caPEM)
	keyBlock, _ := pem.Decode(caKeyPEM)
	if caBlock == nil || keyBlock == nil {
		return errors.New("client CA: no PEM block")
	}
	ca, err := x509.ParseCertificate(caBlock.Bytes)
	if err != nil {
		return fmt.Errorf("parse client CA: %w", err)
	}
	caKey, err := x509.ParseECPrivateKey(keyBlock.Bytes)
	if err != nil {
		return fmt.Errorf("parse client CA key: %w", err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("generate %s's key: %w", cn, err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return fmt.Errorf("certificate serial: %w", err)
	}
	now := time.Now()
	der, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: cn, Organization: orgs},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}, ca, &key.PublicKey, caKey)
	if err != nil {
		return fmt.Errorf("sign %s's certificate: %w", cn, err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return fmt.Errorf("encode %s's key: %w", cn, err)
	}
	pair := append(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})...)
	if err := os.WriteFile(path, pair, 0o600); err != nil {
		return fmt.Errorf("write %s's certificate: %w", cn, err)
	}
	return nil
}

// NodeKubeconfig writes the kubeconfig a kubelet of node name would hold
// and returns its path: a client certificate of the client CA for
// CN=system:node:<name>, O=system:nodes (the identity the Node authorizer
// and NodeRestriction know), in <dir>/nodes/<name>/pki/kubelet-client-current.pem
// (certificate and key in one file, as the kubelet keeps them), named by
// path from <dir>/nodes/<name>/kubeconfig, as a kubelet's kubeconfig names
// its rotating certificate.
func (c *Cluster) NodeKubeconfig(name string) (string, error) {
	dir := filepath.Join(c.dir, "nodes", name)
	if err := os.MkdirAll(filepath.Join(dir, "pki"), 0o700); err != nil {
		return "", fmt.Errorf("node %s's directory: %w", name, err)
	}
	certFile := filepath.Join(dir, "pki", "kubelet-client-current.pem")
	if err := c.WriteClientCertificate(certFile, "system:node:"+name, "system:nodes"); err != nil {
		return "", fmt.Errorf("node %s: %w", name, err)
	}
	const cluster, user = "default-cluster", "default-auth"
	kc := clientcmdapi.NewConfig()
	kc.Clusters[cluster] = &clientcmdapi.Cluster{Server: c.url, CertificateAuthorityData: c.caPEM}
	kc.AuthInfos[user] = &clientcmdapi.AuthInfo{ClientCertificate: certFile, ClientKey: certFile}
	kc.Contexts["default-context"] = &clientcmdapi.Context{Cluster: cluster, AuthInfo: user}
	kc.CurrentContext = "default-context"
	path := filepath.Join(dir, "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		return "", fmt.Errorf("write node %s's kubeconfig: %w", name, err)
	}
	return path, nil
}
