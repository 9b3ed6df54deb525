package checkpoint

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/streamd/streamd/control"
)

// File and directory names of the directory layout.
const (
	// MetadataFile is the commit point of a checkpoint directory.
	MetadataFile    = "_metadata"
	chkPrefix       = "chk-"
	savepointPrefix = "savepoint-"
)

// Dir is the directory Store:
//
//	ROOT/chk-ID/op-UID-INDEX.state   one state blob per subtask with state
//	ROOT/chk-ID/_metadata            the commit point, written last, atomically
//	SAVEPOINTS/savepoint-ID-RAND/    a savepoint: the same content
//
// It is safe for concurrent use.
type Dir struct {
	root, savepoints string
	suffix           string // savepoint directory suffix; "" = random
	retain           int
	log              *slog.Logger

	mu         sync.Mutex
	savepointD map[int64]string // savepoint id -> directory being written

	removeShared func(path string) error // os.Remove; tests crash in it
}

type dirConfig struct {
	retain     int
	savepoints string
	suffix     string
	log        *slog.Logger
}

// DirOption configures OpenDir.
type DirOption func(*dirConfig) error

// WithRetain sets how many completed checkpoints are kept (default 1).
func WithRetain(n int) DirOption {
	return func(c *dirConfig) error {
		if n < 1 {
			return fmt.Errorf("checkpoint: retain %d: want at least 1", n)
		}
		c.retain = n
		return nil
	}
}

// WithSavepointDir sets where savepoints go (default: the root).
func WithSavepointDir(dir string) DirOption {
	return func(c *dirConfig) error {
		if dir == "" {
			return errors.New("checkpoint: empty savepoint directory")
		}
		c.savepoints = dir
		return nil
	}
}

