package host

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"

	"github.com/cockroachdb/pebble/v2"

	"github.com/streamd/streamd/abi"
)

// Key layout of the pebble backend. Both keyspaces sort the way the state is
// read back: keyed state by key group (so a cut reads out group by group,
// and the key groups a subtask owns are one key range), timers by (ts, key)
// (so popDue is a scan from the start).
//
//	's' u16 key_group u32 len(name) name key   -> value
//	't' u64 ts^(1<<63) key                      -> empty
//
// Integers are big-endian; flipping the sign bit makes negative timestamps
// sort first.
const (
	prefixState = 's'
	prefixTimer = 't'
)

// pebbleMemTableSize is each instance's memtable: writes land there, and
// flush to L0 files when it is full.
const pebbleMemTableSize = 16 << 20

// StateCache is a bounded pebble block cache that several pebble instances
// share (state.cache_mib). Release it when the last instance using it was
// made; the instances keep it alive until they close.
type StateCache struct{ c *pebble.Cache }

// NewStateCache makes a block cache of bytes bytes.
func NewStateCache(bytes int64) *StateCache { return &StateCache{pebble.NewCache(bytes)} }

// Release drops the caller's reference.
func (c *StateCache) Release() {
	if c != nil {
		c.c.Unref()
	}
}

// pebbleOptions are what an instance passes from its engine.
type pebbleOptions struct {
	logger *slog.Logger
	name   string // the directory name's prefix: job, operator, subtask, attempt
}

// pebbleState is the pebble backend: one DB per instance, in a directory of
// its own, without a WAL (a subtask's state is recovered from checkpoints,
// never from its local files).
type pebbleState struct {
	maxP int
	rng  abi.KeyGroupRange
	dir  string
	db   *pebble.DB
	w    pebble.Writer // db, or a batch while restoring
	kbuf []byte
	vbuf []byte

	mu     sync.Mutex // guards cuts and closed (loads run on other goroutines)
	cuts   map[*deferredCut]struct{}
	closed bool
}

var noSync = pebble.NoSync

func openPebble(maxP int, rng abi.KeyGroupRange, cfg StateConfig, o pebbleOptions) (*pebbleState, error) {
	parent := cfg.DataDir
	if parent == "" {
		parent = os.TempDir()
	}
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return nil, fmt.Errorf("host: pebble state: data directory: %w", err)
	}
	dir, err := os.MkdirTemp(parent, sanitizeDirName(o.name)+"-")
	if err != nil {
		return nil, fmt.Errorf("host: pebble state: data directory: %w", err)
	}
	opts := &pebble.Options{
		DisableWAL:   true,
		MemTableSize: pebbleMemTableSize,
		Logger:       pebbleLogger{o.logger},
	}
	if cfg.Cache != nil {
		opts.Cache = cfg.Cache.c
	} else {
		c := pebble.NewCache(DefaultStateCacheMiB << 20)
		defer c.Unref() // the DB holds its own reference
		opts.Cache = c
	}
	db, err := pebble.Open(dir, opts)
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("host: pebble state: open %s: %w", dir, err)
	}
	return &pebbleState{maxP: maxP, rng: rng, dir: dir, db: db, w: db, cuts: map[*deferredCut]struct{}{}}, nil
}

// sanitizeDirName keeps letters, digits, '-', '_' and '.' of s.
func sanitizeDirName(s string) string {
	s = strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_', r == '.':
			return r
		}
		return '_'
	}, s)
	if len(s) > 100 {
		s = s[:100]
	}
	return s
}

func appendStateKey(b []byte, kg int, name, key []byte) []byte {
	b = append(b, prefixState, byte(kg>>8), byte(kg))
	b = binary.BigEndian.AppendUint32(b, uint32(len(name)))
	b = append(b, name...)
	return append(b, key...)
}

func appendTimerKey(b []byte, key []byte, ts int64) []byte {
	b = append(b, prefixTimer)
	b = binary.BigEndian.AppendUint64(b, uint64(ts)^(1<<63))
	return append(b, key...)
}

func (s *pebbleState) get(kg int, name, key []byte) ([]byte, bool, error) {
	s.kbuf = appendStateKey(s.kbuf[:0], kg, name, key)
	v, closer, err := s.db.Get(s.kbuf)
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("pebble get: %w", err)
	}
	s.vbuf = append(s.vbuf[:0], v...)
	closer.Close()
	return s.vbuf, true, nil
}

