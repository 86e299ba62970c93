package ledger

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"
)

// Values are a version byte followed by fields, each field a uvarint tag, a
// uvarint length and that many bytes. Numbers inside a field are uvarints;
// times are signed varint Unix nanoseconds, absent when zero. A decoder
// keeps the fields it does not know (Record.unknown) and the encoder writes
// them back unchanged, so a field can be added without a new version, and
// a record a newer caa wrote keeps that caa's fields through an older
// caa's updates (a rollback and a roll forward again lose nothing). A
// change of meaning needs a new version byte.
const (
	recordEncodingV1 byte = 1
	eventEncodingV1  byte = 1
)

// Record field tags. Never reuse a retired number.
const (
	tagPodUID       = 1
	tagNamespace    = 2
	tagName         = 3
	tagRuntimeClass = 4
	tagNode         = 5
	tagProvider     = 6
	tagVMID         = 7
	tagVMName       = 8
	tagKey          = 9
	tagInstanceType = 10
	tagImage        = 11
	tagZone         = 12
	tagIP           = 13 // repeated
	tagPhase        = 14
	tagReason       = 15
	tagMessage      = 16
	tagAttempt      = 17
	tagCreatedAt    = 18
	tagUpdatedAt    = 19
	tagLastSeenAt   = 20
	tagRevision     = 21
	tagReplacesVMID = 22
	tagFailedSpec   = 23
	tagOpenKey      = 24 // repeated
	// 25..39 are left to fields other branches add; the TEE is 40.
	tagConfidential = 40
)

// Event field tags.
const (
	tagEventSeq    = 1
	tagEventTime   = 2
	tagEventAction = 3
	tagEventRecord = 4
)

var errTruncated = errors.New("truncated field")

func encodeRecord(r Record) []byte {
	b := make([]byte, 0, 256)
	b = append(b, recordEncodingV1)
	b = appendString(b, tagPodUID, r.PodUID)
	b = appendString(b, tagNamespace, r.Namespace)
	b = appendString(b, tagName, r.Name)
	b = appendString(b, tagRuntimeClass, r.RuntimeClass)
	b = appendString(b, tagNode, r.Node)
	b = appendString(b, tagProvider, r.Provider)
	b = appendString(b, tagVMID, r.VMID)
	b = appendString(b, tagVMName, r.VMName)
	b = appendString(b, tagKey, r.Key)
	b = appendString(b, tagInstanceType, r.InstanceType)
	b = appendString(b, tagImage, r.Image)
	b = appendString(b, tagZone, r.Zone)
	for _, ip := range r.IPs {
		b = appendField(b, tagIP, []byte(ip))
	}
	b = appendString(b, tagPhase, string(r.Phase))
	b = appendString(b, tagReason, r.Reason)
	b = appendString(b, tagMessage, r.Message)
	b = appendUint(b, tagAttempt, uint64(r.Attempt))
	b = appendTime(b, tagCreatedAt, r.CreatedAt)
	b = appendTime(b, tagUpdatedAt, r.UpdatedAt)
	b = appendTime(b, tagLastSeenAt, r.LastSeenAt)
	b = appendUint(b, tagRevision, r.Revision)
	b = appendString(b, tagReplacesVMID, r.ReplacesVMID)
	b = appendString(b, tagFailedSpec, r.FailedSpec)
	for _, k := range r.OpenKeys {
		b = appendField(b, tagOpenKey, []byte(k))
	}
	b = appendString(b, tagConfidential, r.Confidential)
	// Fields of a newer caa go back as they came (a rollback keeps them).
	b = append(b, r.unknown...)
	return buildRecordFields(b, r)
}

// decodeRecord never panics: any malformed input is an error.
func decodeRecord(data []byte) (Record, error) {
	var r Record
	if len(data) == 0 {
		return r, errors.New("empty value")
	}
	if data[0] != recordEncodingV1 {
		return r, fmt.Errorf("unknown record encoding version %d (this caa reads %d)", data[0], recordEncodingV1)
	}
	err := eachField(data[1:], func(tag uint64, v []byte) error {
		var err error
		switch tag {
		case tagPodUID:
			r.PodUID = string(v)
		case tagNamespace:
			r.Namespace = string(v)
		case tagName:
			r.Name = string(v)
		case tagRuntimeClass:
			r.RuntimeClass = string(v)
		case tagNode:
			r.Node = string(v)
		case tagProvider:
			r.Provider = string(v)
		case tagVMID:
			r.VMID = string(v)
		case tagVMName:
			r.VMName = string(v)
		case tagKey:
			r.Key = string(v)
		case tagInstanceType:
			r.InstanceType = string(v)
		case tagImage:
			r.Image = string(v)
		case tagZone:
			r.Zone = string(v)
		case tagIP:
			r.IPs = append(r.IPs, string(v))
		case tagPhase:
			r.Phase = Phase(v)
		case tagReason:
			r.Reason = string(v)
		case tagMessage:
			r.Message = string(v)
		case tagAttempt:
			var n uint64
			n, err = fieldUint(v)
			if err == nil && n > maxAttempt {
				err = fmt.Errorf("attempt %d out of range", n)
			}
			r.Attempt = int(n)
		case tagCreatedAt:
			r.CreatedAt, err = fieldTime(v)
		case tagUpdatedAt:
			r.UpdatedAt, err = fieldTime(v)
		case tagLastSeenAt:
			r.LastSeenAt, err = fieldTime(v)
		case tagRevision:
			r.Revision, err = fieldUint(v)
		case tagReplacesVMID:
			r.ReplacesVMID = string(v)
		case tagFailedSpec:
			r.FailedSpec = string(v)
		case tagOpenKey:
			r.OpenKeys = append(r.OpenKeys, string(v))
		case tagConfidential:
			r.Confidential = string(v)
		default:
			r.unknown = appendField(r.unknown, tag, v)
		}
		if err != nil {
			return fmt.Errorf("field %d: %w", tag, err)
		}
		return nil
	})
	if err != nil {
		return Record{}, err
	}
	if r.PodUID == "" {
		return Record{}, errors.New("record has no pod UID")
	}
	return r, nil
}

