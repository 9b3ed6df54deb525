package checkpoint

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"maps"
	"slices"

	"github.com/streamd/streamd/host"
)

// appendSnapshot appends s in host.Snapshot's binary format (version 1, or
// 2 with processing-time timers, see host/snapshot.go), byte for byte what s.MarshalBinary returns (a test
// checks it), but into a caller-sized buffer: with 1 million keys
// MarshalBinary spends most of its time growing its buffer. Decoding uses
// host.Snapshot.UnmarshalBinary.
//
// With sorted unset (a checkpoint's blob) each key group's states and each
// state's keys go in the order its maps give them, not sorted: readers take
// them in any order, and for 1 million keys the sort and a map lookup per
// key were two thirds of the encoding (BenchmarkSnapshot1MKeys); timers go
// in the order the snapshot holds them (map order for the memory backend,
// sorting a million timers took 0.5 s). Key groups stay ascending (restore
// streams them by range), list state stays sorted. A savepoint (sorted) is canonical: equal state, equal bytes, from
// either backend. It returns the section's CRC32C too (its last 4 bytes).
func appendSnapshot(b []byte, s *host.Snapshot, sorted bool) ([]byte, uint32, error) {
	le := binary.LittleEndian
	start := len(b)
	b = append(b, "SDSS"...)
	version := host.SnapshotVersionFor(s)
	b = le.AppendUint32(b, version)
	kgs := slices.Sorted(maps.Keys(s.KeyGroups))
	b = le.AppendUint32(b, uint32(len(kgs)))
	var keys []string
	for _, kg := range kgs {
		if kg < 0 {
			return nil, 0, fmt.Errorf("checkpoint: encode state: negative key group %d", kg)
		}
		g := s.KeyGroups[kg]
		if g == nil {
			g = &host.KeyGroupState{}
		}
		b = le.AppendUint32(b, uint32(kg))
		b = le.AppendUint32(b, uint32(len(g.Entries)))
		if !sorted {
			for name, m := range g.Entries {
				b = appendEntries(b, name, m)
			}
		} else {
			for _, name := range slices.Sorted(maps.Keys(g.Entries)) {
				m := g.Entries[name]
				b = le.AppendUint32(b, uint32(len(name)))
				b = append(b, name...)
				keys = keys[:0]
				for k := range m {
					keys = append(keys, k)
				}
				slices.Sort(keys)
				b = le.AppendUint32(b, uint32(len(keys)))
				for _, k := range keys {
					b = appendKV(b, k, m[k])
				}
			}
		}
		b = appendTimers(b, g, false, sorted)
		if version >= 2 {
			b = appendTimers(b, g, true, sorted)
		}
	}
	names := slices.Sorted(maps.Keys(s.Lists))
	b = le.AppendUint32(b, uint32(len(names)))
	for _, name := range names {
		l := s.Lists[name]
		if l == nil {
			l = &host.ListState{}
		}
		b = le.AppendUint32(b, uint32(len(name)))
		b = append(b, name...)
		b = le.AppendUint32(b, uint32(l.Mode))
		b = le.AppendUint32(b, uint32(len(l.Entries)))
		for _, e := range l.Entries {
			b = le.AppendUint32(b, uint32(len(e)))
			b = append(b, e...)
		}
	}
	sum := crc32.Checksum(b[start:], castagnoli)
	return le.AppendUint32(b, sum), sum, nil
}

// appendEntries appends a state's name, entry count and entries in map order.
func appendEntries(b []byte, name string, m map[string][]byte) []byte {
	le := binary.LittleEndian
	b = le.AppendUint32(b, uint32(len(name)))
	b = append(b, name...)
	b = le.AppendUint32(b, uint32(len(m)))
	for k, v := range m {
		b = appendKV(b, k, v)
	}
	return b
}

// appendKV appends one entry: bytes key, bytes value.
func appendKV(b []byte, k string, v []byte) []byte {
	le := binary.LittleEndian
	b = le.AppendUint32(b, uint32(len(k)))
	b = append(b, k...)
	b = le.AppendUint32(b, uint32(len(v)))
	return append(b, v...)
}

// appendTimers appends a timer count and g's event-time timers, or
// processing-time ones (proc), in (ts, key) order if sorted, else in the
// order g holds them (a cut of the memory backend: map order, read in
// place; readers take any).
func appendTimers(b []byte, g *host.KeyGroupState, proc, sorted bool) []byte {
	le := binary.LittleEndian
	b = le.AppendUint32(b, uint32(g.TimerCount(proc)))
	if sorted {
		timers := slices.Clone(g.TimerList(proc))
		sortTimers(timers)
		for _, t := range timers {
			b = appendTimer(b, t.Key, t.TS)
		}
		return b
	}
	g.EachTimer(proc, func(key []byte, ts int64) { b = appendTimer(b, key, ts) })
	return b
}

// appendTimer appends one timer: bytes key, i64 ts.
func appendTimer(b []byte, key []byte, ts int64) []byte {
	le := binary.LittleEndian
	b = le.AppendUint32(b, uint32(len(key)))
	b = append(b, key...)
	return le.AppendUint64(b, uint64(ts))
}

// sortTimers sorts timers by (TS, Key), the order of the host format.
func sortTimers(ts []host.Timer) {
	slices.SortFunc(ts, func(a, b host.Timer) int {
		if c := cmp.Compare(a.TS, b.TS); c != 0 {
			return c
		}
		return bytes.Compare(a.Key, b.Key)
	})
}
