// Command keyby is the first step of the window-count example: it parses
// lines "key,timestamp_ms" and emits each one unchanged with that key and
// event time, so that a hash edge can route it to the subtask owning the key.
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o ../keyby.wasm .
package main

import (
	streamd "github.com/streamd/streamd/sdk/go"

	"github.com/streamd/streamd/examples/wasm/window-count/line"
)

type keyBy struct{ streamd.Base }

func (keyBy) ProcessElement(r streamd.Record, _ int) error {
	key, ts, err := line.Parse(r.Value)
	if err != nil {
		streamd.Log(streamd.LevelWarn, "keyby: skipping line "+string(r.Value)+": "+err.Error())
		return nil
	}
	streamd.Emit(key, r.Value, ts)
	return nil
}

func init() { streamd.Register(keyBy{}) }

func main() {}
