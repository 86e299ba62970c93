package cloud

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestDocCacheBuildsOncePerKeyAndForgetsWhatATurnDidNotUse(t *testing.T) {
	var c DocCache
	builds := 0
	get := func(key string) map[string]any {
		return c.Get(key, func() map[string]any { builds++; return map[string]any{"k": key} })
	}
	get("a")
	require.Equal(t, "a", get("a")["k"])
	get("b")
	require.Equal(t, 2, builds, "a second Get of a key builds nothing")

	c.Turn() // a rendering that uses only "a"
	get("a")
	require.Equal(t, 2, builds, "the generation before still serves")
	c.Turn()
	get("a")
	get("b")
	require.Equal(t, 3, builds, "b was not used in the last generation: built again")
}

func TestDocCacheGenerationIsBounded(t *testing.T) {
	c := DocCache{Max: 2}
	for _, k := range []string{"a", "b", "c", "d", "e"} {
		c.Get(k, func() map[string]any { return map[string]any{} })
	}
	require.LessOrEqual(t, len(c.cur)+len(c.prev), 2*c.Max)
}
