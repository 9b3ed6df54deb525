package host

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"maps"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/streamd/streamd/abi"
)

// Snapshot is the state of one subtask at a checkpoint: keyed state and timers
// by key group (only non-empty groups), and the operator list state the guest
// wrote in snapshot_state. A Snapshot never aliases instance memory.
//
// The keyed state of a Snapshot taken by Instance.SnapshotState is a
// copy-on-write cut: its maps are the instance's own at the time of the
// snapshot, which the instance never writes again (it copies a key group's
// maps before its first write after the cut, and never overwrites a value
// in place once a cut may hold it). So the cut takes no copy of the state,
// and the Snapshot may be read, encoded and written on another goroutine
// while the instance goes on processing. Nobody may write a Snapshot's maps.
//
// The keyed state of a Snapshot taken from a pebble instance is a pebble
// snapshot (a cut, too), read into KeyGroups by Load: call Load before
// reading KeyGroups of a Snapshot from Instance.SnapshotState (MarshalBinary
// and Clone do). Load may run on another goroutine while the instance goes
// on processing.
type Snapshot struct {
	KeyGroups map[int]*KeyGroupState
	Lists     map[string]*ListState
	// Files is keyed state as the files of an LSM checkpoint (an
	// incremental checkpoint of the pebble backend, see FileState), in
	// place of KeyGroups: one part when cut, on restore the parts of every
	// old subtask whose key groups overlap the new subtask's.
	Files []*FileState
	// Sources is keyed state read only when it is restored, in place of
	// KeyGroups: on restore from a full checkpoint or savepoint
	// (checkpoint.LoadRestoreFrom), the key groups the new subtask takes
	// from each old subtask's snapshot. A pebble instance writes them in
	// bounded batches as they are read, so they may be larger than memory.
	Sources []KeyedSource

	release  func()       // Release: the cut is no longer read
	deferred *deferredCut // keyed state still in the backend's cut; nil once loaded
}

// Release says the snapshot's keyed state is no longer read (it has been
// written, or dropped): the memory backend may then write values in place
// again once no cut holds them. Optional (without it the instance just
// allocates new values); idempotent; any goroutine may call it.
func (s *Snapshot) Release() {
	if s == nil {
		return
	}
	if s.release != nil {
		s.release()
	}
	if s.deferred != nil {
		s.deferred.abandon(errReleased) // never loaded: free the backend's cut
	}
}

// errReleased is what loading a Snapshot released unloaded gives.
var errReleased = errors.New("host: the snapshot was released before its state was read")

// Load reads the keyed state of a backend's cut into KeyGroups (a no-op for
// a Snapshot of the memory backend, or one loaded before), and releases the
// cut. It fails when the instance closed before the cut was read, or the
// backend could not read it. Sources are read into KeyGroups too (in
// memory: a restore does not load them). One goroutine at a time may call
// Load.
func (s *Snapshot) Load() error {
	if s != nil && len(s.Sources) > 0 {
		groups := map[int]*KeyGroupState{}
		if err := loadSources(s.Sources, groups); err != nil {
			return err
		}
		if s.KeyGroups == nil {
			s.KeyGroups = map[int]*KeyGroupState{}
		}
		for kg, g := range groups {
			s.KeyGroups[kg] = g
		}
		s.Sources = nil
	}
	return s.loadCut()
}

// loadCut is Load of the backend's cut only.
func (s *Snapshot) loadCut() error {
	if s == nil || s.deferred == nil {
		return nil
	}
	groups, err := s.deferred.load()
	if err != nil {
		return err
	}
	s.KeyGroups, s.deferred = groups, nil
	return nil
}

// Empty reports whether s has no keyed state, timers or list state. A
// Snapshot not loaded yet is not empty (a backend defers only non-empty
// state).
func (s *Snapshot) Empty() bool {
	return s.deferred == nil && len(s.KeyGroups) == 0 && len(s.Lists) == 0 && len(s.Files) == 0 && len(s.Sources) == 0
}

// KeyGroupState is the keyed state and timers of one key group.
type KeyGroupState struct {
	Entries    map[string]map[string][]byte // state name -> key -> value
	Timers     []Timer                      // event-time timers, sorted by (TS, Key)
	ProcTimers []Timer                      // processing-time timers, sorted by (TS, Key)
}

// Timer is an event-time or processing-time timer of a key.
type Timer struct {
	Key []byte
	TS  int64
}