// maxAttempt keeps a decoded attempt inside an int on every platform.
const maxAttempt = 1<<31 - 1

func encodeEvent(e Event) []byte {
	rec := encodeRecord(e.Record)
	b := make([]byte, 0, len(rec)+32)
	b = append(b, eventEncodingV1)
	b = appendUint(b, tagEventSeq, e.Seq)
	b = appendTime(b, tagEventTime, e.Time)
	b = appendString(b, tagEventAction, string(e.Action))
	b = appendField(b, tagEventRecord, rec)
	return b
}

func decodeEvent(data []byte) (Event, error) {
	var e Event
	if len(data) == 0 {
		return e, errors.New("empty value")
	}
	if data[0] != eventEncodingV1 {
		return e, fmt.Errorf("unknown event encoding version %d (this caa reads %d)", data[0], eventEncodingV1)
	}
	err := eachField(data[1:], func(tag uint64, v []byte) error {
		var err error
		switch tag {
		case tagEventSeq:
			e.Seq, err = fieldUint(v)
		case tagEventTime:
			e.Time, err = fieldTime(v)
		case tagEventAction:
			e.Action = Action(v)
		case tagEventRecord:
			e.Record, err = decodeRecord(v)
		}
		if err != nil {
			return fmt.Errorf("field %d: %w", tag, err)
		}
		return nil
	})
	if err != nil {
		return Event{}, err
	}
	if e.Record.PodUID == "" {
		return Event{}, errors.New("event has no record")
	}
	return e, nil
}

func appendField(b []byte, tag uint64, v []byte) []byte {
	b = binary.AppendUvarint(b, tag)
	b = binary.AppendUvarint(b, uint64(len(v)))
	return append(b, v...)
}

func appendString(b []byte, tag uint64, s string) []byte {
	if s == "" {
		return b
	}
	b = binary.AppendUvarint(b, tag)
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

func appendUint(b []byte, tag uint64, n uint64) []byte {
	if n == 0 {
		return b
	}
	var tmp [binary.MaxVarintLen64]byte
	return appendField(b, tag, binary.AppendUvarint(tmp[:0], n))
}

func appendTime(b []byte, tag uint64, t time.Time) []byte {
	if t.IsZero() {
		return b
	}
	var tmp [binary.MaxVarintLen64]byte
	return appendField(b, tag, binary.AppendVarint(tmp[:0], t.UnixNano()))
}

func eachField(data []byte, fn func(tag uint64, v []byte) error) error {
	for len(data) > 0 {
		tag, n := binary.Uvarint(data)
		if n <= 0 {
			return errors.New("bad field tag")
		}
		data = data[n:]
		size, n := binary.Uvarint(data)
		if n <= 0 {
			return fmt.Errorf("field %d: bad length", tag)
		}
		data = data[n:]
		if size > uint64(len(data)) {
			return fmt.Errorf("field %d: %w: wants %d bytes, %d left", tag, errTruncated, size, len(data))
		}
		if err := fn(tag, data[:size]); err != nil {
			return err
		}
		data = data[size:]
	}
	return nil
}

// hasField reports whether encoded fields hold one with tag.
func hasField(data []byte, tag uint64) bool {
	found := false
	_ = eachField(data, func(t uint64, _ []byte) error {
		found = found || t == tag
		return nil
	})
	return found
}

func fieldUint(v []byte) (uint64, error) {
	n, k := binary.Uvarint(v)
	if k <= 0 || k != len(v) {
		return 0, errors.New("bad number")
	}
	return n, nil
}

func fieldTime(v []byte) (time.Time, error) {
	n, k := binary.Varint(v)
	if k <= 0 || k != len(v) {
		return time.Time{}, errors.New("bad time")
	}
	return time.Unix(0, n).UTC(), nil
}
