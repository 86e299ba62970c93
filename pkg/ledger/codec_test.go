package ledger

import (
	"bytes"
	"encoding/binary"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fullRecord sets every field, times with nanoseconds in UTC.
func fullRecord() Record {
	return Record{
		PodUID:       "6f1c0e4e-2b7a-4d0e-9a43-0c5b7e1f9d21",
		Namespace:    "team-a",
		Name:         "web-0",
		RuntimeClass: "kata-remote",
		Node:         testNode,
		Provider:     "azure",
		VMID:         "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/virtualMachines/podvm-web-0",
		VMName:       "podvm-web-0",
		Key:          "6f1c0e4e-2b7a-4d0e-9a43-0c5b7e1f9d21/2",
		InstanceType: "Standard_DC2as_v5",
		Image:        "/images/podvm",
		Zone:         "westeurope-1",
		IPs:          []string{"10.1.2.3", "", "fd00::1"},
		Phase:        PhaseRunning,
		Reason:       "Recreated",
		Message:      "VM gone: \x00 ünïcödé \"quoted\"",
		Attempt:      maxAttempt,
		CreatedAt:    time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC),
		UpdatedAt:    time.Date(2026, 1, 2, 3, 4, 5, 999999999, time.UTC),
		LastSeenAt:   time.Date(1969, 12, 31, 23, 59, 59, 1, time.UTC),
		Revision:     1<<64 - 1,
		OpenKeys:     []string{"uid-a2", "uid-a3"},
	}
}

func TestRecordRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name string
		r    Record
	}{
		{"every field", fullRecord()},
		{"only the uid", Record{PodUID: "u"}},
		{"unix epoch times", Record{PodUID: "u", CreatedAt: time.Unix(0, 0).UTC()}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := decodeRecord(encodeRecord(tc.r))
			require.NoError(t, err)
			assert.Equal(t, tc.r, got)
		})
	}
}

func TestEventRoundTrip(t *testing.T) {
	e := Event{Seq: 1<<40 + 3, Time: time.Date(2030, 6, 7, 8, 9, 10, 123456789, time.UTC), Action: ActionDeleted, Record: fullRecord()}
	got, err := decodeEvent(encodeEvent(e))
	require.NoError(t, err)
	assert.Equal(t, e, got)
}

// TestDecodeKeepsUnknownTags: fields of a newer caa are kept, not read,
// and written back byte for byte.
func TestDecodeKeepsUnknownTags(t *testing.T) {
	r := fullRecord()
	data := encodeRecord(r)
	data = appendField(data, 99, []byte("a field from a newer caa"))
	data = appendField(data, 1<<40, nil)
	got, err := decodeRecord(data)
	require.NoError(t, err)
	assert.True(t, hasField(got.unknown, 99))
	assert.True(t, hasField(got.unknown, 1<<40))
	assert.Equal(t, data, encodeRecord(got), "written back unchanged")
	got.unknown = nil
	assert.Equal(t, r, got)

	e := Event{Seq: 7, Time: r.UpdatedAt, Action: ActionUpdated, Record: r}
	edata := appendField(encodeEvent(e), 5, []byte{0xff, 0xff})
	gotE, err := decodeEvent(edata)
	require.NoError(t, err)
	assert.Equal(t, e, gotE)
}

// TestOpenKeysAreARepeatedFieldOfTheirOwn: the open keys of a record take
// a new tag (24), one field per key, in order, so an older caa keeps them
// as unknown fields and writes them back (TestDecodeKeepsUnknownTags), and
// a record written before they existed reads with none.
func TestOpenKeysAreARepeatedFieldOfTheirOwn(t *testing.T) {
	r := Record{PodUID: "u", Key: "u-a1"}
	old := encodeRecord(r)
	got, err := decodeRecord(old)
	require.NoError(t, err)
	assert.Nil(t, got.OpenKeys)

	data := appendField(appendField(bytes.Clone(old), tagOpenKey, []byte("u-a2")), tagOpenKey, []byte("u-a3"))
	got, err = decodeRecord(data)
	require.NoError(t, err)
	assert.Equal(t, []string{"u-a2", "u-a3"}, got.OpenKeys)
	assert.Empty(t, got.unknown)
}

func uvarint(n uint64) []byte { return binary.AppendUvarint(nil, n) }

