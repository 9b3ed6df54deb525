package host

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/bloom"

	"github.com/streamd/streamd/abi"
)

// Key layout of the pebble backend. Both keyspaces sort the way the state is
// read back: keyed state by key group (so a cut reads out group by group,
// and the key groups a subtask owns are one key range), timers by (ts, key)
// (so popDue is a scan from the start).
//
//	's' u16 key_group u32 len(name) name key   -> value
//	't' u64 ts^(1<<63) key                      -> empty (event-time timers)
//	'u' u64 ts^(1<<63) key                      -> empty (processing-time timers)
//
// Integers are big-endian; flipping the sign bit makes negative timestamps
// sort first. Structured state (mstate.go) is keyed state like any other:
// the entries of (name, key, ns) are one key range of 's'.
const (
	prefixState     = 's'
	prefixTimer     = 't'
	prefixProcTimer = 'u'
)

// timerPrefix is the keyspace of the timers of kind k.
func timerPrefix(k timerKind) byte {
	if k == procTime {
		return prefixProcTimer
	}
	return prefixTimer
}

// sweepPerCut bounds the structured entries an incremental checkpoint's
// TTL sweep looks at (fileCut): expired entries nobody touches go within
// (entries / sweepPerCut) checkpoints.
const sweepPerCut = 10_000

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
	name   string       // the directory name's prefix: job, operator, subtask, attempt
	now    func() int64 // the host's processing time in ms (TTL)
}

// pebbleState is the pebble backend: one DB per instance, in a directory of
// its own, without a WAL (a subtask's state is recovered from checkpoints,
// never from its local files).
type pebbleState struct {
	maxP int
	rng  abi.KeyGroupRange
	dir  string
	lock *dirLock // claims dir (and its file cuts) while the instance lives
	cfg  StateConfig
	log  *slog.Logger
	db   *pebble.DB
	w    pebble.Writer // db, or a batch while restoring
	kbuf []byte
	vbuf []byte
	rows rowCache      // the values read and written last, write-back (rowcache.go)
	wb   *pebble.Batch // the batch flushRows reuses

	mu     sync.Mutex // guards cuts and closed (loads run on other goroutines)
	cuts   map[*deferredCut]struct{}
	closed bool

	cutSeq  int        // file cuts taken: names their directories
	adopted *FileState // the restored files this DB was opened on (AdoptedFiles)

	now   func() int64
	next  [numTimerKinds]nextCache // the earliest timer of each kind
	sweep []byte                   // where the next TTL sweep starts (fileCut); nil: the start
}

// nextCache caches nextTimer: known says ts and ok are up to date.
type nextCache struct {
	known, ok bool
	ts        int64
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
	removeStaleDirs(parent, o.logger)
	lock, dir, err := claimDir(parent, sanitizeDirName(o.name))
	if err == nil {
		if err = os.Mkdir(dir, 0o755); err != nil {
			lock.release()
		}
	}
	if err != nil {
		return nil, fmt.Errorf("host: pebble state: data directory: %w", err)
	}
	now := o.now
	if now == nil {
		now = func() int64 { return time.Now().UnixMilli() }
	}
	s := &pebbleState{maxP: maxP, rng: rng, dir: dir, lock: lock, cfg: cfg, log: o.logger, cuts: map[*deferredCut]struct{}{}, now: now, rows: newRowCache(rowCacheBytes)}
	if err := s.open(); err != nil {
		os.RemoveAll(dir)
		lock.release()
		return nil, err
	}
	return s, nil
}

// pebbleMaxManifest makes pebble start a new MANIFEST once it is this
// large: an incremental checkpoint carries the MANIFEST in its blob.
const pebbleMaxManifest = 4 << 20

