package host

import (
	"bytes"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
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

// TestReleasedCutWritesInPlace: a write after a cut of the memory backend
// copies nothing (it goes to the group's overlay), and once every cut is
// released the overlay is merged into the group's own maps in place, after
// which a write neither copies nor allocates. A second cut taken while the
// first is held copies the group once, and each cut keeps its values.
func TestReleasedCutWritesInPlace(t *testing.T) {
	const maxP = 128
	s := newKeyedState(maxP, abi.KeyGroupRange{Start: 0, End: maxP - 1}, testNow)
	kg := abi.KeyGroup([]byte("k"), maxP)
	name, key := []byte("count"), []byte("k")
	get := func() string {
		v, ok, err := s.get(kg, name, key)
		if err != nil || !ok {
			t.Fatalf("get: %v %v", ok, err)
		}
		return string(v)
	}
	s.put(kg, name, []byte("gone"), []byte("x"))
	s.put(kg, name, key, []byte("v1"))
	cut, err := s.cut()
	if err != nil {
		t.Fatal(err)
	}
	g := &s.groups[kg]
	held := cut.KeyGroups[kg].Entries
	s.put(kg, name, key, []byte("v2"))
	s.del(kg, name, []byte("gone"))
	if !g.frozen || len(g.ov) != 1 || len(g.ov["count"]) != 2 {
		t.Fatalf("after a write to a cut group: frozen %v, overlay %v", g.frozen, g.ov)
	}
	if got := string(held["count"]["k"]); got != "v1" || len(held["count"]) != 2 {
		t.Fatalf("the cut holds %q and %d keys, want v1 and 2", got, len(held["count"]))
	}
	if got := get(); got != "v2" {
		t.Fatalf("get after the cut: %q, want v2", got)
	}
	if _, ok, _ := s.get(kg, name, []byte("gone")); ok {
		t.Fatal("a key deleted after the cut is still read")
	}
	ov := g.ov["count"]["k"].v
	s.put(kg, name, key, []byte("v3")) // the overlay's own value: in place
	if &g.ov["count"]["k"].v[0] != &ov[0] || get() != "v3" {
		t.Fatal("a second write during the cut was not made in place in the overlay")
	}

	// A second cut while the first is held: the overlay becomes a layer of
	// the group, and the cut takes the maps and the layer, merged when it
	// is loaded; nothing is copied on the instance's side.
	base := g.m
	cut2, err := s.cut()
	if err != nil {
		t.Fatal(err)
	}
	if len(g.layers) != 1 || g.ov != nil || !g.frozen || g.shared {
		t.Fatalf("after a second cut: %d layers, overlay %v, frozen %v, shared %v", len(g.layers), g.ov, g.frozen, g.shared)
	}
	s.put(kg, name, key, []byte("v4"))
	if err := cut2.Load(); err != nil {
		t.Fatal(err)
	}
	held2 := cut2.KeyGroups[kg].Entries
	if got := string(held2["count"]["k"]); got != "v3" || len(held2["count"]) != 1 {
		t.Fatalf("the second cut holds %q and %d keys, want v3 and 1", got, len(held2["count"]))
	}
	if string(held["count"]["k"]) != "v1" || get() != "v4" {
		t.Fatalf("the second cut changed the first (%q), or the instance reads %q", held["count"]["k"], get())
	}
	cut.Release()
	cut.Release() // idempotent
	s.put(kg, name, key, []byte("v5"))
	if !g.frozen || string(held2["count"]["k"]) != "v3" {
		t.Fatalf("releasing the first cut released the second (frozen %v, it holds %q)", g.frozen, held2["count"]["k"])
	}

	// Every cut released: the next access merges the overlay into the
	// group's maps in place, and then writes go in place.
	cut2.Release()
	m := g.m
	s.put(kg, name, key, []byte("v6"))
	if g.frozen || g.shared || len(g.ov) != 0 || len(g.layers) != 0 || len(g.m) != len(m) {
		t.Fatalf("after release: frozen %v shared %v overlay %v layers %d", g.frozen, g.shared, g.ov, len(g.layers))
	}
	old := g.m["count"]["k"]
	s.put(kg, name, key, []byte("v7"))
	if &g.m["count"]["k"][0] != &old[0] || get() != "v7" {
		t.Fatal("after release the value was not written in place")
	}
	base["count"]["probe"] = nil // the group's maps are the ones it had: no copy was taken
	if _, ok, _ := s.get(kg, name, []byte("probe")); !ok {
		t.Fatal("the group copied its maps at a cut or at the merge")
	}
	if _, ok, _ := s.get(kg, name, []byte("gone")); ok {
		t.Fatal("the merge brought back a deleted key")
	}

	// Cuts held past maxLayers: the next write copies the group once.
	var held3 []*Snapshot
	for i := 0; i <= maxLayers+1; i++ {
		c, err := s.cut()
		if err != nil {
			t.Fatal(err)
		}
		held3 = append(held3, c)
		s.put(kg, name, key, []byte{'a' + byte(i)})
	}
	if g.frozen || !g.shared || len(g.layers) != 0 {
		t.Fatalf("past %d layers: frozen %v shared %v layers %d, want a copy", maxLayers, g.frozen, g.shared, len(g.layers))
	}
	for i, c := range held3 {
		if err := c.Load(); err != nil {
			t.Fatal(err)
		}
		want := "v7"
		if i > 0 {
			want = string([]byte{'a' + byte(i-1)})
		}
		if got := string(c.KeyGroups[kg].Entries["count"]["k"]); got != want {
			t.Fatalf("cut %d holds %q, want %q", i, got, want)
		}
		c.Release()
	}
}

// TestCutsUnderConcurrentWrites: random writes and deletes on the memory
// backend while cuts (up to maxLayers+2 held at once) are loaded and
// marshaled on other goroutines and released in random order: each cut
// holds exactly the state at its time, and the live state is right after
// every merge. Run with -race, it also checks that no cut's maps are
// written while it is read.
func TestCutsUnderConcurrentWrites(t *testing.T) {
	const maxP, keys = 8, 300
	names := []string{"st", "few"} // "few" has 3 keys: it empties and comes back
	s := newKeyedState(maxP, abi.KeyGroupRange{Start: 0, End: maxP - 1}, testNow)
	rng := rand.New(rand.NewPCG(7, 8))
	model := map[string]string{}
	type held struct {
		snap *Snapshot
		want map[string]string
		done chan error
	}
	var cuts []held
	check := func(h held) {
		if err := <-h.done; err != nil {
			t.Fatal(err)
		}
		h.snap.Release()
	}
	for step := 0; step < 20000; step++ {
		name := names[rng.IntN(len(names))]
		k := fmt.Sprintf("k%d", rng.IntN(keys))
		if name == "few" {
			k = fmt.Sprintf("k%d", rng.IntN(3))
		}
		kg := abi.KeyGroup([]byte(k), maxP)
		mk := name + "/" + k
		switch r := rng.IntN(100); {
		case r < 60:
			v := fmt.Sprintf("v%d", rng.IntN(1000)) // same lengths often: in-place candidates
			if err := s.put(kg, []byte(name), []byte(k), []byte(v)); err != nil {
				t.Fatal(err)
			}
			model[mk] = v
		case r < 75:
			s.del(kg, []byte(name), []byte(k))
			delete(model, mk)
		case r < 95:
			v, ok, _ := s.get(kg, []byte(name), []byte(k))
			if want, wok := model[mk]; ok != wok || string(v) != want {
				t.Fatalf("step %d: get %s = %q %v, want %q %v", step, mk, v, ok, want, wok)
			}
		case r < 98 && len(cuts) < maxLayers+2:
			snap, err := s.cut()
			if err != nil {
				t.Fatal(err)
			}
			h := held{snap, maps.Clone(model), make(chan error, 1)}
			go func() {
				if err := h.snap.Load(); err != nil {
					h.done <- err
					return
				}
				if _, err := h.snap.MarshalBinary(); err != nil {
					h.done <- err
					return
				}
				got := map[string]string{}
				for _, g := range h.snap.KeyGroups {
					for name, m := range g.Entries {
						if len(m) == 0 {
							h.done <- fmt.Errorf("a cut holds state %q without keys", name)
							return
						}
						for k, v := range m {
							got[name+"/"+k] = string(v)
						}
					}
				}
				if !maps.Equal(got, h.want) {
					h.done <- fmt.Errorf("a cut holds %d keys, want %d (or different values)", len(got), len(h.want))
					return
				}
				h.done <- nil
			}()
			cuts = append(cuts, h)
		default:
			if len(cuts) > 0 {
				i := rng.IntN(len(cuts))
				check(cuts[i])
				cuts = append(cuts[:i], cuts[i+1:]...)
			}
		}
	}
	for _, h := range cuts {
		check(h)
	}
	for mk, want := range model {
		name, k, _ := strings.Cut(mk, "/")
		if v, ok, _ := s.get(abi.KeyGroup([]byte(k), maxP), []byte(name), []byte(k)); !ok || string(v) != want {
			t.Fatalf("after every release: %s = %q %v, want %q", mk, v, ok, want)
		}
	}
}

// testNow is the processing time of backends made by the tests: fixed.
func testNow() int64 { return 1_000_000 }

// TestTimerCutsUnderConcurrentWrites: timers of both kinds registered,
// deleted and fired (popDue) on the memory backend while cuts (up to
// maxLayers+2 held at once, so some groups are copied) are loaded on other
// goroutines and released in random order: each cut holds exactly the
// timers of its time, and the live timers fire in (ts, key) order once
// each. With -race, it also checks that no cut's maps are written while it
// is read.
func TestTimerCutsUnderConcurrentWrites(t *testing.T) {
	const maxP, keys = 8, 200
	s := newKeyedState(maxP, abi.KeyGroupRange{Start: 0, End: maxP - 1}, testNow)
	rng := rand.New(rand.NewPCG(9, 10))
	type tm struct {
		kind timerKind
		key  string
		ts   int64
	}
	model := map[tm]bool{}
	type held struct {
		snap *Snapshot
		want map[tm]bool
		done chan error
	}
	var cuts []held
	check := func(h held) {
		t.Helper()
		if err := <-h.done; err != nil {
			t.Fatal(err)
		}
		h.snap.Release()
	}
	var watermark [numTimerKinds]int64
	for step := 0; step < 30000; step++ {
		kind := timerKind(rng.IntN(2))
		id := tm{kind, fmt.Sprintf("k%d", rng.IntN(keys)), watermark[kind] + int64(rng.IntN(50))}
		switch r := rng.IntN(100); {
		case r < 50:
			if err := s.registerTimer(kind, []byte(id.key), id.ts); err != nil {
				t.Fatal(err)
			}
			model[id] = true
		case r < 70:
			if err := s.deleteTimer(kind, []byte(id.key), id.ts); err != nil {
				t.Fatal(err)
			}
			delete(model, id)
		case r < 80:
			if ok, _ := s.hasTimer(kind, timerID{id.key, id.ts}); ok != model[id] {
				t.Fatalf("step %d: hasTimer %v = %v, want %v", step, id, ok, model[id])
			}
		case r < 83: // fire what is due, as Instance.fireDue does
			watermark[kind] += 10
			due, err := s.popDue(kind, watermark[kind], nil)
			if err != nil {
				t.Fatal(err)
			}
			var want []timerID
			for m := range model {
				if m.kind == kind && m.ts <= watermark[kind] {
					want = append(want, timerID{m.key, m.ts})
				}
			}
			slices.SortFunc(want, compareTimerIDs)
			if !slices.Equal(due, want) {
				t.Fatalf("step %d: popDue(%d) = %v, want %v", step, watermark[kind], due, want)
			}
			for _, d := range due {
				if ok, err := s.removeTimer(kind, d); err != nil || !ok {
					t.Fatalf("step %d: removeTimer of due %v: %v, %v", step, d, ok, err)
				}
				if ok, _ := s.removeTimer(kind, d); ok {
					t.Fatalf("step %d: removeTimer of %v again found it", step, d)
				}
				delete(model, tm{kind, d.key, d.ts})
			}
			if next, ok, _ := s.nextTimer(kind); ok {
				if ok, _ := s.hasTimer(kind, s.heaps[kind].heap[0]); !ok || next <= watermark[kind] {
					t.Fatalf("step %d: next timer %d after firing up to %d", step, next, watermark[kind])
				}
			}
		case r < 96 && len(cuts) < maxLayers+2:
			snap, err := s.cut()
			if err != nil {
				t.Fatal(err)
			}
			h := held{snap, maps.Clone(model), make(chan error, 1)}
			lazy := rng.IntN(2) == 0 // read in place, as the checkpoint encoder does
			go func() {
				load := h.snap.Load
				if lazy {
					load = h.snap.LoadForEncoding
				}
				if err := load(); err != nil {
					h.done <- err
					return
				}
				got := map[tm]bool{}
				for kg, g := range h.snap.KeyGroups {
					for _, kind := range []timerKind{eventTime, procTime} {
						var bad error
						n := 0
						g.EachTimer(kind == procTime, func(key []byte, ts int64) {
							if abi.KeyGroup(key, maxP) != kg {
								bad = fmt.Errorf("timer %q in key group %d", key, kg)
							}
							got[tm{kind, string(key), ts}] = true
							n++
						})
						if bad == nil && n != g.TimerCount(kind == procTime) {
							bad = fmt.Errorf("key group %d: %d timers read, TimerCount %d", kg, n, g.TimerCount(kind == procTime))
						}
						if bad != nil {
							h.done <- bad
							return
						}
					}
				}
				if !maps.Equal(got, h.want) {
					h.done <- fmt.Errorf("a cut holds %d timers, want %d (or others)", len(got), len(h.want))
					return
				}
				h.done <- nil
			}()
			cuts = append(cuts, h)
		default:
			if len(cuts) > 0 {
				i := rng.IntN(len(cuts))
				check(cuts[i])
				cuts = append(cuts[:i], cuts[i+1:]...)
			}
		}
	}
	for _, h := range cuts {
		check(h)
	}
	if got := s.heaps[eventTime].live + s.heaps[procTime].live; got != len(model) {
		t.Fatalf("%d live timers counted, want %d", got, len(model))
	}
}

// TestTimerCutTakesNoCopy: cutting the memory backend with 100k timers
// allocates nothing per timer on the instance's goroutine (the groups'
// timer maps are frozen, not copied), and a write after the cut goes to
// the group's overlay; the timers are read when the cut is loaded, and a
// restore from it (into another key-group split: a rescale) has them all.
func TestTimerCutTakesNoCopy(t *testing.T) {
	const maxP, n = 128, 100_000
	s := newKeyedState(maxP, abi.KeyGroupRange{Start: 0, End: maxP - 1}, testNow)
	for i := range n {
		key := []byte(fmt.Sprintf("key-%d", i))
		if err := s.registerTimer(eventTime, key, int64(i%1000)); err != nil {
			t.Fatal(err)
		}
		if i%7 == 0 {
			if err := s.registerTimer(procTime, key, int64(i)); err != nil {
				t.Fatal(err)
			}
		}
	}
	var cut *Snapshot
	allocs := testing.AllocsPerRun(1, func() {
		var err error
		if cut, err = s.cut(); err != nil {
			t.Fatal(err)
		}
	})
	if allocs > 3*maxP {
		t.Fatalf("a cut of %d timers made %.0f allocations, want at most %d (a few per key group)", n, allocs, 3*maxP)
	}
	kg := abi.KeyGroup([]byte("key-0"), maxP)
	frozen := s.groups[kg].timers.m
	if err := s.deleteTimer(eventTime, []byte("key-0"), 0); err != nil {
		t.Fatal(err)
	}
	if _, ok := frozen[string(timerNames[eventTime])][string(appendGroupTimer(nil, []byte("key-0"), 0))]; !ok {
		t.Fatal("a delete after the cut wrote the cut's timer map")
	}
	// Read in place first (the checkpoint encoder's LoadForEncoding): the
	// counts, the version and the size come from the cut's maps; then
	// Load moves the timers into Timers and ProcTimers, and the size is
	// what MarshalBinary writes.
	if err := cut.LoadForEncoding(); err != nil {
		t.Fatal(err)
	}
	lazyEvents, lazyProcs := 0, 0
	for _, g := range cut.KeyGroups {
		if g.Timers != nil || g.ProcTimers != nil {
			t.Fatal("LoadForEncoding made timer slices")
		}
		lazyEvents += g.TimerCount(false)
		lazyProcs += g.TimerCount(true)
	}
	if SnapshotVersionFor(cut) != 2 {
		t.Fatal("a cut with processing-time timers read in place is not of version 2")
	}
	lazySize := cut.Size()
	if err := cut.Load(); err != nil {
		t.Fatal(err)
	}
	events, procs := 0, 0
	for _, g := range cut.KeyGroups {
		events += len(g.Timers)
		procs += len(g.ProcTimers)
	}
	if events != lazyEvents || procs != lazyProcs {
		t.Fatalf("read in place: %d and %d timers; loaded: %d and %d", lazyEvents, lazyProcs, events, procs)
	}
	if data, err := cut.MarshalBinary(); err != nil || int64(len(data)) != lazySize {
		t.Fatalf("Size read in place %d, MarshalBinary %d bytes (%v)", lazySize, len(data), err)
	}
	if want := (n + 6) / 7; events != n || procs != want {
		t.Fatalf("the cut holds %d and %d timers, want %d and %d", events, procs, n, want)
	}
	// Restore into two subtasks of half the key groups each: every timer
	// lands in the subtask of its key group, and fires there.
	fired := 0
	for _, rng := range []abi.KeyGroupRange{{Start: 0, End: 63}, {Start: 64, End: 127}} {
		r := newKeyedState(maxP, rng, testNow)
		part := map[int]*KeyGroupState{}
		for kg, g := range cut.KeyGroups {
			if rng.Contains(kg) {
				part[kg] = g
			}
		}
		if err := r.restore(part); err != nil {
			t.Fatal(err)
		}
		due, err := r.popDue(eventTime, 1000, nil)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.IsSortedFunc(due, compareTimerIDs) {
			t.Fatal("restored timers fire out of (ts, key) order")
		}
		fired += len(due)
	}
	cut.Release()
	if fired != n {
		t.Fatalf("the restored subtasks fire %d timers, want %d", fired, n)
	}
}
