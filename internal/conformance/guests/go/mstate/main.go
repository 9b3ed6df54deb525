// Command mstate is the Go SDK's structured-state conformance operator
// (internal/conformance/guests/SPEC.md, "mstate"): each record's value is a
// command on the record's key, run with the SDK's RawState, timers and
// clock.
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o ../mstate.wasm .
package main

import (
	"encoding/binary"
	"errors"
	"time"

	streamd "github.com/streamd/streamd/sdk/go"
)

type mstate struct{ streamd.Base }

func (mstate) Open(*streamd.Context) error {
	streamd.NewRawState("ttl", streamd.WithTTL(100*time.Millisecond, streamd.UpdateOnCreateAndWrite))
	streamd.NewRawState("ttlr", streamd.WithTTL(100*time.Millisecond, streamd.UpdateOnReadAndWrite))
	return nil
}

// fields splits a command's fields (u32le len, bytes each); missing ones are empty.
func fields(b []byte) [4][]byte {
	var f [4][]byte
	for i := 0; i < 4 && len(b) >= 4; i++ {
		n := int(binary.LittleEndian.Uint32(b))
		if n > len(b)-4 {
			break
		}
		f[i], b = b[4:4+n], b[4+n:]
	}
	return f
}

func result(op byte, v []byte, ok bool) []byte {
	n := int32(-1)
	if ok {
		n = int32(len(v))
	}
	return append(binary.LittleEndian.AppendUint32([]byte{op}, uint32(n)), v...)
}

func (mstate) ProcessElement(r streamd.Record, _ int) error {
	if len(r.Value) == 0 {
		return errors.New("mstate: empty command")
	}
	op, f := r.Value[0], fields(r.Value[1:])
	s := streamd.NewRawState(string(f[0]))
	switch op {
	case 'g':
		v, ok := s.Get(f[1], f[2])
		streamd.Emit(r.Key, result('g', v, ok), r.Timestamp)
	case 'e':
		v, ok := s.Entries(f[1])
		streamd.Emit(r.Key, result('e', v, ok), r.Timestamp)
	case 'p':
		s.Put(f[1], f[2], f[3])
	case 'a':
		s.Append(f[1], f[2], f[3])
	case 'r':
		s.Remove(f[1], f[2])
	case 'c':
		s.Clear(f[1])
	case 'P':
		streamd.RegisterProcessingTimeTimer(int64(binary.LittleEndian.Uint64(f[0])))
	case 'D':
		streamd.DeleteProcessingTimeTimer(int64(binary.LittleEndian.Uint64(f[0])))
	case 'n':
		streamd.Emit(r.Key, binary.LittleEndian.AppendUint64([]byte("n"), uint64(streamd.CurrentProcessingTime())), r.Timestamp)
	case 'o':
		streamd.ValueState(string(f[0])).Put(r.Key, f[1])
	case 't':
		// The raw import: the SDK itself refuses a TTL outside Open before
		// the host can.
		stateTTL(string(f[0]), int64(binary.LittleEndian.Uint64(f[1])))
	case 'x':
		return streamd.Reject(errors.New("mstate reject"))
	default:
		return errors.New("mstate: unknown command " + string(op))
	}
	return nil
}

func (mstate) OnProcessingTime(ts int64, key []byte) error {
	streamd.Emit(key, binary.LittleEndian.AppendUint64([]byte("pt"), uint64(ts)), ts)
	return nil
}

func init() { streamd.Register(mstate{}) }

func main() {}
