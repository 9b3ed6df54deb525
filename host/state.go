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
// snapshot, which the instance does not write again until the Snapshot is
// released (writes go to an overlay of the key group, see group). So the
// cut takes no copy of the state, and the Snapshot may be read, encoded and
// written on another goroutine while the instance goes on processing.
// Nobody may write a Snapshot's maps, or read them once it is released. A
// cut taken while an older one is held is loaded (Load) first.
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
//
// Copy-on-write without copying: a cut takes m as it is and freezes it;
// from then on writes go to the overlay ov (read before m), and m is never
// written while a cut may hold it. Once every cut is released, the
// instance merges the overlay into m in place at the group's next access
// (settle): a cost of the writes made since the cut, not of the group's
// size. A cut taken while an older one still holds m freezes the overlay
// too, as a layer, and takes m and its layers, which the snapshot merges on
// the goroutine that loads it (Snapshot.Load); past maxLayers layers the
// group's next write copies them into new maps.
type group struct {
	m map[string]map[string][]byte // name -> key -> value
	// frozen: m (and its maps) belong to a snapshot cut: writes go to ov.
	frozen bool
	// layers are overlays frozen by cuts (bottom first), between m and ov.
	layers []overlay
	// ov is the writes since the last cut of a frozen group: read first.
	// Its values are the instance's own (never in a cut).
	ov overlay
	// shared: values of m may be held by a cut: store new values in new
	// memory instead of overwriting old ones.
	shared bool
	// idx indexes the structured entries (stored names starting with NUL):
	// stored name -> entry prefix (key and namespace) -> user keys. Only
	// the instance reads it (cuts take m alone), so it is never frozen.
	idx map[string]map[string]map[string]struct{}
}

// overlay is writes made over a frozen group: name -> key -> value or
// deletion.
type overlay map[string]map[string]ovEntry

// ovEntry is a write of an overlay: a value, or a deletion.
type ovEntry struct {
	v   []byte
	del bool
}

// settleAtCut bounds the writes a cut merges into released groups (on the
// instance's goroutine, the synchronous part of a checkpoint: about 400 ns
// each into a group of 8,000 keys).
const settleAtCut = 4096

// pending is the number of writes in the group's layers and overlay.
func (g *group) pending() int {
	n := 0
	for _, w := range g.ov {
		n += len(w)
	}
	for _, l := range g.layers {
		for _, w := range l {
			n += len(w)
		}
	}
	return n
}

// maxLayers bounds the frozen overlays of a group (cuts taken while older
// ones were held, which reads look through).
const maxLayers = 3

// settle merges the layers and overlay of a frozen group into its maps in
// place once no cut holds them any more; past maxLayers (cuts still held)
// it copies them into new maps.
func (s *keyedState) settle(g *group) {
	if !g.frozen {
		return
	}
	if s.cuts.Load() == 0 {
		for _, l := range g.layers {
			l.applyTo(g.m)
		}
		g.ov.applyTo(g.m)
		g.layers, g.ov, g.frozen, g.shared = nil, nil, false, false
		return
	}
	if len(g.layers) > maxLayers {
		g.m, g.frozen, g.shared = g.merged(), false, true
		g.layers, g.ov = nil, nil
	}
}

// merged is a copy of m with the layers and overlay applied (the values
// are shared).
func (g *group) merged() map[string]map[string][]byte {
	m := make(map[string]map[string][]byte, len(g.m))
	for name, vals := range g.m {
		m[name] = maps.Clone(vals)
	}
	for _, l := range g.layers {
		l.applyTo(m)
	}
	g.ov.applyTo(m)
	return m
}

// applyTo applies the overlay to m.
func (o overlay) applyTo(m map[string]map[string][]byte) {
	for name, writes := range o {
		vals := m[name]
		for k, e := range writes {
			switch {
			case e.del:
				delete(vals, k)
			case vals == nil:
				vals = make(map[string][]byte, len(writes))
				m[name] = vals
				fallthrough
			default:
				vals[k] = e.v
			}
		}
		if len(vals) == 0 {
			delete(m, name)
		}
	}
}

// lookup reads an entry of a settled group: the overlay, the layers from
// the top, then its maps.
func (g *group) lookup(name, key []byte) ([]byte, bool) {
	if g.ov != nil {
		if e, ok := g.ov[string(name)][string(key)]; ok {
			return e.v, !e.del
		}
	}
	for i := len(g.layers) - 1; i >= 0; i-- {
		if e, ok := g.layers[i][string(name)][string(key)]; ok {
			return e.v, !e.del
		}
	}
	v, ok := g.m[string(name)][string(key)]
	return v, ok
}

// writes returns the overlay's writes of name of a frozen group.
func (g *group) writes(name []byte) map[string]ovEntry {
	if g.ov == nil {
		g.ov = make(overlay)
	}
	o := g.ov[string(name)]
	if o == nil {
		o = make(map[string]ovEntry)
		g.ov[string(name)] = o
	}
	return o
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
	g := &s.groups[kg-s.rng.Start]
	s.settle(g)
	v, ok := g.lookup(name, key)
	return v, ok, nil
}

