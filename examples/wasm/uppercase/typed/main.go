// Command typed is the uppercase map of this example (examples/wasm/uppercase)
// written with the typed helpers, MapOf(String, String, f): the Go typed side
// of BenchmarkTypedVsRaw (internal/runtime).
//
// f reuses one buffer, as the raw example does, so the comparison measures
// the helper, not an allocation per record (strings.ToUpper would make one):
// MapOf copies the string f returns into the output frame before the next
// call, so f may return a string over its buffer.
package main

import (
	"unsafe"

	"github.com/streamd/streamd/examples/wasm/internal/upper"
	streamd "github.com/streamd/streamd/sdk/go"
)

var buf []byte

func upperString(s string) (string, error) {
	buf = upper.Append(buf[:0], unsafe.Slice(unsafe.StringData(s), len(s))) // only read
	return unsafe.String(unsafe.SliceData(buf), len(buf)), nil
}

func init() {
	streamd.Register(streamd.MapOf(streamd.String, streamd.String, upperString))
}

func main() {}
