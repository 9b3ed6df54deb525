// Command failopen is a test guest for upgrades (streamd upgrade): a version
// that fails in open, on every attempt, so an upgrade to it is rolled back.
// It fails the same way every time, unless the operator's config has
// failopen_vary (kept by a module upgrade from the job it replaces): then
// its error names the attempt, so no two failures are the same.
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o failopen.wasm .
package main

import (
	"errors"
	"fmt"

	streamd "github.com/streamd/streamd/sdk/go"
)

type failOpen struct{ streamd.Base }

func (failOpen) Open(ctx *streamd.Context) error {
	if ctx.Config.String("failopen_vary", "") != "" {
		return fmt.Errorf("failopen: this version fails in open (attempt %d)", ctx.Attempt)
	}
	return errors.New("failopen: this version fails in open")
}

func (failOpen) ProcessElement(r streamd.Record, _ int) error {
	streamd.EmitRecord(r)
	return nil
}

func init() { streamd.Register(&failOpen{}) }

func main() {}
