package connector

import (
	"encoding/binary"
	"errors"

	"github.com/streamd/streamd/abi"
)

// The layout of the records the two-phase-commit sinks (nats, kafka) stage
// in their checkpointed state, big-endian: per record u32 key length, key,
// u32 value length, value, i64 timestamp, and, when the key length has
// stagedHeaders set, u32 length and the header block (abi.Record.Headers).
// States written before headers never set it.

// stagedHeaders in a staged record's key length: a header block follows.
const stagedHeaders = 1 << 31

// StagedSize is the size of r staged.
func StagedSize(r *abi.Record) int {
	n := 4 + len(r.Key) + 4 + len(r.Value) + 8
	if len(r.Headers) > 0 {
		n += 4 + len(r.Headers)
	}
	return n
}

// AppendStaged appends r, staged, to b.
func AppendStaged(b []byte, r *abi.Record) []byte {
	kl := uint32(len(r.Key))
	if len(r.Headers) > 0 {
		kl |= stagedHeaders
	}
	b = binary.BigEndian.AppendUint32(b, kl)
	b = append(b, r.Key...)
	b = binary.BigEndian.AppendUint32(b, uint32(len(r.Value)))
	b = append(b, r.Value...)
	b = binary.BigEndian.AppendUint64(b, uint64(r.Timestamp))
	if len(r.Headers) > 0 {
		b = binary.BigEndian.AppendUint32(b, uint32(len(r.Headers)))
		b = append(b, r.Headers...)
	}
	return b
}

// EachStaged calls f for every record of staged data, until f fails; the
// record's slices alias data. Data cut short, or a header block that runs
// past itself, is an error.
func EachStaged(data []byte, f func(r abi.Record) error) error {
	field := func(l uint32) ([]byte, bool) {
		if uint64(len(data)) < uint64(l) {
			return nil, false
		}
		v := data[:l:l]
		data = data[l:]
		return v, true
	}
	length := func() (uint32, bool) {
		if len(data) < 4 {
			return 0, false
		}
		l := binary.BigEndian.Uint32(data)
		data = data[4:]
		return l, true
	}
	for len(data) > 0 {
		klf, ok := length()
		if !ok {
			return errors.New("truncated record")
		}
		k, ok1 := field(klf &^ stagedHeaders)
		vl, ok2 := length()
		if !ok1 || !ok2 {
			return errors.New("truncated record")
		}
		v, ok := field(vl)
		if !ok || len(data) < 8 {
			return errors.New("truncated record")
		}
		r := abi.Record{Key: k, Value: v, Timestamp: int64(binary.BigEndian.Uint64(data))}
		data = data[8:]
		if klf&stagedHeaders != 0 {
			hl, ok := length()
			if !ok {
				return errors.New("truncated record headers")
			}
			if r.Headers, ok = field(hl); !ok {
				return errors.New("truncated record headers")
			}
			if err := abi.CheckHeaders(r.Headers); err != nil {
				return err
			}
		}
		if err := f(r); err != nil {
			return err
		}
	}
	return nil
}