// open opens the DB in s.dir.
func (s *pebbleState) open() error {
	opts := &pebble.Options{
		DisableWAL:          true,
		MemTableSize:        pebbleMemTableSize,
		MaxManifestFileSize: pebbleMaxManifest,
		Logger:              pebbleLogger{s.log},
		// Every checkpoint flushes the memtable into an L0 file. Compacting
		// L0 into the base level rewrites the base level's files that the
		// flushed keys overlap, which for keys spread over all key groups is
		// all of them, and pushes as much down into the bottom level, which
		// rewrites about ten times that; an incremental checkpoint uploads
		// what compactions wrote. Pebble compacts L0 once it is
		// L0CompactionThreshold/2 sublevels deep (its L0 score is
		// 2*depth/threshold), so 24 lets 12 checkpoints' flushes gather
		// first (pebble's default, 4, compacts at 2). The uploads per
		// checkpoint shrink with the square root of that depth; reads (a
		// keyed operator reads before it writes) probe one more file per
		// sublevel, and bloom filters keep each probe cheap. The base
		// level's size (LBaseMaxBytes, default 64 MiB) is near its optimum
		// for this: 128 MiB, or a second concurrent compaction, uploaded
		// more (7.0% and 4.9% against 4.5%, side by side as below).
		// Measured at 16M keys, up to 1% changed per checkpoint
		// (BenchmarkPebbleStateCheckpointVsNone): a checkpoint uploads 11%
		// of the state on average with the defaults, 7% with 8, 5.4% with
		// 16, 2.8% with 24 (82% of the throughput without checkpoints).
		// Side by side on one loaded DB (pebble alone, the same updates):
		// 4.5% with 16, 3.6% with 24, 3.0% with 32; read-before-write of
		// new keys 9.5% slower with 24 than with 16 (mean L0+levels read
		// amplification 8.9 against 7.1).
		L0CompactionThreshold: 24,
		L0StopWritesThreshold: 64,
	}
	for i := range opts.Levels {
		opts.Levels[i].FilterPolicy = bloom.FilterPolicy(10)
	}
	if s.cfg.Cache != nil {
		opts.Cache = s.cfg.Cache.c
	} else {
		c := pebble.NewCache(DefaultStateCacheMiB << 20)
		defer c.Unref() // the DB holds its own reference
		opts.Cache = c
	}
	db, err := pebble.Open(s.dir, opts)
	if err != nil {
		return fmt.Errorf("host: pebble state: open %s: %w", s.dir, err)
	}
	s.db, s.w = db, db
	return nil
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

func appendTimerKey(b []byte, k timerKind, key []byte, ts int64) []byte {
	b = append(b, timerPrefix(k))
	b = binary.BigEndian.AppendUint64(b, uint64(ts)^(1<<63))
	return append(b, key...)
}

// splitStateKey parses a key of appendStateKey (false: malformed).
func splitStateKey(k []byte) (kg int, name, key []byte, ok bool) {
	if len(k) < 7 || k[0] != prefixState {
		return 0, nil, nil, false
	}
	n := 7 + int(binary.BigEndian.Uint32(k[3:7]))
	if n > len(k) {
		return 0, nil, nil, false
	}
	return int(k[1])<<8 | int(k[2]), k[7:n], k[n:], true
}

// timerTS is the time of a key of appendTimerKey (at least 9 bytes).
func timerTS(k []byte) int64 { return int64(binary.BigEndian.Uint64(k[1:9]) ^ (1 << 63)) }

func (s *pebbleState) get(kg int, name, key []byte) ([]byte, bool, error) {
	s.kbuf = appendStateKey(s.kbuf[:0], kg, name, key)
	if v, ok, known := s.rows.get(s.kbuf); known {
		return v, ok, nil
	}
	v, closer, err := s.db.Get(s.kbuf)
	if errors.Is(err, pebble.ErrNotFound) {
		s.rows.set(s.kbuf, nil, true)
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("pebble get: %w", err)
	}
	s.vbuf = append(s.vbuf[:0], v...)
	closer.Close()
	s.rows.set(s.kbuf, s.vbuf, false)
	return s.vbuf, true, nil
}

func (s *pebbleState) put(kg int, name, key, val []byte) error {
	s.kbuf = appendStateKey(s.kbuf[:0], kg, name, key)
	if s.restoring() {
		if err := s.w.Set(s.kbuf, val, noSync); err != nil {
			return fmt.Errorf("pebble set: %w", err)
		}
		return s.flushBatch()
	}
	return s.writeRow(val, false)
}

func (s *pebbleState) del(kg int, name, key []byte) error {
	s.kbuf = appendStateKey(s.kbuf[:0], kg, name, key)
	if s.restoring() {
		if err := s.w.Delete(s.kbuf, noSync); err != nil {
			return fmt.Errorf("pebble delete: %w", err)
		}
		return nil
	}
	return s.writeRow(nil, true)
}

// writeRow writes the state key in s.kbuf (absent: deletes it) through the
// write-back row cache, flushing it when its dirty entries are full.
func (s *pebbleState) writeRow(val []byte, absent bool) error {
	if !s.rows.write(s.kbuf, val, absent) {
		if err := s.flushRows(); err != nil {
			return err
		}
		if !s.rows.write(s.kbuf, val, absent) { // larger than the cache
			var err error
			if absent {
				err = s.db.Delete(s.kbuf, noSync)
			} else {
				err = s.db.Set(s.kbuf, val, noSync)
			}
			if err != nil {
				return fmt.Errorf("pebble write: %w", err)
			}
			return nil
		}
	}
	if s.rows.dirtyBytes >= s.rows.writeBack() {
		return s.flushRows()
	}
	return nil
}

// flushRows writes the row cache's dirty entries to the DB in one batch:
// before anything reads the DB other than get (a cut, a scan, a sweep, a
// restore).
func (s *pebbleState) flushRows() error {
	if len(s.rows.dirty) == 0 {
		return nil
	}
	if s.wb == nil {
		s.wb = s.db.NewBatch()
	}
	b := s.wb
	defer b.Reset()
	for _, e := range s.rows.dirty {
		var err error
		if e.absent {
			err = b.Delete(keyBytes(e.key), noSync)
		} else {
			err = b.Set(keyBytes(e.key), e.v, noSync)
		}
		if err != nil {
			return fmt.Errorf("pebble write: %w", err)
		}
	}
	if err := s.db.Apply(b, noSync); err != nil {
		return fmt.Errorf("pebble write: %w", err)
	}
	s.rows.flushed()
	return nil
}

// restoring: writes go to a restore batch (which clears the row cache when
// it is applied), not to the DB.
func (s *pebbleState) restoring() bool { return s.w != pebble.Writer(s.db) }

func (s *pebbleState) registerTimer(k timerKind, key []byte, ts int64) error {
	s.kbuf = appendTimerKey(s.kbuf[:0], k, key, ts)
	if err := s.w.Set(s.kbuf, nil, noSync); err != nil {
		return fmt.Errorf("pebble set timer: %w", err)
	}
	if c := &s.next[k]; c.known && (!c.ok || ts < c.ts) {
		c.ok, c.ts = true, ts
	}
	return s.flushBatch()
}

func (s *pebbleState) deleteTimer(k timerKind, key []byte, ts int64) error {
	s.kbuf = appendTimerKey(s.kbuf[:0], k, key, ts)
	if err := s.w.Delete(s.kbuf, noSync); err != nil {
		return fmt.Errorf("pebble delete timer: %w", err)
	}
	if c := &s.next[k]; c.known && c.ok && ts == c.ts {
		c.known = false
	}
	return nil
}

func (s *pebbleState) popDue(k timerKind, w int64, dst []timerID) ([]timerID, error) {
	p := timerPrefix(k)
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: []byte{p}, UpperBound: []byte{p + 1}})
	if err != nil {
		return dst, fmt.Errorf("pebble timers: %w", err)
	}
	for ok := it.First(); ok; ok = it.Next() {
		k := it.Key()
		ts := timerTS(k)
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

func (s *pebbleState) hasTimer(k timerKind, id timerID) (bool, error) {
	s.kbuf = appendTimerKey(s.kbuf[:0], k, []byte(id.key), id.ts)
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

func (s *pebbleState) removeTimer(k timerKind, id timerID) (bool, error) {
	if ok, err := s.hasTimer(k, id); err != nil || !ok {
		return false, err
	}
	return true, s.deleteTimer(k, []byte(id.key), id.ts)
}

// nextTimer reads the first timer of kind k (cached until a delete of the
// earliest timer).
func (s *pebbleState) nextTimer(k timerKind) (int64, bool, error) {
	c := &s.next[k]
	if c.known {
		return c.ts, c.ok, nil
	}
	p := timerPrefix(k)
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: []byte{p}, UpperBound: []byte{p + 1}})
	if err != nil {
		return 0, false, fmt.Errorf("pebble timers: %w", err)
	}
	c.ok = it.First()
	if c.ok {
		c.ts = timerTS(it.Key())
	}
	if err := it.Close(); err != nil {
		return 0, false, fmt.Errorf("pebble timers: %w", err)
	}
	c.known = true
	return c.ts, c.ok, nil
}

