package host

import (
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/streamd/streamd/abi"
)

// TestStaleStateDirsRemoved: the files a dead instance left in the data
// directory (its pebble directory, a file cut, its lock file) go when the
// next instance opens there; a live instance's stay, and so does a young
// lock file whose owner may not have locked it yet.
func TestStaleStateDirsRemoved(t *testing.T) {
	data := t.TempDir()
	cfg := StateConfig{Backend: BackendPebble, DataDir: data}
	rng := abi.KeyGroupRange{Start: 0, End: 127}
	open := func(name string) *pebbleState {
		s, err := openPebble(128, rng, cfg, pebbleOptions{logger: slog.Default(), name: name})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	dead, live := open("dead"), open("live")
	if err := dead.put(0, []byte("s"), []byte("k"), []byte("v")); err != nil {
		t.Fatal(err)
	}
	if _, err := dead.fileCut(); err != nil {
		t.Fatal(err)
	}
	// The process of "dead" dies: the kernel drops its lock; nothing is removed.
	dead.lock.f.Close()
	young := filepath.Join(data, "young-1"+lockSuffix)
	old := filepath.Join(data, "old-1"+lockSuffix)
	for _, p := range []string{young, old} {
		if err := os.WriteFile(p, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	past := time.Now().Add(-2 * staleLockAge)
	if err := os.Chtimes(old, past, past); err != nil {
		t.Fatal(err)
	}
	list := func() []string {
		ents, err := os.ReadDir(data)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		sort.Strings(names)
		return names
	}
	base := func(s *pebbleState) string { return filepath.Base(s.dir) }
	if got := list(); len(got) != 7 { // dead, dead.cut-1, dead lock, live, live lock, young, old
		t.Fatalf("before: %v", got)
	}
	next := open("next")
	want := []string{base(live), base(live) + lockSuffix, base(next), base(next) + lockSuffix, filepath.Base(young)}
	sort.Strings(want)
	if got := list(); !slices.Equal(got, want) {
		t.Fatalf("after the next open: %v, want %v", got, want)
	}
	// The live instance still works on its files.
	if err := live.put(0, []byte("s"), []byte("k"), []byte("v")); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := live.get(0, []byte("s"), []byte("k")); err != nil || !ok {
		t.Fatalf("live instance lost its state: %v %v", ok, err)
	}
	for _, s := range []*pebbleState{live, next} {
		if err := s.close(); err != nil {
			t.Fatal(err)
		}
	}
	if got := list(); !slices.Equal(got, []string{filepath.Base(young)}) {
		t.Fatalf("after closing: %v", got)
	}
}
