package checkpoint

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"hash/crc32"
	"io"
	"path/filepath"
	"slices"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/host"
)

// Streamed reading of state blobs (docs/checkpoints.md, "State backends"). LoadRestoreFrom reads each blob once as a stream: it checks its
// size, checksum and format, decodes the small sections and the list state,
// and notes which key groups the operator snapshot holds, holding one entry
// at a time. The keyed state stays in the blob: each new subtask gets a
// host.KeyedSource per old subtask whose key groups it takes, which reads
// the blob again when the subtask restores, passes on the entries of its
// key groups, and checks the size and checksums again at the end.

// blobAt is a subtask's blob in a store, opened as often as it is read.
type blobAt struct {
	path string // names it in errors
	sub  SubtaskMeta
	// open returns the blob and its size.
	open func(ctx context.Context) (io.ReadCloser, int64, error)
	// shared are the root and opener of the shared files of the store
	// (attachFetch).
	sharedRoot string
	sharedOpen func(ctx context.Context, key string) (io.ReadCloser, error)
}

// stateOpener is a StateReader that opens blobs as streams: those of this
// package are.
type stateOpener interface {
	blobAt(ctx context.Context, md *Metadata, sub SubtaskMeta) (*blobAt, error)
}

var (
	_ stateOpener = fileReader{}
	_ stateOpener = (*Dir)(nil)
	_ stateOpener = (*JetStream)(nil)
	_ stateOpener = JetStreamReader{}
)

func (fileReader) blobAt(ctx context.Context, md *Metadata, sub SubtaskMeta) (*blobAt, error) {
	return dirBlob(md, sub)
}

func (d *Dir) blobAt(ctx context.Context, md *Metadata, sub SubtaskMeta) (*blobAt, error) {
	return dirBlob(md, sub)
}

func (s *JetStream) blobAt(ctx context.Context, md *Metadata, sub SubtaskMeta) (*blobAt, error) {
	return jsBlob(ctx, s.js, s.obs, s.bucket, md, sub)
}

func (r JetStreamReader) blobAt(ctx context.Context, md *Metadata, sub SubtaskMeta) (*blobAt, error) {
	return jsBlob(ctx, r.JS, nil, "", md, sub)
}

// dirBlob is the blob of sub in md's directory.
func dirBlob(md *Metadata, sub SubtaskMeta) (*blobAt, error) {
	if err := checkBlobName(sub.Ref); err != nil {
		return nil, fmt.Errorf("checkpoint: %s: %w", md.Location, err)
	}
	p := filepath.Join(md.Location, sub.Ref)
	root, open := dirShared(md)
	return &blobAt{path: p, sub: sub, sharedRoot: root, sharedOpen: open,
		open: func(ctx context.Context) (io.ReadCloser, int64, error) {
			if err := ctx.Err(); err != nil {
				return nil, 0, err
			}
			f, size, err := openBounded(p, md.Location)
			if err != nil {
				return nil, 0, fmt.Errorf("checkpoint: state of subtask %d: %w", sub.Index, err)
			}
			return f, size, nil
		}}, nil
}

// jsBlob is the blob of sub of md, a jetstream:// location (in obs, when
// it is bucket) or a directory.
func jsBlob(ctx context.Context, js jetstream.JetStream, obs jetstream.ObjectStore, bucket string, md *Metadata, sub SubtaskMeta) (*blobAt, error) {
	b, path, ok, err := ParseJetStreamLocation(md.Location)
	if err != nil {
		return nil, err
	}
	if !ok {
		return dirBlob(md, sub)
	}
	if err := checkBlobName(sub.Ref); err != nil {
		return nil, fmt.Errorf("checkpoint: %s: %w", md.Location, err)
	}
	if b != bucket || obs == nil {
		if obs, err = openBucket(ctx, js, b, false); err != nil {
			return nil, err
		}
	}
	p := md.Location + "/" + sub.Ref
	root, open := jsShared(md, obs, b, path)
	return &blobAt{path: p, sub: sub, sharedRoot: root, sharedOpen: open,
		open: func(ctx context.Context) (io.ReadCloser, int64, error) {
			r, err := obs.Get(ctx, path+"/"+sub.Ref)
			if err == nil {
				var info *jetstream.ObjectInfo
				if info, err = r.Info(); err == nil {
					return r, int64(info.Size), nil
				}
				r.Close()
			}
			return nil, 0, fmt.Errorf("checkpoint: state of subtask %d: %s: %w", sub.Index, p, err)
		}}, nil
}

