package checkpoint

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"hash/crc32"
	"io"
	"io/fs"
	"log/slog"
	"os"
	pathpkg "path"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/host"
)

// Incremental checkpoints (docs/checkpoints.md, "Incremental checkpoints").
//
// A subtask of the pebble backend cuts its keyed state as the files of a
// pebble checkpoint (host.FileState). Its immutable data files (sstables)
// are shared files: stored once, under SharedDir of the store, with a key
// that starts with the id of the checkpoint that uploaded it
// ("ID-OPERATOR-SUBTASK-RANDOM-NAME"); a later checkpoint of the subtask
// refers to the files it still has instead of uploading them again. The
// other files travel in the state blob (section tag 5). The metadata lists,
// per subtask, the shared files its state refers to (SubtaskMeta.Shared):
// the reference counts. After a checkpoint is committed and retention
// applied, a shared file is deleted when no retained checkpoint refers to
// it and the checkpoint that uploaded it is not newer than the one just
// committed (a newer one may still be in progress). So a crash before the
// upload, between the upload and the commit, or during deletion leaves
// files that nothing refers to, which the next commit deletes, and never a
// reference to a missing file.

// FormatVersionShared is the version of the metadata file and of state
// blobs of an incremental checkpoint: version 2 plus the shared-file
// references (SubtaskMeta.Shared) and the state-files section.
const FormatVersionShared = 3

// SharedDir is the directory (object name prefix) of the shared files, in
// a checkpoint store's root.
const SharedDir = "shared"

const tagStateFiles = 5

// SharedRef is one shared file a subtask's state refers to.
type SharedRef struct {
	Name string `json:"name"`
	Size int64  `json:"size"`
}

// SharedStore is a Store that holds the shared files of incremental
// checkpoints. Dir and JetStream are.
type SharedStore interface {
	Store
	// PutShared stores the local file at path as shared file key and
	// returns its size and CRC32C; it is durable when PutShared returns.
	PutShared(ctx context.Context, key, path string) (int64, uint32, error)
	// Root names the store; it is FileState.Root of what it restores.
	Root() string
}

// sharedKey makes the key of a file uploaded by checkpoint id.
func sharedKey(id int64, sub control.SubtaskID, name string) string {
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	return fmt.Sprintf("%d-%s-%d-%s-%s", id, keyPart(sub.Operator), sub.Index, hex.EncodeToString(rnd[:]), name)
}

// keyPart keeps letters, digits, '.' and '_' of s (at most 40).
func keyPart(s string) string {
	s = strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '.', r == '_':
			return r
		}
		return '_'
	}, s)
	return s[:min(len(s), 40)]
}

// sharedUploader is the id of the checkpoint that uploaded the shared file
// key, false when key is not a shared key.
func sharedUploader(key string) (int64, bool) {
	idStr, _, ok := strings.Cut(key, "-")
	id, err := strconv.ParseInt(idStr, 10, 64)
	return id, ok && err == nil && id > 0
}

// checkSharedKey refuses keys that are not plain names of the form
// sharedKey makes.
func checkSharedKey(key string) error {
	if _, ok := sharedUploader(key); !ok || strings.ContainsAny(key, "/\\:,?&=%\x00") || strings.Contains(key, "..") {
		return fmt.Errorf("bad shared file key %q", key)
	}
	return nil
}

// uploadShared uploads the shared files of the file parts of snap that have
// no key yet (those not reused from an earlier checkpoint) as files of
// checkpoint id, and returns every shared file the state refers to.
func uploadShared(ctx context.Context, store Store, id int64, sub control.SubtaskID, snap *host.Snapshot) ([]SharedRef, error) {
	ss, ok := store.(SharedStore)
	if !ok {
		return nil, fmt.Errorf("checkpoint: %T cannot hold incremental checkpoints", store)
	}
	var refs []SharedRef
	for _, part := range snap.Files {
		for i := range part.Files {
			f := &part.Files[i]
			if !f.Shared {
				continue
			}
			if f.Key == "" {
				key := sharedKey(id, sub, f.Name)
				size, crc, err := ss.PutShared(ctx, key, part.Path(f.Name))
				if err != nil {
					return nil, fmt.Errorf("checkpoint: upload state file %s of %v for checkpoint %d: %w", f.Name, sub, id, err)
				}
				if size != f.Size {
					return nil, fmt.Errorf("checkpoint: upload state file %s of %v: %d bytes, the cut had %d", f.Name, sub, size, f.Size)
				}
				f.Key, f.CRC32C = key, crc
			}
			refs = append(refs, SharedRef{Name: f.Key, Size: f.Size})
		}
	}
	return refs, nil
}