// ListState is one operator list state: its redistribution mode and entries.
type ListState struct {
	Mode    abi.ListMode
	Entries [][]byte
}

// keyedState holds the keyed state and timers of one subtask's key groups.
type keyedState struct {
	maxP   int
	rng    abi.KeyGroupRange
	groups []group // [kg-rng.Start]
	timers [numTimerKinds]timerSet
	// cuts is the number of snapshot cuts not released yet (Snapshot.Release).
	cuts *atomic.Int32
	// expiring: some structured entry carries an expiry (TTL): a cut drops
	// the expired ones first.
	expiring bool
	now      func() int64 // the host's processing time in ms (TTL)
}

// timerSet is the timers of one kind: a set, and a min-heap by (ts, key)
// that may hold deleted timers (lazy deletion).
type timerSet struct {
	set  map[timerID]struct{}
	heap []timerID
}

// group is the keyed state of one key group.
type group struct {
	m map[string]map[string][]byte // name -> key -> value
	// frozen: m (and its maps) belong to a snapshot cut; copy them before
	// the next write.
	frozen bool
	// shared: values may be held by a cut: store new values in new memory
	// instead of overwriting old ones.
	shared bool
	// idx indexes the structured entries (stored names starting with NUL):
	// stored name -> entry prefix (key and namespace) -> user keys. Only
	// the instance reads it (cuts take m alone), so it is never frozen.
	idx map[string]map[string]map[string]struct{}
}

// writable returns the maps of key group kg for a write, copying them
// first if a snapshot cut holds them.
func (s *keyedState) writable(kg int) *group {
	g := &s.groups[kg-s.rng.Start]
	if g.frozen && s.cuts.Load() == 0 {
		// Every cut was released: nobody reads these maps any more.
		g.frozen, g.shared = false, false
	}
	if g.frozen {
		m := make(map[string]map[string][]byte, len(g.m))
		for name, vals := range g.m {
			m[name] = maps.Clone(vals)
		}
		g.m, g.frozen, g.shared = m, false, true
	}
	return g
}

type timerID struct {
	key string
	ts  int64
}

func timerLess(a, b timerID) bool {
	if a.ts != b.ts {
		return a.ts < b.ts
	}
	return a.key < b.key
}

func newKeyedState(maxP int, rng abi.KeyGroupRange, now func() int64) keyedState {
	s := keyedState{
		maxP:   maxP,
		rng:    rng,
		groups: make([]group, rng.End-rng.Start+1),
		cuts:   new(atomic.Int32),
		now:    now,
	}
	for k := range s.timers {
		s.timers[k].set = make(map[timerID]struct{})
	}
	return s
}

func (s *keyedState) get(kg int, name, key []byte) ([]byte, bool, error) {
	g := s.groups[kg-s.rng.Start].m
	if g == nil {
		return nil, false, nil
	}
	m := g[string(name)]
	if m == nil {
		return nil, false, nil
	}
	v, ok := m[string(key)]
	return v, ok, nil
}

// put stores a copy of val; it reuses the old value's memory when it fits
// and no snapshot cut may hold it.
func (s *keyedState) put(kg int, name, key, val []byte) error {
	gr := s.writable(kg)
	g := gr.m
	if g == nil {
		g = make(map[string]map[string][]byte)
		gr.m = g
	}
	m := g[string(name)]
	if m == nil {
		m = make(map[string][]byte)
		g[string(name)] = m
	}
	if gr.shared && s.cuts.Load() == 0 {
		gr.shared = false // no cut holds anything any more
	}
	structured := isStructured(name)
	if structured && !s.expiring && valueExpires(val) {
		s.expiring = true
	}
	if old, ok := m[string(key)]; ok && len(old) == len(val) && !gr.shared {
		copy(old, val)
		return nil
	}
	v := make([]byte, len(val))
	copy(v, val)
	m[string(key)] = v
	if structured {
		gr.index(name, key)
	}
	return nil
}

// index adds the structured entry (name, stored key) to the group's index.
func (g *group) index(name, key []byte) {
	prefix, ukey, ok := splitEntryKey(key)
	if !ok {
		return // not written by mstate_* (checkRestored refuses such keys)
	}
	if g.idx == nil {
		g.idx = make(map[string]map[string]map[string]struct{})
	}
	byPrefix := g.idx[string(name)]
	if byPrefix == nil {
		byPrefix = make(map[string]map[string]struct{})
		g.idx[string(name)] = byPrefix
	}
	ukeys := byPrefix[string(prefix)]
	if ukeys == nil {
		ukeys = make(map[string]struct{})
		byPrefix[string(prefix)] = ukeys
	}
	ukeys[string(ukey)] = struct{}{}
}

