// Package keyby is the first stage of the sessionize and interval-join
// examples: it gives every JSON record the value of one of its fields as
// key, so that a hash edge can route it to the subtask that owns the key,
// and keeps the record's value and event time. Each example builds it into
// its own keyby.wasm (see its keyby/ directory).
//
// Config:
//
//	key                   the JSON field whose value is the key (required);
//	                      a string gives its text, anything else its JSON text
//	max_out_of_orderness  optional Go duration: after every record, emit the
//	                      watermark "highest timestamp so far minus this"
//	                      itself (a punctuated watermark), so that lateness
//	                      downstream does not depend on when periodic source
//	                      watermarks happen to be sent; the highest timestamp
//	                      is kept across a restore (operator list state) and
//	                      its watermark emitted again in Open
//
// A line that is not a JSON object with that field is rejected (the job
// file's on_error decides what happens to it).
package keyby

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"time"

	streamd "github.com/streamd/streamd/sdk/go"
)

// KeyBy is the operator.
type KeyBy struct {
	streamd.Base
	field       string
	bound       int64 // ms; -1: no own watermarks
	maxTS       int64
	fields      map[string]json.RawMessage
	lastEmitted int64
}

// New returns the operator; Open reads its config.
func New() *KeyBy { return &KeyBy{} }

func (k *KeyBy) Open(ctx *streamd.Context) error {
	k.field = ctx.Config.String("key", "")
	if k.field == "" {
		return errors.New("keyby: config key (the JSON field to key by) is required")
	}
	k.bound = -1
	if s := ctx.Config.String("max_out_of_orderness", ""); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d < 0 {
			return errors.New("keyby: config max_out_of_orderness " + s + " is not a non-negative Go duration")
		}
		k.bound = d.Milliseconds()
	}
	k.maxTS, k.lastEmitted = streamd.MinWatermark, streamd.MinWatermark
	// After a restore, start from the highest timestamp seen before it, and
	// say so downstream at once: the watermark does not go back, and no
	// record is judged against an older one than before the stop.
	for _, e := range maxTSState.Entries() {
		if len(e) == 8 {
			k.maxTS = max(k.maxTS, int64(binary.LittleEndian.Uint64(e)))
		}
	}
	k.emitWatermark()
	return nil
}

// maxTSState keeps the highest timestamp seen across a restore (union: at
// another parallelism every subtask takes the highest of all).
var maxTSState = streamd.ListState("keyby-max-ts", streamd.Union)

func (k *KeyBy) SnapshotState(int64) error {
	if k.maxTS > streamd.MinWatermark {
		maxTSState.AddUint64(uint64(k.maxTS))
	}
	return nil
}

func (k *KeyBy) emitWatermark() {
	if k.bound < 0 || k.maxTS == streamd.MinWatermark {
		return
	}
	if wm := k.maxTS - k.bound; wm > k.lastEmitted {
		k.lastEmitted = wm
		streamd.EmitWatermark(wm)
	}
}

func (k *KeyBy) ProcessElement(r streamd.Record, _ int) error {
	clear(k.fields)
	if err := json.Unmarshal(r.Value, &k.fields); err != nil {
		return streamd.Reject(errors.New("keyby: not a JSON object: " + err.Error()))
	}
	raw, ok := k.fields[k.field]
	if !ok {
		return streamd.Reject(errors.New("keyby: no field " + k.field))
	}
	key := []byte(raw)
	var s string
	if json.Unmarshal(raw, &s) == nil {
		key = []byte(s)
	}
	streamd.Emit(key, r.Value, r.Timestamp)
	if r.HasTimestamp() && r.Timestamp > k.maxTS {
		k.maxTS = r.Timestamp
		k.emitWatermark()
	}
	return nil
}
