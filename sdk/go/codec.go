package streamd

import (
	"bytes"
	"encoding/binary"
	"errors"
	"strconv"
)

// This file holds the ABI v1 frame codecs (abi/ABI.md "Frames"). It is plain
// Go so that it is tested natively; the SDK does not import the host's abi
// package to keep guest binaries small.

const (
	abiVersion   = 1
	recordHeader = 8 + 4 + 4 // timestamp, key length, value length
	// headersFlag in a record's key length: a header block follows its
	// value (u32 length, entries).
	headersFlag = 1 << 31

	// flushThreshold is the size at which Emit sends the output frame to the
	// host before the export call ends.
	flushThreshold = 64 << 10
)

var errFrame = errors.New("streamd: malformed frame")

// frameErr is a decode error; it wraps errFrame.
type frameErr struct{ msg string }

func (e *frameErr) Error() string { return errFrame.Error() + ": " + e.msg }
func (e *frameErr) Unwrap() error { return errFrame }

func frameError(what string, at int) error {
	return &frameErr{what + " at byte " + strconv.Itoa(at)}
}

// checkBatch validates a batch frame and returns its record count. After it
// succeeds, nextRecord can walk the frame without bounds errors.
func checkBatch(src []byte) (int, error) {
	if len(src) < 4 {
		return 0, frameError("batch of "+strconv.Itoa(len(src))+" bytes has no record count", 0)
	}
	n := binary.LittleEndian.Uint32(src)
	if uint64(n)*recordHeader > uint64(len(src)-4) {
		return 0, frameError("batch says "+strconv.FormatUint(uint64(n), 10)+" records but has "+strconv.Itoa(len(src))+" bytes", 0)
	}
	off := 4
	for i := uint32(0); i < n; i++ {
		if len(src)-off < recordHeader {
			return 0, frameError("record header truncated", off)
		}
		klf := binary.LittleEndian.Uint32(src[off+8:])
		kl := uint64(klf &^ headersFlag)
		off += 12
		if kl > uint64(len(src)-off-4) {
			return 0, frameError("key length "+strconv.FormatUint(kl, 10)+" runs past the frame", off)
		}
		off += int(kl)
		vl := uint64(binary.LittleEndian.Uint32(src[off:]))
		off += 4
		if vl > uint64(len(src)-off) {
			return 0, frameError("value length "+strconv.FormatUint(vl, 10)+" runs past the frame", off)
		}
		off += int(vl)
		if klf&headersFlag != 0 {
			if len(src)-off < 4 {
				return 0, frameError("headers length truncated", off)
			}
			hl := uint64(binary.LittleEndian.Uint32(src[off:]))
			off += 4
			if hl > uint64(len(src)-off) {
				return 0, frameError("headers length "+strconv.FormatUint(hl, 10)+" runs past the frame", off)
			}
			if !validHeaders(src[off : off+int(hl)]) {
				return 0, frameError("header entry runs past its block", off)
			}
			off += int(hl)
		}
	}
	if off != len(src) {
		return 0, frameError(strconv.Itoa(len(src)-off)+" trailing bytes", off)
	}
	return int(n), nil
}

// nextRecord decodes the record at off of a frame checkBatch accepted and
// returns it with the offset of the next one. Key and Value alias src; an
// empty key is nil.
func nextRecord(src []byte, off int) (Record, int) {
	ts := int64(binary.LittleEndian.Uint64(src[off:]))
	klf := binary.LittleEndian.Uint32(src[off+8:])
	kl := int(klf &^ headersFlag)
	off += 12
	var key []byte
	if kl > 0 {
		key = src[off : off+kl : off+kl]
	}
	off += kl
	vl := int(binary.LittleEndian.Uint32(src[off:]))
	off += 4
	val := src[off : off+vl : off+vl]
	off += vl
	r := Record{Key: key, Value: val, Timestamp: ts}
	if klf&headersFlag != 0 {
		r.Headers, off = headersAt(src, off)
	}
	return r, off
}

