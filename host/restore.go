package host

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"hash/crc32"
	"io"
	"slices"

	"github.com/streamd/streamd/abi"
)

// KeyedSource is keyed state that is read when it is restored, key group by
// key group, instead of being held in Snapshot.KeyGroups: the key groups a
// new subtask takes from one old subtask's full snapshot (a savepoint, or a
// full checkpoint), as checkpoint.LoadRestoreFrom plans the restore. A
// restore into the pebble backend writes what it reads in bounded batches,
// so the state may be larger than memory.
type KeyedSource interface {
	// KeyGroups are the key groups it holds, ascending.
	KeyGroups() []int
	// ReadKeyGroups decodes the key groups that rng contains, calling w
	// for each entry and timer, and verifies what it read (sizes and
	// checksums). An error may come after some calls: data read before a
	// checksum mismatch was written, so the caller discards what it
	// restored. It may be called more than once (a restart restores the
	// same checkpoint again), from any goroutine.
	ReadKeyGroups(ctx context.Context, rng abi.KeyGroupRange, w KeyedWriter) error
}

// KeyedWriter receives the keyed state a KeyedSource reads. The slices are
// valid during the call only.
type KeyedWriter interface {
	// Entry is the value of key in state name of key group kg.
	Entry(kg int, name, key, val []byte) error
	// Timer is a timer of key group kg: event time, or processing time.
	Timer(kg int, key []byte, ts int64, processingTime bool) error
}

// restoreWriter checks what is restored (the key group of each key, and
// that it is the subtask's) and passes it on to a backend.
type restoreWriter struct {
	rng   abi.KeyGroupRange
	maxP  int
	put   func(kg int, name, key, val []byte) error
	timer func(k timerKind, key []byte, ts int64) error
}

func (w *restoreWriter) group(kg int) error {
	if !w.rng.Contains(kg) {
		return fmt.Errorf("host: restored key group %d is outside this subtask's key groups %s", kg, w.rng)
	}
	return nil
}

func (w *restoreWriter) Entry(kg int, name, key, val []byte) error {
	if err := w.group(kg); err != nil {
		return err
	}
	got, err := storedKeyGroup(name, key, w.maxP)
	if err != nil {
		return err
	}
	if got != kg {
		return fmt.Errorf("host: restored state %s key %s is in key group %d, stored under %d (max parallelism changed?)", quoteShort(name), quoteShort(key), got, kg)
	}
	return w.put(kg, name, key, val)
}

func (w *restoreWriter) Timer(kg int, key []byte, ts int64, processingTime bool) error {
	if err := w.group(kg); err != nil {
		return err
	}
	if got := abi.KeyGroup(key, w.maxP); got != kg {
		return fmt.Errorf("host: restored timer key %s is in key group %d, stored under %d", quoteShort(key), got, kg)
	}
	k := eventTime
	if processingTime {
		k = procTime
	}
	return w.timer(k, key, ts)
}

// quoteShort quotes b, cut to 64 bytes (a corrupt snapshot may hold
// anything).
func quoteShort(b []byte) string {
	if len(b) > 64 {
		return fmt.Sprintf("%q... (%d bytes)", b[:64], len(b))
	}
	return fmt.Sprintf("%q", b)
}

// readSources restores the key groups in rng of srcs through put and timer.
func readSources(ctx context.Context, srcs []KeyedSource, rng abi.KeyGroupRange, maxP int,
	put func(kg int, name, key, val []byte) error, timer func(k timerKind, key []byte, ts int64) error) error {
	w := &restoreWriter{rng: rng, maxP: maxP, put: put, timer: timer}
	for _, src := range srcs {
		kgs := src.KeyGroups()
		if len(kgs) == 0 {
			continue
		}
		for _, kg := range kgs {
			if err := w.group(kg); err != nil {
				return err
			}
		}
		if err := src.ReadKeyGroups(ctx, rng, w); err != nil {
			return err
		}
	}
	return nil
}

// loadSources reads srcs into key groups, in memory (Snapshot.Load).
func loadSources(srcs []KeyedSource, into map[int]*KeyGroupState) error {
	w := &loadWriter{out: into}
	for _, src := range srcs {
		kgs := src.KeyGroups()
		if len(kgs) == 0 {
			continue
		}
		if err := src.ReadKeyGroups(context.Background(), abi.KeyGroupRange{Start: kgs[0], End: kgs[len(kgs)-1]}, w); err != nil {
			return err
		}
	}
	return nil
}

type loadWriter struct{ out map[int]*KeyGroupState }

func (w *loadWriter) Entry(kg int, name, key, val []byte) error {
	g := groupIn(w.out, kg)
	m := g.Entries[string(name)]
	if m == nil {
		m = map[string][]byte{}
		g.Entries[string(name)] = m
	}
	m[string(key)] = append([]byte{}, val...)
	return nil
}

