package ledger

import (
	"encoding/hex"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Values as a caa from before the Confidential field wrote them: a
// running aws pod record and sandbox record, bytes frozen here so that no
// change to the encoder can move them.
const (
	preTEERecordHex  = "0101077569642d6f6c6402026e73030377656205066e6f64652d6106036177730706692d3031323309097569642d6f6c642f300a096d36612e6c617267650b05616d692d310e0752756e6e696e67120980c8b1c9c3bce58631150103"
	preTEESandboxHex = "01010673622d6f6c6402077569642d6f6c6403026e73040377656205066e6f64652d6107036177730806692d303132330a0873622d6f6c642f300b096d36612e6c617267650c05616d692d31150752756e6e696e671b0102"
)

// TestPreTEERecordDecodesAsNotConfidential: a record written before caa
// recorded the TEE asked for reads as an ordinary VM, never as a
// confidential one, so caa cannot vouch for a VM nobody asked to be one.
func TestPreTEERecordDecodesAsNotConfidential(t *testing.T) {
	b, err := hex.DecodeString(preTEERecordHex)
	require.NoError(t, err)
	r, err := decodeRecord(b)
	require.NoError(t, err)
	assert.Equal(t, "uid-old", r.PodUID)
	assert.Equal(t, "i-0123", r.VMID)
	assert.Empty(t, r.Confidential)
	assert.Empty(t, r.unknown)

	b, err = hex.DecodeString(preTEESandboxHex)
	require.NoError(t, err)
	s, err := decodeSandbox(b)
	require.NoError(t, err)
	assert.Equal(t, "sb-old", s.ID)
	assert.Empty(t, s.Confidential)
	assert.Empty(t, s.unknown)
}

// TestConfidentialRoundTrips through the codec and through a real ledger
// file, on both kinds of record.
func TestConfidentialRoundTrips(t *testing.T) {
	r := fullRecord()
	r.Confidential = "sev-snp"
	got, err := decodeRecord(encodeRecord(r))
	require.NoError(t, err)
	assert.Equal(t, "sev-snp", got.Confidential)

	b, err := hex.DecodeString(preTEESandboxHex)
	require.NoError(t, err)
	s, err := decodeSandbox(b)
	require.NoError(t, err)
	s.Confidential = "tdx"
	gs, err := decodeSandbox(encodeSandbox(s))
	require.NoError(t, err)
	assert.Equal(t, "tdx", gs.Confidential)
	assert.Empty(t, gs.unknown, "the TEE is a known field, not carried as unknown")
}