// unindex removes the structured entry (name, stored key) from the index.
func (g *group) unindex(name, key []byte) {
	prefix, ukey, ok := splitEntryKey(key)
	if !ok || g.idx == nil {
		return
	}
	byPrefix := g.idx[string(name)]
	ukeys := byPrefix[string(prefix)]
	delete(ukeys, string(ukey))
	if len(ukeys) == 0 {
		delete(byPrefix, string(prefix))
		if len(byPrefix) == 0 {
			delete(g.idx, string(name))
		}
	}
}

// scan calls fn for each structured entry of name under prefix (an entry
// prefix: key and namespace), sorted by user key; the values are valid
// during the call.
func (s *keyedState) scan(kg int, name, prefix []byte, fn func(ukey, val []byte) error) error {
	g := &s.groups[kg-s.rng.Start]
	ukeys := g.idx[string(name)][string(prefix)]
	if len(ukeys) == 0 {
		return nil
	}
	sorted := slices.Sorted(maps.Keys(ukeys))
	m := g.m[string(name)]
	key := slices.Clone(prefix)
	for _, uk := range sorted {
		key = append(key[:len(prefix)], uk...)
		if v, ok := m[string(key)]; ok {
			if err := fn([]byte(uk), v); err != nil {
				return err
			}
		}
	}
	return nil
}

func (s *keyedState) del(kg int, name, key []byte) error {
	if g := s.groups[kg-s.rng.Start].m; g == nil || g[string(name)] == nil {
		return nil
	} else if _, ok := g[string(name)][string(key)]; !ok {
		return nil
	}
	gr := s.writable(kg)
	g := gr.m
	m := g[string(name)]
	delete(m, string(key))
	if len(m) == 0 {
		delete(g, string(name))
	}
	if isStructured(name) {
		gr.unindex(name, key)
	}
	return nil
}

func (s *keyedState) registerTimer(k timerKind, key []byte, ts int64) error {
	t := &s.timers[k]
	id := timerID{string(key), ts}
	if _, ok := t.set[id]; ok {
		return nil
	}
	t.set[id] = struct{}{}
	t.push(id)
	return nil
}

func (s *keyedState) deleteTimer(k timerKind, key []byte, ts int64) error {
	t := &s.timers[k]
	delete(t.set, timerID{string(key), ts})
	// Rebuild the heap when deleted timers dominate it.
	if len(t.heap) > 64 && len(t.heap) > 2*len(t.set) {
		t.heap = t.heap[:0]
		for id := range t.set {
			t.heap = append(t.heap, id)
		}
		slices.SortFunc(t.heap, func(a, b timerID) int {
			if timerLess(a, b) {
				return -1
			}
			if timerLess(b, a) {
				return 1
			}
			return 0
		}) // a sorted slice is a valid heap
	}
	return nil
}

func (s *keyedState) hasTimer(k timerKind, id timerID) (bool, error) {
	_, ok := s.timers[k].set[id]
	return ok, nil
}

func (s *keyedState) removeTimer(k timerKind, id timerID) error {
	delete(s.timers[k].set, id)
	return nil
}

// popDue moves every heap entry with ts <= w to dst in (ts, key) order. The
// caller checks hasTimer before firing each (it may have been deleted).
func (s *keyedState) popDue(k timerKind, w int64, dst []timerID) ([]timerID, error) {
	t := &s.timers[k]
	for len(t.heap) > 0 && t.heap[0].ts <= w {
		id := t.pop()
		if _, ok := t.set[id]; !ok {
			continue
		}
		if n := len(dst); n > 0 && dst[n-1] == id {
			continue // duplicate heap entry of a re-registered timer
		}
		dst = append(dst, id)
	}
	return dst, nil
}

// nextTimer is the earliest timer of kind k.
func (s *keyedState) nextTimer(k timerKind) (int64, bool, error) {
	t := &s.timers[k]
	for len(t.heap) > 0 {
		if _, ok := t.set[t.heap[0]]; ok {
			return t.heap[0].ts, true, nil
		}
		t.pop() // deleted
	}
	return 0, false, nil
}