func (w *loadWriter) Timer(kg int, key []byte, ts int64, processingTime bool) error {
	g := groupIn(w.out, kg)
	t := Timer{Key: append([]byte{}, key...), TS: ts}
	if processingTime {
		g.ProcTimers = append(g.ProcTimers, t)
	} else {
		g.Timers = append(g.Timers, t)
	}
	return nil
}

// SnapshotDecoder decodes the snapshot format (MarshalBinary) from a
// reader, key group by key group, holding one entry at a time: what
// restores a snapshot larger than memory. Call Next until it reports no
// more key groups, Read or Skip each, then Finish, which returns the list
// state and verifies the checksum. Entries read before a corruption is
// found have been passed on: the caller discards them when it fails.
type SnapshotDecoder struct {
	br      *bufio.Reader // over body, hashed as it is read
	raw     io.Reader     // the checksum after the body
	h       hash.Hash32
	size    int64 // of the body (without the checksum)
	off     int64 // bytes of the body consumed
	version uint32
	left    int  // key groups not reached yet
	lastKG  int  // the key group Next returned last (-1: none)
	pending bool // the key group Next returned has not been read or skipped
	err     error
	key     []byte
	val     []byte
}

// snapshotReadBuffer is the read buffer of a SnapshotDecoder.
const snapshotReadBuffer = 256 << 10

// NewSnapshotDecoder reads the header of the size-byte snapshot r holds.
// Errors wrap ErrSnapshotFormat (or are r's).
func NewSnapshotDecoder(r io.Reader, size int64) (*SnapshotDecoder, error) {
	if size < int64(len(snapshotMagic))+8+4 {
		return nil, fmt.Errorf("%w: no snapshot header", ErrSnapshotFormat)
	}
	h := crc32.New(castagnoli)
	d := &SnapshotDecoder{raw: r, h: h, size: size - 4, lastKG: -1}
	d.br = bufio.NewReaderSize(io.TeeReader(io.LimitReader(r, size-4), h), snapshotReadBuffer)
	var magic [4]byte
	if d.read(magic[:]); d.err == nil && string(magic[:]) != snapshotMagic {
		return nil, fmt.Errorf("%w: no snapshot header", ErrSnapshotFormat)
	}
	d.version = d.u32()
	if d.err == nil && (d.version < 1 || d.version > snapshotVersion) {
		return nil, fmt.Errorf("%w: version %d, this host reads 1 to %d", ErrSnapshotFormat, d.version, snapshotVersion)
	}
	d.left = d.count(8)
	return d, d.err
}

// Version is the snapshot's format version.
func (d *SnapshotDecoder) Version() uint32 { return d.version }

// Next skips what is left of the current key group and returns the next
// one; false when there is none (then call Finish). Key groups come in
// ascending order.
func (d *SnapshotDecoder) Next() (kg int, ok bool, err error) {
	if d.pending {
		if err := d.Skip(); err != nil {
			return 0, false, err
		}
	}
	if d.err != nil || d.left == 0 {
		return 0, false, d.err
	}
	at := d.off
	kg = int(d.u32())
	if d.err == nil && kg <= d.lastKG {
		d.err = fmt.Errorf("%w: key group %d after key group %d at byte %d (not ascending)", ErrSnapshotFormat, kg, d.lastKG, at)
	}
	if d.err != nil {
		return 0, false, d.err
	}
	d.left--
	d.lastKG, d.pending = kg, true
	return kg, true, nil
}

// Read passes the entries and timers of the key group Next returned to w.
func (d *SnapshotDecoder) Read(w KeyedWriter) error { return d.group(w) }

// Skip reads past the key group Next returned.
func (d *SnapshotDecoder) Skip() error { return d.group(nil) }

// group reads the current key group, to w or (nil) nowhere.
func (d *SnapshotDecoder) group(w KeyedWriter) error {
	if !d.pending {
		if d.err == nil {
			d.err = errors.New("host: snapshot decoder: no key group to read (call Next)")
		}
		return d.err
	}
	d.pending = false
	kg := d.lastKG
	var name []byte
	for ns := d.count(8); ns > 0 && d.err == nil; ns-- {
		name = d.bytes(name[:0])
		for ne := d.count(8); ne > 0 && d.err == nil; ne-- {
			if w == nil {
				d.skipBytes()
				d.skipBytes()
				continue
			}
			d.key = d.bytes(d.key[:0])
			d.val = d.bytes(d.val[:0])
			if d.err == nil {
				d.fail(w.Entry(kg, name, d.key, d.val))
			}
		}
	}
	kinds := 1
	if d.version >= 2 {
		kinds = 2
	}
	for kind := range kinds {
		for nt := d.count(12); nt > 0 && d.err == nil; nt-- {
			if w == nil {
				d.skipBytes()
				d.u64()
				continue
			}
			d.key = d.bytes(d.key[:0])
			ts := int64(d.u64())
			if d.err == nil {
				d.fail(w.Timer(kg, d.key, ts, kind == 1))
			}
		}
	}
	return d.err
}