// scan iterates the stored keys with prefix (kg, name, prefix).
func (s *pebbleState) scan(kg int, name, prefix []byte, fn func(ukey, val []byte) error) error {
	if err := s.flushRows(); err != nil {
		return err
	}
	lo := append(appendStateKey(nil, kg, name, nil), prefix...)
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: prefixEnd(lo)})
	if err != nil {
		return fmt.Errorf("pebble scan: %w", err)
	}
	for ok := it.First(); ok; ok = it.Next() {
		v, err := it.ValueAndErr()
		if err == nil {
			err = fn(it.Key()[len(lo):], v)
		}
		if err != nil {
			it.Close()
			return err
		}
	}
	if err := it.Close(); err != nil {
		return fmt.Errorf("pebble scan: %w", err)
	}
	return nil
}

// sweepExpired deletes expired structured entries (and list elements),
// looking at up to limit entries from where the last sweep stopped, and
// wraps around at the end: the incremental cleanup of incremental
// checkpoints, whose files hold whatever the DB holds.
func (s *pebbleState) sweepExpired(limit int) error {
	if err := s.flushRows(); err != nil {
		return err
	}
	now := s.now()
	lo := s.sweep
	if lo == nil {
		lo = []byte{prefixState}
	}
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: []byte{prefixState + 1}})
	if err != nil {
		return fmt.Errorf("pebble sweep: %w", err)
	}
	b := s.db.NewBatch()
	defer b.Close()
	n := 0
	var last []byte
	ok := it.First()
	for ok && n < limit {
		k := it.Key()
		_, name, _, valid := splitStateKey(k)
		if !valid {
			ok = it.Next()
			continue
		}
		if !isStructured(name) {
			ok = it.SeekGE(prefixEnd(k[:7+len(name)])) // past this state of this key group
			continue
		}
		n++
		last = append(last[:0], k...)
		v, err := it.ValueAndErr()
		if err != nil {
			it.Close()
			return fmt.Errorf("pebble sweep: %w", err)
		}
		live, keep := liveValue(v, now)
		switch {
		case !keep:
			err = b.Delete(k, noSync)
			s.rows.drop(k)
		case len(live) != len(v):
			err = b.Set(k, live, noSync)
			s.rows.drop(k)
		}
		if err != nil {
			it.Close()
			return fmt.Errorf("pebble sweep: %w", err)
		}
		ok = it.Next()
	}
	if ok && last != nil {
		s.sweep = append(last, 0) // the next key after the last one seen
	} else {
		s.sweep = nil
	}
	if err := it.Close(); err != nil {
		return fmt.Errorf("pebble sweep: %w", err)
	}
	if err := s.db.Apply(b, noSync); err != nil {
		return fmt.Errorf("pebble sweep: %w", err)
	}
	return nil
}

