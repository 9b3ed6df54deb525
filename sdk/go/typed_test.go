//go:build !wasip1

package streamd

import (
	"bytes"
	"encoding/binary"
	"strconv"
	"strings"
	"testing"
	"time"
)

func int64Batch(n int) []byte {
	recs := make([]Record, n)
	for i := range recs {
		recs[i] = Record{Key: []byte("key"), Value: binary.LittleEndian.AppendUint64(nil, uint64(i)), Timestamp: int64(i)}
	}
	return batch(recs...)
}

func typedOps() map[string]Operator {
	return map[string]Operator{
		"MapOf-Int64": MapOf(Int64, Int64, func(v int64) (int64, error) { return v + 1, nil }),
		"MapOf-String": MapOf(String, String, func(s string) (string, error) {
			return s, nil
		}),
		"MapOf-Bytes":   MapOf(Bytes, Bytes, func(b []byte) ([]byte, error) { return b, nil }),
		"FilterOf":      FilterOf(Int64, func(v int64) (bool, error) { return v%2 == 0, nil }),
		"FlatMapOf":     FlatMapOf(Int64, Int64, func(v int64, emit func(int64)) error { emit(v); emit(-v); return nil }),
		"ProcessOf":     ProcessOf(Int64, String, func(r Record, v int64, out *Output[string]) error { out.Emit(r.Key, "x", v); return nil }),
		"MapOf-Float64": MapOf(Int64, Float64, func(v int64) (float64, error) { return float64(v) / 2, nil }),
		"MapOf-F64-F64": MapOf(Float64, Float64, func(v float64) (float64, error) { return v * 2, nil }),
	}
}

// TestTypedHelpersDoNotAllocatePerRecord: a batch through a typed helper
// costs the same few allocations whatever its size (values decode into
// reused variables, results encode into a reused buffer).
func TestTypedHelpersDoNotAllocatePerRecord(t *testing.T) {
	for name, o := range typedOps() {
		install(t, o)
		emits := 0
		nativeHost = countingHost{fakeHost: newFakeHost(), emits: &emits}
		perBatch := func(n int) float64 {
			frame := int64Batch(n)
			doProcess(0, frame)
			return testing.AllocsPerRun(20, func() { doProcess(0, frame) })
		}
		if small, large := perBatch(10), perBatch(2000); small != large || large > 2 {
			t.Errorf("%s: allocations per batch: %v for 10 records, %v for 2000", name, small, large)
		}
		if emits == 0 {
			t.Errorf("%s emitted nothing", name)
		}
	}
}

func TestTypedHelpersOutput(t *testing.T) {
	h := install(t, MapOf(Int64, String, func(v int64) (string, error) { return "n" + strconv.FormatInt(v, 10), nil }))
	doProcess(0, int64Batch(2))
	if got := h.emitted(); !sameRecords(got, []Record{rec("key", "n0", 0), rec("key", "n1", 1)}) {
		t.Fatalf("MapOf emitted %v", got)
	}
	h = install(t, MapOf(Int64, Int64, func(v int64) (int64, error) { return v, nil }))
	if st := doProcess(0, batch(rec("k", "abc", 0))); st != statusReject || len(h.rejects) != 1 || h.rejects[0] != "streamd: MapOf: cannot decode the record's value: Int64: 3 bytes, not 8" {
		t.Fatalf("undecodable value: status %d, rejects %q", st, h.rejects)
	}
	h = install(t, MapOf(Float64, Float64, func(v float64) (float64, error) { return v * 1.5, nil }))
	doProcess(0, batch(Record{Key: []byte("k"), Value: Float64.Encode(nil, 2), Timestamp: 1}))
	if got := h.emitted(); len(got) != 1 || !bytes.Equal(got[0].Value, Float64.Encode(nil, 3)) {
		t.Fatalf("Float64 MapOf emitted %v", got)
	}
	h = install(t, MapOf(String, String, func(s string) (string, error) { return s + "!", nil }))
	doProcess(0, batch(rec("k", "hi", 1)))
	if got := h.emitted(); !sameRecords(got, []Record{rec("k", "hi!", 1)}) {
		t.Fatalf("String MapOf emitted %v", got)
	}
	h = install(t, FilterOf(Int64, func(v int64) (bool, error) { return v%2 == 1, nil }))
	doProcess(0, int64Batch(4))
	if got := h.emitted(); len(got) != 2 || got[0].Timestamp != 1 || got[1].Timestamp != 3 {
		t.Fatalf("FilterOf emitted %v", got)
	}
	h = install(t, FilterOf(String, func(s string) (bool, error) { return s == "b", nil }))
	doProcess(0, batch(rec("k", "a", 1), rec("k", "b", 2)))
	if got := h.emitted(); !sameRecords(got, []Record{rec("k", "b", 2)}) {
		t.Fatalf("FilterOf(String) emitted %v", got)
	}
	type point struct{ X, Y int }
	h = install(t, MapOf(JSON[point](), JSON[point](), func(p point) (point, error) { return point{p.Y, p.X}, nil }))
	doProcess(0, batch(rec("k", `{"X":1,"Y":2}`, 0), rec("k", `{"Y":5}`, 0)))
	if got := h.emitted(); !sameRecords(got, []Record{rec("k", `{"X":2,"Y":1}`, 0), rec("k", `{"X":5,"Y":0}`, 0)}) {
		t.Fatalf("JSON MapOf emitted %v (a reused value must start from zero)", got)
	}
}