// put stores a copy of val; it reuses the old value's memory when it fits
// and no snapshot cut may hold it.
func (s *keyedState) put(kg int, name, key, val []byte) error {
	gr := &s.groups[kg-s.rng.Start]
	s.settle(gr)
	structured := isStructured(name)
	if structured && !s.expiring && valueExpires(val) {
		s.expiring = true
	}
	if gr.frozen {
		o := gr.writes(name)
		if e, ok := o[string(key)]; ok && !e.del && len(e.v) == len(val) {
			copy(e.v, val)
			return nil
		}
		v := make([]byte, len(val))
		copy(v, val)
		o[string(key)] = ovEntry{v: v}
		if structured {
			gr.index(name, key)
		}
		return nil
	}
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
	s.settle(g)
	sorted := slices.Sorted(maps.Keys(ukeys))
	key := slices.Clone(prefix)
	for _, uk := range sorted {
		key = append(key[:len(prefix)], uk...)
		if v, ok := g.lookup(name, key); ok {
			if err := fn([]byte(uk), v); err != nil {
				return err
			}
		}
	}
	return nil
}

func (s *keyedState) del(kg int, name, key []byte) error {
	gr := &s.groups[kg-s.rng.Start]
	s.settle(gr)
	if _, ok := gr.lookup(name, key); !ok {
		return nil
	}
	if gr.frozen {
		gr.writes(name)[string(key)] = ovEntry{del: true}
	} else {
		m := gr.m[string(name)]
		delete(m, string(key))
		if len(m) == 0 {
			delete(gr.m, string(name))
		}
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
// A group with layers (an older cut still holds its maps) goes in merged by
// Snapshot.Load. The cut counts until the Snapshot is released.
func (s *keyedState) cut() (*Snapshot, error) {
	kgs, layered := s.snapshot()
	var once sync.Once
	cuts := s.cuts
	snap := &Snapshot{KeyGroups: kgs, release: func() { once.Do(func() { cuts.Add(-1) }) }}
	if len(layered) > 0 {
		snap.KeyGroups = nil
		snap.deferred = &deferredCut{release: func() {}, read: func() (map[int]*KeyGroupState, error) {
			for kg, g := range layered {
				if m := g.merged(); len(m) > 0 {
					groupIn(kgs, kg).Entries = m
				} else if g := kgs[kg]; g != nil && len(g.Timers) == 0 && len(g.ProcTimers) == 0 {
					delete(kgs, kg)
				}
			}
			return kgs, nil
		}}
	}
	return snap, nil
}

// snapshot freezes the groups and returns their maps and timers by key
// group, and the groups that go in with their layers (copies of the
// groups' fields: the maps and layers they refer to are frozen).
func (s *keyedState) snapshot() (map[int]*KeyGroupState, map[int]*group) {
	if s.cuts.Load() == 0 {
		// Merge what no cut holds any more, up to settleAtCut writes: a
		// group not touched since the last cut was released keeps its
		// writes as a layer instead (the cut's loader merges them).
		budget := settleAtCut
		for idx := range s.groups {
			g := &s.groups[idx]
			if n := g.pending(); g.frozen && n <= budget {
				budget -= n
				s.settle(g)
			}
		}
	}
	if s.expiring {
		s.dropExpired()
	}
	out := make(map[int]*KeyGroupState)
	var layered map[int]*group
	groupOf := func(kg int) *KeyGroupState { return groupIn(out, kg) }
	for idx := range s.groups {
		g := &s.groups[idx]
		switch {
		case g.frozen:
			if len(g.ov) > 0 {
				g.layers, g.ov = append(g.layers, g.ov), nil
			}
			if len(g.layers) == 0 {
				out[s.rng.Start+idx] = &KeyGroupState{Entries: g.m}
				continue
			}
			if layered == nil {
				layered = make(map[int]*group)
			}
			layered[s.rng.Start+idx] = &group{m: g.m, layers: slices.Clone(g.layers)}
		case len(g.m) > 0:
			out[s.rng.Start+idx] = &KeyGroupState{Entries: g.m}
			g.frozen = true
		}
	}
	s.cuts.Add(1)
	for id := range s.timers[eventTime].set {
		g := groupOf(abi.KeyGroup([]byte(id.key), s.maxP))
		g.Timers = append(g.Timers, Timer{Key: []byte(id.key), TS: id.ts})
	}
	for id := range s.timers[procTime].set {
		g := groupOf(abi.KeyGroup([]byte(id.key), s.maxP))
		g.ProcTimers = append(g.ProcTimers, Timer{Key: []byte(id.key), TS: id.ts})
	}
	for _, g := range out {
		sortTimers(g.Timers)
		sortTimers(g.ProcTimers)
	}
	return out, layered
}

// dropExpired deletes the expired structured entries and list elements
// (before a cut: the memory backend drops them when a snapshot is
// written). It walks the structured state only.
func (s *keyedState) dropExpired() {
	now := s.now()
	still := false
	type write struct {
		name, key []byte
		live      []byte // nil: delete
	}
	for idx := range s.groups {
		g := &s.groups[idx]
		kg := s.rng.Start + idx
		var writes []write
		for name, byPrefix := range g.idx { // every structured entry, whichever layer holds it
			for prefix, ukeys := range byPrefix {
				for uk := range ukeys {
					key := []byte(prefix + uk)
					v, ok := g.lookup([]byte(name), key)
					if !ok {
						continue
					}
					live, keep := liveValue(v, now)
					switch {
					case !keep:
						writes = append(writes, write{[]byte(name), key, nil})
					case len(live) != len(v):
						writes = append(writes, write{[]byte(name), key, live})
					}
					if keep && valueExpires(live) {
						still = true
					}
				}
			}
		}
		for _, w := range writes {
			if w.live == nil {
				s.del(kg, w.name, w.key)
			} else {
				s.put(kg, w.name, w.key, w.live)
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
