package host

import (
	"bytes"
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/streamd/streamd/abi"
)

// Snapshot is the state of one subtask at a checkpoint: keyed state and timers
// by key group (only non-empty groups), and the operator list state the guest
// wrote in snapshot_state. A Snapshot never aliases instance memory.
//
// The keyed state and timers of a Snapshot taken by Instance.SnapshotState
// from the memory backend are a copy-on-write cut: its maps are the
// instance's own at the time of the snapshot, which the instance does not
// write again until the Snapshot is released (writes go to an overlay of
// the key group, see cowMaps). So the cut takes no copy of the state, and
// the Snapshot may be read, encoded and written on another goroutine while
// the instance goes on processing. Nobody may write a Snapshot's maps or
// its timers' keys, or read them once it is released. The timers (and the values of a cut
// taken while an older one is held) are read into KeyGroups by Load.
//
// The keyed state of a Snapshot taken from a pebble instance is a pebble
// snapshot (a cut, too), read into KeyGroups by Load. So call Load before
// reading KeyGroups of a Snapshot from Instance.SnapshotState
// (MarshalBinary and Clone do). Load may run on another goroutine while the
// instance goes on processing.
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
	if err := s.LoadForEncoding(); err != nil {
		return err
	}
	if s != nil {
		for _, g := range s.KeyGroups {
			g.materializeTimers()
		}
	}
	return nil
}

// LoadForEncoding is Load, except that the timers of a memory backend's cut
// stay in the cut's maps: its readers (the checkpoint encoder) read them
// with KeyGroupState.TimerCount, EachTimer or TimerList, not Timers and
// ProcTimers. A Load after it moves them there.
func (s *Snapshot) LoadForEncoding() error {
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
	Entries map[string]map[string][]byte // state name -> key -> value
	// Timers and ProcTimers are the event-time and processing-time
	// timers: in (TS, Key) order, but in any order in a cut of the memory
	// backend (the encoders sort a savepoint's).
	Timers     []Timer
	ProcTimers []Timer
	// timerMaps are the timers of a memory cut loaded by LoadForEncoding:
	// the group's frozen maps (appendGroupTimer keys) by kind, read in
	// place instead of Timers and ProcTimers (nil: those hold them). Load
	// moves them into Timers and ProcTimers.
	timerMaps [numTimerKinds]map[string][]byte
}

// TimerCount is the number of the group's event-time timers, or
// processing-time ones (proc), wherever they are held (Timers, or a cut's
// maps after LoadForEncoding).
func (g *KeyGroupState) TimerCount(proc bool) int {
	if g == nil {
		return 0
	}
	k := kindOf(proc)
	if m := g.timerMaps[k]; m != nil {
		return len(m)
	}
	if proc {
		return len(g.ProcTimers)
	}
	return len(g.Timers)
}

// EachTimer calls fn with each event-time timer of the group, or each
// processing-time one (proc), in (TS, Key) order when they are in Timers
// and ProcTimers, else in map order. key aliases the snapshot: fn must
// not keep or change it.
func (g *KeyGroupState) EachTimer(proc bool, fn func(key []byte, ts int64)) {
	if g == nil {
		return
	}
	k := kindOf(proc)
	if m := g.timerMaps[k]; m != nil {
		for tk := range m {
			key := tk[8:]
			fn(unsafe.Slice(unsafe.StringData(key), len(key)), groupTimerTS(tk))
		}
		return
	}
	ts := g.Timers
	if proc {
		ts = g.ProcTimers
	}
	for _, t := range ts {
		fn(t.Key, t.TS)
	}
}

// TimerList is the group's event-time timers, or processing-time ones
// (proc), as a slice: Timers or ProcTimers, or a new slice of a cut's maps
// after LoadForEncoding.
func (g *KeyGroupState) TimerList(proc bool) []Timer {
	if g == nil {
		return nil
	}
	if m := g.timerMaps[kindOf(proc)]; m != nil {
		return timersOf(m)
	}
	if proc {
		return g.ProcTimers
	}
	return g.Timers
}

// materializeTimers moves timers held in a cut's maps into Timers and
// ProcTimers.
func (g *KeyGroupState) materializeTimers() {
	if g == nil || g.timerMaps[eventTime] == nil && g.timerMaps[procTime] == nil {
		return
	}
	g.Timers, g.ProcTimers = g.TimerList(false), g.TimerList(true)
	g.timerMaps = [numTimerKinds]map[string][]byte{}
}

