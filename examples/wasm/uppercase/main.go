// Command uppercase is a stateless streamd operator: it upper-cases the value
// of every record and keeps its key and timestamp.
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o uppercase.wasm .
package main

import (
	"github.com/streamd/streamd/examples/wasm/internal/upper"
	streamd "github.com/streamd/streamd/sdk/go"
)

// buf is reused for every record: Map copies the returned record into the
// output frame before the next call, so ProcessElement does not allocate.
var buf []byte

func init() {
	streamd.Register(streamd.Map(func(r streamd.Record) streamd.Record {
		buf = upper.Append(buf[:0], r.Value)
		r.Value = buf
		return r
	}))
}

func main() {}
