package provider

import (
	"maps"
	"slices"
	"strings"
)

// NodeConfigured is implemented by a provider whose creates depend on
// node-level settings beyond the spec (subnet, security groups, zone,
// resource group, extra tags). NodeConfig returns a stable text of them, free
// of secrets: caa keeps a hash of it with a refused spec, so a change of the
// node's configuration retries what the cloud refused.
type NodeConfigured interface {
	NodeConfig() string
}

// NodeConfigOf is p's NodeConfig, or "" when p has none.
func NodeConfigOf(p Provider) string {
	if nc, ok := p.(NodeConfigured); ok {
		return nc.NodeConfig()
	}
	return ""
}

// NodeConfigText writes settings and tags as one stable text, sorted by
// name, for a provider's NodeConfig.
func NodeConfigText(settings, tags map[string]string) string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(settings)) {
		b.WriteString(k + "=" + settings[k] + "\n")
	}
	for _, k := range slices.Sorted(maps.Keys(tags)) {
		b.WriteString("tag " + k + "=" + tags[k] + "\n")
	}
	return b.String()
}