func kindOf(proc bool) timerKind {
	if proc {
		return procTime
	}
	return eventTime
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
	heaps  [numTimerKinds]timerHeap
	tbuf   []byte // a timer's key in its group's maps (appendGroupTimer)
	// cuts is the number of snapshot cuts not released yet (Snapshot.Release).
	cuts *atomic.Int32
	// expiring: some structured entry carries an expiry (TTL): a cut drops
	// the expired ones first.
	expiring bool
	now      func() int64 // the host's processing time in ms (TTL)
}

// timerHeap orders the timers of one kind, which their key groups hold
// (group.timers): a min-heap by (ts, key) that may hold deleted timers and
// duplicates (lazy deletion). live is the number of timers.
type timerHeap struct {
	heap []timerID
	live int
}

// group is the keyed state and the timers of one key group, each in maps
// cut copy-on-write (cowMaps).
type group struct {
	cowMaps // the keyed state: state name -> key -> value
	// timers are the group's timers, timerNames[kind] -> appendGroupTimer
	// key -> nil, cut as the values are: a cut's synchronous part does not
	// grow with the number of timers, and the goroutine that loads it reads
	// them into KeyGroupState.Timers.
	timers cowMaps
	// idx indexes the structured entries (stored names starting with NUL):
	// stored name -> entry prefix (key and namespace) -> user keys. Only
	// the instance reads it (cuts take the maps alone), so it is never
	// frozen.
	idx map[string]map[string]map[string]struct{}
}

// timerNames name the timers of each kind in group.timers.
var timerNames = [numTimerKinds][]byte{eventTime: []byte("event"), procTime: []byte("processing")}

// cowMaps is name -> key -> value maps, cut copy-on-write without copying:
// a cut takes m as it is and freezes it; from then on writes go to the
// overlay ov (read before m), and m is never written while a cut may hold
// it. Once every cut is released, the instance merges the overlay into m in
// place at the next access (settle): a cost of the writes made since the
// cut, not of the maps' size. A cut taken while an older one still holds m
// freezes the overlay too, as a layer, and takes m and its layers, which
// the snapshot merges on the goroutine that loads it (Snapshot.Load); past
// maxLayers layers the next write copies them into new maps.
type cowMaps struct {
	m map[string]map[string][]byte // name -> key -> value
	// frozen: m (and its maps) belong to a snapshot cut: writes go to ov.
	frozen bool
	// layers are overlays frozen by cuts (bottom first), between m and ov.
	layers []overlay
	// ov is the writes since the last cut of frozen maps: read first. Its
	// values are the instance's own (never in a cut).
	ov overlay
	// shared: values of m may be held by a cut: store new values in new
	// memory instead of overwriting old ones.
	shared bool
}

// overlay is writes made over frozen maps: name -> key -> value or
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

// pending is the number of writes in the layers and overlay.
func (c *cowMaps) pending() int {
	n := 0
	for _, w := range c.ov {
		n += len(w)
	}
	for _, l := range c.layers {
		for _, w := range l {
			n += len(w)
		}
	}
	return n
}

// maxLayers bounds the frozen overlays of a group (cuts taken while older
// ones were held, which reads look through).
const maxLayers = 3

// settle merges the layers and overlay of frozen maps into them in place
// once no cut holds them any more; past maxLayers (cuts still held) it
// copies them into new maps.
func (s *keyedState) settle(c *cowMaps) {
	if !c.frozen {
		return
	}
	if s.cuts.Load() == 0 {
		for _, l := range c.layers {
			l.applyTo(c.m)
		}
		c.ov.applyTo(c.m)
		c.layers, c.ov, c.frozen, c.shared = nil, nil, false, false
		return
	}
	if len(c.layers) > maxLayers {
		c.m, c.frozen, c.shared = c.merged(), false, true
		c.layers, c.ov = nil, nil
	}
}

// merged is a copy of m with the layers and overlay applied (the values
// are shared).
func (c *cowMaps) merged() map[string]map[string][]byte {
	m := make(map[string]map[string][]byte, len(c.m))
	for name, vals := range c.m {
		m[name] = maps.Clone(vals)
	}
	for _, l := range c.layers {
		l.applyTo(m)
	}
	c.ov.applyTo(m)
	return m
}

