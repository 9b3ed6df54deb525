package host

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"maps"
	"slices"

	"github.com/streamd/streamd/abi"
)

// Snapshot binary format, version 1 (all integers little-endian):
//
//	"SDSS" u32 version
//	u32 group_count, then by ascending key group:
//	  u32 key_group, u32 state_count, then by state name:
//	    bytes name, u32 entry_count, then by key: bytes key, bytes value
//	    (names and keys ascending; a checkpoint's encoder may write them
//	    in any order, and UnmarshalBinary takes any)
//	  u32 timer_count, then in (ts, key) order: bytes key, i64 ts
//	  (version 2 only) u32 ptimer_count, then in (ts, key) order: bytes key, i64 ts
//	  (a checkpoint's encoder may write timers in any order too)
//	u32 list_count, then by name: bytes name, u32 mode, u32 entry_count, entry_count times bytes entry
//	u32 crc32c of everything before it
//
// where bytes is u32 length followed by the bytes. Version 2 adds the
// processing-time timers of each key group; a snapshot without any is
// written as version 1, byte for byte as before. The encoding is
// deterministic: equal snapshots marshal to equal bytes.
const (
	snapshotMagic   = "SDSS"
	snapshotVersion = 2 // the highest version read and written
)

// SnapshotVersionFor is the format version s is written in: 2 if a key
// group holds processing-time timers, else 1.
func SnapshotVersionFor(s *Snapshot) uint32 {
	for _, g := range s.KeyGroups {
		if g.TimerCount(true) > 0 {
			return 2
		}
	}
	return 1
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// ErrSnapshotFormat is wrapped by every UnmarshalBinary error.
var ErrSnapshotFormat = errors.New("host: malformed snapshot")

// MarshalBinary encodes s in the versioned, checksummed format above. It
// loads s first (Load).
func (s *Snapshot) MarshalBinary() ([]byte, error) {
	if err := s.Load(); err != nil {
		return nil, err
	}
	le := binary.LittleEndian
	b := []byte(snapshotMagic)
	version := SnapshotVersionFor(s)
	b = le.AppendUint32(b, version)
	putBytes := func(p []byte) { b = le.AppendUint32(b, uint32(len(p))); b = append(b, p...) }
	putString := func(p string) { b = le.AppendUint32(b, uint32(len(p))); b = append(b, p...) }

	kgs := slices.Sorted(maps.Keys(s.KeyGroups))
	b = le.AppendUint32(b, uint32(len(kgs)))
	for _, kg := range kgs {
		if kg < 0 {
			return nil, fmt.Errorf("host: marshal snapshot: negative key group %d", kg)
		}
		g := s.KeyGroups[kg]
		if g == nil {
			g = &KeyGroupState{}
		}
		b = le.AppendUint32(b, uint32(kg))
		names := slices.Sorted(maps.Keys(g.Entries))
		b = le.AppendUint32(b, uint32(len(names)))
		for _, name := range names {
			m := g.Entries[name]
			putString(name)
			keys := slices.Sorted(maps.Keys(m))
			b = le.AppendUint32(b, uint32(len(keys)))
			for _, k := range keys {
				putString(k)
				putBytes(m[k])
			}
		}
		putTimers := func(ts []Timer) {
			timers := slices.Clone(ts)
			sortTimers(timers)
			b = le.AppendUint32(b, uint32(len(timers)))
			for _, t := range timers {
				putBytes(t.Key)
				b = le.AppendUint64(b, uint64(t.TS))
			}
		}
		putTimers(g.Timers)
		if version >= 2 {
			putTimers(g.ProcTimers)
		}
	}
	names := slices.Sorted(maps.Keys(s.Lists))
	b = le.AppendUint32(b, uint32(len(names)))
	for _, name := range names {
		l := s.Lists[name]
		if l == nil {
			l = &ListState{}
		}
		putString(name)
		b = le.AppendUint32(b, uint32(l.Mode))
		b = le.AppendUint32(b, uint32(len(l.Entries)))
		for _, e := range l.Entries {
			putBytes(e)
		}
	}
	return le.AppendUint32(b, crc32.Checksum(b, castagnoli)), nil
}

// UnmarshalBinary decodes data written by MarshalBinary into s, replacing its
// contents. The result does not alias data.
func (s *Snapshot) UnmarshalBinary(data []byte) error {
	if len(data) < len(snapshotMagic)+8 || string(data[:4]) != snapshotMagic {
		return fmt.Errorf("%w: no snapshot header", ErrSnapshotFormat)
	}
	body, sum := data[:len(data)-4], binary.LittleEndian.Uint32(data[len(data)-4:])
	if got := crc32.Checksum(body, castagnoli); got != sum {
		return fmt.Errorf("%w: checksum %08x, want %08x (corrupt or truncated)", ErrSnapshotFormat, got, sum)
	}
	d := snapDecoder{b: body, off: 4}
	version := d.u32()
	if version < 1 || version > snapshotVersion {
		return fmt.Errorf("%w: version %d, this host reads 1 to %d", ErrSnapshotFormat, version, snapshotVersion)
	}
	out := Snapshot{KeyGroups: map[int]*KeyGroupState{}, Lists: map[string]*ListState{}}
	for n := d.count(8); n > 0 && d.err == nil; n-- {
		kg := int(d.u32())
		g := &KeyGroupState{Entries: map[string]map[string][]byte{}}
		for ns := d.count(8); ns > 0 && d.err == nil; ns-- {
			name := string(d.bytes())
			m := map[string][]byte{}
			for ne := d.count(8); ne > 0 && d.err == nil; ne-- {
				k := string(d.bytes())
				m[k] = bytes.Clone(d.bytes())
				if m[k] == nil {
					m[k] = []byte{}
				}
			}
			g.Entries[name] = m
		}
		for nt := d.count(12); nt > 0 && d.err == nil; nt-- {
			k := bytes.Clone(d.bytes())
			g.Timers = append(g.Timers, Timer{Key: k, TS: int64(d.u64())})
		}
		if version >= 2 {
			for nt := d.count(12); nt > 0 && d.err == nil; nt-- {
				k := bytes.Clone(d.bytes())
				g.ProcTimers = append(g.ProcTimers, Timer{Key: k, TS: int64(d.u64())})
			}
		}
		out.KeyGroups[kg] = g
	}
	for n := d.count(12); n > 0 && d.err == nil; n-- {
		name := string(d.bytes())
		l := &ListState{Mode: abi.ListMode(d.u32())}
		for ne := d.count(4); ne > 0 && d.err == nil; ne-- {
			e := bytes.Clone(d.bytes())
			if e == nil {
				e = []byte{}
			}
			l.Entries = append(l.Entries, e)
		}
		if d.err == nil && !l.Mode.Valid() {
			return fmt.Errorf("%w: list state %q has invalid mode %d", ErrSnapshotFormat, name, l.Mode)
		}
		out.Lists[name] = l
	}
	if d.err != nil {
		return d.err
	}
	if d.off != len(body) {
		return fmt.Errorf("%w: %d trailing bytes", ErrSnapshotFormat, len(body)-d.off)
	}
	*s = out
	return nil
}

type snapDecoder struct {
	b   []byte
	off int
	err error
}

func (d *snapDecoder) need(n int) bool {
	if d.err != nil {
		return false
	}
	if len(d.b)-d.off < n {
		d.err = fmt.Errorf("%w: truncated at byte %d", ErrSnapshotFormat, d.off)
		return false
	}
	return true
}

func (d *snapDecoder) u32() uint32 {
	if !d.need(4) {
		return 0
	}
	v := binary.LittleEndian.Uint32(d.b[d.off:])
	d.off += 4
	return v
}

func (d *snapDecoder) u64() uint64 {
	if !d.need(8) {
		return 0
	}
	v := binary.LittleEndian.Uint64(d.b[d.off:])
	d.off += 8
	return v
}

// count reads an element count, each element taking at least minSize bytes.
func (d *snapDecoder) count(minSize int) int {
	n := d.u32()
	if d.err == nil && uint64(n)*uint64(minSize) > uint64(len(d.b)-d.off) {
		d.err = fmt.Errorf("%w: count %d at byte %d exceeds the data", ErrSnapshotFormat, n, d.off)
		return 0
	}
	return int(n)
}

func (d *snapDecoder) bytes() []byte {
	n := int(d.u32())
	if !d.need(n) {
		return nil
	}
	p := d.b[d.off : d.off+n]
	d.off += n
	return p
}

// Clone returns a deep copy of s. It loads s first (Load); a Snapshot that
// fails to load clones to its list state alone.
func (s *Snapshot) Clone() *Snapshot {
	_ = s.Load()
	out := &Snapshot{KeyGroups: make(map[int]*KeyGroupState, len(s.KeyGroups)), Lists: make(map[string]*ListState, len(s.Lists))}
	for kg, g := range s.KeyGroups {
		if g == nil {
			continue
		}
		cg := &KeyGroupState{Entries: make(map[string]map[string][]byte, len(g.Entries))}
		for name, m := range g.Entries {
			cm := make(map[string][]byte, len(m))
			for k, v := range m {
				cm[k] = append([]byte{}, v...)
			}
			cg.Entries[name] = cm
		}
		for _, t := range g.Timers {
			cg.Timers = append(cg.Timers, Timer{Key: bytes.Clone(t.Key), TS: t.TS})
		}
		for _, t := range g.ProcTimers {
			cg.ProcTimers = append(cg.ProcTimers, Timer{Key: bytes.Clone(t.Key), TS: t.TS})
		}
		out.KeyGroups[kg] = cg
	}
	for name, l := range s.Lists {
		if l == nil {
			continue
		}
		cl := &ListState{Mode: l.Mode}
		for _, e := range l.Entries {
			cl.Entries = append(cl.Entries, append([]byte{}, e...))
		}
		out.Lists[name] = cl
	}
	return out
}
