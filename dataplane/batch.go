package dataplane

import (
	"sync"

	"github.com/streamd/streamd/abi"
)

// Batch is a slice of records whose keys and values live in one arena owned by
// the batch, so filling and recycling a batch allocates nothing in steady
// state. Get batches from GetBatch and give them back with Release.
type Batch struct {
	Records []abi.Record
	arena   []byte
	bytes   int // bytes of keys and values appended since the last reset
}

const minArena = 64 << 10

var batchPool = sync.Pool{New: func() any { return new(Batch) }}

// GetBatch returns an empty batch from the pool.
func GetBatch() *Batch { return batchPool.Get().(*Batch) }

// Release resets b and returns it to the pool. The records of b must not be
// used afterwards.
func (b *Batch) Release() {
	b.Reset()
	batchPool.Put(b)
}

// Reset empties b, keeping its memory. If the last fill outgrew the arena, the
// arena is replaced by one large enough for it, so the next fill of the same
// size needs no allocation.
func (b *Batch) Reset() {
	clear(b.Records) // drop references into old arenas
	b.Records = b.Records[:0]
	if b.bytes > cap(b.arena) {
		b.arena = make([]byte, 0, b.bytes)
	}
	b.arena = b.arena[:0]
	b.bytes = 0
}

// Len is the number of records in b.
func (b *Batch) Len() int { return len(b.Records) }

// Bytes is the number of key and value bytes in b.
func (b *Batch) Bytes() int { return b.bytes }

// Append copies r into b. An empty key is stored as nil (no key).
func (b *Batch) Append(r abi.Record) {
	n := len(r.Key) + len(r.Value)
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
	}
	start := len(b.arena)
	b.arena = append(b.arena, r.Key...)
	mid := len(b.arena)
	b.arena = append(b.arena, r.Value...)
	end := len(b.arena)
	var key []byte
	if mid > start {
		key = b.arena[start:mid:mid]
	}
	b.Records = append(b.Records, abi.Record{Key: key, Value: b.arena[mid:end:end], Timestamp: r.Timestamp})
}
