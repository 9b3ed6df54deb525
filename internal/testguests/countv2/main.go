// Command countv2 is a test guest for upgrades (streamd upgrade): the second
// version of failonce's keyed counter (mode count). It keeps the same keyed
// state, "count", so it counts on where failonce stopped, and marks what it
// emits: for every record with key k it emits (k, "k=<count> v2").
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o countv2.wasm .
package main

import (
	"fmt"

	streamd "github.com/streamd/streamd/sdk/go"
)

var count = streamd.ValueState("count")

type countV2 struct {
	streamd.Base
	buf []byte
}

func (f *countV2) ProcessElement(r streamd.Record, _ int) error {
	c, _ := count.GetUint64(r.Key)
	c++
	count.PutUint64(r.Key, c)
	f.buf = append(f.buf[:0], r.Key...)
	f.buf = fmt.Appendf(f.buf, "=%d v2", c)
	streamd.Emit(r.Key, f.buf, r.Timestamp)
	return nil
}

func init() { streamd.Register(&countV2{}) }

func main() {}
