// Command rawmap is a benchmark guest: the raw byte API doing what typedmap
// does with MapOf (decode an 8-byte little-endian integer, add one, encode).
package main

import (
	"encoding/binary"
	"errors"

	streamd "github.com/streamd/streamd/sdk/go"
)

type rawMap struct {
	streamd.Base
	buf []byte
}

func (m *rawMap) ProcessElement(r streamd.Record, _ int) error {
	if len(r.Value) != 8 {
		return streamd.Reject(errors.New("not 8 bytes"))
	}
	v := int64(binary.LittleEndian.Uint64(r.Value))
	m.buf = binary.LittleEndian.AppendUint64(m.buf[:0], uint64(v+1))
	streamd.Emit(r.Key, m.buf, r.Timestamp)
	return nil
}

func init() { streamd.Register(&rawMap{}) }

func main() {}
