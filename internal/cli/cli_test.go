package cli

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestJSONLogsWriteDurationsForPeople(t *testing.T) {
	var buf bytes.Buffer
	log, err := NewLogger(&buf, "json", "info")
	require.NoError(t, err)
	log.Info("x", "took", 1500*time.Millisecond)
	assert.Contains(t, buf.String(), `"took":"1.5s"`)
}

func TestLoggerFlagsNameTheChoices(t *testing.T) {
	_, err := NewLogger(&bytes.Buffer{}, "xml", "info")
	assert.EqualError(t, err, `--log-format "xml": want text or json`)
	_, err = NewLogger(&bytes.Buffer{}, "text", "loud")
	assert.EqualError(t, err, `--log-level "loud": want debug, info, warn or error`)
}