// copyFileCRC copies the file at path to w and returns its size and CRC32C.
func copyFileCRC(w io.Writer, path string) (int64, uint32, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	h := crc32.New(castagnoli)
	n, err := io.Copy(io.MultiWriter(w, h), f)
	return n, h.Sum32(), err
}

// appendStateFiles appends the state-files section of parts:
//
//	u32 part_count, then per part:
//	  u32 key_group_start u32 key_group_end u32 max_parallelism u32 file_count
//	  per file: bytes name, u8 shared, then shared: bytes key, u64 size,
//	  u32 crc32c; else: bytes content
func appendStateFiles(b []byte, parts []*host.FileState) ([]byte, error) {
	le := binary.LittleEndian
	putBytes := func(p string) { b = le.AppendUint32(b, uint32(len(p))); b = append(b, p...) }
	b = le.AppendUint32(b, uint32(len(parts)))
	for _, p := range parts {
		b = le.AppendUint32(b, uint32(p.KeyGroups.Start))
		b = le.AppendUint32(b, uint32(p.KeyGroups.End))
		b = le.AppendUint32(b, uint32(p.MaxParallelism))
		b = le.AppendUint32(b, uint32(len(p.Files)))
		for _, f := range p.Files {
			putBytes(f.Name)
			if !f.Shared {
				b = append(b, 0)
				putBytes(string(f.Data))
				continue
			}
			if f.Key == "" {
				return nil, fmt.Errorf("checkpoint: encode state: shared file %s was not uploaded", f.Name)
			}
			b = append(b, 1)
			putBytes(f.Key)
			b = le.AppendUint64(b, uint64(f.Size))
			b = le.AppendUint32(b, f.CRC32C)
		}
	}
	return b, nil
}

// stateFilesSize is the length of appendStateFiles' output.
func stateFilesSize(parts []*host.FileState) int {
	n := 4
	for _, p := range parts {
		n += 16
		for _, f := range p.Files {
			n += 4 + len(f.Name) + 1
			if f.Shared {
				n += 4 + len(f.Key) + 8 + 4
			} else {
				n += 4 + len(f.Data)
			}
		}
	}
	return n
}

func decodeStateFiles(p []byte) ([]*host.FileState, error) {
	r := &reader{b: p}
	n, err := r.count(16, "state file parts")
	if err != nil {
		return nil, err
	}
	var parts []*host.FileState
	for range n {
		var v [4]uint32
		for i := range v {
			if v[i], err = r.u32("state file part"); err != nil {
				return nil, err
			}
		}
		part := &host.FileState{KeyGroups: abi.KeyGroupRange{Start: int(v[0]), End: int(v[1])}, MaxParallelism: int(v[2])}
		if part.KeyGroups.Start > part.KeyGroups.End || part.MaxParallelism < 1 || part.KeyGroups.End >= part.MaxParallelism {
			return nil, fmt.Errorf("state files of key groups %s with max parallelism %d", part.KeyGroups, part.MaxParallelism)
		}
		if int(v[3]) > len(r.b) {
			return nil, fmt.Errorf("state file count %d exceeds the data", v[3])
		}
		for range v[3] {
			name, err := r.bytes("state file name")
			if err != nil {
				return nil, err
			}
			f := host.StateFile{Name: string(name)}
			if err := r.need(1, "state file kind"); err != nil {
				return nil, err
			}
			shared := r.b[r.off]
			r.off++
			switch shared {
			case 0:
				data, err := r.bytes("state file content")
				if err != nil {
					return nil, err
				}
				if data == nil {
					data = []byte{}
				}
				f.Data, f.Size = data, int64(len(data))
			case 1:
				key, err := r.bytes("shared file key")
				if err != nil {
					return nil, err
				}
				f.Shared, f.Key = true, string(key)
				if err := checkSharedKey(f.Key); err != nil {
					return nil, err
				}
				size, err := r.i64("shared file size")
				if err != nil {
					return nil, err
				}
				crc, err := r.u32("shared file crc32c")
				if err != nil {
					return nil, err
				}
				if size < 0 {
					return nil, fmt.Errorf("shared file %s: size %d", f.Key, size)
				}
				f.Size, f.CRC32C = size, crc
			default:
				return nil, fmt.Errorf("state file %q: kind %d", name, shared)
			}
			part.Files = append(part.Files, f)
		}
		parts = append(parts, part)
	}
	if r.off != len(r.b) {
		return nil, fmt.Errorf("state files: %d trailing bytes", len(r.b)-r.off)
	}
	return parts, nil
}

