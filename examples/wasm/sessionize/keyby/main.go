// Command keyby is the first stage of the sessionize example: it keys every
// JSON record by a field and can emit punctuated watermarks (see
// examples/wasm/internal/keyby).
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o ../keyby.wasm .
package main

import (
	streamd "github.com/streamd/streamd/sdk/go"

	"github.com/streamd/streamd/examples/wasm/internal/keyby"
)

func init() { streamd.Register(keyby.New()) }

func main() {}
