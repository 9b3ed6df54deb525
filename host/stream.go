package host

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"maps"
	"slices"

	"github.com/cockroachdb/pebble/v2"

	"github.com/streamd/streamd/abi"
)

// Streamable says whether EncodeTo can write s without loading its keyed
// state: a pebble cut not read yet (a savepoint, or a full checkpoint, of
// the pebble backend).
func (s *Snapshot) Streamable() bool {
	if s == nil || s.deferred == nil || s.deferred.stream == nil {
		return false
	}
	s.deferred.mu.Lock()
	defer s.deferred.mu.Unlock()
	return !s.deferred.done
}

// EncodeTo writes to w exactly what MarshalBinary returns, straight from the
// pebble cut: it reads the cut twice, once to size it (then it calls
// size(n), so that the caller may write a header first) and once to write
// it, holding only the names and timers of the state in memory, never its
// entries. The cut is released after. A Snapshot that is not Streamable is
// marshaled in memory.
func (s *Snapshot) EncodeTo(w io.Writer, size func(n int64) error) error {
	if s == nil || s.deferred == nil || s.deferred.stream == nil {
		data, err := s.MarshalBinary()
		if err != nil {
			return err
		}
		if err := size(int64(len(data))); err != nil {
			return err
		}
		_, err = w.Write(data)
		return err
	}
	c := s.deferred
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done {
		return fmt.Errorf("host: encode snapshot: %w", c.err)
	}
	err := c.stream(s.Lists, w, size)
	c.done, c.err = true, errReleased
	c.release()
	return err
}

// cutPlan is what the first pass over a pebble cut finds.
type cutPlan struct {
	groups  []groupPlan
	size    int64
	version uint32 // 2 with processing-time timers
}

type groupPlan struct {
	kg         int
	names      []string // sorted
	counts     map[string]uint32
	timers     []Timer // (ts, key) order
	procTimers []Timer // (ts, key) order
}

// streamCut writes the canonical encoding of snap (and lists) to w,
// without the structured entries expired at now.
func (s *pebbleState) streamCut(snap *pebble.Snapshot, now int64, lists map[string]*ListState, w io.Writer, size func(int64) error) error {
	plan, err := s.planCut(snap, now, lists)
	if err != nil {
		return err
	}
	if err := size(plan.size); err != nil {
		return err
	}
	bw := bufio.NewWriterSize(w, 1<<20)
	h := crc32.New(castagnoliTable)
	out := io.MultiWriter(bw, h)
	le := binary.LittleEndian
	var scratch []byte
	put := func(b []byte) error {
		_, err := out.Write(b)
		return err
	}
	u32 := func(v uint32) error { scratch = le.AppendUint32(scratch[:0], v); return put(scratch) }
	bytesOf := func(p []byte) error {
		scratch = le.AppendUint32(scratch[:0], uint32(len(p)))
		scratch = append(scratch, p...)
		return put(scratch)
	}
	if err := put(le.AppendUint32([]byte(snapshotMagic), plan.version)); err != nil {
		return err
	}
	if err := u32(uint32(len(plan.groups))); err != nil {
		return err
	}
	var kbuf []byte
	for _, g := range plan.groups {
		if err := u32(uint32(g.kg)); err != nil {
			return err
		}
		if err := u32(uint32(len(g.names))); err != nil {
			return err
		}
		for _, name := range g.names {
			if err := bytesOf([]byte(name)); err != nil {
				return err
			}
			if err := u32(g.counts[name]); err != nil {
				return err
			}
			kbuf = appendStateKey(kbuf[:0], g.kg, []byte(name), nil)
			it, err := snap.NewIter(&pebble.IterOptions{LowerBound: kbuf, UpperBound: prefixEnd(kbuf)})
			if err != nil {
				return fmt.Errorf("host: pebble state: encode: %w", err)
			}
			var n uint32
			for ok := it.First(); ok && err == nil; ok = it.Next() {
				var v []byte
				if v, err = it.ValueAndErr(); err == nil {
					var keep bool
					if v, keep = liveStored([]byte(name), v, now); !keep {
						continue
					}
					if err = bytesOf(it.Key()[len(kbuf):]); err == nil {
						err = bytesOf(v)
					}
				}
				n++
			}
			if cerr := it.Close(); err == nil {
				err = cerr
			}
			if err == nil && n != g.counts[name] {
				err = fmt.Errorf("host: pebble state: encode: state %q of key group %d has %d entries, counted %d", name, g.kg, n, g.counts[name])
			}
			if err != nil {
				return err
			}
		}
		timerLists := [][]Timer{g.timers}
		if plan.version >= 2 {
			timerLists = append(timerLists, g.procTimers)
		}
		for _, timers := range timerLists {
			if err := u32(uint32(len(timers))); err != nil {
				return err
			}
			for _, t := range timers {
				if err := bytesOf(t.Key); err != nil {
					return err
				}
				scratch = le.AppendUint64(scratch[:0], uint64(t.TS))
				if err := put(scratch); err != nil {
					return err
				}
			}
		}
	}
	names := slices.Sorted(maps.Keys(lists))
	if err := u32(uint32(len(names))); err != nil {
		return err
	}
	for _, name := range names {
		l := lists[name]
		if l == nil {
			l = &ListState{}
		}
		if err := bytesOf([]byte(name)); err != nil {
			return err
		}
		if err := u32(uint32(l.Mode)); err != nil {
			return err
		}
		if err := u32(uint32(len(l.Entries))); err != nil {
			return err
		}
		for _, e := range l.Entries {
			if err := bytesOf(e); err != nil {
				return err
			}
		}
	}
	if _, err := bw.Write(le.AppendUint32(nil, h.Sum32())); err != nil {
		return err
	}
	return bw.Flush()
}

