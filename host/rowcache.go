package host

import "unsafe"

// rowCache is the pebble backend's row cache: the values of the keys an
// instance read or wrote last, by their pebble key, in front of the DB. A
// keyed counter reads the key it writes; without the cache each read
// searched the memtable's skiplist and the L0 files (70% of the backend's
// time on BenchmarkStateBackendsNoCheckpoint).
//
// It is write-back, as Kafka Streams' record cache in front of RocksDB is:
// put and del change the cache alone and mark the entry dirty; the dirty
// entries go to the DB in one batch (pebbleState.flushRows) once they hold
// writeBackBytes, and before anything reads the DB other than a point
// lookup (a cut, a scan, a TTL sweep, a restore). A key written many times
// between two flushes is written to the DB once, and each flush is one
// commit instead of one per write (a write per record was half of the
// keyed counter's time on BenchmarkStateBackendsNoCheckpoint, most of it
// inserting into the memtable's skiplist). Dirty
// entries are never evicted, so a point lookup that misses the cache may
// read the DB. It remembers keys known to be absent too, so the first read
// of a new key costs one DB lookup, not one per record until it is
// written. A value returned by get is valid until the next call on the
// backend, as the memory backend's are (put overwrites an entry's value in
// place).
//
// It holds at most max bytes of keys and values (with rowOverhead per
// entry for the map and the entry); past that, an insertion evicts clean
// entries in map order (about random) down to three quarters of the
// bound.
type rowCache struct {
	m     map[string]*rowEntry
	bytes int
	max   int
	// dirty are the entries written since the last flush, dirtyBytes their
	// keys and values.
	dirty      []*rowEntry
	dirtyBytes int
}

type rowEntry struct {
	key    string // the map's key
	v      []byte
	absent bool
	dirty  bool // written, not flushed yet
}

// rowCacheBytes is the row cache of each pebble instance.
const rowCacheBytes = 32 << 20

// writeBackBytes bounds the dirty entries of a row cache of rowCacheBytes
// (a quarter of a smaller cache): a flush is one pebble batch of about
// this size, below pebble's large-batch threshold (half the memtable).
const writeBackBytes = 4 << 20

// rowOverhead is what an entry costs beyond its key and value: the map's
// slot, the entry and the slice headers.
const rowOverhead = 64

func newRowCache(max int) rowCache { return rowCache{m: map[string]*rowEntry{}, max: max} }

// get returns k's value, whether it exists, and whether the cache knows.
func (c *rowCache) get(k []byte) (v []byte, ok, known bool) {
	e := c.m[string(k)]
	if e == nil {
		return nil, false, false
	}
	return e.v, !e.absent, true
}

// set records k's value as the DB holds it (absent: k does not exist).
// It does nothing if k is dirty (the DB's value is older) or does not fit.
func (c *rowCache) set(k, v []byte, absent bool) {
	if e := c.m[string(k)]; e != nil {
		if !e.dirty {
			c.bytes += len(v) - len(e.v)
			e.v, e.absent = append(e.v[:0], v...), absent
		}
		return
	}
	c.insert(k, v, absent)
}

// insert adds the entry k, which the cache does not hold, evicting clean
// entries to make room; nil if it does not fit.
func (c *rowCache) insert(k, v []byte, absent bool) *rowEntry {
	n := len(k) + len(v) + rowOverhead
	if c.bytes+n > c.max {
		c.evict(n)
		if c.bytes+n > c.max {
			return nil
		}
	}
	e := &rowEntry{key: string(k), v: append([]byte(nil), v...), absent: absent}
	c.m[e.key] = e
	c.bytes += n
	return e
}

// write records a write of k (absent: a delete) to be flushed. It returns
// false if the write does not fit beside the dirty entries: the caller
// flushes and writes again, or writes to the DB itself when the cache
// holds no dirty entry (k is larger than the cache; k is not cached then).
func (c *rowCache) write(k, v []byte, absent bool) bool {
	e := c.m[string(k)]
	if e != nil {
		c.bytes += len(v) - len(e.v)
		e.v, e.absent = append(e.v[:0], v...), absent
	} else if e = c.insert(k, v, absent); e == nil {
		return false
	}
	if !e.dirty {
		e.dirty = true
		c.dirty = append(c.dirty, e)
		c.dirtyBytes += len(k)
	}
	c.dirtyBytes += len(v)
	return true
}

// writeBack is the dirty bytes past which the cache is flushed.
func (c *rowCache) writeBack() int { return min(writeBackBytes, c.max/4) }

// flushed marks the dirty entries clean.
func (c *rowCache) flushed() {
	for _, e := range c.dirty {
		e.dirty = false
	}
	clear(c.dirty)
	c.dirty, c.dirtyBytes = c.dirty[:0], 0
}

// drop forgets k, which is not dirty.
func (c *rowCache) drop(k []byte) {
	if e := c.m[string(k)]; e != nil && !e.dirty {
		c.bytes -= len(k) + len(e.v) + rowOverhead
		delete(c.m, string(k))
	}
}

// clear forgets everything (after a flush: dirty entries are lost).
func (c *rowCache) clear() {
	clear(c.m)
	c.bytes = 0
	c.flushed()
}

// evict drops clean entries until n more bytes fit within three quarters
// of the bound.
func (c *rowCache) evict(n int) {
	target := c.max*3/4 - n
	for k, e := range c.m {
		if c.bytes <= target {
			return
		}
		if e.dirty {
			continue
		}
		c.bytes -= len(k) + len(e.v) + rowOverhead
		delete(c.m, k)
	}
}

// keyBytes is the bytes of a cache key, not a copy (pebble copies what it
// is given into its batch).
func keyBytes(k string) []byte { return unsafe.Slice(unsafe.StringData(k), len(k)) }