// cut takes a pebble snapshot: a sequence number, no copy. Reading it into
// KeyGroups is left to Snapshot.Load.
func (s *pebbleState) cut() (*Snapshot, error) {
	if err := s.flushRows(); err != nil {
		return nil, fmt.Errorf("host: pebble state: %w", err)
	}
	snap := s.db.NewSnapshot()
	empty, err := pebbleEmpty(snap)
	if err != nil || empty {
		snap.Close()
		return &Snapshot{}, err
	}
	now := s.now() // expired structured entries are left out of the cut
	c := &deferredCut{read: func() (map[int]*KeyGroupState, error) { return s.readCut(snap, now) },
		stream: func(lists map[string]*ListState, w io.Writer, size func(int64) error) error {
			return s.streamCut(snap, now, lists, w, size)
		}}
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

// fileCut flushes the memtable and makes a pebble checkpoint (hard links
// to the sstables, a copy of the MANIFEST and OPTIONS) in a directory next
// to the DB's: the keyed state as files, for an incremental checkpoint. The
// synchronous cost is the flush of what was written since the last cut.
// The directory goes when the Snapshot is released (or the DB closes).
func (s *pebbleState) fileCut() (*Snapshot, error) {
	if err := s.flushRows(); err != nil {
		return nil, fmt.Errorf("host: pebble state: %w", err)
	}
	empty, err := pebbleEmpty(s.db)
	if err != nil || empty {
		return &Snapshot{}, err
	}
	if err := s.sweepExpired(sweepPerCut); err != nil {
		return nil, fmt.Errorf("host: pebble state: %w", err)
	}
	if err := s.db.Flush(); err != nil {
		return nil, fmt.Errorf("host: pebble state: flush: %w", err)
	}
	s.cutSeq++
	dir := fmt.Sprintf("%s.cut-%d", s.dir, s.cutSeq)
	if err := os.RemoveAll(dir); err != nil {
		return nil, fmt.Errorf("host: pebble state: %w", err)
	}
	if err := s.db.Checkpoint(dir); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("host: pebble state: checkpoint to %s: %w", dir, err)
	}
	fs := &FileState{KeyGroups: s.rng, MaxParallelism: s.maxP, dir: dir}
	ents, err := os.ReadDir(dir)
	if err != nil {
		fs.release()
		return nil, fmt.Errorf("host: pebble state: %w", err)
	}
	for _, e := range ents {
		if !e.Type().IsRegular() {
			continue
		}
		f := StateFile{Name: e.Name()}
		if strings.HasSuffix(f.Name, ".sst") {
			info, err := e.Info()
			if err != nil {
				fs.release()
				return nil, fmt.Errorf("host: pebble state: %w", err)
			}
			f.Shared, f.Size = true, info.Size()
		} else {
			if f.Data, err = os.ReadFile(filepath.Join(dir, f.Name)); err != nil {
				fs.release()
				return nil, fmt.Errorf("host: pebble state: %w", err)
			}
			f.Size = int64(len(f.Data))
		}
		fs.Files = append(fs.Files, f)
	}
	return &Snapshot{Files: []*FileState{fs}, release: fs.release}, nil
}