// Finish reads the list state after the last key group and checks that
// the snapshot ends there and its checksum.
func (d *SnapshotDecoder) Finish() (map[string]*ListState, error) {
	if d.pending || d.left > 0 {
		if d.err == nil {
			d.err = fmt.Errorf("host: snapshot decoder: %d key groups not read before Finish", d.left)
		}
		return nil, d.err
	}
	lists := map[string]*ListState{}
	for n := d.count(12); n > 0 && d.err == nil; n-- {
		name := string(d.bytes(nil))
		l := &ListState{Mode: abi.ListMode(d.u32())}
		for ne := d.count(4); ne > 0 && d.err == nil; ne-- {
			l.Entries = append(l.Entries, d.bytes([]byte{}))
		}
		if d.err == nil && !l.Mode.Valid() {
			d.err = fmt.Errorf("%w: list state %q has invalid mode %d", ErrSnapshotFormat, name, l.Mode)
		}
		lists[name] = l
	}
	if d.err != nil {
		return nil, d.err
	}
	if d.off != d.size {
		return nil, fmt.Errorf("%w: %d trailing bytes", ErrSnapshotFormat, d.size-d.off)
	}
	var sum [4]byte
	if _, err := io.ReadFull(d.raw, sum[:]); err != nil {
		return nil, d.readErr(err)
	}
	if got, want := d.h.Sum32(), binary.LittleEndian.Uint32(sum[:]); got != want {
		return nil, fmt.Errorf("%w: checksum %08x, want %08x (corrupt or truncated)", ErrSnapshotFormat, got, want)
	}
	return lists, nil
}

func (d *SnapshotDecoder) fail(err error) {
	if d.err == nil && err != nil {
		d.err = err
	}
}

// readErr is the error of a read that stopped early: a truncated snapshot
// (end of data), or the reader's own error.
func (d *SnapshotDecoder) readErr(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("%w: truncated at byte %d", ErrSnapshotFormat, d.off)
	}
	return fmt.Errorf("host: read snapshot: %w", err)
}

// read fills p.
func (d *SnapshotDecoder) read(p []byte) {
	if d.err != nil {
		return
	}
	if int64(len(p)) > d.size-d.off {
		d.err = fmt.Errorf("%w: truncated at byte %d", ErrSnapshotFormat, d.off)
		return
	}
	n, err := io.ReadFull(d.br, p)
	d.off += int64(n)
	if err != nil {
		d.err = d.readErr(err)
	}
}

func (d *SnapshotDecoder) u32() uint32 {
	var b [4]byte
	d.read(b[:])
	return binary.LittleEndian.Uint32(b[:])
}

func (d *SnapshotDecoder) u64() uint64 {
	var b [8]byte
	d.read(b[:])
	return binary.LittleEndian.Uint64(b[:])
}

// count reads an element count, each element taking at least minSize bytes.
func (d *SnapshotDecoder) count(minSize int) int {
	at := d.off
	n := d.u32()
	if d.err == nil && uint64(n)*uint64(minSize) > uint64(d.size-d.off) {
		d.err = fmt.Errorf("%w: count %d at byte %d exceeds the data", ErrSnapshotFormat, n, at)
		return 0
	}
	return int(n)
}

// length reads the length of a bytes field and checks it against the data.
func (d *SnapshotDecoder) length() int {
	at := d.off
	n := int64(d.u32())
	if d.err == nil && n > d.size-d.off {
		d.err = fmt.Errorf("%w: length %d at byte %d exceeds the data", ErrSnapshotFormat, n, at)
	}
	if d.err != nil {
		return 0
	}
	return int(n)
}

// bytes appends a bytes field to dst. The buffer grows as the bytes
// arrive, so that a corrupt length makes no allocation larger than the
// data that is there.
func (d *SnapshotDecoder) bytes(dst []byte) []byte {
	n := d.length()
	for n > 0 && d.err == nil {
		chunk := min(n, snapshotReadBuffer)
		l := len(dst)
		dst = slices.Grow(dst, chunk)[:l+chunk]
		d.read(dst[l:])
		n -= chunk
	}
	return dst
}

func (d *SnapshotDecoder) skipBytes() {
	n := d.length()
	if n == 0 || d.err != nil {
		return
	}
	m, err := d.br.Discard(n)
	d.off += int64(m)
	if err != nil {
		d.err = d.readErr(err)
	}
}
