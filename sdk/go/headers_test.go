//go:build !wasip1

package streamd

import (
	"bytes"
	"encoding/binary"
	"testing"
)

func TestHeaders(t *testing.T) {
	var h Headers
	if h.Len() != 0 {
		t.Fatal("empty headers have a length")
	}
	h = h.Add("trace", []byte("t1")).Add("empty", nil).Add("trace", []byte("t2"))
	if h.Len() != 3 {
		t.Fatalf("Len = %d, want 3", h.Len())
	}
	if v, ok := h.Get("trace"); !ok || string(v) != "t1" {
		t.Fatalf("Get(trace) = %q, %v: want the first, t1", v, ok)
	}
	if v, ok := h.Get("empty"); !ok || len(v) != 0 {
		t.Fatalf("Get(empty) = %q, %v", v, ok)
	}
	if _, ok := h.Get("none"); ok {
		t.Fatal("Get of a missing name found one")
	}
	var got []string
	for n, v := range h.All() {
		got = append(got, n+"="+string(v))
	}
	if want := []string{"trace=t1", "empty=", "trace=t2"}; len(got) != 3 || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
		t.Fatalf("All yields %q, want %q", got, want)
	}
	if validHeaders(h[:len(h)-1]) || !validHeaders(h) || !validHeaders(nil) {
		t.Fatal("validHeaders is wrong about a cut block, a whole one or none")
	}
}

// A record's headers reach ProcessElement, and EmitRecord of it sends them
// on; Emit sends none.
func TestHeadersPassThrough(t *testing.T) {
	hd := Headers(nil).Add("trace", []byte("abc"))
	var seen []Headers
	h := install(t, &funcOp{process: func(r Record, input int) error {
		seen = append(seen, Headers(bytes.Clone(r.Headers)))
		EmitRecord(Record{Key: r.Key, Value: bytes.ToUpper(r.Value), Timestamp: r.Timestamp, Headers: r.Headers})
		Emit(r.Key, r.Value, r.Timestamp)
		return nil
	}})
	in := rec("a", "x", 5)
	in.Headers = hd
	if st := doProcess(0, batch(in, rec("b", "y", 6))); st != statusOK {
		t.Fatalf("status %d, fails %q", st, h.fails)
	}
	if len(seen) != 2 || !bytes.Equal(seen[0], hd) || len(seen[1]) != 0 {
		t.Fatalf("ProcessElement saw headers %q, want [%q none]", seen, hd)
	}
	up := rec("a", "X", 5)
	up.Headers = hd
	want := []Record{up, rec("a", "x", 5), rec("b", "Y", 6), rec("b", "y", 6)}
	if got := h.emitted(); !sameRecords(got, want) {
		t.Fatalf("emitted %v, want %v", got, want)
	}
}

// The typed helpers keep the input record's headers on what they emit for
// it (every specialised map, the generic MapOf, FilterOf, FlatMapOf), and
// Output.EmitWithHeaders sends a record with headers; records without
// headers come out as before.
func TestTypedHelpersKeepHeaders(t *testing.T) {
	hd := Headers(nil).Add("trace", []byte("t-1"))
	withH := func(r Record) Record { r.Headers = hd; return r }
	i64 := func(v int64) []byte { return binary.LittleEndian.AppendUint64(nil, uint64(v)) }
	type point struct{ X int }
	for name, c := range map[string]struct {
		op   Operator
		in   []Record
		outs int // per input record
	}{
		"MapOf-Int64":  {MapOf(Int64, Int64, func(v int64) (int64, error) { return v + 1, nil }), []Record{{Key: []byte("k"), Value: i64(1)}}, 1},
		"MapOf-String": {MapOf(String, String, func(s string) (string, error) { return s + "!", nil }), []Record{{Key: []byte("k"), Value: []byte("a")}}, 1},
		"MapOf-Bytes":  {MapOf(Bytes, Bytes, func(b []byte) ([]byte, error) { return b, nil }), []Record{{Key: []byte("k"), Value: []byte("a")}}, 1},
		"MapOf-JSON":   {MapOf(JSON[point](), JSON[point](), func(p point) (point, error) { return p, nil }), []Record{{Key: []byte("k"), Value: []byte(`{"X":1}`)}}, 1},
		"FilterOf":     {FilterOf(Int64, func(int64) (bool, error) { return true, nil }), []Record{{Key: []byte("k"), Value: i64(2)}}, 1},
		"FlatMapOf":    {FlatMapOf(Int64, Int64, func(v int64, emit func(int64)) error { emit(v); emit(-v); return nil }), []Record{{Key: []byte("k"), Value: i64(3)}}, 2},
		"ProcessOf": {ProcessOf(Int64, Int64, func(r Record, v int64, out *Output[int64]) error {
			out.EmitWithHeaders(r.Key, v, r.Timestamp, r.Headers)
			return nil
		}), []Record{{Key: []byte("k"), Value: i64(4)}}, 1},
	} {
		h := install(t, c.op)
		in := []Record{withH(c.in[0]), c.in[0]}
		if st := doProcess(0, batch(in...)); st != statusOK {
			t.Fatalf("%s: status %d, fails %q", name, st, h.fails)
		}
		got := h.emitted()
		if len(got) != 2*c.outs {
			t.Fatalf("%s: emitted %d records, want %d", name, len(got), 2*c.outs)
		}
		for i, r := range got {
			want := Headers(nil)
			if i < c.outs {
				want = hd
			}
			if !bytes.Equal(r.Headers, want) {
				t.Errorf("%s: output %d has headers %q, want %q", name, i, r.Headers, want)
			}
		}
	}
}