// importFiles restores parts: it opens the DB on the files of the part
// that overlaps its key groups most (no copy of entries, as Flink's RocksDB
// backend restores), deletes what lies outside its key groups, and copies
// the entries in its key groups of the other parts.
func (s *pebbleState) importFiles(ctx context.Context, parts []*FileState) error {
	if err := s.flushRows(); err != nil {
		return fmt.Errorf("host: pebble state: restore: %w", err)
	}
	best, most := -1, 0
	for i, p := range parts {
		lo, hi := max(p.KeyGroups.Start, s.rng.Start), min(p.KeyGroups.End, s.rng.End)
		if p.MaxParallelism == s.maxP && hi-lo+1 > most {
			best, most = i, hi-lo+1
		}
	}
	if empty, err := pebbleEmpty(s.db); err != nil || !empty {
		best = -1 // restored KeyGroups are in it already: copy instead
	}
	rest := parts
	if best >= 0 {
		if err := s.adopt(ctx, parts[best]); err != nil {
			return err
		}
		rest = append(slices.Clone(parts[:best]), parts[best+1:]...)
	}
	b := s.db.NewBatch()
	s.w = b
	defer func() {
		s.w = s.db
		b.Close()
	}()
	if err := importParts(ctx, rest, s.cfg.DataDir, s.rng, s.maxP, s.put, s.registerTimer); err != nil {
		return err
	}
	s.rows.clear()
	if err := s.db.Apply(b, noSync); err != nil {
		return fmt.Errorf("host: pebble state: restore: %w", err)
	}
	return nil
}