// scanState reads the blob of sub through o as a stream (see the top of
// this file): the state it returns has its keyed state as a KeyedSource.
func scanState(ctx context.Context, o stateOpener, md *Metadata, sub SubtaskMeta) (*SubtaskState, error) {
	if sub.Ref == "" {
		return nil, nil
	}
	b, err := o.blobAt(ctx, md, sub)
	if err != nil {
		return nil, err
	}
	var kgs []int
	st, err := b.scan(ctx, func(kg int) host.KeyedWriter {
		kgs = append(kgs, kg)
		return nil
	}, true)
	if err != nil {
		return nil, err
	}
	if err := checkDecoded(b.path, st, sub); err != nil {
		return nil, err
	}
	if len(kgs) > 0 {
		st.Operator.Sources = []host.KeyedSource{&blobSource{blob: b, kgs: slices.Clip(kgs)}}
	}
	attachFetch(st, b.sharedRoot, b.sharedOpen)
	return st, nil
}

// blobSource is the keyed state of a blob's operator snapshot, or the part
// of it a new subtask takes (kgs).
type blobSource struct {
	blob *blobAt
	kgs  []int // ascending
}

func (s *blobSource) KeyGroups() []int { return s.kgs }

// ReadKeyGroups reads the blob, passing the key groups in rng that s holds
// to w.
func (s *blobSource) ReadKeyGroups(ctx context.Context, rng abi.KeyGroupRange, w host.KeyedWriter) error {
	if len(s.kgs) == 0 {
		return nil
	}
	lo, hi := max(rng.Start, s.kgs[0]), min(rng.End, s.kgs[len(s.kgs)-1])
	_, err := s.blob.scan(ctx, func(kg int) host.KeyedWriter {
		if kg < lo || kg > hi {
			return nil
		}
		return w
	}, false)
	return err
}

// clippedSource is the part of a KeyedSource in the key groups of a new
// subtask (Reassign).
type clippedSource struct {
	src host.KeyedSource
	rng abi.KeyGroupRange
	kgs []int
}

// clipSource is the part of src in rng; nil if it holds none of it.
func clipSource(src host.KeyedSource, rng abi.KeyGroupRange) host.KeyedSource {
	var kgs []int
	for _, kg := range src.KeyGroups() {
		if rng.Contains(kg) {
			kgs = append(kgs, kg)
		}
	}
	if len(kgs) == 0 {
		return nil
	}
	return &clippedSource{src: src, rng: rng, kgs: kgs}
}

func (c *clippedSource) KeyGroups() []int { return c.kgs }

func (c *clippedSource) ReadKeyGroups(ctx context.Context, rng abi.KeyGroupRange, w host.KeyedWriter) error {
	lo, hi := max(rng.Start, c.rng.Start), min(rng.End, c.rng.End)
	if lo > hi {
		return nil
	}
	return c.src.ReadKeyGroups(ctx, abi.KeyGroupRange{Start: lo, End: hi}, w)
}

// writerError is an error of the KeyedWriter a scan passes entries to (the
// backend's, or the host's key group checks): not the blob's.
type writerError struct{ err error }

func (e *writerError) Error() string { return e.err.Error() }
func (e *writerError) Unwrap() error { return e.err }

type scanWriter struct{ w host.KeyedWriter }

