package host

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"
	"testing"

	"github.com/streamd/streamd/abi"
)

// decodeStreamed decodes data with a SnapshotDecoder, reading the key
// groups read says and skipping the others.
func decodeStreamed(data []byte, read func(kg int) bool) (*Snapshot, error) {
	d, err := NewSnapshotDecoder(bytes.NewReader(data), int64(len(data)))
	if err != nil {
		return nil, err
	}
	out := &Snapshot{KeyGroups: map[int]*KeyGroupState{}}
	w := &loadWriter{out: out.KeyGroups}
	for {
		kg, ok, err := d.Next()
		if err != nil {
			return nil, err
		}
		if !ok {
			break
		}
		if !read(kg) {
			continue // Next skips it
		}
		groupIn(out.KeyGroups, kg)
		if err := d.Read(w); err != nil {
			return nil, err
		}
	}
	if out.Lists, err = d.Finish(); err != nil {
		return nil, err
	}
	return out, nil
}

// The streamed decoder reads what UnmarshalBinary reads, versions 1 and 2,
// and refuses what it refuses.
func TestSnapshotDecoder(t *testing.T) {
	s := &Snapshot{KeyGroups: map[int]*KeyGroupState{}, Lists: map[string]*ListState{
		"u": {Mode: abi.ListUnion, Entries: [][]byte{[]byte("a"), {}}},
		"e": {Mode: abi.ListSplit, Entries: [][]byte{}},
	}}
	for kg := 0; kg < 40; kg += 3 {
		g := &KeyGroupState{Entries: map[string]map[string][]byte{}}
		for i := range kg * 7 {
			name := []string{"count", "sum", "x"}[i%3]
			if g.Entries[name] == nil {
				g.Entries[name] = map[string][]byte{}
			}
			g.Entries[name][fmt.Sprintf("k%d", i)] = bytes.Repeat([]byte{byte(i)}, i%300)
		}
		for i := range kg % 5 {
			g.Timers = append(g.Timers, Timer{Key: []byte(fmt.Sprintf("k%d", i)), TS: int64(-i)})
		}
		s.KeyGroups[kg] = g
	}
	v1, err := s.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	withProc := s.Clone()
	withProc.KeyGroups[3].ProcTimers = []Timer{{Key: []byte("p"), TS: 9}, {Key: []byte("q"), TS: 9}}
	v2, err := withProc.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{"v1": v1, "v2": v2} {
		want := &Snapshot{}
		if err := want.UnmarshalBinary(data); err != nil {
			t.Fatal(err)
		}
		got, err := decodeStreamed(data, func(int) bool { return true })
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !reflect.DeepEqual(got.KeyGroups, want.KeyGroups) || !reflect.DeepEqual(got.Lists, want.Lists) {
			t.Fatalf("%s: streamed decode differs from UnmarshalBinary", name)
		}
		// Skipping key groups: the others as they are, nothing of the skipped.
		got, err = decodeStreamed(data, func(kg int) bool { return kg%2 == 0 })
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		for kg, g := range want.KeyGroups {
			if kg%2 == 0 && !reflect.DeepEqual(got.KeyGroups[kg], g) || kg%2 == 1 && got.KeyGroups[kg] != nil {
				t.Fatalf("%s: key group %d read wrong with odd ones skipped", name, kg)
			}
		}
	}
	// Every truncation and every flipped byte of some is an error wrapping
	// ErrSnapshotFormat; so is a key group out of order.
	for n := 0; n < len(v2); n += 1 + n/50 {
		if _, err := decodeStreamed(v2[:n], func(int) bool { return true }); !errors.Is(err, ErrSnapshotFormat) {
			t.Fatalf("truncated to %d bytes: %v", n, err)
		}
	}
	for i := 0; i < len(v2); i += 1 + i/20 {
		bad := bytes.Clone(v2)
		bad[i] ^= 0x21
		if _, err := decodeStreamed(bad, func(int) bool { return i%2 == 0 }); !errors.Is(err, ErrSnapshotFormat) {
			t.Fatalf("byte %d flipped: %v", i, err)
		}
	}
	two := &Snapshot{KeyGroups: map[int]*KeyGroupState{1: {}, 2: {}}}
	b, _ := two.MarshalBinary()
	b[12], b[24] = 2, 1 // swap the key group numbers (each group is 12 bytes)
	if _, err := decodeStreamed(b, func(int) bool { return true }); err == nil || !strings.Contains(err.Error(), "not ascending") {
		t.Fatalf("key groups out of order: %v", err)
	}
	// A read error of the reader is its own, not a format error.
	d, err := NewSnapshotDecoder(io.MultiReader(bytes.NewReader(v1[:100]), errReader{}), int64(len(v1)))
	if err == nil {
		for _, _, err = d.Next(); err == nil; _, _, err = d.Next() {
		}
	}
	if errors.Is(err, ErrSnapshotFormat) || !strings.Contains(err.Error(), "disk on fire") {
		t.Fatalf("read error: %v", err)
	}
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, errors.New("disk on fire") }
