package checkpoint

import (
	"encoding/binary"
	"fmt"

	"github.com/streamd/streamd/abi"
)

// Channel state is a section of the subtask's state blob rather than a blob
// of its own: it is written and acknowledged with the rest of the subtask's
// snapshot (one write, one ref, one checksum check on read), a blob without
// it is the version 1 blob unchanged, and the metadata only needs its length
// (SubtaskMeta.InFlightBytes) to report and check it.

// ChannelState is the channel state of one subtask in an unaligned
// checkpoint: the elements the barrier overtook, per channel, in channel
// order. Inputs are the subtask's input channels whose barrier had not
// arrived when it took its snapshot (the elements it had not processed yet);
// Outputs are its output buffers (elements it had emitted that the barrier
// overtook). Each channel at most once in each list.
type ChannelState struct {
	Inputs  []ChannelData
	Outputs []ChannelData
}

// ChannelData is the in-flight content of one channel.
//
// In Inputs it names the sending end: Operator is the upstream uid, Subtask
// the upstream subtask index. In Outputs it names the receiving end: the
// downstream uid and subtask. Input is always the index of the edge among the
// receiving operator's inputs (control.Edge.Input).
type ChannelData struct {
	Operator string
	Subtask  int
	Input    int
	Elements []Element
}

// ElementKind says what an Element is.
type ElementKind uint8

const (
	ElementRecord    ElementKind = 1
	ElementWatermark ElementKind = 2
	// elementRecordHeaders is the encoded kind of an ElementRecord whose
	// record has headers; it decodes as an ElementRecord.
	elementRecordHeaders ElementKind = 3
)

// Element is one record or watermark of a channel.
type Element struct {
	Kind      ElementKind
	Record    abi.Record // ElementRecord; an empty key or value decodes as nil
	Watermark int64      // ElementWatermark
}

// RecordElement returns a record element.
func RecordElement(r abi.Record) Element { return Element{Kind: ElementRecord, Record: r} }

// WatermarkElement returns a watermark element.
func WatermarkElement(ts int64) Element { return Element{Kind: ElementWatermark, Watermark: ts} }

// Empty reports whether c holds no channel (nil counts as empty). An empty
// channel state is not stored: the blob is that of an aligned checkpoint.
func (c *ChannelState) Empty() bool { return c == nil || len(c.Inputs)+len(c.Outputs) == 0 }

// Channel-state section (state blob tag 4), version 1 (integers
// little-endian; docs/checkpoint-format.md):
//
//	"SDCS" u32 version
//	u32 input_count, input_count × channel
//	u32 output_count, output_count × channel
//	u32 crc32c of everything before it
//
//	channel: bytes operator, u32 subtask, u32 input, u32 element_count, elements
//	element: u8 kind; 1 record: bytes key, bytes value, i64 timestamp; 2 watermark: i64 ts;
//	         3 record with headers: bytes key, bytes value, i64 timestamp, bytes headers
//	         (kind 3 is written only for a record with headers, so a state
//	         without any reads as it did before headers)
const (
	channelMagic   = "SDCS"
	channelVersion = 1
)

// minimum encoded sizes, to bound counts by the bytes that remain
const (
	minChannelBytes = 4 + 4 + 4 + 4 // empty operator name, subtask, input, element count
	minElementBytes = 1 + 8         // a watermark
)

// EncodedSize is the length of c's channel-state section: the in-flight
// bytes the metadata records for the subtask (SubtaskMeta.InFlightBytes).
// It is 0 for an empty channel state.
func (c *ChannelState) EncodedSize() int64 {
	if c.Empty() {
		return 0
	}
	n := int64(len(channelMagic) + 4 + 4 + 4 + 4)
	for _, list := range [][]ChannelData{c.Inputs, c.Outputs} {
		for _, ch := range list {
			n += int64(minChannelBytes + len(ch.Operator))
			for _, e := range ch.Elements {
				n += minElementBytes
				if e.Kind == ElementRecord {
					n += int64(8 + len(e.Record.Key) + len(e.Record.Value))
					if len(e.Record.Headers) > 0 {
						n += int64(4 + len(e.Record.Headers))
					}
				}
			}
		}
	}
	return n
}

// Encode returns c's channel-state section (its format is above). It checks
// that no channel appears twice in a list and that every element has a known
// kind.
func (c *ChannelState) Encode() ([]byte, error) {
	if c.Empty() {
		return nil, fmt.Errorf("checkpoint: encode channel state: no channels")
	}
	return c.appendTo(make([]byte, 0, c.EncodedSize()))
}

