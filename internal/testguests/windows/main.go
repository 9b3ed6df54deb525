// Command windows is a test guest: the window library of the Go SDK, with
// the operator of package windowsop.
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o windows.wasm .
package main

import (
	streamd "github.com/streamd/streamd/sdk/go"

	"github.com/streamd/streamd/internal/testguests/windowsop"
)

func init() { streamd.Register(windowsop.New()) }

func main() {}
