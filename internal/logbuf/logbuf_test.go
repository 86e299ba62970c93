package logbuf_test

import (
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/caa-project/caa/internal/logbuf"
)

// Writers and a reader at once: run under -race, the buffer must hold every
// line whole.
func TestConcurrentWritesKeepEveryLine(t *testing.T) {
	var b logbuf.Buffer
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := range 100 {
				_, _ = fmt.Fprintf(&b, "writer %d line %d\n", w, i)
				_ = b.String()
			}
		})
	}
	wg.Wait()
	lines := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
	assert.Len(t, lines, 400)
	assert.Contains(t, lines, "writer 3 line 99")
}
