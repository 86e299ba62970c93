package provider

import (
	"fmt"
	"os"
	"strings"
)

// Helpers for the providers' settings, which come from flags with
// environment fallbacks and share one syntax for lists and tags.

// SplitList splits a comma-separated setting, trimming spaces and dropping
// empty items.
func SplitList(s string) []string {
	var out []string
	for item := range strings.SplitSeq(s, ",") {
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
	}
	return out
}

// ParseTags reads "k=v,k2=v2"; an item without '=' or with an empty key is
// an error that quotes it.
func ParseTags(s string) (map[string]string, error) {
	out := map[string]string{}
	for _, item := range SplitList(s) {
		k, v, ok := strings.Cut(item, "=")
		if !ok || strings.TrimSpace(k) == "" {
			return nil, fmt.Errorf("%q is not key=value", item)
		}
		out[strings.TrimSpace(k)] = strings.TrimSpace(v)
	}
	return out, nil
}

// FirstEnv returns the value of the first environment variable among keys
// that is set and not empty.
func FirstEnv(keys ...string) string {
	for _, k := range keys {
		if v := os.Getenv(k); v != "" {
			return v
		}
	}
	return ""
}
