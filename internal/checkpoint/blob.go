package checkpoint

import (
	"context"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/host"
)

// State blob format, version 1 or 2 (integers little-endian):
//
//	"SDST" u32 version u32 section_count
//	section_count times: u8 tag, u64 length, length bytes
//	u32 crc32c (Castagnoli) of everything before it
//
// Tags: 1 operator snapshot (host.Snapshot.MarshalBinary), 2 source
// position, 3 sink pending-commit data, 4 channel state (ChannelState.Encode;
// version 2 only). Each tag at most once, in ascending order. A blob is
// written as version 2 only when it has channel state, so the blobs of an
// aligned checkpoint are byte for byte those of version 1.
const (
	blobMagic = "SDST"

	tagOperator       = 1
	tagSourcePosition = 2
	tagSinkPending    = 3
	tagChannelState   = 4
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func crc32c(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }

// EncodeState encodes s as a state blob: a versioned header, the sections and
// a CRC32C. The encoding is canonical (keys sorted, as in a savepoint).
func EncodeState(s *SubtaskState) ([]byte, error) {
	b, _, err := appendState(nil, s, true)
	return b, err
}

// appendState is EncodeState appending to dst[:0] (reusing its memory when
// it is large enough), with the keys of the operator snapshot sorted or in
// map order (appendSnapshot). It returns the blob's CRC32C (of all of it,
// its own trailer included: BlobRef.CRC32C) too, reading the operator
// snapshot once for both checksums.
func appendState(dst []byte, s *SubtaskState, sorted bool) ([]byte, uint32, error) {
	n, size := 0, len(blobMagic)+8+4                     // size: all but the operator snapshot's bytes
	if err := s.Operator.LoadForEncoding(); err != nil { // a pebble cut: read it here, off the subtask's goroutine
		return nil, 0, fmt.Errorf("checkpoint: encode state: %w", err)
	}
	if s.Operator != nil {
		n, size = n+1, size+9
	}
	if s.SourcePosition != nil {
		n, size = n+1, size+9+len(s.SourcePosition)
	}
	if _, pending, ok := s.sinkPending(); ok {
		n, size = n+1, size+9+pending
	}
	version := uint32(FormatVersion)
	chanSize := s.Channels.EncodedSize()
	if chanSize > 0 {
		n, size = n+1, size+9+int(chanSize)
		version = FormatVersionChannelState
	}
	filesSize := 0
	if s.Operator != nil && len(s.Operator.Files) > 0 {
		filesSize = stateFilesSize(s.Operator.Files)
		n, size = n+1, size+9+filesSize
		version = FormatVersionShared
	}
	le := binary.LittleEndian
	// The operator snapshot is not sized first (a pass over every key of
	// it): a reused buffer is large enough, as the state changes little
	// between two checkpoints, and a new one grows.
	b := dst[:0]
	if cap(b) < size {
		b = make([]byte, 0, size)
	}
	snapSize := 0
	b = append(b, blobMagic...)
	b = le.AppendUint32(b, version)
	b = le.AppendUint32(b, uint32(n))
	var sum uint32 // of b[:summed]
	summed := 0
	if s.Operator != nil {
		b = append(b, tagOperator)
		b = le.AppendUint64(b, 0) // the length, once known
		at := len(b)
		var err error
		var snapSum uint32
		if b, snapSum, err = appendSnapshot(b, s.Operator, sorted); err != nil {
			return nil, 0, err
		}
		snapSize = len(b) - at
		le.PutUint64(b[at-8:at], uint64(snapSize))
		summed = len(b) - 4 // all but the section's own checksum
		sum = crc32cCombine(crc32c(b[:at]), snapSum, int64(summed-at))
	}
	b, err := appendMiddleSections(b, s, chanSize)
	if err != nil {
		return nil, 0, err
	}
	if filesSize > 0 {
		b = append(b, tagStateFiles)
		b = le.AppendUint64(b, uint64(filesSize))
		var err error
		if b, err = appendStateFiles(b, s.Operator.Files); err != nil {
			return nil, 0, err
		}
	}
	if len(b)+4 != size+snapSize {
		return nil, 0, fmt.Errorf("checkpoint: encode state: %d bytes, computed %d", len(b)+4, size+snapSize)
	}
	sum = crc32.Update(sum, castagnoli, b[summed:])
	b = le.AppendUint32(b, sum)
	return b, crc32.Update(sum, castagnoli, b[len(b)-4:]), nil
}

// appendMiddleSections appends the sections between the operator
// snapshot and the state files: source position, sink pending-commit data
// and channel state (of chanSize bytes).
func appendMiddleSections(b []byte, s *SubtaskState, chanSize int64) ([]byte, error) {
	for _, p := range positionAndPending(s) {
		b = append(b, p...)
	}
	return appendChannelSection(b, s, chanSize)
}

// positionAndPending is the source position and sink pending-commit
// sections in pieces, the data in place (not copied): encodeStateTo writes
// them as they are.
func positionAndPending(s *SubtaskState) [][]byte {
	le := binary.LittleEndian
	var pieces [][]byte
	if s.SourcePosition != nil {
		pieces = append(pieces, le.AppendUint64([]byte{tagSourcePosition}, uint64(len(s.SourcePosition))), s.SourcePosition)
	}
	if parts, size, ok := s.sinkPending(); ok {
		pieces = append(pieces, le.AppendUint64([]byte{tagSinkPending}, uint64(size)))
		pieces = append(pieces, parts...)
	}
	return pieces
}

// appendChannelSection appends the channel state section (chanSize
// bytes; none when 0).
func appendChannelSection(b []byte, s *SubtaskState, chanSize int64) ([]byte, error) {
	if chanSize == 0 {
		return b, nil
	}
	b = append(b, tagChannelState)
	b = binary.LittleEndian.AppendUint64(b, uint64(chanSize))
	return s.Channels.appendTo(b)
}

// DecodeState decodes a state blob written by EncodeState. Errors wrap
// ErrCorrupt.
func DecodeState(data []byte) (*SubtaskState, error) {
	s, err := decodeState(data)
	if err != nil {
		return nil, fmt.Errorf("%w: %s", ErrCorrupt, err)
	}
	return s, nil
}

// decodeState returns errors without a prefix; the caller names the file.
func decodeState(data []byte) (*SubtaskState, error) {
	le := binary.LittleEndian
	if len(data) >= 4 && string(data[:4]) != blobMagic {
		return nil, fmt.Errorf("not a streamd state blob (magic %q)", data[:4])
	}
	if len(data) < len(blobMagic)+12 {
		return nil, fmt.Errorf("truncated: %d bytes", len(data))
	}
	body := data[:len(data)-4]
	if got, want := crc32c(body), le.Uint32(data[len(data)-4:]); got != want {
		return nil, fmt.Errorf("checksum mismatch (crc32c %08x, stored %08x): corrupt or truncated", got, want)
	}
	v := le.Uint32(body[4:])
	if v < FormatVersion || v > FormatVersionShared {
		return nil, fmt.Errorf("state blob version %d, this streamd reads versions %d to %d", v, FormatVersion, FormatVersionShared)
	}
	n := le.Uint32(body[8:])
	off := 12
	s := &SubtaskState{}
	last := byte(0)
	for i := uint32(0); i < n; i++ {
		if len(body)-off < 9 {
			return nil, fmt.Errorf("section %d header truncated at byte %d", i, off)
		}
		tag := body[off]
		l := le.Uint64(body[off+1:])
		off += 9
		if l > uint64(len(body)-off) {
			return nil, fmt.Errorf("section %d (tag %d) of %d bytes exceeds the blob at byte %d", i, tag, l, off)
		}
		if tag <= last {
			return nil, fmt.Errorf("section tag %d out of order or repeated", tag)
		}
		last = tag
		p := body[off : off+int(l)]
		off += int(l)
		if tag == tagOperator {
			snap := &host.Snapshot{}
			if err := snap.UnmarshalBinary(p); err != nil {
				return nil, fmt.Errorf("operator snapshot: %w", err)
			}
			s.Operator = snap
			continue
		}
		if err := s.decodeSection(v, tag, p); err != nil {
			return nil, err
		}
	}
	if off != len(body) {
		return nil, fmt.Errorf("%d trailing bytes", len(body)-off)
	}
	return s, nil
}

// decodeSection decodes section tag (other than the operator snapshot) of a
// version v blob into s.
func (s *SubtaskState) decodeSection(v uint32, tag byte, p []byte) error {
	switch tag {
	case tagSourcePosition:
		s.SourcePosition = append([]byte{}, p...)
	case tagSinkPending:
		s.SinkPending = append([]byte{}, p...)
	case tagChannelState:
		if v < FormatVersionChannelState {
			return fmt.Errorf("channel state (section tag %d) in a version %d blob", tag, v)
		}
		c, err := decodeChannelState(p)
		if err != nil {
			return fmt.Errorf("channel state: %w", err)
		}
		s.Channels = c
	case tagStateFiles:
		if v < FormatVersionShared {
			return fmt.Errorf("state files (section tag %d) in a version %d blob", tag, v)
		}
		if s.Operator == nil {
			return fmt.Errorf("state files (section tag %d) without an operator snapshot", tag)
		}
		parts, err := decodeStateFiles(p)
		if err != nil {
			return fmt.Errorf("state files: %w", err)
		}
		s.Operator.Files = parts
	default:
		return fmt.Errorf("unknown section tag %d", tag)
	}
	return nil
}

// String encodes r for control.Ack.StateRef:
// "NAME?size=SIZE&crc32c=HEX", with "&inflight=N" appended when r.InFlight
// is not 0.
func (r BlobRef) String() string {
	s := url.PathEscape(r.Name) + "?size=" + strconv.FormatInt(r.Size, 10) + "&crc32c=" + fmt.Sprintf("%08x", r.CRC32C)
	if r.InFlight != 0 {
		s += "&inflight=" + strconv.FormatInt(r.InFlight, 10)
	}
	if len(r.Shared) > 0 {
		parts := make([]string, len(r.Shared))
		for i, sh := range r.Shared {
			parts[i] = sh.Name + ":" + strconv.FormatInt(sh.Size, 10)
		}
		s += "&shared=" + strings.Join(parts, ",")
	}
	return s
}

// ParseBlobRef parses the String form of a BlobRef.
func ParseBlobRef(s string) (BlobRef, error) {
	u, err := url.Parse(s)
	if err != nil || u.Path == "" || u.Scheme != "" || u.Host != "" {
		return BlobRef{}, fmt.Errorf("checkpoint: state ref %q: want NAME?size=N&crc32c=HEX", s)
	}
	q := u.Query()
	size, err1 := strconv.ParseInt(q.Get("size"), 10, 64)
	crc, err2 := strconv.ParseUint(q.Get("crc32c"), 16, 32)
	if err1 != nil || err2 != nil || size < 0 {
		return BlobRef{}, fmt.Errorf("checkpoint: state ref %q: want NAME?size=N&crc32c=HEX", s)
	}
	var inflight int64
	if q.Has("inflight") {
		if inflight, err = strconv.ParseInt(q.Get("inflight"), 10, 64); err != nil || inflight < 0 || inflight > size {
			return BlobRef{}, fmt.Errorf("checkpoint: state ref %q: inflight must be a byte count of at most size", s)
		}
	}
	if err := checkBlobName(u.Path); err != nil {
		return BlobRef{}, fmt.Errorf("checkpoint: state ref %q: %w", s, err)
	}
	var shared []SharedRef
	if q.Has("shared") {
		for _, p := range strings.Split(q.Get("shared"), ",") {
			name, sz, ok := strings.Cut(p, ":")
			n, err := strconv.ParseInt(sz, 10, 64)
			if !ok || err != nil || n < 0 || checkSharedKey(name) != nil {
				return BlobRef{}, fmt.Errorf("checkpoint: state ref %q: shared must be KEY:SIZE,...", s)
			}
			shared = append(shared, SharedRef{Name: name, Size: n})
		}
	}
	return BlobRef{Name: u.Path, Size: size, CRC32C: uint32(crc), InFlight: inflight, Shared: shared}, nil
}

// blobBufs holds encoding buffers of WriteSubtaskState; a store's
// WriteState does not keep the data it was given. Not a sync.Pool: that
// drops its buffers at every other garbage collection, and a state of 100
// MiB checkpointed every second then allocated its size again at most
// checkpoints (and drove the GC it was dropped by).
var blobBufs bufList

// maxPooledBlob caps the size of a buffer kept for reuse, maxPooledBlobs
// their number (subtasks writing at once each take one).
const (
	maxPooledBlob  = 1 << 30
	maxPooledBlobs = 4
)

// bufList is a bounded free list of buffers, largest first.
type bufList struct {
	mu   sync.Mutex
	bufs [][]byte
}

// get returns a buffer to append to (the largest kept, or nil).
func (l *bufList) get() []byte {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.bufs) == 0 {
		return nil
	}
	b := l.bufs[0]
	l.bufs = l.bufs[1:]
	return b[:0]
}

