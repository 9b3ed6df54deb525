// Command failopen is a test guest for upgrades (streamd upgrade): a version
// that fails in open, on every attempt, so an upgrade to it is rolled back.
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o failopen.wasm .
package main

import (
	"errors"

	streamd "github.com/streamd/streamd/sdk/go"
)

type failOpen struct{ streamd.Base }

func (failOpen) Open(*streamd.Context) error {
	return errors.New("failopen: this version fails in open")
}

func (failOpen) ProcessElement(r streamd.Record, _ int) error {
	streamd.EmitRecord(r)
	return nil
}

func init() { streamd.Register(&failOpen{}) }

func main() {}
