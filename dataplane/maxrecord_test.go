package dataplane

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/streamd/streamd/abi"
)

// A record writer refuses a record over max_record_bytes before taking any
// record of the emit, and stays failed.
func TestWriterMaxRecordBytes(t *testing.T) {
	c := NewLocalChannel("a[0]->b[0]", 4)
	w, err := NewRecordWriter([]Output{c.Output()}, Forward, WriterOptions{BatchSize: 2, MaxRecordBytes: 8})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ok := abi.Record{Key: []byte("k"), Value: []byte("1234567")} // 8 bytes
	if err := w.EmitBatch(ctx, []abi.Record{ok, ok}); err != nil {
		t.Fatalf("records of exactly the limit: %v", err)
	}
	err = w.EmitBatch(ctx, []abi.Record{ok, {Key: []byte("k"), Value: []byte("12345678")}})
	if !errors.Is(err, abi.ErrRecordTooLarge) || !strings.Contains(err.Error(), "record 1 of 2: record too large: a record of 9 bytes (key 1, value 8) is over max_record_bytes 8") {
		t.Fatalf("error %v", err)
	}
	if w.Err() != err || w.Flush(ctx) != err {
		t.Errorf("the writer did not stay failed")
	}
	if c.Len() != 1 {
		t.Errorf("%d batches sent, want only the first emit's", c.Len())
	}
	if d, _ := NewRecordWriter([]Output{c.Output()}, Forward, WriterOptions{}); d.maxRecord != abi.DefaultMaxRecordBytes {
		t.Errorf("default limit %d", d.maxRecord)
	}
}