func (c *ChannelState) appendTo(b []byte) ([]byte, error) {
	le := binary.LittleEndian
	start := len(b)
	b = append(b, channelMagic...)
	b = le.AppendUint32(b, channelVersion)
	for side, list := range [][]ChannelData{c.Inputs, c.Outputs} {
		if err := checkChannels(list, sideName[side]); err != nil {
			return nil, fmt.Errorf("checkpoint: encode channel state: %w", err)
		}
		b = le.AppendUint32(b, uint32(len(list)))
		for _, ch := range list {
			b = le.AppendUint32(b, uint32(len(ch.Operator)))
			b = append(b, ch.Operator...)
			b = le.AppendUint32(b, uint32(ch.Subtask))
			b = le.AppendUint32(b, uint32(ch.Input))
			b = le.AppendUint32(b, uint32(len(ch.Elements)))
			for i, e := range ch.Elements {
				switch e.Kind {
				case ElementRecord:
					h := e.Record.Headers
					if len(h) > 0 {
						b = append(b, byte(elementRecordHeaders))
					} else {
						b = append(b, byte(e.Kind))
					}
					b = le.AppendUint32(b, uint32(len(e.Record.Key)))
					b = append(b, e.Record.Key...)
					b = le.AppendUint32(b, uint32(len(e.Record.Value)))
					b = append(b, e.Record.Value...)
					b = le.AppendUint64(b, uint64(e.Record.Timestamp))
					if len(h) > 0 {
						b = le.AppendUint32(b, uint32(len(h)))
						b = append(b, h...)
					}
				case ElementWatermark:
					b = append(b, byte(e.Kind))
					b = le.AppendUint64(b, uint64(e.Watermark))
				default:
					return nil, fmt.Errorf("checkpoint: encode channel state: %s channel %s: element %d has unknown kind %d", sideName[side], ch.name(), i, e.Kind)
				}
			}
		}
	}
	return le.AppendUint32(b, crc32c(b[start:])), nil
}

var sideName = [2]string{"input", "output"}

func (ch *ChannelData) name() string {
	return fmt.Sprintf("(%s[%d], input %d)", ch.Operator, ch.Subtask, ch.Input)
}

type channelKey struct {
	op             string
	subtask, input int
}

func checkChannels(list []ChannelData, side string) error {
	seen := make(map[channelKey]bool, len(list))
	for _, ch := range list {
		if ch.Operator == "" || ch.Subtask < 0 || ch.Input < 0 {
			return fmt.Errorf("%s channel %s: empty operator or negative index", side, ch.name())
		}
		k := channelKey{ch.Operator, ch.Subtask, ch.Input}
		if seen[k] {
			return fmt.Errorf("%s channel %s appears twice", side, ch.name())
		}
		seen[k] = true
	}
	return nil
}

// DecodeChannelState decodes a channel-state section written by Encode.
// Errors wrap ErrCorrupt. Every count and length is checked against the bytes
// that remain before anything is allocated.
func DecodeChannelState(data []byte) (*ChannelState, error) {
	c, err := decodeChannelState(data)
	if err != nil {
		return nil, fmt.Errorf("%w: channel state: %s", ErrCorrupt, err)
	}
	return c, nil
}