// adopt replaces the (empty) DB by one opened on part's files, then deletes
// the entries and timers outside the subtask's key groups.
func (s *pebbleState) adopt(ctx context.Context, part *FileState) error {
	s.closeBatch()
	if err := s.db.Close(); err != nil {
		return fmt.Errorf("host: pebble state: %w", err)
	}
	err := os.RemoveAll(s.dir)
	if err == nil {
		err = os.MkdirAll(s.dir, 0o755)
	}
	if err == nil {
		err = fetchPart(ctx, part, s.dir)
	}
	if err == nil {
		err = s.open()
	}
	if err != nil {
		// Leave an empty DB behind, so that close works.
		os.RemoveAll(s.dir)
		os.MkdirAll(s.dir, 0o755)
		if oerr := s.open(); oerr != nil {
			return errors.Join(err, oerr)
		}
		return err
	}
	s.adopted = part
	s.next = [numTimerKinds]nextCache{}
	s.rows.clear()
	if part.KeyGroups.Start < s.rng.Start {
		if err := s.db.DeleteRange([]byte{prefixState}, []byte{prefixState, byte(s.rng.Start >> 8), byte(s.rng.Start)}, noSync); err != nil {
			return fmt.Errorf("host: pebble state: clip: %w", err)
		}
	}
	if part.KeyGroups.End > s.rng.End {
		if err := s.db.DeleteRange([]byte{prefixState, byte((s.rng.End + 1) >> 8), byte(s.rng.End + 1)}, []byte{prefixState + 1}, noSync); err != nil {
			return fmt.Errorf("host: pebble state: clip: %w", err)
		}
	}
	if part.KeyGroups.Start >= s.rng.Start && part.KeyGroups.End <= s.rng.End {
		return nil
	}
	var drop [][]byte
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixTimer}, UpperBound: []byte{prefixProcTimer + 1}})
	if err != nil {
		return fmt.Errorf("host: pebble state: clip: %w", err)
	}
	for ok := it.First(); ok; ok = it.Next() {
		if k := it.Key(); len(k) >= 9 && !s.rng.Contains(abi.KeyGroup(k[9:], s.maxP)) {
			drop = append(drop, bytes.Clone(k))
		}
	}
	if err := it.Close(); err != nil {
		return fmt.Errorf("host: pebble state: clip: %w", err)
	}
	for _, k := range drop {
		if err := s.db.Delete(k, noSync); err != nil {
			return fmt.Errorf("host: pebble state: clip: %w", err)
		}
	}
	return nil
}

func pebbleEmpty(snap pebble.Reader) (bool, error) {
	it, err := snap.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixState}, UpperBound: []byte{prefixProcTimer + 1}})
	if err != nil {
		return false, fmt.Errorf("pebble cut: %w", err)
	}
	any := it.First()
	if err := it.Close(); err != nil {
		return false, fmt.Errorf("pebble cut: %w", err)
	}
	return !any, nil
}

