package ec2fake

import (
	"crypto/rand"
	"encoding/base32"
	"strings"
	"sync"
	"time"
)

// Credentials are one set of temporary keys the Keyring issued.
type Credentials struct {
	AccessKeyID     string
	SecretAccessKey string
	SessionToken    string
	Expiration      time.Time
	// Principal is who the keys act for, as EC2's messages name it (an
	// assumed-role ARN).
	Principal string
}

// Keyring issues temporary credentials, as STS and the EKS Pod Identity
// agent do, and answers the EC2 fake (WithKeyring) which of them are valid:
// a request signed with keys the Keyring never issued, or past their
// expiration, is refused. It counts the requests each key signed. Safe for
// concurrent use.
type Keyring struct {
	now func() time.Time
	// Skew is how long after its expiration the fake still accepts a
	// key, for a request signed a moment before the expiration and
	// received a moment after.
	skew time.Duration

	mu     sync.Mutex
	keys   map[string]*issuedKey // by access key id
	issued []string              // access key ids in issue order
}

type issuedKey struct {
	creds Credentials
	used  int64
}

// NewKeyring returns an empty keyring on the clock now (time.Now when nil).
// A key stays valid skew past its expiration.
func NewKeyring(now func() time.Time, skew time.Duration) *Keyring {
	if now == nil {
		now = time.Now
	}
	return &Keyring{now: now, skew: skew, keys: map[string]*issuedKey{}}
}

// Issue makes fresh temporary keys for principal, valid for lifetime.
func (k *Keyring) Issue(principal string, lifetime time.Duration) Credentials {
	c := Credentials{
		AccessKeyID:     "ASIA" + randomText(16),
		SecretAccessKey: randomText(40),
		SessionToken:    "FwoG" + randomText(120),
		Expiration:      k.now().Add(lifetime).UTC().Truncate(time.Second),
		Principal:       principal,
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.keys[c.AccessKeyID] = &issuedKey{creds: c}
	k.issued = append(k.issued, c.AccessKeyID)
	return c
}

// valid returns the keys of accessKeyID if they were issued and have not
// expired (beyond the skew).
func (k *Keyring) valid(accessKeyID string) (Credentials, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	ik, ok := k.keys[accessKeyID]
	if !ok || k.now().After(ik.creds.Expiration.Add(k.skew)) {
		return Credentials{}, false
	}
	return ik.creds, true
}

// use counts one accepted request signed with accessKeyID.
func (k *Keyring) use(accessKeyID string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if ik, ok := k.keys[accessKeyID]; ok {
		ik.used++
	}
}

// Issued returns every credential issued so far, oldest first.
func (k *Keyring) Issued() []Credentials {
	k.mu.Lock()
	defer k.mu.Unlock()
	out := make([]Credentials, 0, len(k.issued))
	for _, id := range k.issued {
		out = append(out, k.keys[id].creds)
	}
	return out
}

// Uses returns how many accepted requests accessKeyID signed.
func (k *Keyring) Uses(accessKeyID string) int64 {
	k.mu.Lock()
	defer k.mu.Unlock()
	if ik, ok := k.keys[accessKeyID]; ok {
		return ik.used
	}
	return 0
}

// Revoke makes accessKeyID invalid at once, as if it had expired.
func (k *Keyring) Revoke(accessKeyID string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if ik, ok := k.keys[accessKeyID]; ok {
		ik.creds.Expiration = time.Time{}
	}
}

var keyAlphabet = base32.NewEncoding("ABCDEFGHIJKLMNOPQRSTUVWXYZ234567").WithPadding(base32.NoPadding)

// randomText is n characters of upper-case letters and digits.
func randomText(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return strings.ToUpper(keyAlphabet.EncodeToString(b))[:n]
}
