package cloud

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestMemoServesOnlyTheStampItWasMadeAt(t *testing.T) {
	var m Memo[string]
	_, ok := m.Get("q", Stamp{1, 0})
	assert.False(t, ok, "empty")
	m.Put("q", Stamp{1, 0}, "a1")
	v, ok := m.Get("q", Stamp{1, 0})
	assert.True(t, ok)
	assert.Equal(t, "a1", v)
	_, ok = m.Get("q", Stamp{2, 0})
	assert.False(t, ok, "the core changed")
	_, ok = m.Get("q", Stamp{1, 1})
	assert.False(t, ok, "the front end changed")

	m.Put("r", Stamp{2, 0}, "b2")
	_, ok = m.Get("q", Stamp{1, 0})
	assert.False(t, ok, "a put at a new stamp forgets the old one's values")

	small := Memo[int]{Max: 2}
	small.Put("a", Stamp{}, 1)
	small.Put("b", Stamp{}, 2)
	small.Put("c", Stamp{}, 3)
	_, ok = small.Get("a", Stamp{})
	assert.False(t, ok, "full: starts again")
	v3, ok := small.Get("c", Stamp{})
	assert.True(t, ok)
	assert.Equal(t, 3, v3)
}
