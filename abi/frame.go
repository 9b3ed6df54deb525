package abi

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Record is one stream element: optional key, value, event timestamp
// (NoTimestamp when it has none) and headers. An empty key means "no key".
//
// Headers is the record's header block (nil: none), as the frame carries it:
// entries of u32 name_len, name, u32 value_len, value. Build one with
// AppendHeader and read it with EachHeader; names may repeat, and their
// order is kept.
type Record struct {
	Key       []byte
	Value     []byte
	Timestamp int64
	Headers   []byte
}

// ErrFrame is wrapped by every framing decode error.
var ErrFrame = errors.New("abi: malformed frame")

const recordHeader = 8 + 4 + 4 // timestamp, key length, value length

// HeadersFlag set in a record's u32 key_len says a header block follows its
// value (u32 headers_len, headers). Key lengths are below max_record_bytes
// (at most 1 GiB), so the bit was never set in a frame without headers.
const HeadersFlag = 1 << 31

// RecordSize is the encoded size of r inside a batch frame.
func RecordSize(r Record) int {
	n := recordHeader + len(r.Key) + len(r.Value)
	if len(r.Headers) > 0 {
		n += 4 + len(r.Headers)
	}
	return n
}

// RecordSizeNoHeaders is the encoded size of r without its headers, as
// PutBatchNoHeaders frames it.
func RecordSizeNoHeaders(r Record) int { return recordHeader + len(r.Key) + len(r.Value) }

// BatchSize is the encoded size of a batch frame holding recs.
func BatchSize(recs []Record) int {
	n := 4
	for i := range recs {
		n += RecordSize(recs[i])
	}
	return n
}

// BatchSizeNoHeaders is BatchSize for PutBatchNoHeaders.
func BatchSizeNoHeaders(recs []Record) int {
	n := 4
	for i := range recs {
		n += recordHeader + len(recs[i].Key) + len(recs[i].Value)
	}
	return n
}

// AppendBatch appends the batch frame of recs to dst:
//
//	u32 count, then count times: i64 timestamp, u32 key_len, key, u32 value_len, value
//	[, u32 headers_len, headers when key_len has HeadersFlag]
//
// all little-endian, unaligned.
func AppendBatch(dst []byte, recs []Record) []byte {
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(recs)))
	for i := range recs {
		dst = AppendRecord(dst, recs[i])
	}
	return dst
}

// AppendRecord appends one record (without the batch count) to dst.
func AppendRecord(dst []byte, r Record) []byte {
	kl := uint32(len(r.Key))
	if len(r.Headers) > 0 {
		kl |= HeadersFlag
	}
	dst = binary.LittleEndian.AppendUint64(dst, uint64(r.Timestamp))
	dst = binary.LittleEndian.AppendUint32(dst, kl)
	dst = append(dst, r.Key...)
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(r.Value)))
	dst = append(dst, r.Value...)
	if len(r.Headers) > 0 {
		dst = binary.LittleEndian.AppendUint32(dst, uint32(len(r.Headers)))
		dst = append(dst, r.Headers...)
	}
	return dst
}

// PutBatch encodes recs into dst, which must be at least BatchSize(recs) long,
// and returns the number of bytes written. It does not allocate.
func PutBatch(dst []byte, recs []Record) int { return putBatch(dst, recs, true) }

// PutBatchNoHeaders is PutBatch without the records' headers, for a guest
// that does not read them (ABI.md, "Record headers"); dst must be at least
// BatchSizeNoHeaders(recs) long.
func PutBatchNoHeaders(dst []byte, recs []Record) int { return putBatch(dst, recs, false) }

func putBatch(dst []byte, recs []Record, headers bool) int {
	binary.LittleEndian.PutUint32(dst, uint32(len(recs)))
	off := 4
	for i := range recs {
		r := &recs[i]
		kl := uint32(len(r.Key))
		hdr := headers && len(r.Headers) > 0
		if hdr {
			kl |= HeadersFlag
		}
		binary.LittleEndian.PutUint64(dst[off:], uint64(r.Timestamp))
		binary.LittleEndian.PutUint32(dst[off+8:], kl)
		off += 12
		off += copy(dst[off:], r.Key)
		binary.LittleEndian.PutUint32(dst[off:], uint32(len(r.Value)))
		off += 4
		off += copy(dst[off:], r.Value)
		if hdr {
			binary.LittleEndian.PutUint32(dst[off:], uint32(len(r.Headers)))
			off += 4
			off += copy(dst[off:], r.Headers)
		}
	}
	return off
}

