package connector

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/streamd/streamd/abi"
)

// EventTime takes a record's event time from a JSON field of its value
// (a source's timestamp: {field: NAME}) and keeps the largest one seen:
// the source's watermark is that minus the lag (max_out_of_orderness).
type EventTime struct {
	Field string // "": the record's own timestamp
	Lag   int64  // ms
	maxTS int64
	any   bool
}

// errTimestamp is wrapped by every bad timestamp field.
var errTimestamp = errors.New("bad event timestamp")

// extract returns the event time in the JSON field e.Field of value: a
// number (ms since the epoch) or an RFC 3339 string.
func (e *EventTime) extract(value []byte) (int64, error) {
	dec := json.NewDecoder(bytes.NewReader(value))
	dec.UseNumber()
	var obj map[string]json.RawMessage
	if err := dec.Decode(&obj); err != nil || obj == nil {
		return 0, fmt.Errorf("%w: the value is not a JSON object (timestamp field %q)", errTimestamp, e.Field)
	}
	raw, ok := obj[e.Field]
	if !ok {
		return 0, fmt.Errorf("%w: field %q is missing", errTimestamp, e.Field)
	}
	raw = bytes.TrimSpace(raw)
	if len(raw) > 0 && raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return 0, fmt.Errorf("%w: field %q: %v", errTimestamp, e.Field, err)
		}
		t, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			return 0, fmt.Errorf("%w: field %q: %q is not an RFC 3339 time (like 2024-05-01T12:00:00Z)", errTimestamp, e.Field, s)
		}
		return t.UnixMilli(), nil
	}
	if ms, err := strconv.ParseInt(string(raw), 10, 64); err == nil {
		if ms == abi.NoTimestamp {
			return 0, fmt.Errorf("%w: field %q: %d is out of range", errTimestamp, e.Field, ms)
		}
		return ms, nil
	}
	f, err := strconv.ParseFloat(string(raw), 64)
	if err != nil || math.IsInf(f, 0) || f != math.Trunc(f) || f <= math.MinInt64 || f >= math.MaxInt64 {
		return 0, fmt.Errorf("%w: field %q: %s is neither an integer number of milliseconds nor an RFC 3339 string", errTimestamp, e.Field, raw)
	}
	return int64(f), nil
}

// stamp sets r's timestamp from its value (with a field) and advances the
// largest timestamp seen.
func (e *EventTime) stamp(r *abi.Record) error {
	if e.Field != "" {
		ts, err := e.extract(r.Value)
		if err != nil {
			return err
		}
		r.Timestamp = ts
	}
	if r.Timestamp != abi.NoTimestamp && (!e.any || r.Timestamp > e.maxTS) {
		e.maxTS, e.any = r.Timestamp, true
	}
	return nil
}

// Watermark is the largest timestamp seen minus the lag, abi.MinWatermark
// before any.
func (e *EventTime) Watermark() int64 {
	if !e.any {
		return abi.MinWatermark
	}
	if e.maxTS < math.MinInt64+e.Lag {
		return abi.MinWatermark
	}
	return e.maxTS - e.Lag
}