func (s *pebbleState) put(kg int, name, key, val []byte) error {
	s.kbuf = appendStateKey(s.kbuf[:0], kg, name, key)
	if err := s.w.Set(s.kbuf, val, noSync); err != nil {
		return fmt.Errorf("pebble set: %w", err)
	}
	return s.flushBatch()
}

func (s *pebbleState) del(kg int, name, key []byte) error {
	s.kbuf = appendStateKey(s.kbuf[:0], kg, name, key)
	if err := s.w.Delete(s.kbuf, noSync); err != nil {
		return fmt.Errorf("pebble delete: %w", err)
	}
	return nil
}

func (s *pebbleState) registerTimer(key []byte, ts int64) error {
	s.kbuf = appendTimerKey(s.kbuf[:0], key, ts)
	if err := s.w.Set(s.kbuf, nil, noSync); err != nil {
		return fmt.Errorf("pebble set timer: %w", err)
	}
	return s.flushBatch()
}

func (s *pebbleState) deleteTimer(key []byte, ts int64) error {
	s.kbuf = appendTimerKey(s.kbuf[:0], key, ts)
	if err := s.w.Delete(s.kbuf, noSync); err != nil {
		return fmt.Errorf("pebble delete timer: %w", err)
	}
	return nil
}

func (s *pebbleState) popDue(w int64, dst []timerID) ([]timerID, error) {
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixTimer}, UpperBound: []byte{prefixTimer + 1}})
	if err != nil {
		return dst, fmt.Errorf("pebble timers: %w", err)
	}
	for ok := it.First(); ok; ok = it.Next() {
		k := it.Key()
		ts := int64(binary.BigEndian.Uint64(k[1:9]) ^ (1 << 63))
		if ts > w {
			break
		}
		dst = append(dst, timerID{key: string(k[9:]), ts: ts})
	}
	if err := it.Close(); err != nil {
		return dst, fmt.Errorf("pebble timers: %w", err)
	}
	return dst, nil
}

func (s *pebbleState) hasTimer(id timerID) (bool, error) {
	s.kbuf = appendTimerKey(s.kbuf[:0], []byte(id.key), id.ts)
	_, closer, err := s.db.Get(s.kbuf)
	if errors.Is(err, pebble.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("pebble get timer: %w", err)
	}
	closer.Close()
	return true, nil
}

func (s *pebbleState) removeTimer(id timerID) error {
	return s.deleteTimer([]byte(id.key), id.ts)
}

// cut takes a pebble snapshot: a sequence number, no copy. Reading it into
// KeyGroups is left to Snapshot.Load.
func (s *pebbleState) cut() (*Snapshot, error) {
	snap := s.db.NewSnapshot()
	empty, err := pebbleEmpty(snap)
	if err != nil || empty {
		snap.Close()
		return &Snapshot{}, err
	}
	c := &deferredCut{read: func() (map[int]*KeyGroupState, error) { return s.readCut(snap) }}
	c.release = func() {
		snap.Close()
		s.mu.Lock()
		delete(s.cuts, c)
		s.mu.Unlock()
	}
	s.mu.Lock()
	s.cuts[c] = struct{}{}
	s.mu.Unlock()
	return &Snapshot{deferred: c}, nil
}

func pebbleEmpty(snap *pebble.Snapshot) (bool, error) {
	it, err := snap.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixState}, UpperBound: []byte{prefixTimer + 1}})
	if err != nil {
		return false, fmt.Errorf("pebble cut: %w", err)
	}
	any := it.First()
	if err := it.Close(); err != nil {
		return false, fmt.Errorf("pebble cut: %w", err)
	}
	return !any, nil
}

