package host

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/streamd/streamd/abi"
)

// TestStreamedSnapshotIsCanonical: a pebble cut written by EncodeTo (two
// passes over the cut, entries never in memory) is byte for byte what
// MarshalBinary of the same state loaded writes, with states whose names
// sort differently by length and by bytes, timers, empty values and list
// state; size announces the length before any byte.
func TestStreamedSnapshotIsCanonical(t *testing.T) {
	const maxP = 32
	s := backendIn(t, BackendPebble, maxP, abi.KeyGroupRange{Start: 0, End: maxP - 1}, t.TempDir())
	for i := range 2000 {
		key := []byte(fmt.Sprintf("k%d", i))
		kg := abi.KeyGroup(key, maxP)
		for _, name := range []string{"zz", "a", "abc", "b"} {
			val := []byte(fmt.Sprintf("%s-%d", name, i))
			if i%7 == 0 {
				val = []byte{}
			}
			if err := s.put(kg, []byte(name), key, val); err != nil {
				t.Fatal(err)
			}
		}
		if i%5 == 0 {
			if err := s.registerTimer(eventTime, key, int64(i%13)-3); err != nil {
				t.Fatal(err)
			}
		}
	}
	lists := map[string]*ListState{"offsets": {Mode: abi.ListSplit, Entries: [][]byte{[]byte("1"), {}}}, "all": {Mode: abi.ListUnion}}
	a, err := s.cut()
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.cut()
	if err != nil {
		t.Fatal(err)
	}
	a.Lists, b.Lists = lists, lists
	if !a.Streamable() {
		t.Fatal("a pebble cut is not streamable")
	}
	var buf bytes.Buffer
	announced := int64(-1)
	if err := a.EncodeTo(&buf, func(n int64) error {
		if buf.Len() != 0 {
			t.Error("size announced after bytes were written")
		}
		announced = n
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	want, err := b.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	if announced != int64(buf.Len()) || !bytes.Equal(buf.Bytes(), want) {
		t.Fatalf("streamed %d bytes (announced %d), MarshalBinary %d; equal %v", buf.Len(), announced, len(want), bytes.Equal(buf.Bytes(), want))
	}
	var back Snapshot
	if err := back.UnmarshalBinary(buf.Bytes()); err != nil {
		t.Fatal(err)
	}
	if a.Streamable() {
		t.Fatal("the cut is still streamable after EncodeTo released it")
	}
}
