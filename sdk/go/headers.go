package streamd

import (
	"encoding/binary"
	"iter"
)

// Headers are a record's headers (a Kafka record's headers, for one), in
// the frame's encoding (abi/ABI.md, "Record headers"): entries of a name
// and a value, in order, a name possibly repeated. A Headers read from an
// input record aliases the SDK's input buffer like its Key and Value.
// Build one with Add:
//
//	h := streamd.Headers(nil).Add("trace-id", id).Add("source", []byte("orders"))
//	streamd.EmitRecord(streamd.Record{Key: k, Value: v, Timestamp: ts, Headers: h})
//
// EmitRecord(r) of an input record r sends its headers on unchanged.
type Headers []byte

// Add returns h with the header name: value appended (h may be reused as
// with append).
func (h Headers) Add(name string, value []byte) Headers {
	h = binary.LittleEndian.AppendUint32(h, uint32(len(name)))
	h = append(h, name...)
	h = binary.LittleEndian.AppendUint32(h, uint32(len(value)))
	return append(h, value...)
}

// All yields every header, in order. The values alias h.
func (h Headers) All() iter.Seq2[string, []byte] {
	return func(yield func(string, []byte) bool) {
		for off := 0; off < len(h); {
			name, value, next, ok := nextHeader(h, off)
			if !ok || !yield(string(name), value) {
				return
			}
			off = next
		}
	}
}

// Get returns the value of the first header called name.
func (h Headers) Get(name string) ([]byte, bool) {
	for off := 0; off < len(h); {
		n, value, next, ok := nextHeader(h, off)
		if !ok {
			break
		}
		if string(n) == name {
			return value, true
		}
		off = next
	}
	return nil, false
}

// Len is the number of headers.
func (h Headers) Len() int {
	n := 0
	for off := 0; off < len(h); n++ {
		_, _, next, ok := nextHeader(h, off)
		if !ok {
			break
		}
		off = next
	}
	return n
}

// validHeaders reports whether h is a sequence of whole entries.
func validHeaders(h []byte) bool {
	for off := 0; off < len(h); {
		_, _, next, ok := nextHeader(h, off)
		if !ok {
			return false
		}
		off = next
	}
	return true
}

func nextHeader(h []byte, off int) (name, value []byte, next int, ok bool) {
	if len(h)-off < 4 {
		return nil, nil, 0, false
	}
	nl := uint64(binary.LittleEndian.Uint32(h[off:]))
	off += 4
	if nl > uint64(len(h)-off-4) {
		return nil, nil, 0, false
	}
	name = h[off : off+int(nl) : off+int(nl)]
	off += int(nl)
	vl := uint64(binary.LittleEndian.Uint32(h[off:]))
	off += 4
	if vl > uint64(len(h)-off) {
		return nil, nil, 0, false
	}
	return name, h[off : off+int(vl) : off+int(vl)], off + int(vl), true
}