// readCut reads a snapshot into key groups: the keyed state in key order
// (without the structured entries expired at now), then the timers, which
// come out in (ts, key) order, the order of KeyGroupState.Timers.
func (s *pebbleState) readCut(snap *pebble.Snapshot, now int64) (map[int]*KeyGroupState, error) {
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
		gk, sname, skey, valid := splitStateKey(k)
		if !valid {
			it.Close()
			return nil, fmt.Errorf("host: pebble state: read cut: malformed key %q", k)
		}
		v, err := it.ValueAndErr()
		if err != nil {
			it.Close()
			return nil, fmt.Errorf("host: pebble state: read cut: %w", err)
		}
		var keep bool
		if v, keep = liveStored(sname, v, now); !keep {
			continue
		}
		if gk != kg {
			kg, g, m = gk, group(gk), nil
		}
		if m == nil || string(sname) != name {
			name = string(sname)
			m = make(map[string][]byte)
			g.Entries[name] = m
		}
		m[string(skey)] = append([]byte{}, v...)
	}
	if err := it.Close(); err != nil {
		return nil, fmt.Errorf("host: pebble state: read cut: %w", err)
	}
	it, err = snap.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixTimer}, UpperBound: []byte{prefixProcTimer + 1}})
	if err != nil {
		return nil, fmt.Errorf("host: pebble state: read cut: %w", err)
	}
	for ok := it.First(); ok; ok = it.Next() {
		k := it.Key()
		key := bytes.Clone(k[9:])
		tg := group(abi.KeyGroup(key, s.maxP))
		if k[0] == prefixProcTimer {
			tg.ProcTimers = append(tg.ProcTimers, Timer{Key: key, TS: timerTS(k)})
		} else {
			tg.Timers = append(tg.Timers, Timer{Key: key, TS: timerTS(k)})
		}
	}
	if err := it.Close(); err != nil {
		return nil, fmt.Errorf("host: pebble state: read cut: %w", err)
	}
	return out, nil
}

// restore writes groups through batches of up to restoreBatchBytes: below
// pebble's large-batch threshold (half the memtable), above which an
// applied batch is kept in the Go heap as a memtable of its own until it
// is flushed.
const restoreBatchBytes = pebbleMemTableSize / 4

func (s *pebbleState) restore(groups map[int]*KeyGroupState) error {
	if err := s.flushRows(); err != nil {
		return fmt.Errorf("host: pebble state: restore: %w", err)
	}
	b := s.db.NewBatch()
	s.w = b
	defer func() {
		s.w = s.db
		b.Close()
	}()
	if err := checkRestored(groups, s.rng, s.maxP, s.put, s.registerTimer); err != nil {
		return err
	}
	s.rows.clear()
	if err := s.db.Apply(b, noSync); err != nil {
		return fmt.Errorf("host: pebble state: restore: %w", err)
	}
	return nil
}

// restoreFrom writes the key groups of srcs as they are read, in batches of
// up to restoreBatchBytes: memory does not grow with their size. A failed
// restore leaves a part in the DB; the instance is discarded, which
// removes it.
func (s *pebbleState) restoreFrom(ctx context.Context, srcs []KeyedSource) error {
	if err := s.flushRows(); err != nil {
		return fmt.Errorf("host: pebble state: restore: %w", err)
	}
	b := s.db.NewBatch()
	s.w = b
	defer func() {
		s.w = s.db
		b.Close()
	}()
	if err := readSources(ctx, srcs, s.rng, s.maxP, s.put, s.registerTimer); err != nil {
		return err
	}
	s.rows.clear()
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

// closeBatch closes flushRows' batch (before the DB closes).
func (s *pebbleState) closeBatch() {
	if s.wb != nil {
		s.wb.Close()
		s.wb = nil
	}
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
	s.closeBatch()
	err := s.db.Close()
	if rerr := os.RemoveAll(s.dir); err == nil {
		err = rerr
	}
	// File cuts still being written fail to upload; their directories go.
	if cutDirs, _ := filepath.Glob(s.dir + ".cut-*"); len(cutDirs) > 0 {
		for _, d := range cutDirs {
			os.RemoveAll(d)
		}
	}
	s.lock.release()
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
