package host

// rowCache is the pebble backend's row cache (RocksDB's row_cache): the
// values of the keys an instance read or wrote last, by their pebble key,
// in front of the DB. A keyed counter reads the key it writes; without the
// cache each read searched the memtable's skiplist and the L0 files (70% of
// the backend's time on BenchmarkStateBackendsNoCheckpoint).
//
// It is write-through: put and del update the DB and the cache; every other
// write to the DB (a restore, a TTL sweep, the clipping of adopted files)
// drops what it changed or clears the cache. It remembers keys known to be
// absent too, so the first read of a new key costs one DB lookup, not one
// per record until it is written. A value returned by get is valid until
// the next call on the backend, as the memory backend's are (put overwrites
// an entry's value in place).
//
// It holds at most rowCacheBytes of keys and values (with rowOverhead per
// entry for the map and the entry); past that, an insertion evicts entries
// in map order (about random) down to three quarters of the bound.
type rowCache struct {
	m     map[string]*rowEntry
	bytes int
	max   int
}

type rowEntry struct {
	v      []byte
	absent bool
}

// rowCacheBytes is the row cache of each pebble instance.
const rowCacheBytes = 32 << 20

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

// set records k's value (absent: k does not exist).
func (c *rowCache) set(k, v []byte, absent bool) {
	if e := c.m[string(k)]; e != nil {
		c.bytes += len(v) - len(e.v)
		e.v, e.absent = append(e.v[:0], v...), absent
		return
	}
	n := len(k) + len(v) + rowOverhead
	if c.bytes+n > c.max {
		c.evict(n)
		if c.bytes+n > c.max {
			return // larger than the cache
		}
	}
	c.m[string(k)] = &rowEntry{v: append([]byte(nil), v...), absent: absent}
	c.bytes += n
}

// drop forgets k.
func (c *rowCache) drop(k []byte) {
	if e := c.m[string(k)]; e != nil {
		c.bytes -= len(k) + len(e.v) + rowOverhead
		delete(c.m, string(k))
	}
}

// clear forgets everything.
func (c *rowCache) clear() {
	clear(c.m)
	c.bytes = 0
}

// evict drops entries until n more bytes fit within three quarters of the
// bound.
func (c *rowCache) evict(n int) {
	target := c.max*3/4 - n
	for k, e := range c.m {
		if c.bytes <= target {
			return
		}
		c.bytes -= len(k) + len(e.v) + rowOverhead
		delete(c.m, k)
	}
}