// sharedRefs lists the shared files of st's operator state.
func sharedRefs(st *SubtaskState) []SharedRef {
	if st == nil || st.Operator == nil {
		return nil
	}
	var out []SharedRef
	for _, p := range st.Operator.Files {
		for _, f := range p.Files {
			if f.Shared {
				out = append(out, SharedRef{Name: f.Key, Size: f.Size})
			}
		}
	}
	return out
}

// attachFetch makes the file parts of st read their shared files through
// open, from the store named root.
func attachFetch(st *SubtaskState, root string, open func(ctx context.Context, key string) (io.ReadCloser, error)) {
	if st == nil || st.Operator == nil {
		return
	}
	for _, p := range st.Operator.Files {
		p.Root = root
		p.Fetch = func(ctx context.Context, f host.StateFile, w io.Writer) error {
			r, err := open(ctx, f.Key)
			if err != nil {
				return err
			}
			defer r.Close()
			_, err = io.Copy(w, r)
			return err
		}
	}
}

// liveShared is the set of shared files the checkpoints mds refer to.
func liveShared(mds []*Metadata) map[string]bool {
	live := map[string]bool{}
	for _, md := range mds {
		for _, op := range md.Operators {
			for _, s := range op.Subtasks {
				for _, r := range s.Shared {
					live[r.Name] = true
				}
			}
		}
	}
	return live
}

// collectable says whether shared file key may be deleted after checkpoint
// committed was committed, given the files the retained checkpoints refer
// to: nothing refers to it, and its uploader is not newer than committed
// (tmp files of an upload included).
func collectable(key string, live map[string]bool, committed int64) bool {
	id, ok := sharedUploader(key)
	return ok && id <= committed && !live[key]
}

// PutShared copies the file at path to ROOT/shared/KEY: to a temporary name,
// fsync, rename, fsync the directory.
func (d *Dir) PutShared(ctx context.Context, key, path string) (int64, uint32, error) {
	if err := ctx.Err(); err != nil {
		return 0, 0, err
	}
	if err := checkSharedKey(key); err != nil {
		return 0, 0, err
	}
	dir := filepath.Join(d.root, SharedDir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return 0, 0, err
	}
	final := filepath.Join(dir, key)
	tmp := final + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return 0, 0, err
	}
	n, crc, err := copyFileCRC(f, path)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, final)
	}
	if err == nil {
		err = syncDir(dir)
	}
	if err != nil {
		os.Remove(tmp)
		return 0, 0, err
	}
	return n, crc, nil
}

// dirShared opens shared file key of the store whose checkpoint md is
// (directory layout: the shared directory is next to the checkpoint's).
func dirShared(md *Metadata) (string, func(ctx context.Context, key string) (io.ReadCloser, error)) {
	root := filepath.Dir(md.Location)
	return root, func(ctx context.Context, key string) (io.ReadCloser, error) {
		if err := checkSharedKey(key); err != nil {
			return nil, err
		}
		return os.Open(filepath.Join(root, SharedDir, key))
	}
}

// gcShared deletes the shared files no retained checkpoint refers to, after
// checkpoint committed was committed (see collectable).
func (d *Dir) gcShared(committed int64) {
	ents, err := os.ReadDir(filepath.Join(d.root, SharedDir))
	if err != nil || len(ents) == 0 {
		return
	}
	keys := make([]string, len(ents))
	for i, e := range ents {
		keys[i] = e.Name()
	}
	collectShared(context.Background(), d, d.log, keys, committed, func(key string) error {
		if err := d.removeShared(filepath.Join(d.root, SharedDir, key)); !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		return nil
	})
}

// collectShared deletes (remove) those of the shared files keys of store
// that are collectable after checkpoint committed was committed.
func collectShared(ctx context.Context, store Store, log *slog.Logger, keys []string, committed int64, remove func(key string) error) {
	mds, err := store.Completed(ctx)
	if err != nil {
		log.Warn("checkpoint: shared files: cannot list checkpoints; nothing deleted", "store", storeRoot(store), "err", err)
		return
	}
	live := liveShared(mds)
	for _, k := range keys {
		if collectable(k, live, committed) {
			if err := remove(k); err != nil {
				log.Warn("checkpoint: cannot remove shared file", "store", storeRoot(store), "file", k, "err", err)
			}
		}
	}
}

