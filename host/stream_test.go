package host

import (
	"bytes"
	"encoding/binary"
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
	for _, structuredAndProc := range []bool{false, true} {
		t.Run(fmt.Sprintf("structured_and_processing_timers=%v", structuredAndProc), func(t *testing.T) {
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
			if structuredAndProc {
				addStructuredAndProcTimers(t, s, maxP)
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
			if v, want := buf.Bytes()[4], map[bool]byte{false: 1, true: 2}[structuredAndProc]; v != want {
				t.Errorf("format version %d, want %d", v, want)
			}
			if structuredAndProc {
				checkStructuredAndProcTimers(t, back.KeyGroups)
			}
			if a.Streamable() {
				t.Fatal("the cut is still streamable after EncodeTo released it")
			}
		})
	}
}

// addStructuredAndProcTimers writes structured entries (expired at testNow,
// a list expired in part, live ones) and processing-time timers.
func addStructuredAndProcTimers(t *testing.T, s stateBackend, maxP int) {
	t.Helper()
	now := testNow()
	for i := range 50 {
		key := []byte(fmt.Sprintf("m%d", i))
		kg := abi.KeyGroup(key, maxP)
		put := func(ukey string, v []byte) {
			if err := s.put(kg, []byte("\x00st"), append(appendEntryPrefix(nil, key, []byte("ns")), ukey...), v); err != nil {
				t.Fatal(err)
			}
		}
		put("dead", storedValue(now-1, "x"))
		put("live", storedValue(now+1, "y"))
		put("list", storedList(now-1, "gone", now+1, "kept", 0, "forever"))
		if err := s.registerTimer(procTime, key, int64(i%3)); err != nil {
			t.Fatal(err)
		}
	}
}

func storedValue(exp int64, v string) []byte {
	b := binary.LittleEndian.AppendUint64([]byte{entryValue}, uint64(exp))
	return append(b, v...)
}

// storedList: pairs of expiry (int64) and element (string).
func storedList(elems ...any) []byte {
	b := []byte{entryList}
	for i := 0; i < len(elems); i += 2 {
		var exp int64
		switch e := elems[i].(type) {
		case int:
			exp = int64(e)
		case int64:
			exp = e
		}
		b = binary.LittleEndian.AppendUint64(b, uint64(exp))
		b = binary.LittleEndian.AppendUint32(b, uint32(len(elems[i+1].(string))))
		b = append(b, elems[i+1].(string)...)
	}
	return b
}

// checkStructuredAndProcTimers: the cut of addStructuredAndProcTimers's
// state holds no expired entry or element, and the processing timers.
func checkStructuredAndProcTimers(t *testing.T, groups map[int]*KeyGroupState) {
	t.Helper()
	now := testNow()
	entries, ptimers := 0, 0
	for _, g := range groups {
		ptimers += len(g.ProcTimers)
		for k, v := range g.Entries["\x00st"] {
			entries++
			_, ukey, _ := splitEntryKey([]byte(k))
			switch string(ukey) {
			case "live":
			case "list":
				if want := storedList(now+1, "kept", 0, "forever"); !bytes.Equal(v, want) {
					t.Errorf("list in the cut = %q, want %q", v, want)
				}
			default:
				t.Errorf("entry %q in the cut", ukey)
			}
		}
	}
	if entries != 100 || ptimers != 50 {
		t.Errorf("cut holds %d structured entries and %d processing timers, want 100 and 50", entries, ptimers)
	}
}
