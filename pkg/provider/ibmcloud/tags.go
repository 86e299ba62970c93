package ibmcloud

import (
	"crypto/sha256"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/caa-project/caa/pkg/provider"
)

// IBM Cloud user tags are strings of at most 128 characters drawn from
// letters, digits, space, '_', '-', '.' and ':', compared without case;
// "key:value" is the convention. caa's tags hold more than that (a '/' in
// the pod tag, anything in the operator's extra tags), so each key and
// value is escaped: bytes other than [a-z0-9.-] become '_' and two lower
// case hex digits. A tag still over 128 characters is cut into numbered
// pieces, key + "_z" + index; since an escaped key only ever has '_' before
// two hex digits, "_z" cannot come out of escaping.
const (
	maxUserTag = 128
	chunkMark  = "_z"
	// nameHashLen is how much of the key hash the instance name keeps: 80
	// bits, so that names of distinct keys collide with odds around 1e-12
	// even at a million VMs.
	nameHashLen = 20
	// maxInstanceName keeps names within 40 characters (VPC allows 63):
	// VPC derives the guest's hostname from the name, and some images take
	// no longer hostname. It leaves 15 characters of the key readable.
	maxInstanceName = 40
)

// instanceName is the VM's name, deterministic in (cluster, key) and in
// nothing else, so that a retried Create finds the VM an earlier one made.
// The readable part, from the key, lets people match a VM to its ledger
// record; uniqueness comes from the hash. provider.DNSLabel makes it follow
// VPC's name rule ([a-z0-9-], starting with a letter, ending with a letter
// or digit) in at most 40 characters. It must never change for a key.
func instanceName(spec provider.Spec) string {
	sum := sha256.Sum256(fmt.Appendf(nil, "%d:%s%d:%s", len(spec.Cluster), spec.Cluster, len(spec.Key), spec.Key))
	return provider.DNSLabel("caa-", spec.Key, sum[:], nameHashLen, maxInstanceName)
}

// encodeUserTags turns a tag map into user tags, in a stable order.
func encodeUserTags(tags map[string]string) ([]string, error) {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(tags)) {
		t, err := encodeTag(k, tags[k])
		if err != nil {
			return nil, err
		}
		out = append(out, t...)
	}
	return out, nil
}

func encodeTag(key, value string) ([]string, error) {
	if key == "" {
		return nil, fmt.Errorf("%w: a tag has an empty key", provider.ErrInvalidSpec)
	}
	ek, ev := escape(key), escape(value)
	if len(ek)+1+len(ev) <= maxUserTag {
		return []string{ek + ":" + ev}, nil
	}
	var out []string
	for i := 0; ev != ""; i++ {
		prefix := ek + chunkMark + strconv.Itoa(i) + ":"
		room := maxUserTag - len(prefix)
		if room < 3 {
			return nil, fmt.Errorf("%w: tag key %q is too long for an IBM Cloud user tag (%d characters escaped)",
				provider.ErrInvalidSpec, key, len(ek))
		}
		cut := min(room, len(ev))
		// Never split an escape: '_' only ever starts one of three bytes.
		if cut < len(ev) {
			if ev[cut-1] == '_' {
				cut--
			} else if ev[cut-2] == '_' {
				cut -= 2
			}
		}
		out = append(out, prefix+ev[:cut])
		ev = ev[cut:]
	}
	return out, nil
}

// decodeUserTags reads back what encodeUserTags wrote. Tags it did not
// write (a person's "env:prod") come through as they are; pieces of a cut
// tag with one missing are dropped rather than guessed.
func decodeUserTags(userTags []string) map[string]string {
	out := map[string]string{}
	pieces := map[string]map[int]string{}
	for _, t := range userTags {
		k, v, _ := strings.Cut(t, ":")
		if base, i, ok := chunkKey(k); ok {
			if pieces[base] == nil {
				pieces[base] = map[int]string{}
			}
			pieces[base][i] = v
			continue
		}
		out[unescapeOr(k)] = unescapeOr(v)
	}
	for base, parts := range pieces {
		var b strings.Builder
		for i := range len(parts) {
			p, ok := parts[i]
			if !ok {
				b.Reset()
				break
			}
			b.WriteString(p)
		}
		if b.Len() > 0 {
			out[unescapeOr(base)] = unescapeOr(b.String())
		}
	}
	return out
}

// chunkKey splits "key_z3" into ("key", 3).
func chunkKey(k string) (string, int, bool) {
	i := strings.LastIndex(k, chunkMark)
	if i <= 0 {
		return "", 0, false
	}
	digits := k[i+len(chunkMark):]
	n, err := strconv.Atoi(digits)
	if err != nil || n < 0 || strconv.Itoa(n) != digits {
		return "", 0, false
	}
	return k[:i], n, true
}

func escape(s string) string {
	const hexDigits = "0123456789abcdef"
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '.' {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('_')
		b.WriteByte(hexDigits[c>>4])
		b.WriteByte(hexDigits[c&0xf])
	}
	return b.String()
}

// unescapeOr undoes escape, or returns s unchanged when s is not what
// escape writes (a tag someone else wrote, like "cost_center"): the
// decoded text must be UTF-8 and escape back to exactly s.
func unescapeOr(s string) string {
	if !strings.Contains(s, "_") {
		return s
	}
	out := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		if s[i] != '_' {
			out = append(out, s[i])
			continue
		}
		if i+2 >= len(s) {
			return s
		}
		v, err := strconv.ParseUint(s[i+1:i+3], 16, 8)
		if err != nil {
			return s
		}
		out = append(out, byte(v))
		i += 2
	}
	if !utf8.Valid(out) || escape(string(out)) != s {
		return s
	}
	return string(out)
}