// storeRoot names store for logs.
func storeRoot(store Store) string {
	if r, ok := store.(interface{ Root() string }); ok {
		return r.Root()
	}
	return fmt.Sprintf("%T", store)
}

// PutShared puts the file at path as PREFIX/shared/KEY.
func (s *JetStream) PutShared(ctx context.Context, key, path string) (int64, uint32, error) {
	if err := checkSharedKey(key); err != nil {
		return 0, 0, err
	}
	f, err := os.Open(path)
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	h := crc32.New(castagnoli)
	info, err := s.obs.Put(ctx, jetstream.ObjectMeta{Name: s.prefix + "/" + SharedDir + "/" + key}, io.TeeReader(f, h))
	if err != nil {
		return 0, 0, fmt.Errorf("put %s: %w", s.Root()+"/"+SharedDir+"/"+key, err)
	}
	return int64(info.Size), h.Sum32(), nil
}

// jsShared opens shared file key of the store whose checkpoint md is, in obs.
func jsShared(md *Metadata, obs jetstream.ObjectStore, bucket, path string) (string, func(ctx context.Context, key string) (io.ReadCloser, error)) {
	prefix := pathpkg.Dir(path)
	return JetStreamScheme + bucket + "/" + prefix, func(ctx context.Context, key string) (io.ReadCloser, error) {
		if err := checkSharedKey(key); err != nil {
			return nil, err
		}
		return obs.Get(ctx, prefix+"/"+SharedDir+"/"+key)
	}
}

// gcShared deletes the shared objects no retained checkpoint refers to.
func (s *JetStream) gcShared(ctx context.Context, committed int64) {
	infos, err := s.lister().listObjects(ctx, s.obs)
	if err != nil {
		return
	}
	pre := s.prefix + "/" + SharedDir + "/"
	var keys []string
	for _, in := range infos {
		if k, ok := strings.CutPrefix(in.Name, pre); ok && !in.Deleted {
			keys = append(keys, k)
		}
	}
	if len(keys) == 0 {
		return
	}
	collectShared(ctx, s, s.log, keys, committed, func(key string) error {
		if err := s.obs.Delete(ctx, pre+key); !errors.Is(err, jetstream.ErrObjectNotFound) {
			return err
		}
		return nil
	})
}

// InStore says whether checkpoint md lives in store (so its shared files
// are the store's).
func InStore(store Store, md *Metadata) bool {
	r, ok := store.(interface{ Root() string })
	if !ok || md.Location == "" {
		return false
	}
	root := r.Root()
	if strings.HasPrefix(root, JetStreamScheme) {
		i := strings.LastIndexByte(md.Location, '/')
		return i > 0 && md.Location[:i] == root // (path.Dir would clean the "//" of the scheme)
	}
	return filepath.Clean(filepath.Dir(md.Location)) == filepath.Clean(root)
}

// SharedFiles lists the shared files md refers to, each once.
func (md *Metadata) SharedFiles() []SharedRef {
	seen := map[string]bool{}
	var out []SharedRef
	for _, op := range md.Operators {
		for _, s := range op.Subtasks {
			for _, r := range s.Shared {
				if !seen[r.Name] {
					seen[r.Name] = true
					out = append(out, r)
				}
			}
		}
	}
	return out
}

// IncrementalSize is what checkpoint md wrote itself: its blobs and the
// shared files it uploaded (those it refers to from earlier checkpoints
// not counted). FullSize - IncrementalSize is what it reused.
func (md *Metadata) IncrementalSize() int64 {
	var n int64
	for _, op := range md.Operators {
		for _, s := range op.Subtasks {
			n += s.Size
		}
	}
	for _, r := range md.SharedFiles() {
		if id, _ := sharedUploader(r.Name); id == md.ID {
			n += r.Size
		}
	}
	return n
}

// FullSize is the size of the whole state of md: its blobs and every
// shared file it refers to.
func (md *Metadata) FullSize() int64 {
	var n int64
	for _, op := range md.Operators {
		for _, s := range op.Subtasks {
			n += s.Size
		}
	}
	for _, r := range md.SharedFiles() {
		n += r.Size
	}
	return n
}

// StreamStore is a Store that writes a state blob from a function that
// writes it, so that the blob is never whole in memory (a pebble savepoint:
// host.Snapshot.EncodeTo). Dir and JetStream are.
type StreamStore interface {
	WriteStateFrom(ctx context.Context, kind control.CheckpointKind, id int64, sub control.SubtaskID, write func(w io.Writer) error) (BlobRef, error)
}

// crcWriter counts and checksums what goes through it.
type crcWriter struct {
	w io.Writer
	h hash.Hash32
	n int64
}