// DecodeBatch appends the records of the batch frame src to dst. The keys,
// values and headers alias src. Trailing bytes after the last record are an
// error.
func DecodeBatch(src []byte, dst []Record) ([]Record, error) {
	if len(src) < 4 {
		return dst, fmt.Errorf("%w: batch of %d bytes has no record count", ErrFrame, len(src))
	}
	n := binary.LittleEndian.Uint32(src)
	// Each record takes at least recordHeader bytes: a count larger than that
	// allows is corrupt, and must not make us allocate.
	if uint64(n)*recordHeader > uint64(len(src)-4) {
		return dst, fmt.Errorf("%w: batch says %d records but has only %d bytes", ErrFrame, n, len(src))
	}
	off := 4
	for i := uint32(0); i < n; i++ {
		r, next, err := decodeRecord(src, off)
		if err != nil {
			return dst, fmt.Errorf("%w (record %d of %d)", err, i, n)
		}
		dst = append(dst, r)
		off = next
	}
	if off != len(src) {
		return dst, fmt.Errorf("%w: %d trailing bytes after %d records", ErrFrame, len(src)-off, n)
	}
	return dst, nil
}

func decodeRecord(src []byte, off int) (Record, int, error) {
	if len(src)-off < recordHeader {
		return Record{}, 0, fmt.Errorf("%w: record header truncated at byte %d", ErrFrame, off)
	}
	ts := int64(binary.LittleEndian.Uint64(src[off:]))
	klf := binary.LittleEndian.Uint32(src[off+8:])
	kl := int(klf &^ HeadersFlag)
	off += 12
	if kl > len(src)-off-4 {
		return Record{}, 0, fmt.Errorf("%w: key length %d runs past the frame at byte %d", ErrFrame, kl, off)
	}
	key := src[off : off+kl : off+kl]
	off += kl
	vl := int(binary.LittleEndian.Uint32(src[off:]))
	off += 4
	if vl < 0 || vl > len(src)-off {
		return Record{}, 0, fmt.Errorf("%w: value length %d runs past the frame at byte %d", ErrFrame, vl, off)
	}
	val := src[off : off+vl : off+vl]
	off += vl
	if kl == 0 {
		key = nil
	}
	r := Record{Key: key, Value: val, Timestamp: ts}
	if klf&HeadersFlag != 0 {
		if len(src)-off < 4 {
			return Record{}, 0, fmt.Errorf("%w: headers length truncated at byte %d", ErrFrame, off)
		}
		hl := int(binary.LittleEndian.Uint32(src[off:]))
		off += 4
		if hl < 0 || hl > len(src)-off {
			return Record{}, 0, fmt.Errorf("%w: headers length %d runs past the frame at byte %d", ErrFrame, hl, off)
		}
		h := src[off : off+hl : off+hl]
		if err := CheckHeaders(h); err != nil {
			return Record{}, 0, fmt.Errorf("%w at byte %d", err, off)
		}
		off += hl
		if hl > 0 {
			r.Headers = h
		}
	}
	return r, off, nil
}

// AppendHeader appends the header name: value to the header block h.
func AppendHeader(h []byte, name string, value []byte) []byte {
	h = binary.LittleEndian.AppendUint32(h, uint32(len(name)))
	h = append(h, name...)
	h = binary.LittleEndian.AppendUint32(h, uint32(len(value)))
	return append(h, value...)
}

// EachHeader calls f with each header of the block h in order, until f
// returns false. The name and value alias h. A malformed block (see
// CheckHeaders) ends the walk at its first bad entry.
func EachHeader(h []byte, f func(name, value []byte) bool) {
	for off := 0; off < len(h); {
		name, value, next, ok := nextHeader(h, off)
		if !ok || !f(name, value) {
			return
		}
		off = next
	}
}

// HeaderCount is the number of headers in the block h.
func HeaderCount(h []byte) int {
	n := 0
	EachHeader(h, func(_, _ []byte) bool { n++; return true })
	return n
}

// CheckHeaders returns an error wrapping ErrFrame if h is not a sequence of
// whole header entries.
func CheckHeaders(h []byte) error {
	n := 0
	for off := 0; off < len(h); n++ {
		_, _, next, ok := nextHeader(h, off)
		if !ok {
			return fmt.Errorf("%w: header %d runs past its block of %d bytes", ErrFrame, n, len(h))
		}
		off = next
	}
	return nil
}

func nextHeader(h []byte, off int) (name, value []byte, next int, ok bool) {
	if len(h)-off < 4 {
		return nil, nil, 0, false
	}
	nl := int(binary.LittleEndian.Uint32(h[off:]))
	off += 4
	if nl < 0 || nl > len(h)-off-4 {
		return nil, nil, 0, false
	}
	name = h[off : off+nl : off+nl]
	off += nl
	vl := int(binary.LittleEndian.Uint32(h[off:]))
	off += 4
	if vl < 0 || vl > len(h)-off {
		return nil, nil, 0, false
	}
	return name, h[off : off+vl : off+vl], off + vl, true
}

