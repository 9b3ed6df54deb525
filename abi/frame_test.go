package abi

import (
	"bytes"
	"errors"
	"math"
	"reflect"
	"testing"
)

func TestBatchRoundTrip(t *testing.T) {
	recs := []Record{
		{Key: []byte("k1"), Value: []byte("v1"), Timestamp: 42},
		{Key: nil, Value: []byte("no key"), Timestamp: NoTimestamp},
		{Key: []byte("k3"), Value: nil, Timestamp: math.MaxInt64},
		{},
	}
	enc := AppendBatch(nil, recs)
	if len(enc) != BatchSize(recs) {
		t.Fatalf("AppendBatch wrote %d bytes, BatchSize says %d", len(enc), BatchSize(recs))
	}
	put := make([]byte, BatchSize(recs))
	if n := PutBatch(put, recs); n != len(put) || !bytes.Equal(put, enc) {
		t.Fatalf("PutBatch wrote %d bytes %x, want %x", n, put, enc)
	}
	got, err := DecodeBatch(enc, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(recs) {
		t.Fatalf("decoded %d records, want %d", len(got), len(recs))
	}
	for i := range recs {
		if !bytes.Equal(got[i].Key, recs[i].Key) || !bytes.Equal(got[i].Value, recs[i].Value) || got[i].Timestamp != recs[i].Timestamp {
			t.Errorf("record %d: got %+v, want %+v", i, got[i], recs[i])
		}
		if len(recs[i].Key) == 0 && got[i].Key != nil {
			t.Errorf("record %d: empty key decoded as %q, want nil (no key)", i, got[i].Key)
		}
	}
}

func TestBatchWireFormat(t *testing.T) {
	// The bytes of ABI.md's batch frame, spelled out: a guest author's reference.
	enc := AppendBatch(nil, []Record{{Key: []byte("k"), Value: []byte("vv"), Timestamp: 1}})
	want := []byte{
		1, 0, 0, 0, // count
		1, 0, 0, 0, 0, 0, 0, 0, // timestamp
		1, 0, 0, 0, 'k', // key
		2, 0, 0, 0, 'v', 'v', // value
	}
	if !bytes.Equal(enc, want) {
		t.Fatalf("frame %v, want %v", enc, want)
	}
}

func TestDecodeBatchRejectsMalformed(t *testing.T) {
	good := AppendBatch(nil, []Record{{Key: []byte("key"), Value: []byte("value"), Timestamp: 7}})
	cases := map[string][]byte{
		"empty":          {},
		"short count":    {1, 0},
		"huge count":     {0xff, 0xff, 0xff, 0xff},
		"truncated":      good[:len(good)-1],
		"trailing bytes": append(append([]byte{}, good...), 0),
		"key past end":   {1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0, 0, 0, 0, 0, 0, 0},
	}
	for name, b := range cases {
		if _, err := DecodeBatch(b, nil); !errors.Is(err, ErrFrame) {
			t.Errorf("%s: err = %v, want ErrFrame", name, err)
		}
	}
}

func FuzzDecodeBatch(f *testing.F) {
	f.Add(AppendBatch(nil, []Record{{Key: []byte("a"), Value: []byte("b"), Timestamp: 3}}))
	f.Add([]byte{0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		recs, err := DecodeBatch(b, nil)
		if err != nil {
			return
		}
		// What decodes re-encodes to the same bytes.
		if re := AppendBatch(nil, recs); !bytes.Equal(re, b) {
			t.Fatalf("re-encoded %x, input %x", re, b)
		}
	})
}

func TestOpenContextRoundTrip(t *testing.T) {
	c := OpenContext{
		Job: "wordcount", Operator: "count", Subtask: 2, Parallelism: 4, MaxParallelism: 128,
		Attempt: 1, NumInputs: 2, Restored: true,
		Config: map[string]string{"min_length": "3", "a": "x"},
	}
	got, err := DecodeOpenContext(AppendOpenContext(nil, c))
	if err != nil {
		t.Fatal(err)
	}
	c.ConfigKeys = []string{"a", "min_length"} // encoded in sorted order
	if !reflect.DeepEqual(got, c) {
		t.Fatalf("got %+v, want %+v", got, c)
	}
	enc := AppendOpenContext(nil, c)
	for i := 0; i < len(enc); i++ {
		if _, err := DecodeOpenContext(enc[:i]); !errors.Is(err, ErrFrame) {
			t.Fatalf("truncated to %d bytes: err = %v, want ErrFrame", i, err)
		}
	}
}