// WithSavepointSuffix names savepoints savepoint-ID-SUFFIX instead of
// savepoint-ID-RANDOM, so that several processes (the hosts of a job spread
// over hosts and its controller) write one savepoint into one directory.
// suffix must be a valid file name.
func WithSavepointSuffix(suffix string) DirOption {
	return func(c *dirConfig) error {
		if suffix == "" || strings.ContainsAny(suffix, `/\`) || suffix == "." || suffix == ".." {
			return fmt.Errorf("checkpoint: savepoint suffix %q: want a file name", suffix)
		}
		c.suffix = suffix
		return nil
	}
}

// WithLogger sets where Dir logs cleanup problems (retention runs after the
// commit point, so its errors do not fail Commit). Default: discarded.
func WithLogger(l *slog.Logger) DirOption {
	return func(c *dirConfig) error {
		if l == nil {
			return errors.New("checkpoint: nil logger")
		}
		c.log = l
		return nil
	}
}

// OpenDir opens (creating it if needed) the checkpoint directory root.
func OpenDir(root string, opts ...DirOption) (*Dir, error) {
	c := dirConfig{retain: 1, log: slog.New(slog.DiscardHandler)}
	for _, o := range opts {
		if err := o(&c); err != nil {
			return nil, err
		}
	}
	if root == "" {
		return nil, errors.New("checkpoint: empty checkpoint directory")
	}
	if c.savepoints == "" {
		c.savepoints = root
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		return nil, fmt.Errorf("checkpoint: create checkpoint directory: %w", err)
	}
	return &Dir{root: root, savepoints: c.savepoints, suffix: c.suffix, retain: c.retain, log: c.log, savepointD: map[int64]string{}, removeShared: os.Remove}, nil
}

// Root returns the checkpoint directory.
func (d *Dir) Root() string { return d.root }

var _ Store = (*Dir)(nil)

// checkpointDir returns the directory of checkpoint id of kind, creating
// it (and choosing a savepoint's name) when create is set.
func (d *Dir) checkpointDir(kind control.CheckpointKind, id int64, create bool) (string, error) {
	switch kind {
	case control.KindCheckpoint, "":
		p := filepath.Join(d.root, chkPrefix+strconv.FormatInt(id, 10))
		if create {
			if err := os.MkdirAll(p, 0o755); err != nil {
				return "", fmt.Errorf("checkpoint: %w", err)
			}
		}
		return p, nil
	case control.KindSavepoint:
		d.mu.Lock()
		defer d.mu.Unlock()
		if p, ok := d.savepointD[id]; ok {
			return p, nil
		}
		if !create {
			return "", fmt.Errorf("checkpoint: savepoint %d has no directory", id)
		}
		var rnd [3]byte
		_, _ = rand.Read(rnd[:])
		suffix := hex.EncodeToString(rnd[:])
		if d.suffix != "" {
			suffix = d.suffix
		}
		p := filepath.Join(d.savepoints, fmt.Sprintf("%s%d-%s", savepointPrefix, id, suffix))
		if err := os.MkdirAll(p, 0o755); err != nil {
			return "", fmt.Errorf("checkpoint: %w", err)
		}
		d.savepointD[id] = p
		return p, nil
	}
	return "", fmt.Errorf("checkpoint: unknown kind %q", kind)
}

// WriteState writes a subtask's blob to DIR/op-UID-INDEX.state and fsyncs it.
func (d *Dir) WriteState(ctx context.Context, kind control.CheckpointKind, id int64, sub control.SubtaskID, data []byte) (BlobRef, error) {
	return d.writeStateSummed(ctx, kind, id, sub, data, crc32c(data))
}

// writeStateSummed is WriteState of data whose CRC32C is sum.
func (d *Dir) writeStateSummed(ctx context.Context, kind control.CheckpointKind, id int64, sub control.SubtaskID, data []byte, sum uint32) (BlobRef, error) {
	if err := ctx.Err(); err != nil {
		return BlobRef{}, err
	}
	dir, err := d.checkpointDir(kind, id, true)
	if err != nil {
		return BlobRef{}, err
	}
	ref := BlobRef{Name: blobName(sub), Size: int64(len(data)), CRC32C: sum}
	if err := writeFileSync(filepath.Join(dir, ref.Name), data); err != nil {
		return BlobRef{}, fmt.Errorf("checkpoint: write state of %v for %s %d: %w", sub, kindName(kind), id, err)
	}
	return ref, nil
}

func kindName(k control.CheckpointKind) string {
	if k == "" {
		return string(control.KindCheckpoint)
	}
	return string(k)
}

func writeFileSync(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// Commit writes DIR/_metadata: to a temporary name, fsync, rename, fsync the
// directory. Then, for a checkpoint, it applies retention.
func (d *Dir) Commit(ctx context.Context, md *Metadata) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if md.Version == 0 {
		md.Version = md.neededVersion()
	}
	data, err := encodeMetadata(md)
	if err != nil {
		return err
	}
	dir, err := d.checkpointDir(md.Kind, md.ID, true)
	if err != nil {
		return err
	}
	final := filepath.Join(dir, MetadataFile)
	if _, err := os.Lstat(final); err == nil {
		return fmt.Errorf("checkpoint: commit %s %d: %s already exists", kindName(md.Kind), md.ID, final)
	}
	// Every blob the metadata names must be there, whole.
	for _, op := range md.Operators {
		for _, s := range op.Subtasks {
			if s.Ref == "" {
				continue
			}
			fi, err := os.Stat(filepath.Join(dir, s.Ref))
			if err != nil {
				return fmt.Errorf("checkpoint: commit %s %d: state of %s/%d: %w", kindName(md.Kind), md.ID, op.UID, s.Index, err)
			}
			if fi.Size() != s.Size {
				return fmt.Errorf("checkpoint: commit %s %d: %s has %d bytes, the acknowledgement says %d", kindName(md.Kind), md.ID, filepath.Join(dir, s.Ref), fi.Size(), s.Size)
			}
		}
	}
	// The blobs' directory entries are durable before the commit point.
	if err := syncDir(dir); err != nil {
		return fmt.Errorf("checkpoint: commit %s %d: %w", kindName(md.Kind), md.ID, err)
	}
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	tmp := filepath.Join(dir, MetadataFile+".tmp-"+hex.EncodeToString(rnd[:]))
	if err := writeFileSync(tmp, data); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("checkpoint: commit %s %d: %w", kindName(md.Kind), md.ID, err)
	}
	if err := os.Rename(tmp, final); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("checkpoint: commit %s %d: %w", kindName(md.Kind), md.ID, err)
	}
	if err := syncDir(dir); err != nil {
		return fmt.Errorf("checkpoint: commit %s %d: %w", kindName(md.Kind), md.ID, err)
	}
	if err := syncDir(filepath.Dir(dir)); err != nil {
		return fmt.Errorf("checkpoint: commit %s %d: %w", kindName(md.Kind), md.ID, err)
	}
	md.Location = dir
	if md.Kind == control.KindSavepoint {
		d.mu.Lock()
		delete(d.savepointD, md.ID)
		d.mu.Unlock()
		return nil
	}
	d.cleanup(md.ID)
	return nil
}

// chkEntry is one chk-ID (or savepoint-ID-SUFFIX) directory.
type chkEntry struct {
	id        int64
	path      string
	savepoint bool
	complete  bool
}

// listChk lists the chk-ID directories of root, and with savepoints set the
// savepoint-ID-SUFFIX directories too, ascending by id (then by name, so a
// checkpoint sorts before a savepoint of the same id).
func listChk(root string, savepoints bool) ([]chkEntry, error) {
	ents, err := os.ReadDir(root)
	if err != nil {
		return nil, err
	}
	var out []chkEntry
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		id, sp, ok := parseDirName(e.Name())
		if !ok || sp && !savepoints {
			continue
		}
		p := filepath.Join(root, e.Name())
		_, err = os.Lstat(filepath.Join(p, MetadataFile))
		out = append(out, chkEntry{id: id, path: p, savepoint: sp, complete: err == nil})
	}
	slices.SortFunc(out, func(a, b chkEntry) int {
		if c := cmpInt64(a.id, b.id); c != 0 {
			return c
		}
		return strings.Compare(a.path, b.path)
	})
	return out, nil
}

// parseDirName reads the id of a chk-ID or savepoint-ID-SUFFIX name.
func parseDirName(name string) (id int64, savepoint, ok bool) {
	idStr, isChk := strings.CutPrefix(name, chkPrefix)
	if !isChk {
		rest, isSp := strings.CutPrefix(name, savepointPrefix)
		var hasSuffix bool
		if idStr, _, hasSuffix = strings.Cut(rest, "-"); !isSp || !hasSuffix {
			return 0, false, false
		}
	}
	id, err := strconv.ParseInt(idStr, 10, 64)
	if err != nil || id < 1 {
		return 0, false, false
	}
	return id, !isChk, true
}

func cmpInt64(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// cleanup keeps the newest d.retain completed checkpoints (and always
// committed), and removes incomplete checkpoints older than committed.
func (d *Dir) cleanup(committed int64) {
	ents, err := listChk(d.root, false)
	if err != nil {
		d.log.Warn("checkpoint: retention: cannot list checkpoints", "dir", d.root, "err", err)
		return
	}
	var complete []chkEntry
	for _, e := range ents {
		if e.complete {
			complete = append(complete, e)
		} else if e.id < committed {
			d.remove(e.path, "incomplete")
		}
	}
	for i, e := range complete {
		if i < len(complete)-d.retain && e.id != committed {
			d.remove(e.path, "retention")
		}
	}
	d.gcShared(committed)
}

// remove deletes a checkpoint directory: first its _metadata, so that a
// crash half way leaves an incomplete (ignored) directory, never a
// complete one with missing blobs.
func (d *Dir) remove(path, why string) {
	err := os.Remove(filepath.Join(path, MetadataFile))
	if err == nil || errors.Is(err, fs.ErrNotExist) {
		err = os.RemoveAll(path)
	}
	if err != nil {
		d.log.Warn("checkpoint: cannot remove checkpoint", "dir", path, "why", why, "err", err)
		return
	}
	d.log.Debug("checkpoint: removed", "dir", path, "why", why)
}

// Completed lists the completed checkpoints of the root, ascending by id.
// A corrupt _metadata is an error.
func (d *Dir) Completed(ctx context.Context) ([]*Metadata, error) {
	ents, err := listChk(d.root, false)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: %w", err)
	}
	var out []*Metadata
	for _, e := range ents {
		if !e.complete {
			continue
		}
		md, err := loadMetadata(e.path)
		if err != nil {
			return nil, err
		}
		out = append(out, md)
	}
	return out, nil
}

// Latest returns the newest completed checkpoint of the root (savepoints
// are not checkpoints: Resolve of the root considers them too).
func (d *Dir) Latest(ctx context.Context) (*Metadata, error) {
	return latestIn(d.root, false)
}

// ReadState reads a blob of md.
func (d *Dir) ReadState(ctx context.Context, md *Metadata, sub SubtaskMeta) (*SubtaskState, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return ReadState(md, sub)
}

// Delete removes a completed checkpoint of this store.
func (d *Dir) Delete(ctx context.Context, md *Metadata) error {
	if md.Kind == control.KindSavepoint {
		return fmt.Errorf("checkpoint: refusing to delete savepoint %d at %s: savepoints are never deleted by streamd", md.ID, md.Location)
	}
	want := filepath.Join(d.root, chkPrefix+strconv.FormatInt(md.ID, 10))
	if md.Location != "" && filepath.Clean(md.Location) != filepath.Clean(want) {
		return fmt.Errorf("checkpoint: delete checkpoint %d: %s is not in %s", md.ID, md.Location, d.root)
	}
	if err := os.Remove(filepath.Join(want, MetadataFile)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("checkpoint: delete checkpoint %d: %w", md.ID, err)
	}
	if err := os.RemoveAll(want); err != nil {
		return fmt.Errorf("checkpoint: delete checkpoint %d: %w", md.ID, err)
	}
	d.gcShared(md.ID)
	return nil
}

// Discard deletes an unreferenced blob. A checkpoint or savepoint that was
// never committed loses its directory when its last blob is discarded.
func (d *Dir) Discard(ctx context.Context, kind control.CheckpointKind, id int64, stateRef string) error {
	ref, err := ParseBlobRef(stateRef)
	if err != nil {
		return err
	}
	dir, err := d.checkpointDir(kind, id, false)
	if err != nil {
		return nil // nothing was written
	}
	if _, err := os.Lstat(filepath.Join(dir, MetadataFile)); err == nil {
		return fmt.Errorf("checkpoint: discard %s: %s %d is committed", ref.Name, kindName(kind), id)
	}
	if err := os.Remove(filepath.Join(dir, ref.Name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("checkpoint: discard: %w", err)
	}
	if os.Remove(dir) == nil && kind == control.KindSavepoint { // only succeeds when empty
		d.mu.Lock()
		delete(d.savepointD, id)
		d.mu.Unlock()
	}
	return nil
}

// NextID is one more than the highest id of a chk-ID directory in the root
// (complete or not) or of a savepoint-ID-RAND directory in the root or the
// savepoint directory, so ids keep growing across runs.
func (d *Dir) NextID(ctx context.Context) (int64, error) {
	ents, err := listChk(d.root, false)
	if err != nil {
		return 0, fmt.Errorf("checkpoint: %w", err)
	}
	next := int64(1)
	if len(ents) > 0 {
		next = ents[len(ents)-1].id + 1
	}
	for _, dir := range []string{d.root, d.savepoints} {
		des, err := os.ReadDir(dir)
		if err != nil {
			continue // the savepoint directory may not exist yet
		}
		for _, e := range des {
			rest, ok := strings.CutPrefix(e.Name(), savepointPrefix)
			idStr, _, ok2 := strings.Cut(rest, "-")
			if id, err := strconv.ParseInt(idStr, 10, 64); ok && ok2 && err == nil && e.IsDir() && id >= next {
				next = id + 1
			}
		}
	}
	return next, nil
}

// latestIn loads the newest completed checkpoint of root, and with
// savepoints set the newest completed checkpoint or savepoint by id. The
// newest one is loaded even if an older one would load: a corrupt newest
// _metadata is an error, never a silent fall back.
func latestIn(root string, savepoints bool) (*Metadata, error) {
	ents, err := listChk(root, savepoints)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: %w", err)
	}
	incomplete := 0
	for i := len(ents) - 1; i >= 0; i-- {
		if ents[i].complete {
			return loadMetadata(ents[i].path)
		}
		incomplete++
	}
	if incomplete > 0 {
		return nil, fmt.Errorf("%w in %s (%d incomplete checkpoint directories without %s)", ErrNoCheckpoint, root, incomplete, MetadataFile)
	}
	return nil, fmt.Errorf("%w in %s", ErrNoCheckpoint, root)
}

// loadMetadata reads and verifies DIR/_metadata.
func loadMetadata(dir string) (*Metadata, error) {
	p := filepath.Join(dir, MetadataFile)
	data, err := readBounded(p, dir, MaxMetadataBytes)
	if err != nil {
		return nil, err
	}
	md, err := decodeMetadata(data)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %s", ErrCorrupt, p, err)
	}
	md.Location = dir
	return md, nil
}

// Resolve finds a completed checkpoint or savepoint from path: its
// directory, its _metadata file, or any other directory (a checkpoint root
// or a savepoint directory): then the completed checkpoint or savepoint
// (chk-ID or savepoint-ID-SUFFIX with a _metadata) with the highest id in
// it. Checkpoint and savepoint ids are one sequence per job, so that is the
// last state the job committed output for. If the highest one has a corrupt
// _metadata, that is the error (no fall back to an older one). A directory
// without any, whose subdirectories hold checkpoints (the checkpoint
// directory of deployed jobs: one DIR/JOB_ID per job), resolves to the newest
// of those jobs' newest ones by the time they completed. The metadata is read
// and verified; the blobs are not (see Verify).
func Resolve(path string) (*Metadata, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: %w", err)
	}
	if !fi.IsDir() {
		if filepath.Base(path) != MetadataFile {
			return nil, fmt.Errorf("checkpoint: %s is neither a checkpoint directory nor a %s file", path, MetadataFile)
		}
		return loadMetadata(filepath.Dir(path))
	}
	if _, err := os.Lstat(filepath.Join(path, MetadataFile)); err == nil {
		return loadMetadata(path)
	}
	base := filepath.Base(filepath.Clean(path))
	if strings.HasPrefix(base, chkPrefix) || strings.HasPrefix(base, savepointPrefix) {
		return nil, fmt.Errorf("%w: %s is incomplete: it has no %s (the checkpoint never completed)", ErrNoCheckpoint, path, MetadataFile)
	}
	ents, err := listChk(path, true)
	if err != nil || len(ents) > 0 {
		return latestIn(path, true)
	}
	if md, err := latestOfJobs(path); md != nil || err != nil {
		return md, err
	}
	return latestIn(path, true)
}

// latestOfJobs is the newest (by completion time, then id) of the newest
// completed checkpoints or savepoints of root's job directories (those
// holding chk-ID or savepoint-ID-SUFFIX directories); nil if there is none.
func latestOfJobs(root string) (*Metadata, error) {
	ents, err := os.ReadDir(root)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: %w", err)
	}
	var best *Metadata
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		sub := filepath.Join(root, e.Name())
		chk, err := listChk(sub, true)
		if err != nil || !slices.ContainsFunc(chk, func(c chkEntry) bool { return c.complete }) {
			continue
		}
		md, err := latestIn(sub, true)
		if err != nil {
			return nil, err
		}
		if best == nil || md.Time.After(best.Time) || md.Time.Equal(best.Time) && md.ID > best.ID {
			best = md
		}
	}
	return best, nil
}

// NewerThan returns the newest completed checkpoint or savepoint of job
// md.Job with a higher id than md in the directory that holds md's
// directory (for md at ROOT/chk-3: the newest in ROOT), or nil if there is
// none. Restoring md when there is one writes the output committed after
// md again (the file sink commits at every completed checkpoint and
// savepoint). Resolve of a directory never returns an md with a newer one
// beside it. A newer directory whose _metadata cannot be read is an error
// naming it (ErrCorrupt): its job, hence whether it counts, is unknown.
// md must be in a directory; see NewerThanIn for any location.
func NewerThan(md *Metadata) (*Metadata, error) {
	if strings.HasPrefix(md.Location, JetStreamScheme) {
		return nil, fmt.Errorf("checkpoint: newer than %s: not a directory (see NewerThanJetStream)", md.Location)
	}
	if md.Location == "" {
		return nil, fmt.Errorf("checkpoint: newer than %s %d: it has no location", kindName(md.Kind), md.ID)
	}
	parent := filepath.Dir(filepath.Clean(md.Location))
	ents, err := listChk(parent, true)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: newer than %s: %w", md.Location, err)
	}
	for i := len(ents) - 1; i >= 0 && ents[i].id > md.ID; i-- {
		if !ents[i].complete {
			continue
		}
		n, err := loadMetadata(ents[i].path)
		if err != nil {
			return nil, fmt.Errorf("checkpoint: newer than %s: %w", md.Location, err)
		}
		if n.Job == md.Job {
			return n, nil
		}
	}
	return nil, nil
}

// ReadState reads the blob of subtask sub of md (directory layout) and
// verifies its size, checksum and format. Errors name the file.
func ReadState(md *Metadata, sub SubtaskMeta) (*SubtaskState, error) {
	if sub.Ref == "" {
		return nil, nil
	}
	if err := checkBlobName(sub.Ref); err != nil {
		return nil, fmt.Errorf("checkpoint: %s: %w", md.Location, err)
	}
	p := filepath.Join(md.Location, sub.Ref)
	data, err := readBounded(p, md.Location, sub.Size)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: state of subtask %d: %w", sub.Index, err)
	}
	st, err := decodeBlob(p, data, sub)
	if err != nil {
		return nil, err
	}
	root, open := dirShared(md)
	attachFetch(st, root, open)
	return st, nil
}

// decodeBlob checks the blob read from path against its metadata entry (size,
// checksum, in-flight bytes) and decodes it.
func decodeBlob(path string, data []byte, sub SubtaskMeta) (*SubtaskState, error) {
	if err := checkBlob(path, int64(len(data)), crc32c(data), sub); err != nil {
		return nil, err
	}
	s, err := decodeState(data)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %s", ErrCorrupt, path, err)
	}
	if err := checkDecoded(path, s, sub); err != nil {
		return nil, err
	}
	return s, nil
}

// checkDecoded checks a decoded blob against its metadata entry: its
// channel-state bytes and shared files.
func checkDecoded(path string, s *SubtaskState, sub SubtaskMeta) error {
	if n := s.Channels.EncodedSize(); n != sub.InFlightBytes {
		return fmt.Errorf("%w: %s: %d bytes of channel state, the metadata says %d", ErrCorrupt, path, n, sub.InFlightBytes)
	}
	if got := sharedRefs(s); !slices.Equal(got, sub.Shared) {
		return fmt.Errorf("%w: %s: refers to %d shared files, the metadata lists %d others", ErrCorrupt, path, len(got), len(sub.Shared))
	}
	return nil
}

func checkBlob(path string, size int64, sum uint32, sub SubtaskMeta) error {
	switch {
	case size < sub.Size:
		return fmt.Errorf("%w: %s: truncated: %d of %d bytes", ErrCorrupt, path, size, sub.Size)
	case size > sub.Size:
		return fmt.Errorf("%w: %s: %d bytes, the metadata says %d", ErrCorrupt, path, size, sub.Size)
	case sum != sub.CRC32C:
		return fmt.Errorf("%w: %s: checksum mismatch (crc32c %08x, metadata says %08x)", ErrCorrupt, path, sum, sub.CRC32C)
	}
	return nil
}

// Verify checks that every blob md names exists with the size and CRC32C
// the metadata records (directory layout), streaming each file.
func Verify(md *Metadata) error {
	for _, op := range md.Operators {
		for _, s := range op.Subtasks {
			if s.Ref == "" {
				continue
			}
			if err := checkBlobName(s.Ref); err != nil {
				return fmt.Errorf("checkpoint: %s: %w", md.Location, err)
			}
			p := filepath.Join(md.Location, s.Ref)
			f, _, err := openBounded(p, md.Location)
			if err != nil {
				return fmt.Errorf("checkpoint: state of %s/%d: %w", op.UID, s.Index, err)
			}
			h := crc32.New(castagnoli)
			n, err := io.Copy(h, io.LimitReader(f, s.Size+1))
			f.Close()
			if err != nil {
				return fmt.Errorf("checkpoint: %s: %w", p, err)
			}
			if err := checkBlob(p, n, h.Sum32(), s); err != nil {
				return err
			}
		}
	}
	for _, r := range md.SharedFiles() {
		p := filepath.Join(filepath.Dir(md.Location), SharedDir, r.Name)
		fi, err := os.Stat(p)
		if err != nil {
			return fmt.Errorf("%w: shared file of %s %d: %w", ErrCorrupt, md.Kind, md.ID, err)
		}
		if fi.Size() != r.Size {
			return fmt.Errorf("%w: %s: %d bytes, the metadata says %d", ErrCorrupt, p, fi.Size(), r.Size)
		}
	}
	return nil
}
