package host

import (
	"bytes"
	"cmp"
	"fmt"
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
type Snapshot struct {
	KeyGroups map[int]*KeyGroupState
	Lists     map[string]*ListState

	release func() // Release: the cut is no longer read
}

// Release says the snapshot's keyed state is no longer read (it has been
// written, or dropped): the instance may write values in place again once
// no cut holds them. Optional (without it the instance just allocates new
// values); idempotent; any goroutine may call it.
func (s *Snapshot) Release() {
	if s != nil && s.release != nil {
		s.release()
	}
}

// KeyGroupState is the keyed state and timers of one key group.
type KeyGroupState struct {
	Entries map[string]map[string][]byte // state name -> key -> value
	Timers  []Timer                      // sorted by (TS, Key)
}

// Timer is an event-time timer of a key.
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
	timers map[timerID]struct{}
	heap   []timerID // min-heap by (ts, key); may hold deleted timers (lazy deletion)
	// cuts is the number of snapshot cuts not released yet (Snapshot.Release).
	cuts *atomic.Int32
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

func newKeyedState(maxP int, rng abi.KeyGroupRange) keyedState {
	return keyedState{
		maxP:   maxP,
		rng:    rng,
		groups: make([]group, rng.End-rng.Start+1),
		timers: make(map[timerID]struct{}),
		cuts:   new(atomic.Int32),
	}
}

func (s *keyedState) get(kg int, name, key []byte) ([]byte, bool) {
	g := s.groups[kg-s.rng.Start].m
	if g == nil {
		return nil, false
	}
	m := g[string(name)]
	if m == nil {
		return nil, false
	}
	v, ok := m[string(key)]
	return v, ok
}

// put stores a copy of val; it reuses the old value's memory when it fits
// and no snapshot cut may hold it.
func (s *keyedState) put(kg int, name, key, val []byte) {
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
	if old, ok := m[string(key)]; ok && len(old) == len(val) && !gr.shared {
		copy(old, val)
		return
	}
	v := make([]byte, len(val))
	copy(v, val)
	m[string(key)] = v
}

func (s *keyedState) del(kg int, name, key []byte) {
	if g := s.groups[kg-s.rng.Start].m; g == nil || g[string(name)] == nil {
		return
	} else if _, ok := g[string(name)][string(key)]; !ok {
		return
	}
	g := s.writable(kg).m
	m := g[string(name)]
	delete(m, string(key))
	if len(m) == 0 {
		delete(g, string(name))
	}
}

func (s *keyedState) registerTimer(key []byte, ts int64) {
	id := timerID{string(key), ts}
	if _, ok := s.timers[id]; ok {
		return
	}
	s.timers[id] = struct{}{}
	s.push(id)
}

func (s *keyedState) deleteTimer(key []byte, ts int64) {
	delete(s.timers, timerID{string(key), ts})
	// Rebuild the heap when deleted timers dominate it.
	if len(s.heap) > 64 && len(s.heap) > 2*len(s.timers) {
		s.heap = s.heap[:0]
		for id := range s.timers {
			s.heap = append(s.heap, id)
		}
		slices.SortFunc(s.heap, func(a, b timerID) int {
			if timerLess(a, b) {
				return -1
			}
			if timerLess(b, a) {
				return 1
			}
			return 0
		}) // a sorted slice is a valid heap
	}
}

func (s *keyedState) hasTimer(id timerID) bool {
	_, ok := s.timers[id]
	return ok
}

func (s *keyedState) removeTimer(id timerID) { delete(s.timers, id) }

// popDue moves every heap entry with ts <= w to dst in (ts, key) order. The
// caller checks hasTimer before firing each (it may have been deleted).
func (s *keyedState) popDue(w int64, dst []timerID) []timerID {
	for len(s.heap) > 0 && s.heap[0].ts <= w {
		id := s.pop()
		if _, ok := s.timers[id]; !ok {
			continue
		}
		if n := len(dst); n > 0 && dst[n-1] == id {
			continue // duplicate heap entry of a re-registered timer
		}
		dst = append(dst, id)
	}
	return dst
}

func (s *keyedState) push(id timerID) {
	s.heap = append(s.heap, id)
	i := len(s.heap) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !timerLess(s.heap[i], s.heap[p]) {
			break
		}
		s.heap[i], s.heap[p] = s.heap[p], s.heap[i]
		i = p
	}
}

func (s *keyedState) pop() timerID {
	h := s.heap
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
	s.heap = h
	return top
}

// cut is snapshot as a Snapshot (without list state) whose Release ends the
// cut.
func (s *keyedState) cut() *Snapshot {
	kgs := s.snapshot()
	var once sync.Once
	cuts := s.cuts
	return &Snapshot{KeyGroups: kgs, release: func() { once.Do(func() { cuts.Add(-1) }) }}
}

// snapshot cuts the keyed state (copy-on-write: the groups' maps go into the
// snapshot as they are and are frozen) and copies the timers, by key group.
// The cut counts until released (cut).
func (s *keyedState) snapshot() map[int]*KeyGroupState {
	out := make(map[int]*KeyGroupState)
	group := func(kg int) *KeyGroupState {
		g := out[kg]
		if g == nil {
			g = &KeyGroupState{Entries: make(map[string]map[string][]byte)}
			out[kg] = g
		}
		return g
	}
	for idx := range s.groups {
		g := &s.groups[idx]
		if len(g.m) == 0 {
			continue
		}
		out[s.rng.Start+idx] = &KeyGroupState{Entries: g.m}
		g.frozen = true
	}
	s.cuts.Add(1)
	for id := range s.timers {
		g := group(abi.KeyGroup([]byte(id.key), s.maxP))
		g.Timers = append(g.Timers, Timer{Key: []byte(id.key), TS: id.ts})
	}
	for _, g := range out {
		sortTimers(g.Timers)
	}
	return out
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
	for kg, g := range groups {
		if !s.rng.Contains(kg) {
			return fmt.Errorf("host: restored key group %d is outside this subtask's key groups %s", kg, s.rng)
		}
		if g == nil {
			continue
		}
		for name, m := range g.Entries {
			for k, v := range m {
				if got := abi.KeyGroup([]byte(k), s.maxP); got != kg {
					return fmt.Errorf("host: restored state %q key %q is in key group %d, stored under %d (max parallelism changed?)", name, k, got, kg)
				}
				s.put(kg, []byte(name), []byte(k), v)
			}
		}
		for _, t := range g.Timers {
			if got := abi.KeyGroup(t.Key, s.maxP); got != kg {
				return fmt.Errorf("host: restored timer key %q is in key group %d, stored under %d", t.Key, got, kg)
			}
			s.registerTimer(t.Key, t.TS)
		}
	}
	return nil
}