// put keeps b for reuse unless it is too large, or the list is full of
// larger ones.
func (l *bufList) put(b []byte) {
	if cap(b) > maxPooledBlob || cap(b) == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	i := 0
	for i < len(l.bufs) && cap(l.bufs[i]) >= cap(b) {
		i++
	}
	if i == maxPooledBlobs {
		return
	}
	l.bufs = slices.Insert(l.bufs, i, b[:0])
	if len(l.bufs) > maxPooledBlobs {
		l.bufs = l.bufs[:maxPooledBlobs]
	}
}

// streamSinkPending is the size of a sink's pending-commit data from which
// WriteSubtaskState writes it to a StreamStore as it is instead of copying
// it into the blob first (the Kafka sink's staged records: tens of MB at
// every checkpoint).
const streamSinkPending = 1 << 20

// WriteSubtaskState encodes st (EncodeState), writes it to store as the blob
// of subtask sub of checkpoint id and returns its ref with InFlight set to
// the channel-state bytes: put ref.String() into control.Ack.StateRef and
// ref.Size into control.Ack.Size. It releases st.Operator's keyed state
// (Snapshot.Release) once encoded, before writing it, unless it is files.
func WriteSubtaskState(ctx context.Context, store Store, kind control.CheckpointKind, id int64, sub control.SubtaskID, st *SubtaskState) (BlobRef, error) {
	_, pendingSize, _ := st.sinkPending()
	// The encoding buffers are reused: a large state would otherwise
	// allocate its size again at every checkpoint (and drive the GC).
	if ss, ok := store.(StreamStore); ok && (st.Operator.Streamable() || st.Operator == nil && pendingSize >= streamSinkPending) {
		// A pebble cut, written as it is read, or a sink's large
		// pending-commit data (staged records), written as it is: the
		// blob is never whole in memory.
		ref, err := ss.WriteStateFrom(ctx, kind, id, sub, func(w io.Writer) error { return encodeStateTo(w, st) })
		if err != nil {
			return BlobRef{}, err
		}
		ref.InFlight = st.Channels.EncodedSize()
		return ref, nil
	}
	var shared []SharedRef
	if st.Operator != nil && len(st.Operator.Files) > 0 {
		var err error
		if shared, err = uploadShared(ctx, store, id, sub, st.Operator); err != nil {
			return BlobRef{}, err
		}
	}
	// A checkpoint's keys go unsorted (cheaper by half); a savepoint is
	// canonical.
	data, sum, err := appendState(blobBufs.get(), st, kind == control.KindSavepoint)
	if st.Operator != nil && len(st.Operator.Files) == 0 {
		// Encoded: the keyed state's cut is no longer read, so the
		// subtask may write its key groups in place again while the blob
		// is written and synced.
		st.Operator.Release()
	}
	defer blobBufs.put(data)
	if err != nil {
		return BlobRef{}, err
	}
	var ref BlobRef
	switch st := store.(type) {
	case *Dir: // the stores themselves, not a type that embeds one to wrap its WriteState
		ref, err = st.writeStateSummed(ctx, kind, id, sub, data, sum)
	case *JetStream:
		ref, err = st.writeStateSummed(ctx, kind, id, sub, data, sum)
	default:
		ref, err = store.WriteState(ctx, kind, id, sub, data)
	}
	if err != nil {
		return BlobRef{}, err
	}
	ref.InFlight = st.Channels.EncodedSize()
	ref.Shared = shared
	return ref, nil
}