// prefixEnd is the smallest key after every key with prefix p.
func prefixEnd(p []byte) []byte {
	end := slices.Clone(p)
	for i := len(end) - 1; i >= 0; i-- {
		if end[i] < 0xff {
			end[i]++
			return end[:i+1]
		}
	}
	return nil
}

// planCut counts the groups, states and bytes of snap: the first pass.
func (s *pebbleState) planCut(snap *pebble.Snapshot, now int64, lists map[string]*ListState) (*cutPlan, error) {
	p := &cutPlan{size: 4 + 4 + 4 + 4 + 4, version: 1} // magic, version, group count, list count, crc
	byKG := map[int]*groupPlan{}
	group := func(kg int) *groupPlan {
		g := byKG[kg]
		if g == nil {
			g = &groupPlan{kg: kg, counts: map[string]uint32{}}
			byKG[kg] = g
		}
		return g
	}
	it, err := snap.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixState}, UpperBound: []byte{prefixState + 1}})
	if err != nil {
		return nil, fmt.Errorf("host: pebble state: encode: %w", err)
	}
	for ok := it.First(); ok; ok = it.Next() {
		k := it.Key()
		kg, name, key, valid := splitStateKey(k)
		if !valid {
			it.Close()
			return nil, fmt.Errorf("host: pebble state: encode: malformed key %q", k)
		}
		v, err := it.ValueAndErr()
		if err != nil {
			it.Close()
			return nil, fmt.Errorf("host: pebble state: encode: %w", err)
		}
		var keep bool
		if v, keep = liveStored(name, v, now); !keep {
			continue
		}
		g := group(kg)
		if _, seen := g.counts[string(name)]; !seen {
			g.names = append(g.names, string(name))
			p.size += 4 + int64(len(name)) + 4
		}
		g.counts[string(name)]++
		p.size += 8 + int64(len(key)) + int64(len(v))
	}
	if err := it.Close(); err != nil {
		return nil, fmt.Errorf("host: pebble state: encode: %w", err)
	}
	it, err = snap.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixTimer}, UpperBound: []byte{prefixProcTimer + 1}})
	if err != nil {
		return nil, fmt.Errorf("host: pebble state: encode: %w", err)
	}
	for ok := it.First(); ok; ok = it.Next() {
		k := it.Key()
		key := slices.Clone(k[9:])
		g := group(abi.KeyGroup(key, s.maxP))
		if k[0] == prefixProcTimer {
			g.procTimers = append(g.procTimers, Timer{Key: key, TS: timerTS(k)})
			p.version = 2
		} else {
			g.timers = append(g.timers, Timer{Key: key, TS: timerTS(k)})
		}
		p.size += 4 + int64(len(key)) + 8
	}
	if err := it.Close(); err != nil {
		return nil, fmt.Errorf("host: pebble state: encode: %w", err)
	}
	for _, kg := range slices.Sorted(maps.Keys(byKG)) {
		g := byKG[kg]
		slices.Sort(g.names)
		p.groups = append(p.groups, *g)
		p.size += 4 + 4 + 4 // key group, state count, timer count
	}
	if p.version >= 2 {
		p.size += 4 * int64(len(p.groups)) // processing-time timer counts
	}
	for name, l := range lists {
		p.size += 4 + int64(len(name)) + 4 + 4
		if l != nil {
			for _, e := range l.Entries {
				p.size += 4 + int64(len(e))
			}
		}
	}
	return p, nil
}