// OpenContext is what the host passes to the guest's open export.
type OpenContext struct {
	Job            string
	Operator       string // the operator's uid
	Subtask        int    // 0-based index of this parallel instance
	Parallelism    int
	MaxParallelism int // number of key groups
	Attempt        int // 0 on the first run, +1 on every restart
	NumInputs      int
	Restored       bool              // state was restored from a checkpoint or savepoint
	Config         map[string]string // the operator's config from the job file, flattened to strings
	ConfigKeys     []string          // the order Config is encoded in; nil means sorted order
}

const flagRestored = 1

// AppendOpenContext appends the open-context frame:
//
//	u32 abi_version, u32 subtask, u32 parallelism, u32 max_parallelism, u32 attempt,
//	u32 num_inputs, u32 flags (bit 0: restored), u32 job_len, job, u32 operator_len,
//	operator, u32 config_count, config_count times (u32 key_len, key, u32 value_len, value)
func AppendOpenContext(dst []byte, c OpenContext) []byte {
	le := binary.LittleEndian
	dst = le.AppendUint32(dst, Version)
	for _, v := range []int{c.Subtask, c.Parallelism, c.MaxParallelism, c.Attempt, c.NumInputs} {
		dst = le.AppendUint32(dst, uint32(v))
	}
	var flags uint32
	if c.Restored {
		flags |= flagRestored
	}
	dst = le.AppendUint32(dst, flags)
	dst = appendString(dst, c.Job)
	dst = appendString(dst, c.Operator)
	keys := c.ConfigKeys
	if keys == nil {
		keys = sortedKeys(c.Config)
	}
	dst = le.AppendUint32(dst, uint32(len(keys)))
	for _, k := range keys {
		dst = appendString(dst, k)
		dst = appendString(dst, c.Config[k])
	}
	return dst
}

// DecodeOpenContext parses an open-context frame.
func DecodeOpenContext(src []byte) (OpenContext, error) {
	d := decoder{b: src}
	var c OpenContext
	if v := d.u32(); d.err == nil && v != Version {
		return c, fmt.Errorf("%w: open context has ABI version %d, want %d", ErrFrame, v, Version)
	}
	c.Subtask = int(d.u32())
	c.Parallelism = int(d.u32())
	c.MaxParallelism = int(d.u32())
	c.Attempt = int(d.u32())
	c.NumInputs = int(d.u32())
	flags := d.u32()
	c.Restored = flags&flagRestored != 0
	c.Job = d.str()
	c.Operator = d.str()
	n := d.u32()
	if d.err == nil && uint64(n)*8 > uint64(len(d.b)-d.off) {
		return c, fmt.Errorf("%w: open context says %d config entries but has %d bytes left", ErrFrame, n, len(d.b)-d.off)
	}
	c.Config = make(map[string]string, n)
	for i := uint32(0); i < n && d.err == nil; i++ {
		k := d.str()
		c.Config[k] = d.str()
		c.ConfigKeys = append(c.ConfigKeys, k)
	}
	if d.err != nil {
		return c, d.err
	}
	if d.off != len(src) {
		return c, fmt.Errorf("%w: %d trailing bytes in open context", ErrFrame, len(src)-d.off)
	}
	return c, nil
}

func appendString(dst []byte, s string) []byte {
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(s)))
	return append(dst, s...)
}

type decoder struct {
	b   []byte
	off int
	err error
}

func (d *decoder) u32() uint32 {
	if d.err != nil {
		return 0
	}
	if len(d.b)-d.off < 4 {
		d.err = fmt.Errorf("%w: truncated at byte %d", ErrFrame, d.off)
		return 0
	}
	v := binary.LittleEndian.Uint32(d.b[d.off:])
	d.off += 4
	return v
}

func (d *decoder) str() string {
	n := d.u32()
	if d.err != nil {
		return ""
	}
	if uint64(n) > uint64(len(d.b)-d.off) {
		d.err = fmt.Errorf("%w: string of %d bytes runs past the frame at byte %d", ErrFrame, n, d.off)
		return ""
	}
	s := string(d.b[d.off : d.off+int(n)])
	d.off += int(n)
	return s
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	// insertion sort: config maps are small and this package stays dependency-light
	for i := 1; i < len(keys); i++ {
		for j := i; j > 0 && keys[j] < keys[j-1]; j-- {
			keys[j], keys[j-1] = keys[j-1], keys[j]
		}
	}
	return keys
}
