package host_test

import (
	"bytes"
	"context"
	"testing"

	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/internal/testwasm"
)

// Record headers reach a guest that exports streamd_record_headers (both
// SDKs' guests do) and come back with what it emits; a guest without it (a
// hand-written one of ABI v1 before headers) gets the old frame, reads its
// records as before, and what it emits has none.
func TestRecordHeadersThroughGuests(t *testing.T) {
	h := abi.AppendHeader(abi.AppendHeader(nil, "trace", []byte("t-1")), "trace", []byte("t-2"))
	in := []abi.Record{
		{Key: []byte("a"), Value: []byte("xyz"), Timestamp: 1, Headers: h},
		{Key: []byte("b"), Value: []byte("plain"), Timestamp: 2},
	}
	e := newEngine(t)
	for _, tc := range []struct {
		name, path string
		headers    bool
	}{
		{"go uppercase", "examples/wasm/uppercase/uppercase.wasm", true},
		{"rust uppercase", "examples/wasm/uppercase-rust/uppercase_rust.wasm", true},
		{"wat conformance (no export)", watConformance, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			inst := instance(t, load(t, e, testwasm.Path(t, tc.path)), hostCfg())
			var out []abi.Record
			err := inst.Process(context.Background(), 0, in, func(recs []abi.Record) {
				for _, r := range recs {
					out = append(out, abi.Record{Key: bytes.Clone(r.Key), Value: bytes.Clone(r.Value), Timestamp: r.Timestamp, Headers: bytes.Clone(r.Headers)})
				}
			})
			if err != nil {
				t.Fatal(err)
			}
			if len(out) < 2 {
				t.Fatalf("emitted %d records for 2", len(out))
			}
			for _, r := range out {
				want := []byte(nil)
				if tc.headers && string(r.Key) == "a" {
					want = h
				}
				if !bytes.Equal(r.Headers, want) {
					t.Errorf("emitted %q/%q with headers %q, want %q", r.Key, r.Value, r.Headers, want)
				}
			}
			if tc.headers && (string(out[0].Value) != "XYZ" || string(out[1].Value) != "PLAIN") {
				t.Errorf("emitted %q, %q: want the values upper-cased", out[0].Value, out[1].Value)
			}
		})
	}
}
