package provider

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"unicode/utf8"
)

// Limits that the identity tags and names derived here meet by
// construction, whatever the pod's namespace and name (up to the 63 and 253
// characters Kubernetes allows), so that no cloud refuses or silently cuts
// them:
//
//   - AWS: tag values up to 256 characters (the Name tag included).
//   - Azure: tag values up to 256 characters; a Linux VM name up to 64.
//   - IBM Cloud: a user tag "key:value" up to 128 characters of a small
//     alphabet; an instance name up to 63 of [a-z0-9-]. The ibmcloud
//     package escapes tags into that alphabet and cuts those still too long
//     into numbered pieces; the pod tag fits one piece.
//
// Matching never goes by these shortened values: the pod UID tag carries a
// VM's identity, and the cluster and node tags its scope.
const (
	// MaxTagValue is the longest tag value every cloud takes.
	MaxTagValue = 256
	// MaxPodTag is the longest TagPod value: short enough that
	// "caa-pod:<value>", escaped, is one IBM Cloud user tag.
	MaxPodTag = 100
	// HashLen is how many hex digits of SHA-256 Shorten appends: 48 bits,
	// enough to keep apart the pods of one node.
	HashLen = 12
)

// Shorten returns s when it has at most limit bytes. Otherwise it returns
// the longest prefix of s that leaves room, then '+' and HashLen hex digits
// of the SHA-256 of all of s: limit bytes at most, readable, and distinct
// for distinct values of s (but for a hash collision). '+' appears in no
// Kubernetes name, so a shortened name never equals one that fit. limit
// must leave room for the hash (limit > HashLen+1).
func Shorten(s string, limit int) string {
	if len(s) <= limit {
		return s
	}
	sum := sha256.Sum256([]byte(s))
	cut := limit - 1 - HashLen
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "+" + hex.EncodeToString(sum[:])[:HashLen]
}

// PodTag is the value of TagPod for a pod: "namespace/name", shortened to
// MaxPodTag (see Shorten). It is for people; nothing matches on it.
func PodTag(namespace, name string) string {
	return Shorten(namespace+"/"+name, MaxPodTag)
}

// DisplayName is a VM name for people: "caa-<namespace>-<name>",
// shortened to limit bytes (see Shorten). Clouds that need a stricter name
// (a DNS label) use DNSLabel.
func (s Spec) DisplayName(limit int) string {
	return Shorten("caa-"+s.PodNamespace+"-"+s.PodName, limit)
}

// DNSLabel builds a name that is a DNS label (and so a hostname, an Azure
// VM name and an IBM Cloud instance name): prefix, then the ASCII letters
// and digits of readable in lower case with every other run turned into
// one '-', cut to leave room, then '-' and the first hashLen hex digits of
// sum, limit bytes in all. The readable part lets people tell which VM is
// which; the hash keeps apart values whose readable parts fold or cut to
// the same text. prefix must start with a letter.
func DNSLabel(prefix, readable string, sum []byte, hashLen, limit int) string {
	hash := hex.EncodeToString(sum)[:hashLen]
	room := max(limit-len(prefix)-1-hashLen, 0)
	var b strings.Builder
	dash := false
	for _, r := range strings.ToLower(readable) {
		if b.Len() >= room {
			break
		}
		if (r < 'a' || r > 'z') && (r < '0' || r > '9') {
			dash = true
			continue
		}
		if dash && b.Len() > 0 {
			b.WriteByte('-')
		}
		dash = false
		b.WriteRune(r)
	}
	frag := strings.TrimRight(b.String()[:min(b.Len(), room)], "-")
	if frag == "" {
		return prefix + hash
	}
	return prefix + frag + "-" + hash
}