// decimal is a user codec: an int64 as decimal text, encoded with
// strconv.AppendInt straight into dst.
type decimal struct{}

func (decimal) Encode(dst []byte, v int64) []byte { return strconv.AppendInt(dst, v, 10) }
func (decimal) Decode(b []byte) (int64, error)    { return strconv.ParseInt(string(b), 10, 64) }

// shortEncode breaks the Codec contract: it does not append to dst.
type shortEncode struct{ decimal }

func (shortEncode) Encode(dst []byte, v int64) []byte { return []byte("x") }

// TestOutputEncodesIntoTheFrame: the generic path encodes every value
// straight into the output frame, which flushes at its threshold as with
// Emit; a codec whose Encode does not append fails the subtask.
func TestOutputEncodesIntoTheFrame(t *testing.T) {
	const n = 10000 // > 64 KiB of output: several frames
	h := install(t, MapOf(Int64, decimal{}, func(v int64) (int64, error) { return v * 1000003, nil }))
	if st := doProcess(0, int64Batch(n)); st != statusOK {
		t.Fatalf("status %d, fails %q", st, h.fails)
	}
	got := h.emitted()
	if len(h.frames) < 2 || len(got) != n {
		t.Fatalf("%d records in %d frames, want %d in several", len(got), len(h.frames), n)
	}
	for i, r := range got {
		if want := strconv.Itoa(i * 1000003); string(r.Value) != want || string(r.Key) != "key" || r.Timestamp != int64(i) {
			t.Fatalf("record %d: %q %q %d, want key %q", i, r.Key, r.Value, r.Timestamp, want)
		}
	}
	// ProcessOf's Output, and a key of its own per value.
	h = install(t, ProcessOf(decimal{}, decimal{}, func(r Record, v int64, out *Output[int64]) error {
		out.Emit(nil, v+1, r.Timestamp)
		out.Emit([]byte("again"), -v, r.Timestamp)
		return nil
	}))
	doProcess(0, batch(rec("k", "41", 7)))
	if got := h.emitted(); !sameRecords(got, []Record{rec("", "42", 7), rec("again", "-41", 7)}) {
		t.Fatalf("ProcessOf emitted %v", got)
	}
	h = install(t, MapOf(Int64, shortEncode{}, func(v int64) (int64, error) { return v, nil }))
	if st := doProcess(0, int64Batch(1)); st == statusOK || len(h.fails) != 1 || !strings.Contains(h.fails[0], "must append to dst") {
		t.Fatalf("an Encode that does not append: status %d, fails %q", st, h.fails)
	}
}

// BenchmarkTypedVsRaw reports the time of typed helpers relative to the raw
// byte API doing the same work (the contract: within 10%).
func BenchmarkTypedVsRaw(b *testing.B) {
	var buf []byte
	raw := Map(func(r Record) Record {
		v := int64(binary.LittleEndian.Uint64(r.Value))
		buf = binary.LittleEndian.AppendUint64(buf[:0], uint64(v+1))
		r.Value = buf
		return r
	})
	typed := MapOf(Int64, Int64, func(v int64) (int64, error) { return v + 1, nil })
	frame := int64Batch(1000)
	emits := 0
	measure := func(o Operator) time.Duration {
		nativeHost, op = countingHost{fakeHost: newFakeHost(), emits: &emits}, o
		start := time.Now()
		for i := 0; i < b.N; i++ {
			doProcess(0, frame)
		}
		return time.Since(start)
	}
	defer func() { nativeHost, op = nil, nil; out.reset() }()
	measure(raw)
	measure(typed)
	var tr, tt time.Duration
	for turn := 0; turn < 3; turn++ {
		tr += measure(raw)
		tt += measure(typed)
	}
	b.ReportMetric(float64(tt)/float64(tr), "typed/raw")
	b.ReportMetric(float64(tt.Nanoseconds())/float64(3*b.N*1000), "ns/record-typed")
}