// freeze cuts c: it returns the maps and the layers (nil: none) a cut
// takes, which are not written again while the cut is held.
func (c *cowMaps) freeze() (map[string]map[string][]byte, []overlay) {
	if !c.frozen {
		if len(c.m) == 0 {
			return nil, nil
		}
		c.frozen = true
		return c.m, nil
	}
	if len(c.ov) > 0 {
		c.layers, c.ov = append(c.layers, c.ov), nil
	}
	return c.m, slices.Clone(c.layers)
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

// lookup reads an entry of settled maps: the overlay, the layers from the
// top, then m.
func (c *cowMaps) lookup(name, key []byte) ([]byte, bool) {
	if c.ov != nil {
		if e, ok := c.ov[string(name)][string(key)]; ok {
			return e.v, !e.del
		}
	}
	for i := len(c.layers) - 1; i >= 0; i-- {
		if e, ok := c.layers[i][string(name)][string(key)]; ok {
			return e.v, !e.del
		}
	}
	v, ok := c.m[string(name)][string(key)]
	return v, ok
}

// writes returns the overlay's writes of name of frozen maps.
func (c *cowMaps) writes(name []byte) map[string]ovEntry {
	if c.ov == nil {
		c.ov = make(overlay)
	}
	o := c.ov[string(name)]
	if o == nil {
		o = make(map[string]ovEntry)
		c.ov[string(name)] = o
	}
	return o
}

// remove deletes the entry (name, key) of settled maps.
func (c *cowMaps) remove(name, key []byte) {
	if c.frozen {
		c.writes(name)[string(key)] = ovEntry{del: true}
		return
	}
	m := c.m[string(name)]
	delete(m, string(key))
	if len(m) == 0 {
		delete(c.m, string(name))
	}
}

// add sets the entry (name, key) of settled maps to nil (a timer).
func (c *cowMaps) add(name []byte, key string) {
	if c.frozen {
		c.writes(name)[key] = ovEntry{}
		return
	}
	if c.m == nil {
		c.m = make(map[string]map[string][]byte)
	}
	m := c.m[string(name)]
	if m == nil {
		m = make(map[string][]byte)
		c.m[string(name)] = m
	}
	m[key] = nil
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

func compareTimerIDs(a, b timerID) int {
	if c := cmp.Compare(a.ts, b.ts); c != 0 {
		return c
	}
	return strings.Compare(a.key, b.key)
}

// appendGroupTimer appends the key of timer (key, ts) in its group's
// maps: ts (8 bytes, big-endian), then the key.
func appendGroupTimer(b []byte, key []byte, ts int64) []byte {
	return append(binary.BigEndian.AppendUint64(b, uint64(ts)), key...)
}

// groupTimerTS is the ts of a key of appendGroupTimer.
func groupTimerTS(k string) int64 {
	var u uint64
	for i := range 8 {
		u = u<<8 | uint64(k[i])
	}
	return int64(u)
}
func newKeyedState(maxP int, rng abi.KeyGroupRange, now func() int64) keyedState {
	s := keyedState{
		maxP:   maxP,
		rng:    rng,
		groups: make([]group, rng.End-rng.Start+1),
		cuts:   new(atomic.Int32),
		now:    now,
	}
	return s
}

func (s *keyedState) get(kg int, name, key []byte) ([]byte, bool, error) {
	g := &s.groups[kg-s.rng.Start]
	s.settle(&g.cowMaps)
	v, ok := g.lookup(name, key)
	return v, ok, nil
}

// put stores a copy of val; it reuses the old value's memory when it fits
// and no snapshot cut may hold it.
func (s *keyedState) put(kg int, name, key, val []byte) error {
	gr := &s.groups[kg-s.rng.Start]
	s.settle(&gr.cowMaps)
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
	s.settle(&g.cowMaps)
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
	s.settle(&gr.cowMaps)
	if _, ok := gr.lookup(name, key); !ok {
		return nil
	}
	gr.remove(name, key)
	if isStructured(name) {
		gr.unindex(name, key)
	}
	return nil
}

// findTimer looks up the timer of kind k whose group key (appendGroupTimer)
// is in s.tbuf: its group, and whether it is set.
func (s *keyedState) findTimer(k timerKind) (*group, bool) {
	g := &s.groups[abi.KeyGroup(s.tbuf[8:], s.maxP)-s.rng.Start]
	s.settle(&g.timers)
	_, ok := g.timers.lookup(timerNames[k], s.tbuf)
	return g, ok
}

func (s *keyedState) registerTimer(k timerKind, key []byte, ts int64) error {
	s.tbuf = appendGroupTimer(s.tbuf[:0], key, ts)
	g, ok := s.findTimer(k)
	if ok {
		return nil
	}
	tk := string(s.tbuf)
	g.timers.add(timerNames[k], tk)
	h := &s.heaps[k]
	h.live++
	h.push(timerID{tk[8:], ts}) // shares the group key's memory
	return nil
}

func (s *keyedState) deleteTimer(k timerKind, key []byte, ts int64) error {
	s.tbuf = appendGroupTimer(s.tbuf[:0], key, ts)
	s.removeFound(k)
	return nil
}

// removeFound removes the timer of kind k whose group key is in s.tbuf and
// reports whether it was there.
func (s *keyedState) removeFound(k timerKind) bool {
	g, ok := s.findTimer(k)
	if !ok {
		return false
	}
	g.timers.remove(timerNames[k], s.tbuf)
	h := &s.heaps[k]
	h.live--
	if len(h.heap) > 64 && len(h.heap) > 2*h.live {
		s.compactHeap(k) // deleted timers dominate the heap
	}
	return true
}

// compactHeap drops the deleted timers and the duplicates from the heap of
// kind k.
func (s *keyedState) compactHeap(k timerKind) {
	h := &s.heaps[k]
	live := h.heap[:0]
	for _, id := range h.heap {
		if ok, _ := s.hasTimer(k, id); ok {
			live = append(live, id)
		}
	}
	clear(h.heap[len(live):])
	slices.SortFunc(live, compareTimerIDs)
	h.heap = slices.Compact(live) // a sorted slice is a valid heap
}

func (s *keyedState) hasTimer(k timerKind, id timerID) (bool, error) {
	s.tbuf = append(binary.BigEndian.AppendUint64(s.tbuf[:0], uint64(id.ts)), id.key...)
	_, ok := s.findTimer(k)
	return ok, nil
}

func (s *keyedState) removeTimer(k timerKind, id timerID) (bool, error) {
	s.tbuf = append(binary.BigEndian.AppendUint64(s.tbuf[:0], uint64(id.ts)), id.key...)
	return s.removeFound(k), nil
}

// popDue moves every heap entry with ts <= w to dst in (ts, key) order. The
// caller checks hasTimer before firing each (it may have been deleted).
func (s *keyedState) popDue(k timerKind, w int64, dst []timerID) ([]timerID, error) {
	h := &s.heaps[k]
	for len(h.heap) > 0 && h.heap[0].ts <= w {
		id := h.pop()
		if ok, _ := s.hasTimer(k, id); !ok {
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
	h := &s.heaps[k]
	for len(h.heap) > 0 {
		if ok, _ := s.hasTimer(k, h.heap[0]); ok {
			return h.heap[0].ts, true, nil
		}
		h.pop() // deleted
	}
	return 0, false, nil
}

func (h *timerHeap) push(id timerID) {
	h.heap = append(h.heap, id)
	i := len(h.heap) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !timerLess(h.heap[i], h.heap[p]) {
			break
		}
		h.heap[i], h.heap[p] = h.heap[p], h.heap[i]
		i = p
	}
}

func (h *timerHeap) pop() timerID {
	hp := h.heap
	top := hp[0]
	n := len(hp) - 1
	hp[0] = hp[n]
	hp[n] = timerID{}
	hp = hp[:n]
	i := 0
	for {
		l := 2*i + 1
		if l >= n {
			break
		}
		m := l
		if r := l + 1; r < n && timerLess(hp[r], hp[l]) {
			m = r
		}
		if !timerLess(hp[m], hp[i]) {
			break
		}
		hp[i], hp[m] = hp[m], hp[i]
		i = m
	}
	h.heap = hp
	return top
}

// cut cuts the keyed state and the timers copy-on-write: the groups' maps
// go into the snapshot as they are and are frozen. The values of a group
// without layers go in at once; the timers, and the values of a group with
// layers (an older cut still holds its maps), are read into KeyGroupState
// by Snapshot.Load, on the goroutine that encodes the snapshot. The cut
// counts until the Snapshot is released.
func (s *keyedState) cut() (*Snapshot, error) {
	kgs, later := s.snapshot()
	var once sync.Once
	cuts := s.cuts
	snap := &Snapshot{KeyGroups: kgs, release: func() { once.Do(func() { cuts.Add(-1) }) }}
	if len(later) > 0 {
		snap.KeyGroups = nil
		snap.deferred = &deferredCut{release: func() {}, read: func() (map[int]*KeyGroupState, error) {
			return loadCutGroups(kgs, later), nil
		}}
	}
	return snap, nil
}

// cutGroup is what a cut took of a group that it reads when it is loaded:
// its values with their layers (values.layers nil: the values went in at
// once, or there are none) and its timers (timers.m and timers.layers nil:
// none).
type cutGroup struct {
	kg             int
	values, timers cowMaps
}

// loadCutGroups merges the layers of groups and reads their timers into
// out, which holds the groups whose values went in at once.
func loadCutGroups(out map[int]*KeyGroupState, groups []cutGroup) map[int]*KeyGroupState {
	for i := range groups {
		c := &groups[i]
		if len(c.values.layers) > 0 {
			if m := c.values.merged(); len(m) > 0 {
				groupIn(out, c.kg).Entries = m
			}
		}
		tm := c.timers.m
		if len(c.timers.layers) > 0 {
			tm = c.timers.merged()
		}
		ev, proc := tm[string(timerNames[eventTime])], tm[string(timerNames[procTime])]
		if len(ev)+len(proc) > 0 {
			// Read in place (EachTimer): a million timers as a []Timer
			// were 24 MB of garbage a checkpoint; Load moves them into
			// Timers and ProcTimers for readers of the fields.
			g := groupIn(out, c.kg)
			if len(ev) > 0 {
				g.timerMaps[eventTime] = ev
			}
			if len(proc) > 0 {
				g.timerMaps[procTime] = proc
			}
		}
	}
	return out
}

// timersOf reads timers held by a group's maps (appendGroupTimer keys), in
// map order. Their keys are the map keys' own bytes, not copies (copying a
// million keys was two thirds of the loading, all cache misses): a frozen
// map's keys are never written, and nobody writes a Snapshot's timers.
func timersOf(m map[string][]byte) []Timer {
	if len(m) == 0 {
		return nil
	}
	out := make([]Timer, 0, len(m))
	for k := range m {
		key := k[8:]
		out = append(out, Timer{Key: unsafe.Slice(unsafe.StringData(key), len(key)), TS: groupTimerTS(k)})
	}
	return out
}

// snapshot freezes the groups' maps: it returns the values of the groups
// without layers by key group, and what the cut reads when it is loaded
// (the groups' fields: the maps and layers they refer to are frozen).
func (s *keyedState) snapshot() (map[int]*KeyGroupState, []cutGroup) {
	if s.cuts.Load() == 0 {
		// Merge what no cut holds any more, up to settleAtCut writes: maps
		// not touched since the last cut was released keep their writes as
		// a layer instead (the cut's loader merges them).
		budget := settleAtCut
		for idx := range s.groups {
			g := &s.groups[idx]
			for _, c := range [2]*cowMaps{&g.cowMaps, &g.timers} {
				if n := c.pending(); c.frozen && n <= budget {
					budget -= n
					s.settle(c)
				}
			}
		}
	}
	if s.expiring {
		s.dropExpired()
	}
	out := make(map[int]*KeyGroupState)
	var later []cutGroup
	for idx := range s.groups {
		g := &s.groups[idx]
		c := cutGroup{kg: s.rng.Start + idx}
		m, layers := g.cowMaps.freeze()
		switch {
		case len(layers) > 0:
			c.values = cowMaps{m: m, layers: layers}
		case len(m) > 0:
			out[c.kg] = &KeyGroupState{Entries: m}
		}
		c.timers.m, c.timers.layers = g.timers.freeze()
		if c.values.layers != nil || c.timers.m != nil || c.timers.layers != nil {
			later = append(later, c)
		}
	}
	s.cuts.Add(1)
	return out, later
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
