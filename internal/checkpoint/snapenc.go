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
func appendSnapshot(b []byte, s *host.Snapshot) ([]byte, error) {
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
			return nil, fmt.Errorf("checkpoint: encode state: negative key group %d", kg)
		}
		g := s.KeyGroups[kg]
		if g == nil {
			g = &host.KeyGroupState{}
		}
		b = le.AppendUint32(b, uint32(kg))
		names := slices.Sorted(maps.Keys(g.Entries))
		b = le.AppendUint32(b, uint32(len(names)))
		for _, name := range names {
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
				v := m[k]
				b = le.AppendUint32(b, uint32(len(k)))
				b = append(b, k...)
				b = le.AppendUint32(b, uint32(len(v)))
				b = append(b, v...)
			}
		}
		b = appendTimers(b, g.Timers)
		if version >= 2 {
			b = appendTimers(b, g.ProcTimers)
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
	return le.AppendUint32(b, crc32.Checksum(b[start:], castagnoli)), nil
}

// appendTimers appends a timer count and the timers in (ts, key) order.
func appendTimers(b []byte, ts []host.Timer) []byte {
	le := binary.LittleEndian
	timers := slices.Clone(ts)
	sortTimers(timers)
	b = le.AppendUint32(b, uint32(len(timers)))
	for _, t := range timers {
		b = le.AppendUint32(b, uint32(len(t.Key)))
		b = append(b, t.Key...)
		b = le.AppendUint64(b, uint64(t.TS))
	}
	return b
}

// snapshotSize is the length appendSnapshot appends.
func snapshotSize(s *host.Snapshot) int {
	n := 4 + 4 + 4 + 4 + 4 // magic, version, group count, list count, crc
	v2 := host.SnapshotVersionFor(s) >= 2
	for _, g := range s.KeyGroups {
		n += 4 + 4 + 4 // group, state count, timer count
		if v2 {
			n += 4 // processing-time timer count
		}
		if g == nil {
			continue
		}
		for _, t := range g.ProcTimers {
			n += 4 + len(t.Key) + 8
		}
		for name, m := range g.Entries {
			n += 4 + len(name) + 4
			for k, v := range m {
				n += 8 + len(k) + len(v)
			}
		}
		for _, t := range g.Timers {
			n += 4 + len(t.Key) + 8
		}
	}
	for name, l := range s.Lists {
		n += 4 + len(name) + 4 + 4
		if l == nil {
			continue
		}
		for _, e := range l.Entries {
			n += 4 + len(e)
		}
	}
	return n
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