// headersAt returns the header block whose length is at off of a frame
// checkBatch accepted, and the offset after it; out of line, as records
// with headers are the rare case.
//
//go:noinline
func headersAt(src []byte, off int) (Headers, int) {
	hl := int(binary.LittleEndian.Uint32(src[off:]))
	off += 4
	if hl == 0 {
		return nil, off
	}
	return Headers(src[off : off+hl : off+hl]), off + hl
}

// decodeRecords decodes a batch frame into records that own their bytes
// (a native host's view of what the guest emitted).
func decodeRecords(frame []byte) ([]Record, error) {
	n, err := checkBatch(frame)
	if err != nil {
		return nil, err
	}
	recs := make([]Record, 0, n)
	off := 4
	var r Record
	for i := 0; i < n; i++ {
		r, off = nextRecord(frame, off)
		recs = append(recs, Record{Key: bytes.Clone(r.Key), Value: bytes.Clone(r.Value), Timestamp: r.Timestamp, Headers: Headers(bytes.Clone([]byte(r.Headers)))})
	}
	return recs, nil
}

// outFrame accumulates emitted records into one batch frame. Its buffer is
// reused across flushes, so steady-state emitting does not allocate.
type outFrame struct {
	buf   []byte // u32 count placeholder, then the records
	count uint32
}

// Go's wasm code pays for every branch, call and memory access, so the
// common path is kept short: growth is out of line, empty keys and values
// are not copied, o.buf is resliced from itself (no write barrier on its
// pointer), and a record without a key writes its header in two 8-byte
// stores (timestamp; key length 0 and value length). It reports whether
// the frame reached flushThreshold.
func (o *outFrame) add(key, value []byte, ts int64) (full bool) {
	off := len(o.buf)
	if off == 0 {
		off = 4 // room for the count
	}
	need := off + recordHeader + len(key) + len(value)
	if need > cap(o.buf) {
		o.grow(need)
	}
	o.buf = o.buf[:need]
	b := o.buf
	binary.LittleEndian.PutUint64(b[off:], uint64(ts))
	if len(key) == 0 {
		binary.LittleEndian.PutUint64(b[off+8:], uint64(len(value))<<32)
		off += 16
	} else {
		binary.LittleEndian.PutUint32(b[off+8:], uint32(len(key)))
		off += 12
		off += copy(b[off:], key)
		binary.LittleEndian.PutUint32(b[off:], uint32(len(value)))
		off += 4
	}
	if len(value) > 0 {
		copy(b[off:], value)
	}
	o.count++
	return need >= flushThreshold
}

// addWithHeaders is add for a record with headers h (not empty).
//
//go:noinline
func (o *outFrame) addWithHeaders(key, value []byte, ts int64, h Headers) (full bool) {
	off := len(o.buf)
	if off == 0 {
		off = 4 // room for the count
	}
	need := off + recordHeader + len(key) + len(value) + 4 + len(h)
	if need > cap(o.buf) {
		o.grow(need)
	}
	b := o.buf[:need]
	binary.LittleEndian.PutUint64(b[off:], uint64(ts))
	binary.LittleEndian.PutUint32(b[off+8:], uint32(len(key))|headersFlag)
	off += 12
	off += copy(b[off:], key)
	binary.LittleEndian.PutUint32(b[off:], uint32(len(value)))
	off += 4
	off += copy(b[off:], value)
	binary.LittleEndian.PutUint32(b[off:], uint32(len(h)))
	copy(b[off+4:], h)
	o.buf = b
	o.count++
	return need >= flushThreshold
}

// begin starts a record whose value the caller appends to o.buf itself
// (a codec encoding straight into the frame) and returns where its value
// length goes; end finishes it. It repeats add's header code on purpose:
// add written as begin plus the value costs Emit 7% in Go's wasm code (the
// uppercase example through the host).
func (o *outFrame) begin(key []byte, ts int64) int {
	off := len(o.buf)
	if off == 0 {
		off = 4 // room for the count
	}
	need := off + recordHeader + len(key)
	if need > cap(o.buf) {
		o.grow(need)
	}
	b := o.buf[:need]
	binary.LittleEndian.PutUint64(b[off:], uint64(ts))
	binary.LittleEndian.PutUint32(b[off+8:], uint32(len(key)))
	off += 12
	if len(key) > 0 {
		off += copy(b[off:], key)
	}
	o.buf = b
	return off
}