func TestDecodeRecordRejectsGarbage(t *testing.T) {
	valid := encodeRecord(Record{PodUID: "uid-1", Namespace: "ns"})
	withField := func(tag uint64, v []byte) []byte { return appendField(bytes.Clone(valid), tag, v) }
	for _, tc := range []struct {
		name string
		data []byte
	}{
		{"nil", nil},
		{"empty", []byte{}},
		{"unknown version", append([]byte{2}, valid[1:]...)},
		{"version 0", append([]byte{0}, valid[1:]...)},
		{"only the version", []byte{recordEncodingV1}},
		{"truncated value", valid[:len(valid)-1]},
		{"length past the end", append([]byte{recordEncodingV1, tagPodUID, 200}, "uid-1"...)},
		{"tag without length", append(bytes.Clone(valid), tagReason)},
		{"unterminated tag varint", append(bytes.Clone(valid), 0x80)},
		{"overlong tag varint", append(bytes.Clone(valid), bytes.Repeat([]byte{0xff}, 11)...)},
		{"overlong length varint", append(append(bytes.Clone(valid), tagReason), bytes.Repeat([]byte{0xff}, 11)...)},
		{"length overflows int", append(append(bytes.Clone(valid), tagReason), uvarint(1<<63)...)},
		{"bad revision varint", withField(tagRevision, []byte{0x80})},
		{"revision with trailing bytes", withField(tagRevision, []byte{1, 1})},
		{"empty revision", withField(tagRevision, nil)},
		{"attempt overflow", withField(tagAttempt, uvarint(maxAttempt+1))},
		{"attempt max uint64", withField(tagAttempt, uvarint(1<<64-1))},
		{"bad time", withField(tagCreatedAt, []byte{0x80})},
		{"time with trailing bytes", withField(tagUpdatedAt, []byte{2, 0})},
		{"missing uid", encodeRecord(Record{Namespace: "ns", Name: "n", Phase: PhaseRunning})},
		{"uid cleared by a later field", withField(tagPodUID, nil)},
		{"an event", encodeEvent(Event{Seq: 1, Record: Record{PodUID: "uid-1"}})[:3]},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var r Record
			var err error
			require.NotPanics(t, func() { r, err = decodeRecord(tc.data) })
			require.Error(t, err)
			assert.Equal(t, Record{}, r, "a failed decode returns no partial record")
		})
	}
}

func TestDecodeEventRejectsGarbage(t *testing.T) {
	valid := encodeEvent(Event{Seq: 3, Time: testEpoch, Action: ActionCreated, Record: fullRecord()})
	for _, tc := range []struct {
		name string
		data []byte
	}{
		{"empty", nil},
		{"unknown version", append([]byte{9}, valid[1:]...)},
		{"truncated", valid[:len(valid)/2]},
		{"bad seq", appendField([]byte{eventEncodingV1}, tagEventSeq, []byte{0x80})},
		{"bad time", appendField([]byte{eventEncodingV1}, tagEventTime, nil)},
		{"record without uid", appendField([]byte{eventEncodingV1}, tagEventRecord, []byte{recordEncodingV1})},
		{"record garbage", appendField([]byte{eventEncodingV1}, tagEventRecord, []byte{0xff})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			require.NotPanics(t, func() { _, err = decodeEvent(tc.data) })
			require.Error(t, err)
		})
	}
}

func FuzzDecodeRecord(f *testing.F) {
	f.Add(encodeRecord(fullRecord()))
	f.Add(encodeRecord(Record{PodUID: "u"}))
	f.Add(appendField(encodeRecord(podRecord("uid-1")), 77, []byte("future")))
	f.Add([]byte{})
	f.Add([]byte{recordEncodingV1})
	f.Add([]byte{recordEncodingV1, tagPodUID, 1, 'u', tagAttempt, 5, 0x80, 0x80, 0x80, 0x80, 0x08})
	f.Add([]byte{recordEncodingV1, tagPodUID, 1, 'u', tagCreatedAt, 1, 0x00})
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := decodeRecord(data)
		if err != nil {
			return
		}
		enc := encodeRecord(r)
		again, err := decodeRecord(enc)
		require.NoError(t, err, "a decoded record must encode to something that decodes")
		require.Equal(t, r, again)
		require.Equal(t, enc, encodeRecord(again), "the encoding of a record is canonical")
	})
}

func FuzzDecodeEvent(f *testing.F) {
	f.Add(encodeEvent(Event{Seq: 3, Time: testEpoch, Action: ActionCreated, Record: fullRecord()}))
	f.Add(encodeEvent(Event{Seq: 1, Action: ActionDeleted, Record: Record{PodUID: "u"}}))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		e, err := decodeEvent(data)
		if err != nil {
			return
		}
		enc := encodeEvent(e)
		again, err := decodeEvent(enc)
		require.NoError(t, err, "a decoded event must encode to something that decodes")
		require.Equal(t, e, again)
	})
}