func (s scanWriter) Entry(kg int, name, key, val []byte) error {
	if err := s.w.Entry(kg, name, key, val); err != nil {
		return &writerError{err}
	}
	return nil
}

func (s scanWriter) Timer(kg int, key []byte, ts int64, processingTime bool) error {
	if err := s.w.Timer(kg, key, ts, processingTime); err != nil {
		return &writerError{err}
	}
	return nil
}

// hashReader counts and checksums what is read through it, and keeps the
// first error of r that is not the end of data.
type hashReader struct {
	r     io.Reader
	h     hash.Hash32
	n     int64
	ioErr error
}

func (h *hashReader) Read(p []byte) (int, error) {
	n, err := h.r.Read(p)
	h.h.Write(p[:n])
	h.n += int64(n)
	if err != nil && err != io.EOF && h.ioErr == nil {
		h.ioErr = err
	}
	return n, err
}

// scan reads the blob once as a stream. For each key group of the operator
// snapshot it calls group, and passes the key group's entries and timers to
// the writer it returns (nil: skipped). With decode it decodes the other
// sections and the list state into the state it returns (else it only
// checks their checksum). The size and checksums are checked at the end;
// an error of a blob whose checksum does not match is that mismatch.
func (b *blobAt) scan(ctx context.Context, group func(kg int) host.KeyedWriter, decode bool) (*SubtaskState, error) {
	r, size, err := b.open(ctx)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	if size != b.sub.Size {
		return nil, checkBlob(b.path, size, b.sub.CRC32C, b.sub)
	}
	whole := &hashReader{r: io.LimitReader(r, size), h: crc32.New(castagnoli)}
	st, trailer, err := b.scanBody(ctx, whole, size, group, decode)
	if err != nil && ctx.Err() != nil {
		return nil, ctx.Err()
	}
	if err != nil {
		// For the checksum: an error of a corrupt blob (also one the
		// writer found, such as a key in the wrong key group) is that.
		io.Copy(io.Discard, whole)
	} else {
		var one [1]byte
		if n, _ := r.Read(one[:]); n > 0 {
			return nil, fmt.Errorf("%w: %s: more than the %d bytes expected", ErrCorrupt, b.path, size)
		}
	}
	if whole.ioErr != nil {
		return nil, fmt.Errorf("checkpoint: state of subtask %d: %s: %w", b.sub.Index, b.path, whole.ioErr)
	}
	if cerr := checkBlob(b.path, whole.n, whole.h.Sum32(), b.sub); cerr != nil {
		return nil, cerr
	}
	var werr *writerError
	if errors.As(err, &werr) {
		return nil, werr.err
	}
	if err == nil && trailer.got != trailer.want {
		err = fmt.Errorf("checksum mismatch (crc32c %08x, stored %08x): corrupt or truncated", trailer.got, trailer.want)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %s", ErrCorrupt, b.path, err)
	}
	return st, nil
}

// blobTrailer is the checksum of a blob's body and the one it stores.
type blobTrailer struct{ got, want uint32 }

