// Command sideout is the Go SDK's watermark and side-output conformance
// operator (internal/conformance/guests/SPEC.md, "sideout"), on the SDK's
// EmitWatermark, InputWatermark and EmitTo. The two misuse cases go to the
// imports themselves (misuse_wasip1.go): the SDK refuses them before the
// host would.
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o ../sideout.wasm .
package main

import (
	"encoding/binary"
	"math"

	streamd "github.com/streamd/streamd/sdk/go"
)

type sideout struct {
	streamd.Base
	wmFinish bool
}

func (s *sideout) ProcessElement(r streamd.Record, _ int) error {
	v := string(r.Value)
	switch {
	case v == "wm":
		streamd.EmitWatermark(r.Timestamp)
	case v == "iw":
		b := binary.LittleEndian.AppendUint64([]byte("iw"), uint64(streamd.InputWatermark(0)))
		streamd.Emit(r.Key, binary.LittleEndian.AppendUint64(b, uint64(streamd.InputWatermark(1))), r.Timestamp)
	case v == "badin":
		streamd.InputWatermark(7)
	case v == "badname":
		emitToRaw("bad name", r)
	case v == "wmfinish":
		s.wmFinish = true
	case len(v) > 0 && v[len(v)-1] >= '1' && v[len(v)-1] <= '9' && (v[len(v)-1]-'0')%2 == 1:
		streamd.EmitTo("side", r.Key, r.Value, r.Timestamp)
	default:
		streamd.Emit(r.Key, r.Value, r.Timestamp)
	}
	return nil
}

func (s *sideout) OnWatermark(ts int64) error {
	if ts != math.MaxInt64 {
		streamd.EmitWatermark(ts - 1000)
	}
	return nil
}

func (s *sideout) Finish() error {
	if s.wmFinish {
		emitWatermarkRaw(0)
	}
	return nil
}

func init() { streamd.Register(&sideout{}) }

func main() {}
