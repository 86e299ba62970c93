package azure

import (
	"crypto/rand"
	"crypto/rsa"
	"fmt"
	"strings"

	"golang.org/x/crypto/ssh"
)

// throwawayKeyBits is the size of the RSA key made when none is
// configured. Azure's API reference for sshPublicKey.keyData asks for "at
// least 2048-bit and in ssh-rsa format"; Ed25519 keys are accepted by
// newer API versions and regions, but not everywhere an older API version
// or a sovereign cloud is in use, so the key caa makes is RSA, which every
// one takes. 3072 bits, NIST's size for use past 2030, costs a fraction of
// a second once per start.
const throwawayKeyBits = 3072

// throwawaySSHKey returns the OpenSSH public key of a fresh RSA key pair
// whose private half is dropped on return: it is never logged, stored or
// sent, so the key admits nobody. Azure requires a login for a Linux VM
// made from an image; the pod VM needs none.
func throwawaySSHKey() (string, error) {
	priv, err := rsa.GenerateKey(rand.Reader, throwawayKeyBits)
	if err != nil {
		return "", fmt.Errorf("azure: make a throwaway SSH key: %w", err)
	}
	pub, err := ssh.NewPublicKey(&priv.PublicKey)
	if err != nil {
		return "", fmt.Errorf("azure: make a throwaway SSH key: %w", err)
	}
	return strings.TrimSpace(string(ssh.MarshalAuthorizedKey(pub))) + " caa-throwaway", nil
}