func (t *timerSet) push(id timerID) {
	t.heap = append(t.heap, id)
	i := len(t.heap) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !timerLess(t.heap[i], t.heap[p]) {
			break
		}
		t.heap[i], t.heap[p] = t.heap[p], t.heap[i]
		i = p
	}
}

func (t *timerSet) pop() timerID {
	h := t.heap
	top := h[0]
	n := len(h) - 1
	h[0] = h[n]
	h = h[:n]
	i := 0
	for {
		l := 2*i + 1
		if l >= n {
			break
		}
		m := l
		if r := l + 1; r < n && timerLess(h[r], h[l]) {
			m = r
		}
		if !timerLess(h[m], h[i]) {
			break
		}
		h[i], h[m] = h[m], h[i]
		i = m
	}
	t.heap = h
	return top
}

// cut cuts the keyed state (copy-on-write: the groups' maps go into the
// snapshot as they are and are frozen) and copies the timers, by key group.
// The cut counts until the Snapshot is released.
func (s *keyedState) cut() (*Snapshot, error) {
	kgs := s.snapshot()
	var once sync.Once
	cuts := s.cuts
	return &Snapshot{KeyGroups: kgs, release: func() { once.Do(func() { cuts.Add(-1) }) }}, nil
}

func (s *keyedState) snapshot() map[int]*KeyGroupState {
	if s.expiring {
		s.dropExpired()
	}
	out := make(map[int]*KeyGroupState)
	group := func(kg int) *KeyGroupState { return groupIn(out, kg) }
	for idx := range s.groups {
		g := &s.groups[idx]
		if len(g.m) == 0 {
			continue
		}
		out[s.rng.Start+idx] = &KeyGroupState{Entries: g.m}
		g.frozen = true
	}
	s.cuts.Add(1)
	for id := range s.timers[eventTime].set {
		g := group(abi.KeyGroup([]byte(id.key), s.maxP))
		g.Timers = append(g.Timers, Timer{Key: []byte(id.key), TS: id.ts})
	}
	for id := range s.timers[procTime].set {
		g := group(abi.KeyGroup([]byte(id.key), s.maxP))
		g.ProcTimers = append(g.ProcTimers, Timer{Key: []byte(id.key), TS: id.ts})
	}
	for _, g := range out {
		sortTimers(g.Timers)
		sortTimers(g.ProcTimers)
	}
	return out
}

// dropExpired deletes the expired structured entries and list elements
// (before a cut: the memory backend drops them when a snapshot is
// written). It walks the structured state only.
func (s *keyedState) dropExpired() {
	now := s.now()
	still := false
	for idx := range s.groups {
		g := &s.groups[idx]
		kg := s.rng.Start + idx
		for name, m := range g.m {
			if !isStructured([]byte(name)) {
				continue
			}
			var dead []string
			var trimmed map[string][]byte
			for k, v := range m {
				live, keep := liveValue(v, now)
				switch {
				case !keep:
					dead = append(dead, k)
				case len(live) != len(v):
					if trimmed == nil {
						trimmed = map[string][]byte{}
					}
					trimmed[k] = live
				}
				if keep && valueExpires(live) {
					still = true
				}
			}
			for _, k := range dead {
				s.del(kg, []byte(name), []byte(k))
			}
			for k, v := range trimmed {
				s.put(kg, []byte(name), []byte(k), v)
			}
		}
	}
	s.expiring = still
}

// groupIn returns key group kg of out, adding an empty one if missing.
func groupIn(out map[int]*KeyGroupState, kg int) *KeyGroupState {
	g := out[kg]
	if g == nil {
		g = &KeyGroupState{Entries: make(map[string]map[string][]byte)}
		out[kg] = g
	}
	return g
}

func sortTimers(ts []Timer) {
	slices.SortFunc(ts, func(a, b Timer) int {
		if c := cmp.Compare(a.TS, b.TS); c != 0 {
			return c
		}
		return bytes.Compare(a.Key, b.Key)
	})
}

// restore loads groups (deep copy); every group must lie in this subtask's range.
func (s *keyedState) restore(groups map[int]*KeyGroupState) error {
	return checkRestored(groups, s.rng, s.maxP, s.put, s.registerTimer)
}

func (s *keyedState) restoreFrom(ctx context.Context, srcs []KeyedSource) error {
	return readSources(ctx, srcs, s.rng, s.maxP, s.put, s.registerTimer)
}

func (s *keyedState) close() error { return nil }
