package dataplane

import (
	"testing"

	"github.com/streamd/streamd/abi"
)

// A retained batch keeps its records through its owner's Release and is
// reset only at the Release that matches the last Retain.
func TestBatchRetain(t *testing.T) {
	b := GetBatch()
	b.Append(abi.Record{Key: []byte("k"), Value: []byte("value")})
	recs := b.Records
	b.Retain()
	b.Retain()
	b.Release() // the owner
	b.Release() // the first holder
	if b.Len() != 1 || string(recs[0].Value) != "value" {
		t.Fatalf("records after two of three releases: %d records, value %q", b.Len(), recs[0].Value)
	}
	b.Release() // the last holder: reset and pooled
	if b.Len() != 0 || b.holds.Load() != 0 {
		t.Fatalf("after the last release: %d records, %d holds; want 0, 0", b.Len(), b.holds.Load())
	}
}
