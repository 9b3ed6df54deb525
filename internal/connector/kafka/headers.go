package kafka

import (
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/internal/connector"
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

// headerBlock is the header block of hs in the arena; nil for none.
func headerBlock(a *connector.HeaderArena, hs []kgo.RecordHeader) []byte {
	if len(hs) == 0 {
		return nil
	}
	n := 0
	for _, h := range hs {
		n += 8 + len(h.Key) + len(h.Value)
	}
	b := a.Reserve(n)
	for _, h := range hs {
		b = abi.AppendHeader(b, h.Key, h.Value)
	}
	return b
}
