package host

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/streamd/streamd/abi"
)

// Keyed-state backends (state.backend in a job file).
const (
	BackendMemory = "memory" // Go maps per key group; the default
	BackendPebble = "pebble" // an embedded LSM (github.com/cockroachdb/pebble/v2) under the data directory
)

// DefaultStateCacheMiB is state.cache_mib when a job sets none: the bound of
// the pebble block cache.
const DefaultStateCacheMiB = 256

// ErrState: the keyed-state backend failed (a pebble read or write error,
// e.g. a full disk). The instance is discarded.
var ErrState = errors.New("host: keyed state backend failed")

// StateConfig selects and configures the keyed-state backend of an instance.
type StateConfig struct {
	// Backend is BackendMemory (or "") or BackendPebble.
	Backend string
	// DataDir is where a pebble instance keeps its files: it makes a
	// directory of its own below DataDir (created if missing), removed when
	// the instance closes. "": the OS temp directory.
	DataDir string
	// Cache is the block cache pebble instances share (NewStateCache); nil:
	// each pebble instance makes one of DefaultStateCacheMiB.
	Cache *StateCache
	// Incremental: checkpoints (Instance.SnapshotCheckpoint) of the pebble
	// backend cut the keyed state as files, which incremental checkpoints
	// share; otherwise they are full like savepoints. The memory backend
	// ignores it.
	Incremental bool
}

// CheckBackend checks a state.backend value ("" is memory).
func CheckBackend(name string) error {
	switch name {
	case "", BackendMemory, BackendPebble:
		return nil
	}
	return fmt.Errorf("unknown state backend %q (want %s or %s)", name, BackendMemory, BackendPebble)
}

// stateBackend keeps the keyed state and event-time timers of one subtask's
// key groups. It is driven by the instance's goroutine only, except that a
// cut (the Snapshot it returns) may be loaded on another goroutine while the
// instance goes on. Callers check keys against the subtask's key groups
// first. Errors are the backend's own (I/O); the instance is discarded.
type stateBackend interface {
	// get returns the value of key in state name; it is valid until the
	// next call on the backend.
	get(kg int, name, key []byte) ([]byte, bool, error)
	// put stores a copy of val.
	put(kg int, name, key, val []byte) error
	del(kg int, name, key []byte) error
	// scan calls fn for every entry of structured state name (a stored
	// name, NUL name) whose stored key starts with prefix (a key and
	// namespace, appendEntryPrefix), in user-key order, with the user key
	// and the value, both valid during the call only. fn may not write.
	scan(kg int, name, prefix []byte, fn func(ukey, val []byte) error) error
	// registerTimer and deleteTimer add and remove the timer (key, ts) of
	// kind k (event or processing time); both are idempotent.
	registerTimer(k timerKind, key []byte, ts int64) error
	deleteTimer(k timerKind, key []byte, ts int64) error
	// popDue appends every timer of kind k with ts <= w to dst in (ts,
	// key) order. The caller removes each with removeTimer before it
	// fires it, and skips those removeTimer did not find (an earlier
	// timer call deleted them).
	popDue(k timerKind, w int64, dst []timerID) ([]timerID, error)
	hasTimer(k timerKind, id timerID) (bool, error)
	// removeTimer removes the timer id of kind k and reports whether it
	// was there.
	removeTimer(k timerKind, id timerID) (bool, error)
	// nextTimer is the earliest ts of the timers of kind k.
	nextTimer(k timerKind) (int64, bool, error)
	// cut returns the keyed state and timers as they are now, by key group,
	// in milliseconds: later writes do not change it. The Snapshot may be
	// loaded (Snapshot.Load) on another goroutine.
	cut() (*Snapshot, error)
	// restore loads groups, which must lie in this subtask's key groups.
	restore(groups map[int]*KeyGroupState) error
	// restoreFrom loads the key groups of srcs, which must lie in this
	// subtask's key groups, as they are read. After an error the backend
	// holds part of them: the instance is discarded.
	restoreFrom(ctx context.Context, srcs []KeyedSource) error
	// close releases the backend and its files; a cut not loaded yet fails
	// to load afterwards. Idempotent.
	close() error
}

// newBackend makes the backend cfg selects for the key groups rng; now is
// the host's processing time in ms (state TTL).
func newBackend(cfg InstanceConfig, rng abi.KeyGroupRange, now func() int64, opts pebbleOptions) (stateBackend, error) {
	switch cfg.State.Backend {
	case "", BackendMemory:
		s := newKeyedState(cfg.MaxParallelism, rng, now)
		return &s, nil
	case BackendPebble:
		opts.now = now
		return openPebble(cfg.MaxParallelism, rng, cfg.State, opts)
	}
	return nil, CheckBackend(cfg.State.Backend)
}

// checkRestored calls put for every entry and timer for every timer of
// groups, after checking that each lies in rng and in the key group it is
// stored under (of its embedded key, for structured state).
func checkRestored(groups map[int]*KeyGroupState, rng abi.KeyGroupRange, maxP int,
	put func(kg int, name, key, val []byte) error, timer func(k timerKind, key []byte, ts int64) error) error {
	w := &restoreWriter{rng: rng, maxP: maxP, put: put, timer: timer}
	for kg, g := range groups {
		if err := w.group(kg); err != nil {
			return err
		}
		if g == nil {
			continue
		}
		for name, m := range g.Entries {
			for k, v := range m {
				if err := w.Entry(kg, []byte(name), []byte(k), v); err != nil {
					return err
				}
			}
		}
		for _, proc := range []bool{false, true} {
			for _, t := range g.TimerList(proc) {
				if err := w.Timer(kg, t.Key, t.TS, proc); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// deferredCut is the keyed state of a Snapshot that is read from a backend's
// cut when first needed (Snapshot.Load), on whichever goroutine asks.
type deferredCut struct {
	mu   sync.Mutex
	read func() (map[int]*KeyGroupState, error) // reads the cut
	// stream writes the canonical encoding of the cut and lists (see
	// Snapshot.EncodeTo); nil: the backend cannot.
	stream  func(lists map[string]*ListState, w io.Writer, size func(int64) error) error
	release func() // frees the cut; called once
	done    bool
	groups  map[int]*KeyGroupState
	err     error
}

// load reads the cut once and releases it.
func (c *deferredCut) load() (map[int]*KeyGroupState, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.done {
		c.groups, c.err = c.read()
		c.done = true
		c.release()
	}
	return c.groups, c.err
}

// abandon releases a cut not loaded yet: loading it fails with err. It waits
// for a load in progress.
func (c *deferredCut) abandon(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.done {
		c.done, c.err = true, err
		c.release()
	}
}