func decodeChannelState(data []byte) (*ChannelState, error) {
	le := binary.LittleEndian
	if len(data) >= 4 && string(data[:4]) != channelMagic {
		return nil, fmt.Errorf("not a channel-state section (magic %q)", data[:4])
	}
	if len(data) < len(channelMagic)+4+4+4+4 {
		return nil, fmt.Errorf("truncated: %d bytes", len(data))
	}
	body := data[:len(data)-4]
	if got, want := crc32c(body), le.Uint32(data[len(data)-4:]); got != want {
		return nil, fmt.Errorf("checksum mismatch (crc32c %08x, stored %08x): corrupt or truncated", got, want)
	}
	if v := le.Uint32(body[4:]); v != channelVersion {
		return nil, fmt.Errorf("version %d, this streamd reads version %d", v, channelVersion)
	}
	r := &reader{b: body, off: 8}
	c := &ChannelState{}
	for side := range 2 {
		n, err := r.count(minChannelBytes, sideName[side]+" channel count")
		if err != nil {
			return nil, err
		}
		list := make([]ChannelData, 0, n)
		for range n {
			var ch ChannelData
			name, err := r.bytes("operator name")
			if err != nil {
				return nil, err
			}
			ch.Operator = string(name)
			sub, err1 := r.u32("subtask")
			in, err2 := r.u32("input")
			if err := firstErr(err1, err2); err != nil {
				return nil, err
			}
			ch.Subtask, ch.Input = int(sub), int(in)
			ne, err := r.count(minElementBytes, fmt.Sprintf("element count of %s channel %s", sideName[side], ch.name()))
			if err != nil {
				return nil, err
			}
			ch.Elements = make([]Element, 0, ne)
			for i := range ne {
				e, err := r.element()
				if err != nil {
					return nil, fmt.Errorf("%s channel %s element %d: %w", sideName[side], ch.name(), i, err)
				}
				ch.Elements = append(ch.Elements, e)
			}
			list = append(list, ch)
		}
		if err := checkChannels(list, sideName[side]); err != nil {
			return nil, err
		}
		if side == 0 {
			c.Inputs = list
		} else {
			c.Outputs = list
		}
	}
	if r.off != len(body) {
		return nil, fmt.Errorf("%d trailing bytes", len(body)-r.off)
	}
	return c, nil
}

// reader reads little-endian fields from b, checking every length against
// what remains.
type reader struct {
	b   []byte
	off int
}

func (r *reader) need(n int, what string) error {
	if n > len(r.b)-r.off {
		return fmt.Errorf("%s at byte %d: %d bytes needed, %d remain (truncated or corrupt)", what, r.off, n, len(r.b)-r.off)
	}
	return nil
}

func (r *reader) u32(what string) (uint32, error) {
	if err := r.need(4, what); err != nil {
		return 0, err
	}
	v := binary.LittleEndian.Uint32(r.b[r.off:])
	r.off += 4
	return v, nil
}

func (r *reader) i64(what string) (int64, error) {
	if err := r.need(8, what); err != nil {
		return 0, err
	}
	v := binary.LittleEndian.Uint64(r.b[r.off:])
	r.off += 8
	return int64(v), nil
}

// count reads a u32 count of items of at least min bytes each and refuses one
// that the remaining bytes cannot hold.
func (r *reader) count(least int, what string) (int, error) {
	at := r.off
	n, err := r.u32(what)
	if err != nil {
		return 0, err
	}
	if rem := len(r.b) - r.off; uint64(n)*uint64(least) > uint64(rem) {
		return 0, fmt.Errorf("%s %d at byte %d exceeds the %d bytes that remain", what, n, at, rem)
	}
	return int(n), nil
}

// bytes reads a u32 length and that many bytes (nil when the length is 0),
// copied.
func (r *reader) bytes(what string) ([]byte, error) {
	at := r.off
	n, err := r.u32(what + " length")
	if err != nil {
		return nil, err
	}
	if uint64(n) > uint64(len(r.b)-r.off) {
		return nil, fmt.Errorf("%s of %d bytes at byte %d exceeds the %d bytes that remain", what, n, at, len(r.b)-r.off)
	}
	if n == 0 {
		return nil, nil
	}
	p := append([]byte(nil), r.b[r.off:r.off+int(n)]...)
	r.off += int(n)
	return p, nil
}

func (r *reader) element() (Element, error) {
	if err := r.need(1, "element kind"); err != nil {
		return Element{}, err
	}
	kind := ElementKind(r.b[r.off])
	r.off++
	switch kind {
	case ElementRecord, elementRecordHeaders:
		k, err := r.bytes("key")
		if err != nil {
			return Element{}, err
		}
		v, err := r.bytes("value")
		if err != nil {
			return Element{}, err
		}
		ts, err := r.i64("timestamp")
		if err != nil {
			return Element{}, err
		}
		rec := abi.Record{Key: k, Value: v, Timestamp: ts}
		if kind == elementRecordHeaders {
			at := r.off
			if rec.Headers, err = r.bytes("headers"); err != nil {
				return Element{}, err
			}
			if err := abi.CheckHeaders(rec.Headers); err != nil {
				return Element{}, fmt.Errorf("headers at byte %d: %w", at, err)
			}
		}
		return RecordElement(rec), nil
	case ElementWatermark:
		ts, err := r.i64("watermark")
		if err != nil {
			return Element{}, err
		}
		return WatermarkElement(ts), nil
	}
	return Element{}, fmt.Errorf("unknown element kind %d at byte %d", kind, r.off-1)
}

func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
