package katanode

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/test/e2e/cluster"
)

// TestNewWithFailsWithAnError: a node the apiserver refuses (an invalid
// name) is an error from NewWith, and its undo runs on what it built,
// not on the nil it returns (a panic before: seen in CI under load).
func TestNewWithFailsWithAnError(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := cluster.Start(ctx, t)
	n, err := NewWith(ctx, c, "/nonexistent/caa", "Not_A_Node_Name", Options{})
	require.Error(t, err)
	assert.Nil(t, n)
}
