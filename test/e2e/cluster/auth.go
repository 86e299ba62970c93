package cluster

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"

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
		saKey:    filepath.Join(dir, "sa.key"),
		saPub:    filepath.Join(dir, "sa.pub"),
		tokens:   filepath.Join(dir, "tokens.csv"),
		adminTok: hex.EncodeToString(secret),
	}
	files := []struct {
		path string
		data []byte
	}{
		{c.saKey, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der})},
		{c.saPub, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER})},
		// token,user,uid,"group[,group...]"
		{c.tokens, fmt.Appendf(nil, "%s,%s,%s,\"system:masters\"\n", c.adminTok, adminUser, adminUser)},
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