// readCut reads a snapshot into key groups: the keyed state in key order,
// then the timers, which come out in (ts, key) order, the order of
// KeyGroupState.Timers.
func (s *pebbleState) readCut(snap *pebble.Snapshot) (map[int]*KeyGroupState, error) {
	out := make(map[int]*KeyGroupState)
	group := func(kg int) *KeyGroupState { return groupIn(out, kg) }
	it, err := snap.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixState}, UpperBound: []byte{prefixState + 1}})
	if err != nil {
		return nil, fmt.Errorf("host: pebble state: read cut: %w", err)
	}
	var g *KeyGroupState
	kg := -1
	var name string
	var m map[string][]byte
	for ok := it.First(); ok; ok = it.Next() {
		k := it.Key()
		if len(k) < 7 || 7+int(binary.BigEndian.Uint32(k[3:7])) > len(k) {
			it.Close()
			return nil, fmt.Errorf("host: pebble state: read cut: malformed key %q", k)
		}
		if gk := int(k[1])<<8 | int(k[2]); gk != kg {
			kg, g, m = gk, group(gk), nil
		}
		n := 7 + int(binary.BigEndian.Uint32(k[3:7]))
		if m == nil || string(k[7:n]) != name {
			name = string(k[7:n])
			m = make(map[string][]byte)
			g.Entries[name] = m
		}
		v, err := it.ValueAndErr()
		if err != nil {
			it.Close()
			return nil, fmt.Errorf("host: pebble state: read cut: %w", err)
		}
		m[string(k[n:])] = append([]byte{}, v...)
	}
	if err := it.Close(); err != nil {
		return nil, fmt.Errorf("host: pebble state: read cut: %w", err)
	}
	it, err = snap.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixTimer}, UpperBound: []byte{prefixTimer + 1}})
	if err != nil {
		return nil, fmt.Errorf("host: pebble state: read cut: %w", err)
	}
	for ok := it.First(); ok; ok = it.Next() {
		k := it.Key()
		key := bytes.Clone(k[9:])
		tg := group(abi.KeyGroup(key, s.maxP))
		tg.Timers = append(tg.Timers, Timer{Key: key, TS: int64(binary.BigEndian.Uint64(k[1:9]) ^ (1 << 63))})
	}
	if err := it.Close(); err != nil {
		return nil, fmt.Errorf("host: pebble state: read cut: %w", err)
	}
	return out, nil
}

// restore writes groups through batches of up to restoreBatchBytes.
const restoreBatchBytes = 8 << 20

func (s *pebbleState) restore(groups map[int]*KeyGroupState) error {
	b := s.db.NewBatch()
	s.w = b
	defer func() {
		s.w = s.db
		b.Close()
	}()
	if err := checkRestored(groups, s.rng, s.maxP, s.put, s.registerTimer); err != nil {
		return err
	}
	if err := s.db.Apply(b, noSync); err != nil {
		return fmt.Errorf("host: pebble state: restore: %w", err)
	}
	return nil
}

// flushBatch commits the restore batch when it is large.
func (s *pebbleState) flushBatch() error {
	b, ok := s.w.(*pebble.Batch)
	if !ok || b.Len() < restoreBatchBytes {
		return nil
	}
	if err := s.db.Apply(b, noSync); err != nil {
		return fmt.Errorf("pebble restore: %w", err)
	}
	b.Reset()
	return nil
}

// close abandons the cuts not loaded yet (waiting for loads in progress),
// closes the DB and removes its directory.
func (s *pebbleState) close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	cuts := make([]*deferredCut, 0, len(s.cuts))
	for c := range s.cuts {
		cuts = append(cuts, c)
	}
	s.mu.Unlock()
	for _, c := range cuts {
		c.abandon(errors.New("host: pebble state: the instance closed before its snapshot was read"))
	}
	err := s.db.Close()
	if rerr := os.RemoveAll(s.dir); err == nil {
		err = rerr
	}
	if err != nil {
		return fmt.Errorf("host: pebble state: close %s: %w", s.dir, err)
	}
	return nil
}

// pebbleLogger sends pebble's log lines to the engine's logger: info at
// debug level (pebble is chatty about compactions), errors as errors.
type pebbleLogger struct{ l *slog.Logger }

func (p pebbleLogger) Infof(format string, args ...any) {
	p.l.Log(context.Background(), slog.LevelDebug, "pebble: "+fmt.Sprintf(format, args...))
}

func (p pebbleLogger) Errorf(format string, args ...any) {
	p.l.Log(context.Background(), slog.LevelError, "pebble: "+fmt.Sprintf(format, args...))
}

func (p pebbleLogger) Fatalf(format string, args ...any) {
	msg := "pebble: " + fmt.Sprintf(format, args...)
	p.l.Log(context.Background(), slog.LevelError, msg)
	panic(msg)
}
