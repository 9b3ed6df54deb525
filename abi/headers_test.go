package abi

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"
)

type header struct{ name, value string }

func headersOf(h []byte) []header {
	var out []header
	EachHeader(h, func(n, v []byte) bool { out = append(out, header{string(n), string(v)}); return true })
	return out
}

func TestBatchWithHeaders(t *testing.T) {
	var h []byte
	h = AppendHeader(h, "trace", []byte("abc"))
	h = AppendHeader(h, "empty", nil)
	h = AppendHeader(h, "trace", []byte("second of the name"))
	recs := []Record{
		{Key: []byte("k1"), Value: []byte("v1"), Timestamp: 7, Headers: h},
		{Value: []byte("plain"), Timestamp: NoTimestamp},
		{Key: []byte("k3"), Headers: AppendHeader(nil, "", []byte("nameless"))},
	}
	enc := AppendBatch(nil, recs)
	if len(enc) != BatchSize(recs) {
		t.Fatalf("AppendBatch wrote %d bytes, BatchSize says %d", len(enc), BatchSize(recs))
	}
	put := make([]byte, BatchSize(recs))
	if n := PutBatch(put, recs); n != len(put) || !bytes.Equal(put, enc) {
		t.Fatalf("PutBatch wrote %d bytes, want AppendBatch's %d", n, len(enc))
	}
	// The first record's key length carries the flag, the second's does not.
	if kl := binary.LittleEndian.Uint32(enc[4+8:]); kl != HeadersFlag|2 {
		t.Fatalf("key_len of a record with headers is %#x, want %#x", kl, HeadersFlag|2)
	}
	got, err := DecodeBatch(enc, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range recs {
		if !bytes.Equal(got[i].Key, recs[i].Key) || !bytes.Equal(got[i].Value, recs[i].Value) ||
			got[i].Timestamp != recs[i].Timestamp || !bytes.Equal(got[i].Headers, recs[i].Headers) {
			t.Errorf("record %d: got %+v, want %+v", i, got[i], recs[i])
		}
	}
	want := []header{{"trace", "abc"}, {"empty", ""}, {"trace", "second of the name"}}
	if hs := headersOf(got[0].Headers); len(hs) != 3 || hs[0] != want[0] || hs[1] != want[1] || hs[2] != want[2] {
		t.Errorf("headers %q, want %q", hs, want)
	}
	if n := HeaderCount(got[0].Headers); n != 3 {
		t.Errorf("HeaderCount = %d, want 3", n)
	}
	if got[1].Headers != nil {
		t.Errorf("a record without headers decoded with %q", got[1].Headers)
	}

	// Without headers: the frame a guest that does not read them gets is
	// the old one, byte for byte.
	plain := make([]Record, len(recs))
	for i, r := range recs {
		r.Headers = nil
		plain[i] = r
	}
	no := make([]byte, BatchSizeNoHeaders(recs))
	if n := PutBatchNoHeaders(no, recs); n != len(no) || !bytes.Equal(no, AppendBatch(nil, plain)) {
		t.Fatalf("PutBatchNoHeaders wrote %d bytes unlike the frame of the records without headers", n)
	}
	if RecordBytes(recs[0]) != 4+len(h) || RecordSize(recs[0]) != RecordSizeNoHeaders(recs[0])+4+len(h) {
		t.Errorf("sizes of a record with headers: RecordBytes %d, RecordSize %d", RecordBytes(recs[0]), RecordSize(recs[0]))
	}
	if err := CheckRecordBytes(recs[0], RecordBytes(recs[0])-1); !errors.Is(err, ErrRecordTooLarge) {
		t.Errorf("a record whose headers take it over the limit: %v", err)
	}
}

func TestDecodeBatchRejectsMalformedHeaders(t *testing.T) {
	rec := Record{Key: []byte("k"), Value: []byte("v"), Headers: AppendHeader(nil, "name", []byte("value"))}
	enc := AppendBatch(nil, []Record{rec})
	for _, tc := range []struct {
		name  string
		frame []byte
	}{
		{"no headers length", AppendBatch(nil, []Record{{Key: []byte("k"), Value: []byte("v")}})},
		{"headers cut short", enc[:len(enc)-1]},
		{"block length past the frame", func() []byte {
			b := bytes.Clone(enc)
			binary.LittleEndian.PutUint32(b[len(b)-len(rec.Headers)-4:], uint32(len(rec.Headers)+1))
			return b
		}()},
		{"entry past its block", func() []byte {
			b := bytes.Clone(enc)
			binary.LittleEndian.PutUint32(b[len(b)-len(rec.Headers):], 100)
			return b
		}()},
	} {
		f := tc.frame
		if tc.name == "no headers length" {
			f = bytes.Clone(f)
			binary.LittleEndian.PutUint32(f[4+8:], HeadersFlag|1)
		}
		if _, err := DecodeBatch(f, nil); !errors.Is(err, ErrFrame) {
			t.Errorf("%s: DecodeBatch = %v, want an ErrFrame", tc.name, err)
		}
	}
	if err := CheckHeaders([]byte{1, 0, 0}); !errors.Is(err, ErrFrame) {
		t.Errorf("CheckHeaders of 3 bytes: %v", err)
	}
	if hs := headersOf([]byte{1, 0, 0}); hs != nil {
		t.Errorf("EachHeader of a malformed block yielded %q", hs)
	}
}
