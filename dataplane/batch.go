package dataplane

import (
	"sync"
	"sync/atomic"

	"github.com/streamd/streamd/abi"
)

// Batch is a slice of records whose keys and values live in one arena owned by
// the batch, so filling and recycling a batch allocates nothing in steady
// state. Get batches from GetBatch and give them back with Release.
type Batch struct {
	Records []abi.Record
	arena   []byte
	bytes   int // bytes of keys, values and headers appended since the last reset
	// holds counts the Retain calls not matched by a Release yet.
	holds atomic.Int32
	// foreign: some records may point outside the arena (an older arena,
	// or memory DecodeFrame aliased), so Reset must clear them.
	foreign bool
}

const minArena = 64 << 10

// Batches move between goroutines (a writer fills, a receiver releases), so
// they are pooled. A sync.Pool drops its contents at every other garbage
// collection, and a busy channel allocates tens of megabytes per second
// (NATS copies every message it delivers), which collects often: the free
// list keeps up to freeBatches batches with their arenas across
// collections, so that steady-state fills allocate nothing; the pool takes
// what does not fit, and batches whose arena grew past freeArenaMax.
const (
	freeBatches  = 32
	freeArenaMax = 1 << 20
)

var (
	// free is a stack, so the batch taken is the one released last, whose
	// memory is the most likely still in the cache.
	free struct {
		sync.Mutex
		list []*Batch
	}
	batchPool = sync.Pool{New: func() any { return new(Batch) }}
)

// GetBatch returns an empty batch from the pool.
func GetBatch() *Batch {
	free.Lock()
	if n := len(free.list); n > 0 {
		b := free.list[n-1]
		free.list[n-1] = nil
		free.list = free.list[:n-1]
		free.Unlock()
		return b
	}
	free.Unlock()
	return batchPool.Get().(*Batch)
}

// Retain keeps b's records valid after its owner's Release: b goes back to the
// pool only at the Release that matches the last Retain. Who retains reads the
// records only and releases b once. An unaligned checkpoint holds the batches
// it captures as channel state this way until they are written, instead of
// copying them.
func (b *Batch) Retain() { b.holds.Add(1) }

// Release resets b and returns it to the pool, unless a Retain holds it (then
// it drops that hold). The records of b must not be used afterwards.
func (b *Batch) Release() {
	if b.holds.Add(-1) >= 0 {
		return
	}
	b.holds.Store(0)
	b.Reset()
	if cap(b.arena) <= freeArenaMax {
		free.Lock()
		if len(free.list) < freeBatches {
			free.list = append(free.list, b)
			free.Unlock()
			return
		}
		free.Unlock()
	}
	batchPool.Put(b)
}

// Reset empties b, keeping its memory. If the last fill outgrew the arena, the
// arena is replaced by one large enough for it, so the next fill of the same
// size needs no allocation.
func (b *Batch) Reset() {
	if b.foreign {
		clear(b.Records) // drop references into old arenas and aliased frames
		b.foreign = false
	}
	b.Records = b.Records[:0]
	if b.bytes > cap(b.arena) {
		b.arena = make([]byte, 0, b.bytes)
	}
	b.arena = b.arena[:0]
	b.bytes = 0
}

// DecodeFrame sets b's records to those of the abi batch frame src
// (abi.DecodeBatch): their keys and values alias src, which must stay
// unchanged until b is reset or released.
func (b *Batch) DecodeFrame(src []byte) error {
	recs, err := abi.DecodeBatch(src, b.Records[:0])
	b.Records = recs
	b.foreign = true
	return err
}

// Len is the number of records in b.
func (b *Batch) Len() int { return len(b.Records) }

// Bytes is the number of key, value and header bytes appended to b.
func (b *Batch) Bytes() int { return b.bytes }

// Append copies r into b. An empty key is stored as nil (no key).
func (b *Batch) Append(r abi.Record) {
	n := len(r.Key) + len(r.Value) + len(r.Headers)
	b.bytes += n
	if cap(b.arena)-len(b.arena) < n {
		// Start a new arena: records already appended keep pointing into the
		// old one, which stays alive as long as they do.
		c := 2 * cap(b.arena)
		if c < minArena {
			c = minArena
		}
		if c < n {
			c = n
		}
		b.arena = make([]byte, 0, c)
		b.foreign = b.foreign || len(b.Records) > 0
	}
	start := len(b.arena)
	b.arena = append(b.arena, r.Key...)
	mid := len(b.arena)
	b.arena = append(b.arena, r.Value...)
	end := len(b.arena)
	var key, headers []byte
	if mid > start {
		key = b.arena[start:mid:mid]
	}
	if len(r.Headers) > 0 {
		b.arena = append(b.arena, r.Headers...)
		headers = b.arena[end:len(b.arena):len(b.arena)]
	}
	b.Records = append(b.Records, abi.Record{Key: key, Value: b.arena[mid:end:end], Timestamp: r.Timestamp, Headers: headers})
}
