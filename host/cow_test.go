package host

import (
	"bytes"
	"fmt"
	"log/slog"
	"path/filepath"
	"testing"

	"github.com/streamd/streamd/abi"
)

var backends = []string{BackendMemory, BackendPebble}

var discardLogger = slog.New(slog.DiscardHandler)

// newTestBackend makes a backend of all maxP key groups, closed at cleanup.
func newTestBackend(t *testing.T, backend string, maxP int, dir string) stateBackend {
	t.Helper()
	cfg := InstanceConfig{MaxParallelism: maxP, State: StateConfig{Backend: backend, DataDir: dir}}
	s, err := newBackend(cfg, abi.KeyGroupRange{Start: 0, End: maxP - 1}, testNow, pebbleOptions{logger: discardLogger, name: "test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.close() })
	return s
}

// TestSnapshotCutCopyOnWrite: a snapshot is a cut of the keyed state that
// later writes (overwrites of the same length, which the memory backend
// otherwise does in place, new keys, deletes, new states and new key groups,
// timers) never change, while the live state sees them; a second cut sees
// both. The cuts are loaded only after the writes, as the runtime does in
// the background.
func TestSnapshotCutCopyOnWrite(t *testing.T) {
	for _, backend := range backends {
		t.Run(backend, func(t *testing.T) { testCutCopyOnWrite(t, backend) })
	}
}

func testCutCopyOnWrite(t *testing.T, backend string) {
	const maxP = 128
	s := newTestBackend(t, backend, maxP, t.TempDir())
	kgOf := func(key string) int { return abi.KeyGroup([]byte(key), maxP) }
	put := func(name, key, val string) {
		if err := s.put(kgOf(key), []byte(name), []byte(key), []byte(val)); err != nil {
			t.Fatal(err)
		}
	}
	get := func(name, key string) string {
		v, ok, err := s.get(kgOf(key), []byte(name), []byte(key))
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			return "<none>"
		}
		return string(v)
	}
	want := map[int]*KeyGroupState{}
	for i := range 1000 {
		k, v := fmt.Sprintf("k%d", i), fmt.Sprintf("v%04d", i)
		put("count", k, v)
		g := want[kgOf(k)]
		if g == nil {
			g = &KeyGroupState{Entries: map[string]map[string][]byte{"count": {}}}
			want[kgOf(k)] = g
		}
		g.Entries["count"][k] = []byte(v)
	}
	for _, ts := range []int64{-5, 7} {
		if err := s.registerTimer(eventTime, []byte("k1"), ts); err != nil {
			t.Fatal(err)
		}
		want[kgOf("k1")].Timers = append(want[kgOf("k1")].Timers, Timer{Key: []byte("k1"), TS: ts})
	}
	encode := func(snap *Snapshot) []byte {
		t.Helper()
		b, err := snap.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	before := encode(&Snapshot{KeyGroups: want})
	cut, err := s.cut()
	if err != nil {
		t.Fatal(err)
	}
	for i := range 1000 {
		switch i % 4 {
		case 0:
			put("count", fmt.Sprintf("k%d", i), fmt.Sprintf("w%04d", i)) // same length: in place before the cut
		case 1:
			if err := s.del(kgOf(fmt.Sprintf("k%d", i)), []byte("count"), []byte(fmt.Sprintf("k%d", i))); err != nil {
				t.Fatal(err)
			}
		case 2:
			put("count", fmt.Sprintf("new%d", i), "x")
		case 3:
			put("other", fmt.Sprintf("k%d", i), "y")
		}
	}
	if err := s.deleteTimer(eventTime, []byte("k1"), 7); err != nil {
		t.Fatal(err)
	}
	if err := s.registerTimer(eventTime, []byte("k2"), 9); err != nil {
		t.Fatal(err)
	}
	if got := get("count", "k0"); got != "w0000" {
		t.Fatalf("live state k0 = %q, want w0000", got)
	}
	if got := get("count", "k1"); got != "<none>" {
		t.Fatalf("live state k1 = %q, want deleted", got)
	}
	cut2, err := s.cut()
	if err != nil {
		t.Fatal(err)
	}
	// Writes after the second cut leave both cuts alone.
	put("count", "k0", "z0000")
	if got := encode(cut); !bytes.Equal(got, before) {
		t.Fatalf("the cut changed after the writes (%d bytes, want %d)", len(got), len(before))
	}
	if err := cut2.Load(); err != nil {
		t.Fatal(err)
	}
	if v := cut2.KeyGroups[kgOf("k0")].Entries["count"]["k0"]; string(v) != "w0000" {
		t.Fatalf("second cut k0 = %q, want w0000", v)
	}
	if v := cut.KeyGroups[kgOf("k0")].Entries["count"]["k0"]; string(v) != "v0000" {
		t.Fatalf("first cut k0 = %q, want v0000", v)
	}
	n := 0
	for _, g := range cut2.KeyGroups {
		n += len(g.Entries["count"]) + len(g.Entries["other"])
	}
	if want := 1000 - 250 + 250 + 250; n != want {
		t.Fatalf("second cut holds %d entries, want %d", n, want)
	}
	if got := cut2.KeyGroups[kgOf("k1")].Timers; len(got) != 1 || got[0].TS != -5 {
		t.Fatalf("second cut timers of k1 = %v, want only -5", got)
	}
	if got := cut2.KeyGroups[kgOf("k2")].Timers; len(got) != 1 || got[0].TS != 9 {
		t.Fatalf("second cut timers of k2 = %v, want 9", got)
	}
}

// TestPebbleCloseAbandonsCuts: closing a pebble backend fails the load of a
// cut not read yet (instead of reading a closed DB) and removes its files.
func TestPebbleCloseAbandonsCuts(t *testing.T) {
	dir := t.TempDir()
	s := newTestBackend(t, BackendPebble, 128, dir)
	if err := s.put(abi.KeyGroup([]byte("a"), 128), []byte("s"), []byte("a"), []byte("1")); err != nil {
		t.Fatal(err)
	}
	empty, err := newTestBackend(t, BackendPebble, 128, dir).cut()
	if err != nil || !empty.Empty() {
		t.Fatalf("cut of an empty backend: %v, empty %v", err, empty.Empty())
	}
	cut, err := s.cut()
	if err != nil || cut.Empty() {
		t.Fatalf("cut: %v, empty %v", err, cut.Empty())
	}
	if err := s.close(); err != nil {
		t.Fatal(err)
	}
	if err := cut.Load(); err == nil {
		t.Fatal("loading a cut after close succeeded")
	}
	left, _ := filepath.Glob(filepath.Join(dir, "test-*"))
	if len(left) != 2 { // the empty backend's and its lock file, closed at cleanup
		t.Fatalf("files left after close: %v, want only the open backend's", left)
	}
}

// TestReleasedCutWritesInPlace: once every cut of the memory backend is
// released, a write neither copies its key group nor allocates a new value.
func TestReleasedCutWritesInPlace(t *testing.T) {
	const maxP = 128
	s := newKeyedState(maxP, abi.KeyGroupRange{Start: 0, End: maxP - 1}, testNow)
	kg := abi.KeyGroup([]byte("k"), maxP)
	s.put(kg, []byte("count"), []byte("k"), []byte("v1"))
	cut, err := s.cut()
	if err != nil {
		t.Fatal(err)
	}
	s.put(kg, []byte("count"), []byte("k"), []byte("v2")) // copies the group: the cut holds it
	if got := string(cut.KeyGroups[kg].Entries["count"]["k"]); got != "v1" {
		t.Fatalf("cut holds %q, want v1", got)
	}
	g := &s.groups[kg]
	if !g.shared {
		t.Fatal("a group copied from a cut does not say its values are shared")
	}
	cut.Release()
	cut.Release() // idempotent
	old := g.m["count"]["k"]
	s.put(kg, []byte("count"), []byte("k"), []byte("v3"))
	if g.frozen || g.shared || &g.m["count"]["k"][0] != &old[0] {
		t.Fatalf("after release: frozen %v shared %v, the value was not written in place", g.frozen, g.shared)
	}
	if got := string(cut.KeyGroups[kg].Entries["count"]["k"]); got != "v1" {
		t.Fatalf("the released cut now holds %q (its value was reused before the release?)", got)
	}
}

// testNow is the processing time of backends made by the tests: fixed.
func testNow() int64 { return 1_000_000 }