// end finishes the record begun at lenAt, whose value is what was appended
// to the frame since: buf is the frame with the value appended (the result
// of a Codec's Encode(o.buf, v)).
func (o *outFrame) end(lenAt int, buf []byte) {
	if len(buf) < lenAt+4 {
		Fail("streamd: a Codec's Encode(dst, v) returned fewer bytes than dst: it must append to dst")
	}
	binary.LittleEndian.PutUint32(buf[lenAt:], uint32(len(buf)-lenAt-4))
	o.buf = buf
	o.count++
}

// endWithHeaders is end for a record with headers h, begun with a key of
// keyLen bytes: it flags the record's key length and appends h after the
// value. Out of line: records with headers are the rare case.
//
//go:noinline
func (o *outFrame) endWithHeaders(lenAt int, buf []byte, keyLen int, h Headers) {
	o.end(lenAt, buf)
	if len(h) == 0 {
		return
	}
	klAt := lenAt - keyLen - 4
	binary.LittleEndian.PutUint32(o.buf[klAt:], uint32(keyLen)|headersFlag)
	o.buf = binary.LittleEndian.AppendUint32(o.buf, uint32(len(h)))
	o.buf = append(o.buf, h...)
}

// grow makes room for need bytes, at least doubling the buffer.
//
//go:noinline
func (o *outFrame) grow(need int) {
	n := max(need, 2*cap(o.buf), 4096)
	b := make([]byte, len(o.buf), n)
	copy(b, o.buf)
	o.buf = b
}

// frame returns the finished batch frame, or nil when nothing was added.
func (o *outFrame) frame() []byte {
	if o.count == 0 {
		return nil
	}
	binary.LittleEndian.PutUint32(o.buf, o.count)
	return o.buf
}

// reset empties the frame and keeps its buffer.
func (o *outFrame) reset() {
	o.buf = o.buf[:0]
	o.count = 0
}

func (o *outFrame) size() int { return len(o.buf) }

// decodeContext parses the open-context frame.
func decodeContext(src []byte) (*Context, error) {
	d := decoder{b: src}
	if v := d.u32(); d.err == nil && v != abiVersion {
		return nil, &frameErr{"open context has ABI version " + strconv.FormatUint(uint64(v), 10) + ", want 1"}
	}
	c := &Context{}
	c.Subtask = int(d.u32())
	c.Parallelism = int(d.u32())
	c.MaxParallelism = int(d.u32())
	c.Attempt = int(d.u32())
	c.NumInputs = int(d.u32())
	c.Restored = d.u32()&1 != 0
	c.Job = d.str()
	c.Operator = d.str()
	n := d.u32()
	if d.err == nil && uint64(n)*8 > uint64(len(src)-d.off) {
		return nil, frameError("open context says "+strconv.FormatUint(uint64(n), 10)+" config entries but has "+strconv.Itoa(len(src)-d.off)+" bytes left", d.off)
	}
	c.Config = make(Config, n)
	for i := uint32(0); i < n && d.err == nil; i++ {
		k := d.str()
		c.Config[k] = d.str()
	}
	if d.err != nil {
		return nil, d.err
	}
	if d.off != len(src) {
		return nil, frameError(strconv.Itoa(len(src)-d.off)+" trailing bytes in open context", d.off)
	}
	return c, nil
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
		d.err = frameError("open context truncated", d.off)
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
		d.err = frameError("string of "+strconv.FormatUint(uint64(n), 10)+" bytes runs past the frame", d.off)
		return ""
	}
	s := string(d.b[d.off : d.off+int(n)])
	d.off += int(n)
	return s
}