func newCRCWriter(w io.Writer) *crcWriter { return &crcWriter{w: w, h: crc32.New(castagnoli)} }

func (c *crcWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.h.Write(p[:n])
	c.n += int64(n)
	return n, err
}

// encodeStateTo writes the state blob of st (what EncodeState returns) to
// w, streaming the operator snapshot and writing the source position and
// the sink's pending-commit data as they are (no copy). It writes no
// state files section: st.Operator.Files must be empty.
func encodeStateTo(w io.Writer, st *SubtaskState) error {
	le := binary.LittleEndian
	cw := newCRCWriter(w)
	n := 0
	version := uint32(FormatVersion)
	chanSize := st.Channels.EncodedSize()
	_, _, hasPending := st.sinkPending()
	if st.SourcePosition != nil {
		n++
	}
	if hasPending {
		n++
	}
	if st.Operator != nil {
		n++
	}
	if chanSize > 0 {
		n++
		version = FormatVersionChannelState
	}
	hdr := append([]byte(blobMagic), 0, 0, 0, 0, 0, 0, 0, 0)
	le.PutUint32(hdr[4:], version)
	le.PutUint32(hdr[8:], uint32(n))
	if _, err := cw.Write(hdr); err != nil {
		return err
	}
	if st.Operator != nil {
		if _, err := cw.Write([]byte{tagOperator}); err != nil {
			return err
		}
		if err := st.Operator.EncodeTo(cw, func(size int64) error {
			_, err := cw.Write(le.AppendUint64(nil, uint64(size)))
			return err
		}); err != nil {
			return err
		}
	}
	for _, p := range positionAndPending(st) {
		if _, err := cw.Write(p); err != nil {
			return err
		}
	}
	if chanSize > 0 {
		b, err := appendChannelSection(nil, st, chanSize)
		if err != nil {
			return err
		}
		if _, err := cw.Write(b); err != nil {
			return err
		}
	}
	_, err := w.Write(le.AppendUint32(nil, cw.h.Sum32()))
	return err
}

// WriteStateFrom writes a subtask's blob to DIR/op-UID-INDEX.state as write
// writes it, and fsyncs it.
func (d *Dir) WriteStateFrom(ctx context.Context, kind control.CheckpointKind, id int64, sub control.SubtaskID, write func(w io.Writer) error) (BlobRef, error) {
	if err := ctx.Err(); err != nil {
		return BlobRef{}, err
	}
	dir, err := d.checkpointDir(kind, id, true)
	if err != nil {
		return BlobRef{}, err
	}
	ref := BlobRef{Name: blobName(sub)}
	f, err := os.OpenFile(filepath.Join(dir, ref.Name), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return BlobRef{}, fmt.Errorf("checkpoint: write state of %v for %s %d: %w", sub, kindName(kind), id, err)
	}
	cw := newCRCWriter(f)
	err = write(cw)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(filepath.Join(dir, ref.Name))
		return BlobRef{}, fmt.Errorf("checkpoint: write state of %v for %s %d: %w", sub, kindName(kind), id, err)
	}
	ref.Size, ref.CRC32C = cw.n, cw.h.Sum32()
	return ref, nil
}

// WriteStateFrom puts a subtask's blob as PREFIX/DIR/op-UID-INDEX.state as
// write writes it.
func (s *JetStream) WriteStateFrom(ctx context.Context, kind control.CheckpointKind, id int64, sub control.SubtaskID, write func(w io.Writer) error) (BlobRef, error) {
	dir, err := s.checkpointDir(kind, id, true)
	if err != nil {
		return BlobRef{}, err
	}
	ref := BlobRef{Name: blobName(sub)}
	pr, pw := io.Pipe()
	cw := newCRCWriter(pw)
	go func() { pw.CloseWithError(write(cw)) }()
	info, err := s.obs.Put(ctx, jetstream.ObjectMeta{Name: s.object(dir, ref.Name)}, pr)
	pr.CloseWithError(err) // a failed put stops the writer
	if err != nil {
		return BlobRef{}, fmt.Errorf("checkpoint: write state of %v for %s %d to %s: %w", sub, kindName(kind), id, s.location(dir), err)
	}
	if int64(info.Size) != cw.n {
		return BlobRef{}, fmt.Errorf("checkpoint: write state of %v for %s %d: the object store kept %d of %d bytes", sub, kindName(kind), id, info.Size, cw.n)
	}
	ref.Size, ref.CRC32C = cw.n, cw.h.Sum32()
	return ref, nil
}
