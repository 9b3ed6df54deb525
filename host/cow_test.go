package host

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/streamd/streamd/abi"
)

// TestSnapshotCutCopyOnWrite: a snapshot is a cut of the keyed state that
// later writes (overwrites of the same length, which are otherwise done in
// place, new keys, deletes, new states and new key groups) never change,
// while the live state sees them; a second cut sees both.
func TestSnapshotCutCopyOnWrite(t *testing.T) {
	const maxP = 128
	s := newKeyedState(maxP, abi.KeyGroupRange{Start: 0, End: maxP - 1})
	put := func(name, key, val string) {
		s.put(abi.KeyGroup([]byte(key), maxP), []byte(name), []byte(key), []byte(val))
	}
	get := func(name, key string) string {
		v, ok := s.get(abi.KeyGroup([]byte(key), maxP), []byte(name), []byte(key))
		if !ok {
			return "<none>"
		}
		return string(v)
	}
	for i := range 1000 {
		put("count", fmt.Sprintf("k%d", i), fmt.Sprintf("v%04d", i))
	}
	encode := func(kgs map[int]*KeyGroupState) []byte {
		b, err := (&Snapshot{KeyGroups: kgs}).MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	cut := s.snapshot()
	before := encode((&Snapshot{KeyGroups: cut}).Clone().KeyGroups)
	for i := range 1000 {
		switch i % 4 {
		case 0:
			put("count", fmt.Sprintf("k%d", i), fmt.Sprintf("w%04d", i)) // same length: in place before the cut
		case 1:
			s.del(abi.KeyGroup([]byte(fmt.Sprintf("k%d", i)), maxP), []byte("count"), []byte(fmt.Sprintf("k%d", i)))
		case 2:
			put("count", fmt.Sprintf("new%d", i), "x")
		case 3:
			put("other", fmt.Sprintf("k%d", i), "y")
		}
	}
	if got := encode(cut); !bytes.Equal(got, before) {
		t.Fatalf("the cut changed after the writes (%d bytes, was %d)", len(got), len(before))
	}
	if got := get("count", "k0"); got != "w0000" {
		t.Fatalf("live state k0 = %q, want w0000", got)
	}
	if got := get("count", "k1"); got != "<none>" {
		t.Fatalf("live state k1 = %q, want deleted", got)
	}
	cut2 := s.snapshot()
	// Writes after the second cut leave both cuts alone.
	put("count", "k0", "z0000")
	if v := cut2[abi.KeyGroup([]byte("k0"), maxP)].Entries["count"]["k0"]; string(v) != "w0000" {
		t.Fatalf("second cut k0 = %q, want w0000", v)
	}
	if v := cut[abi.KeyGroup([]byte("k0"), maxP)].Entries["count"]["k0"]; string(v) != "v0000" {
		t.Fatalf("first cut k0 = %q, want v0000", v)
	}
	if got := encode(cut); !bytes.Equal(got, before) {
		t.Fatal("the first cut changed after the second")
	}
	// Released cuts: writes go in place again, without copying.
	s.cuts.Store(0)
	g := &s.groups[abi.KeyGroup([]byte("k4"), maxP)]
	old := g.m["count"]["k4"]
	put("count", "k4", "u0004")
	if g.frozen || g.shared || &g.m["count"]["k4"][0] != &old[0] {
		t.Fatalf("after release: frozen %v shared %v, the value was not written in place", g.frozen, g.shared)
	}
	n := 0
	for _, g := range cut2 {
		n += len(g.Entries["count"]) + len(g.Entries["other"])
	}
	if want := 1000 - 250 + 250 + 250; n != want {
		t.Fatalf("second cut holds %d entries, want %d", n, want)
	}
}
