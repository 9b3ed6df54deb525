// Command window-count counts records per key in event-time tumbling
// windows. Each record's value is a line "key,timestamp_ms", and its key is
// the line's key (keyby/ makes it so); for every window it emits, when the watermark passes the
// window's end, the value "key,window_start,window_end,count" with key = key
// and event time window_end-1. Records of windows the watermark already
// passed are dropped.
//
// Config: size_ms, the window size in milliseconds (default 10000).
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o window-count.wasm .
//
// The count of a window lives in keyed state named "count@<window_end>" under
// the key, and a timer at window_end-1 emits and clears it. Keyed state
// belongs to the key's key group, so at parallelism > 1 the records must
// reach this operator through a hash edge keyed by the same key (see keyby/).
package main

import (
	"errors"
	"strconv"

	streamd "github.com/streamd/streamd/sdk/go"

	"github.com/streamd/streamd/examples/wasm/window-count/line"
)

type windowCount struct {
	streamd.Base
	size int64
	out  []byte // reused output value
}

func (w *windowCount) Open(ctx *streamd.Context) error {
	size, err := ctx.Config.Int("size_ms", 10000)
	if err != nil {
		return err
	}
	if size <= 0 {
		return errors.New("window-count: size_ms must be positive, got " + strconv.FormatInt(size, 10))
	}
	w.size = size
	return nil
}

// window returns the keyed state that counts the window ending at end.
func window(end int64) streamd.Value {
	return streamd.ValueState("count@" + strconv.FormatInt(end, 10))
}

func (w *windowCount) ProcessElement(r streamd.Record, _ int) error {
	key, ts, err := line.Parse(r.Value)
	if err != nil {
		streamd.Log(streamd.LevelWarn, "window-count: skipping line "+string(r.Value)+": "+err.Error())
		return nil
	}
	if string(key) != string(r.Key) {
		// State and timers belong to the record's key, the current key.
		return errors.New("window-count: a record of key " + strconv.Quote(string(r.Key)) + " holds the line of key " +
			strconv.Quote(string(key)) + ": key the lines with keyby first")
	}
	start := ts - (ts%w.size+w.size)%w.size // floor, also for negative ts
	end := start + w.size
	if end < start {
		return errors.New("window-count: timestamp " + strconv.FormatInt(ts, 10) + " is too large for windows of " + strconv.FormatInt(w.size, 10) + " ms")
	}
	if end-1 <= streamd.CurrentWatermark() {
		streamd.Log(streamd.LevelDebug, "window-count: dropping late line "+string(r.Value))
		return nil
	}
	state := window(end)
	n, _ := state.GetUint64(key)
	state.PutUint64(key, n+1)
	if n == 0 {
		streamd.RegisterEventTimeTimer(end - 1)
	}
	return nil
}

func (w *windowCount) OnTimer(ts int64, key []byte) error {
	end := ts + 1
	state := window(end)
	n, ok := state.GetUint64(key)
	if !ok {
		return nil
	}
	state.Delete(key)
	b := append(w.out[:0], key...)
	b = append(b, ',')
	b = strconv.AppendInt(b, end-w.size, 10)
	b = append(b, ',')
	b = strconv.AppendInt(b, end, 10)
	b = append(b, ',')
	b = strconv.AppendUint(b, n, 10)
	w.out = b
	streamd.Emit(key, b, ts)
	return nil
}

func init() { streamd.Register(&windowCount{}) }

func main() {}
