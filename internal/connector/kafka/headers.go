package kafka

import (
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/streamd/streamd/abi"
)

// kafkaHeaders are the Kafka record headers of the header block h
// (abi.Record.Headers), their values aliasing h; nil for none.
func kafkaHeaders(h []byte) []kgo.RecordHeader {
	if len(h) == 0 {
		return nil
	}
	out := make([]kgo.RecordHeader, 0, 4)
	abi.EachHeader(h, func(name, value []byte) bool {
		out = append(out, kgo.RecordHeader{Key: string(name), Value: value})
		return true
	})
	return out
}

// headerArena holds the header blocks of the records a source reads. A
// block is never overwritten (a full chunk is replaced, not reused), so a
// record's headers stay valid as long as it is referenced.
type headerArena struct{ buf []byte }

// block returns the header block of hs in the arena; nil for none.
func (a *headerArena) block(hs []kgo.RecordHeader) []byte {
	if len(hs) == 0 {
		return nil
	}
	n := 0
	for _, h := range hs {
		n += 8 + len(h.Key) + len(h.Value)
	}
	if cap(a.buf)-len(a.buf) < n {
		a.buf = make([]byte, 0, max(64<<10, n))
	}
	at := len(a.buf)
	for _, h := range hs {
		a.buf = abi.AppendHeader(a.buf, h.Key, h.Value)
	}
	return a.buf[at:len(a.buf):len(a.buf)]
}
