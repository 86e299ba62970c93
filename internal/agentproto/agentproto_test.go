package agentproto

import (
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/dynamicpb"
)

// The bytes on the wire, written out by hand from kata's field numbers
// (health.proto, agent.proto): tag = field<<3 | wire type.
func TestWireMatchesKatasFieldNumbers(t *testing.T) {
	for name, tc := range map[string]struct {
		msg  *dynamicpb.Message
		want []byte
	}{
		"CheckRequest{service=1}":                       {NewCheckRequest("x"), []byte{0x0a, 1, 'x'}},
		"HealthCheckResponse{status=1 SERVING}":         {NewHealthCheckResponse(Serving), []byte{0x08, 1}},
		"WaitProcessRequest{container_id=1, exec_id=2}": {NewWaitProcessRequest("c", "e"), []byte{0x0a, 1, 'c', 0x12, 1, 'e'}},
		"WaitProcessResponse{status=1}":                 {NewWaitProcessResponse(137), []byte{0x08, 0x89, 0x01}},
	} {
		got, err := proto.MarshalOptions{Deterministic: true}.Marshal(tc.msg)
		require.NoError(t, err, name)
		require.Equal(t, tc.want, got, name)
	}
	resp := NewWaitProcessResponse(0)
	require.NoError(t, proto.Unmarshal([]byte{0x08, 0x89, 0x01}, resp))
	require.EqualValues(t, 137, Status(resp))
	req := EmptyWaitProcessRequest()
	require.NoError(t, proto.Unmarshal([]byte{0x0a, 1, 'c', 0x12, 1, 'e'}, req))
	require.Equal(t, "c", ContainerID(req))
}