// scanBody reads the blob of size bytes from r (see scan). Its errors have
// no prefix, except the writer's (*writerError).
func (b *blobAt) scanBody(ctx context.Context, r io.Reader, size int64, group func(kg int) host.KeyedWriter, decode bool) (*SubtaskState, blobTrailer, error) {
	le := binary.LittleEndian
	var tr blobTrailer
	if size < int64(len(blobMagic))+12 {
		return nil, tr, fmt.Errorf("truncated: %d bytes", size)
	}
	h := crc32.New(castagnoli)
	body := &blobBody{r: io.TeeReader(io.LimitReader(r, size-4), h), size: size - 4}
	var hdr [12]byte
	if err := body.read(hdr[:]); err != nil {
		return nil, tr, err
	}
	if string(hdr[:4]) != blobMagic {
		return nil, tr, fmt.Errorf("not a streamd state blob (magic %q)", hdr[:4])
	}
	v := le.Uint32(hdr[4:])
	if v < FormatVersion || v > FormatVersionShared {
		return nil, tr, fmt.Errorf("state blob version %d, this streamd reads versions %d to %d", v, FormatVersion, FormatVersionShared)
	}
	n := le.Uint32(hdr[8:])
	s := &SubtaskState{}
	last := byte(0)
	for i := uint32(0); i < n; i++ {
		var sh [9]byte
		at := body.off
		if body.size-body.off < 9 {
			return nil, tr, fmt.Errorf("section %d header truncated at byte %d", i, at)
		}
		if err := body.read(sh[:]); err != nil {
			return nil, tr, err
		}
		tag, l := sh[0], le.Uint64(sh[1:])
		if l > uint64(body.size-body.off) {
			return nil, tr, fmt.Errorf("section %d (tag %d) of %d bytes exceeds the blob at byte %d", i, tag, l, body.off)
		}
		if tag <= last {
			return nil, tr, fmt.Errorf("section tag %d out of order or repeated", tag)
		}
		last = tag
		switch {
		case tag == tagOperator:
			snap, err := scanSnapshot(ctx, body, int64(l), group, decode)
			if err != nil {
				return nil, tr, err
			}
			s.Operator = snap
		case decode:
			p := make([]byte, l)
			if err := body.read(p); err != nil {
				return nil, tr, err
			}
			if err := s.decodeSection(v, tag, p); err != nil {
				return nil, tr, err
			}
		default:
			if err := body.skip(int64(l)); err != nil {
				return nil, tr, err
			}
		}
	}
	if body.off != body.size {
		return nil, tr, fmt.Errorf("%d trailing bytes", body.size-body.off)
	}
	var sum [4]byte
	if _, err := io.ReadFull(r, sum[:]); err != nil {
		return nil, tr, fmt.Errorf("truncated: no checksum")
	}
	tr = blobTrailer{got: h.Sum32(), want: le.Uint32(sum[:])}
	return s, tr, nil
}

// scanSnapshot streams the operator snapshot of l bytes from body.
func scanSnapshot(ctx context.Context, body *blobBody, l int64, group func(kg int) host.KeyedWriter, decode bool) (*host.Snapshot, error) {
	start := body.off
	sec := io.LimitReader(body, l)
	d, err := host.NewSnapshotDecoder(sec, l)
	if err != nil {
		return nil, fmt.Errorf("operator snapshot: %w", err)
	}
	for {
		kg, ok, err := d.Next()
		if err != nil {
			return nil, operatorErr(err)
		}
		if !ok {
			break
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if w := group(kg); w != nil {
			err = d.Read(scanWriter{w})
		} else {
			err = d.Skip()
		}
		if err != nil {
			return nil, operatorErr(err)
		}
	}
	lists, err := d.Finish()
	if err != nil {
		return nil, operatorErr(err)
	}
	if body.off != start+l {
		return nil, fmt.Errorf("operator snapshot: %d of its %d bytes read", body.off-start, l)
	}
	snap := &host.Snapshot{}
	if decode {
		snap.Lists = lists
	}
	return snap, nil
}

// operatorErr prefixes an error of the snapshot decoder (not the writer's).
func operatorErr(err error) error {
	var werr *writerError
	if errors.As(err, &werr) {
		return err
	}
	return fmt.Errorf("operator snapshot: %w", err)
}

// blobBody reads the body of a blob (before its checksum), counting.
type blobBody struct {
	r    io.Reader
	off  int64
	size int64
}

func (b *blobBody) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	b.off += int64(n)
	return n, err
}

func (b *blobBody) read(p []byte) error {
	if _, err := io.ReadFull(b, p); err != nil {
		return fmt.Errorf("truncated at byte %d", b.off)
	}
	return nil
}

func (b *blobBody) skip(n int64) error {
	if m, _ := io.CopyN(io.Discard, b, n); m != n {
		return fmt.Errorf("truncated at byte %d", b.off)
	}
	return nil
}
