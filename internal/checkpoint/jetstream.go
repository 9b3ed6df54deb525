package checkpoint

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/internal/natsutil"
)

// JetStream location scheme and default bucket.
const (
	// JetStreamScheme starts the location of a checkpoint in a JetStream
	// object store: jetstream://BUCKET/PREFIX/chk-ID.
	JetStreamScheme = "jetstream://"
	// DefaultBucket is the object store bucket of checkpoints when the job
	// names none.
	DefaultBucket = "STREAMD_CHECKPOINTS"
)

var (
	bucketRE = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)
	prefixRE = regexp.MustCompile(`^[A-Za-z0-9_-]+(/[A-Za-z0-9_-]+)*$`)
)

// JetStream is the Store on a NATS JetStream object store: the directory
// layout of Dir, with object names for paths:
//
//	PREFIX/chk-ID/op-UID-INDEX.state        one state blob per subtask with state
//	PREFIX/chk-ID/_metadata                 the commit point, put last
//	PREFIX/savepoint-ID-SUFFIX/...          a savepoint: the same content
//
// Blobs and metadata have the encodings of Dir (EncodeState, the _metadata
// format). Hosts put their subtasks' blobs and the driver puts the metadata,
// so processes on different machines share one store without a shared file
// system. An object becomes visible only once it is whole (the object
// store writes its chunks, then its info), so the _metadata object is the
// commit point as the file is for Dir. Locations are
// jetstream://BUCKET/PREFIX/chk-ID. It is safe for concurrent use.
type JetStream struct {
	js             jetstream.JetStream
	obs            jetstream.ObjectStore
	bucket, prefix string
	suffix         string
	retain         int
	log            *slog.Logger

	mu         sync.Mutex
	savepointD map[int64]string // savepoint id -> its name (savepoint-ID-SUFFIX)
	// Retention runs in the background, one pass at a time (cleanupLater):
	// cleanNext is the latest committed checkpoint a pass has still to
	// clean up after (0: none); cleaned is closed when no pass runs.
	cleanNext int64
	cleaned   chan struct{}
}

var _ Store = (*JetStream)(nil)

// OpenJetStream opens the checkpoints under prefix (letters, digits, '-',
// '_', tokens separated by '/') in the object store bucket of js, creating
// the bucket (file storage) if it does not exist. Options: WithRetain,
// WithSavepointSuffix, WithLogger (WithSavepointDir is refused: savepoints
// go under the prefix).
func OpenJetStream(ctx context.Context, js jetstream.JetStream, bucket, prefix string, opts ...DirOption) (*JetStream, error) {
	c := dirConfig{retain: 1, log: slog.New(slog.DiscardHandler)}
	for _, o := range opts {
		if err := o(&c); err != nil {
			return nil, err
		}
	}
	if c.savepoints != "" {
		return nil, errors.New("checkpoint: a JetStream store keeps savepoints under its prefix: no savepoint directory")
	}
	if bucket == "" {
		bucket = DefaultBucket
	}
	if !bucketRE.MatchString(bucket) {
		return nil, fmt.Errorf("checkpoint: object store bucket %q: may contain only letters, digits, '-' and '_'", bucket)
	}
	if !prefixRE.MatchString(prefix) {
		return nil, fmt.Errorf("checkpoint: object store prefix %q: want tokens of letters, digits, '-' and '_' separated by '/'", prefix)
	}
	obs, err := openBucket(ctx, js, bucket, true)
	if err != nil {
		return nil, err
	}
	return &JetStream{js: js, obs: obs, bucket: bucket, prefix: prefix, suffix: c.suffix, retain: c.retain, log: c.log,
		savepointD: map[int64]string{}}, nil
}

func openBucket(ctx context.Context, js jetstream.JetStream, bucket string, create bool) (jetstream.ObjectStore, error) {
	obs, err := js.ObjectStore(ctx, bucket)
	if create && errors.Is(err, jetstream.ErrBucketNotFound) {
		obs, err = js.CreateObjectStore(ctx, jetstream.ObjectStoreConfig{
			Bucket: bucket, Description: "streamd checkpoints and savepoints", Storage: jetstream.FileStorage})
		if errors.Is(err, jetstream.ErrBucketExists) {
			obs, err = js.ObjectStore(ctx, bucket)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("checkpoint: object store bucket %s (the NATS server needs JetStream): %w", bucket, err)
	}
	return obs, nil
}

// Root returns the store's location, jetstream://BUCKET/PREFIX.
func (s *JetStream) Root() string { return JetStreamScheme + s.bucket + "/" + s.prefix }

// location is the location of the checkpoint directory dir (prefix-relative).
func (s *JetStream) location(dir string) string { return s.Root() + "/" + dir }

// ParseJetStreamLocation splits jetstream://BUCKET/PATH; ok is false when
// loc does not start with JetStreamScheme.
func ParseJetStreamLocation(loc string) (bucket, path string, ok bool, err error) {
	rest, ok := strings.CutPrefix(loc, JetStreamScheme)
	if !ok {
		return "", "", false, nil
	}
	bucket, path, _ = strings.Cut(rest, "/")
	path = strings.TrimSuffix(path, "/")
	if !bucketRE.MatchString(bucket) || !prefixRE.MatchString(path) {
		return "", "", true, fmt.Errorf("checkpoint: %q: want %sBUCKET/PREFIX[/chk-ID|/savepoint-ID-SUFFIX]", loc, JetStreamScheme)
	}
	return bucket, path, true, nil
}

// checkpointDir is the prefix-relative name of checkpoint id of kind,
// choosing a savepoint's name when create is set.
func (s *JetStream) checkpointDir(kind control.CheckpointKind, id int64, create bool) (string, error) {
	switch kind {
	case control.KindCheckpoint, "":
		return chkPrefix + strconv.FormatInt(id, 10), nil
	case control.KindSavepoint:
		s.mu.Lock()
		defer s.mu.Unlock()
		if d, ok := s.savepointD[id]; ok {
			return d, nil
		}
		if !create {
			return "", fmt.Errorf("checkpoint: savepoint %d has no name", id)
		}
		suffix := s.suffix
		if suffix == "" {
			var rnd [3]byte
			_, _ = rand.Read(rnd[:])
			suffix = hex.EncodeToString(rnd[:])
		}
		d := fmt.Sprintf("%s%d-%s", savepointPrefix, id, suffix)
		s.savepointD[id] = d
		return d, nil
	}
	return "", fmt.Errorf("checkpoint: unknown kind %q", kind)
}

func (s *JetStream) object(dir, name string) string { return s.prefix + "/" + dir + "/" + name }

// WriteState puts a subtask's blob as PREFIX/DIR/op-UID-INDEX.state.
func (s *JetStream) WriteState(ctx context.Context, kind control.CheckpointKind, id int64, sub control.SubtaskID, data []byte) (BlobRef, error) {
	return s.writeStateSummed(ctx, kind, id, sub, data, crc32c(data))
}

// writeStateSummed is WriteState of data whose CRC32C is sum.
func (s *JetStream) writeStateSummed(ctx context.Context, kind control.CheckpointKind, id int64, sub control.SubtaskID, data []byte, sum uint32) (BlobRef, error) {
	dir, err := s.checkpointDir(kind, id, true)
	if err != nil {
		return BlobRef{}, err
	}
	ref := BlobRef{Name: blobName(sub), Size: int64(len(data)), CRC32C: sum}
	info, err := s.obs.PutBytes(ctx, s.object(dir, ref.Name), data)
	if err != nil {
		return BlobRef{}, fmt.Errorf("checkpoint: write state of %v for %s %d to %s: %w", sub, kindName(kind), id, s.location(dir), err)
	}
	if info.Size != uint64(len(data)) {
		return BlobRef{}, fmt.Errorf("checkpoint: write state of %v for %s %d: the object store kept %d of %d bytes", sub, kindName(kind), id, info.Size, len(data))
	}
	return ref, nil
}

// Commit puts PREFIX/DIR/_metadata after checking that every blob it names
// is there with its size; then, for a checkpoint, it applies retention.
func (s *JetStream) Commit(ctx context.Context, md *Metadata) error {
	if md.Version == 0 {
		md.Version = md.neededVersion()
	}
	data, err := encodeMetadata(md)
	if err != nil {
		return err
	}
	dir, err := s.checkpointDir(md.Kind, md.ID, true)
	if err != nil {
		return err
	}
	where := fmt.Sprintf("checkpoint: commit %s %d to %s", kindName(md.Kind), md.ID, s.location(dir))
	if _, err := s.obs.GetInfo(ctx, s.object(dir, MetadataFile)); err == nil {
		return fmt.Errorf("%s: %s already exists", where, MetadataFile)
	} else if !errors.Is(err, jetstream.ErrObjectNotFound) {
		return fmt.Errorf("%s: %w", where, err)
	}
	for _, op := range md.Operators {
		for _, sm := range op.Subtasks {
			if sm.Ref == "" {
				continue
			}
			info, err := s.obs.GetInfo(ctx, s.object(dir, sm.Ref))
			if err != nil {
				return fmt.Errorf("%s: state of %s/%d: %w", where, op.UID, sm.Index, err)
			}
			if int64(info.Size) != sm.Size {
				return fmt.Errorf("%s: %s has %d bytes, the acknowledgement says %d", where, sm.Ref, info.Size, sm.Size)
			}
		}
	}
	if _, err := s.obs.PutBytes(ctx, s.object(dir, MetadataFile), data); err != nil {
		return fmt.Errorf("%s: %w", where, err)
	}
	md.Location = s.location(dir)
	if md.Kind == control.KindSavepoint {
		s.mu.Lock()
		delete(s.savepointD, md.ID)
		s.mu.Unlock()
		return nil
	}
	s.cleanupLater(md.ID)
	return nil
}

// cleanupTimeout bounds one retention pass (two listings of the bucket and
// the deletes).
const cleanupTimeout = time.Minute

// cleanupLater applies retention after checkpoint committed in the
// background: a pass lists the whole bucket (the object store lists no
// prefix alone) twice, which took tens of milliseconds, and seconds when
// an ordered consumer stalled, and the job's loop that commits waited for
// it. Passes run one at a time; commits while one runs are cleaned up
// after by one more pass, for the latest of them.
func (s *JetStream) cleanupLater(committed int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cleanNext = max(s.cleanNext, committed)
	if s.cleaned != nil {
		return // the running pass takes it next
	}
	done := make(chan struct{})
	s.cleaned = done
	go func() {
		defer close(done)
		for {
			s.mu.Lock()
			id := s.cleanNext
			s.cleanNext = 0
			if id == 0 {
				s.cleaned = nil
				s.mu.Unlock()
				return
			}
			s.mu.Unlock()
			ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
			s.cleanup(ctx, id)
			cancel()
		}
	}()
}

// WaitCleanup waits until no retention pass runs or ctx ends: what Commit
// left to clean up is then removed.
func (s *JetStream) WaitCleanup(ctx context.Context) error {
	s.mu.Lock()
	done := s.cleaned
	s.mu.Unlock()
	if done == nil {
		return nil
	}
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// jsDir is one checkpoint or savepoint "directory" under the prefix.
type jsDir struct {
	name     string // chk-ID or savepoint-ID-SUFFIX
	id       int64
	savept   bool
	complete bool
	objects  []string // full object names
}

// listFirstTry bounds the first try of a bucket listing (listObjects);
// each try after it gets twice as long, up to listMaxTry.
const (
	listFirstTry = 250 * time.Millisecond
	listMaxTry   = 16 * time.Second
)

// lister is what a bucket listing needs besides the bucket: the
// connection it waits for (nil: none) and where a stalled try is logged
// (nil: nowhere).
type lister struct {
	nc  *nats.Conn
	log *slog.Logger
}

// listObjects is obs.List, each try bounded and a try that ran out tried
// again until ctx ends. A listing reads the objects' infos on an ordered
// consumer, which stalls for good when it starts while the connection is
// down (a NATS restart: a new leader's NextID for a job it took over
// waited two minutes in one in TestChaos, and the controller answered
// nothing meanwhile), so each try first waits for the connection. A
// listing takes well under a second; a try that ran out (the connection
// dropped during it) is logged and tried again.
func (l lister) listObjects(ctx context.Context, obs jetstream.ObjectStore) ([]*jetstream.ObjectInfo, error) {
	try := listFirstTry
	for {
		if l.nc != nil {
			if err := natsutil.WaitConnected(ctx, l.nc); err != nil {
				return nil, err
			}
		}
		tctx, cancel := context.WithTimeout(ctx, try)
		infos, err := obs.List(tctx)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil {
			return infos, err
		}
		if l.log != nil {
			l.log.Warn("checkpoint: a bucket listing stalled; trying again", "waited", try)
		}
		try = min(2*try, listMaxTry)
	}
}

// lister is the store's: its connection and log.
func (s *JetStream) lister() lister { return lister{nc: s.js.Conn(), log: s.log} }

// list groups the objects under prefix/ by directory, ascending by id.
func (l lister) listDirs(ctx context.Context, obs jetstream.ObjectStore, prefix string) ([]*jsDir, error) {
	infos, err := l.listObjects(ctx, obs)
	if err != nil && !errors.Is(err, jetstream.ErrNoObjectsFound) {
		return nil, fmt.Errorf("checkpoint: list %s: %w", prefix, err)
	}
	byName := map[string]*jsDir{}
	for _, in := range infos {
		rest, ok := strings.CutPrefix(in.Name, prefix+"/")
		if !ok || in.Deleted {
			continue
		}
		dir, file, ok := strings.Cut(rest, "/")
		if !ok || strings.Contains(file, "/") {
			continue
		}
		d := byName[dir]
		if d == nil {
			d = &jsDir{name: dir}
			switch {
			case strings.HasPrefix(dir, chkPrefix):
				id, err := strconv.ParseInt(strings.TrimPrefix(dir, chkPrefix), 10, 64)
				if err != nil || id < 1 {
					continue
				}
				d.id = id
			case strings.HasPrefix(dir, savepointPrefix):
				idStr, _, ok := strings.Cut(strings.TrimPrefix(dir, savepointPrefix), "-")
				id, err := strconv.ParseInt(idStr, 10, 64)
				if !ok || err != nil || id < 1 {
					continue
				}
				d.id, d.savept = id, true
			default:
				continue
			}
			byName[dir] = d
		}
		d.objects = append(d.objects, in.Name)
		if file == MetadataFile {
			d.complete = true
		}
	}
	out := make([]*jsDir, 0, len(byName))
	for _, d := range byName {
		out = append(out, d)
	}
	slices.SortFunc(out, func(a, b *jsDir) int {
		if c := cmpInt64(a.id, b.id); c != 0 {
			return c
		}
		return strings.Compare(a.name, b.name)
	})
	return out, nil
}

// cleanup applies retention after checkpoint committed was committed.
func (s *JetStream) cleanup(ctx context.Context, committed int64) {
	dirs, err := s.lister().listDirs(ctx, s.obs, s.prefix)
	if err != nil {
		s.log.Warn("checkpoint: retention: cannot list checkpoints", "store", s.Root(), "err", err)
		return
	}
	var complete []*jsDir
	for _, d := range dirs {
		if d.savept {
			continue
		}
		if d.complete {
			if d.id <= committed { // a later one is its own pass's
				complete = append(complete, d)
			}
		} else if d.id < committed {
			s.remove(ctx, d, "incomplete")
		}
	}
	for i, d := range complete {
		if i < len(complete)-s.retain && d.id != committed {
			s.remove(ctx, d, "retention")
		}
	}
	s.gcShared(ctx, committed)
}

// remove deletes a checkpoint's objects, the _metadata first, so that a crash
// half way leaves an incomplete (ignored) checkpoint.
func (s *JetStream) remove(ctx context.Context, d *jsDir, why string) {
	meta := s.object(d.name, MetadataFile)
	objs := slices.Clone(d.objects)
	slices.SortStableFunc(objs, func(a, b string) int {
		switch {
		case a == meta:
			return -1
		case b == meta:
			return 1
		}
		return 0
	})
	for _, o := range objs {
		if err := s.obs.Delete(ctx, o); err != nil && !errors.Is(err, jetstream.ErrObjectNotFound) {
			s.log.Warn("checkpoint: cannot remove checkpoint", "location", s.location(d.name), "why", why, "err", err)
			return
		}
	}
	s.log.Debug("checkpoint: removed", "location", s.location(d.name), "why", why)
}

// loadMeta gets and verifies DIR/_metadata of prefix in obs.
func loadMeta(ctx context.Context, obs jetstream.ObjectStore, bucket, prefix, dir string) (*Metadata, error) {
	loc := JetStreamScheme + bucket + "/" + prefix + "/" + dir
	data, err := obs.GetBytes(ctx, prefix+"/"+dir+"/"+MetadataFile)
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return nil, fmt.Errorf("%w: %s is incomplete: it has no %s (the checkpoint never completed)", ErrNoCheckpoint, loc, MetadataFile)
	}
	if err != nil {
		return nil, fmt.Errorf("checkpoint: %s/%s: %w", loc, MetadataFile, err)
	}
	md, err := decodeMetadata(data)
	if err != nil {
		return nil, fmt.Errorf("%w: %s/%s: %s", ErrCorrupt, loc, MetadataFile, err)
	}
	md.Location = loc
	return md, nil
}

// Completed lists the completed checkpoints under the prefix, ascending.
func (s *JetStream) Completed(ctx context.Context) ([]*Metadata, error) {
	dirs, err := s.lister().listDirs(ctx, s.obs, s.prefix)
	if err != nil {
		return nil, err
	}
	var out []*Metadata
	for _, d := range dirs {
		if d.savept || !d.complete {
			continue
		}
		md, err := loadMeta(ctx, s.obs, s.bucket, s.prefix, d.name)
		if err != nil {
			return nil, err
		}
		out = append(out, md)
	}
	return out, nil
}

// Latest returns the newest completed checkpoint under the prefix
// (savepoints are not checkpoints: ResolveJetStream of the prefix considers
// them too).
func (s *JetStream) Latest(ctx context.Context) (*Metadata, error) {
	return latestJS(ctx, s.lister(), s.obs, s.bucket, s.prefix, false)
}

// latestJS loads the newest completed checkpoint under prefix, and with
// savepoints set the newest completed checkpoint or savepoint by id (a
// corrupt newest _metadata is an error, as for latestIn).
func latestJS(ctx context.Context, l lister, obs jetstream.ObjectStore, bucket, prefix string, savepoints bool) (*Metadata, error) {
	dirs, err := l.listDirs(ctx, obs, prefix)
	if err != nil {
		return nil, err
	}
	incomplete := 0
	for i := len(dirs) - 1; i >= 0; i-- {
		d := dirs[i]
		if d.savept && !savepoints {
			continue
		}
		if d.complete {
			return loadMeta(ctx, obs, bucket, prefix, d.name)
		}
		incomplete++
	}
	root := JetStreamScheme + bucket + "/" + prefix
	if incomplete > 0 {
		return nil, fmt.Errorf("%w in %s (%d incomplete checkpoints without %s)", ErrNoCheckpoint, root, incomplete, MetadataFile)
	}
	return nil, fmt.Errorf("%w in %s", ErrNoCheckpoint, root)
}

// ReadState gets a blob of md, which may be in another bucket of the same
// JetStream, and verifies its size, checksum and format.
func (s *JetStream) ReadState(ctx context.Context, md *Metadata, sub SubtaskMeta) (*SubtaskState, error) {
	return readStateJS(ctx, s.js, s.obs, s.bucket, md, sub)
}

func readStateJS(ctx context.Context, js jetstream.JetStream, obs jetstream.ObjectStore, bucket string, md *Metadata, sub SubtaskMeta) (*SubtaskState, error) {
	if sub.Ref == "" {
		return nil, nil
	}
	if !strings.HasPrefix(md.Location, JetStreamScheme) {
		return ReadState(md, sub) // a directory
	}
	b, err := jsBlob(ctx, js, obs, bucket, md, sub)
	if err != nil {
		return nil, err
	}
	r, _, err := b.open(ctx)
	if err != nil {
		return nil, err
	}
	data, err := io.ReadAll(r)
	r.Close()
	if err != nil {
		return nil, fmt.Errorf("checkpoint: state of subtask %d: %s: %w", sub.Index, b.path, err)
	}
	st, err := decodeBlob(b.path, data, sub)
	if err != nil {
		return nil, err
	}
	attachFetch(st, b.sharedRoot, b.sharedOpen)
	return st, nil
}

// Delete removes a completed checkpoint of this store.
func (s *JetStream) Delete(ctx context.Context, md *Metadata) error {
	if md.Kind == control.KindSavepoint {
		return fmt.Errorf("checkpoint: refusing to delete savepoint %d at %s: savepoints are never deleted by streamd", md.ID, md.Location)
	}
	name := chkPrefix + strconv.FormatInt(md.ID, 10)
	if md.Location != "" && md.Location != s.location(name) {
		return fmt.Errorf("checkpoint: delete checkpoint %d: %s is not in %s", md.ID, md.Location, s.Root())
	}
	d := &jsDir{name: name, objects: []string{s.object(name, MetadataFile)}}
	for _, op := range md.Operators {
		for _, sm := range op.Subtasks {
			if sm.Ref != "" {
				d.objects = append(d.objects, s.object(name, sm.Ref))
			}
		}
	}
	for _, o := range d.objects {
		if err := s.obs.Delete(ctx, o); err != nil && !errors.Is(err, jetstream.ErrObjectNotFound) {
			return fmt.Errorf("checkpoint: delete checkpoint %d: %w", md.ID, err)
		}
	}
	return nil
}

// Discard deletes a blob that no metadata references.
func (s *JetStream) Discard(ctx context.Context, kind control.CheckpointKind, id int64, stateRef string) error {
	ref, err := ParseBlobRef(stateRef)
	if err != nil {
		return err
	}
	dir, err := s.checkpointDir(kind, id, false)
	if err != nil {
		return nil // nothing was written
	}
	if _, err := s.obs.GetInfo(ctx, s.object(dir, MetadataFile)); err == nil {
		return fmt.Errorf("checkpoint: discard %s: %s %d is committed", ref.Name, kindName(kind), id)
	}
	if err := s.obs.Delete(ctx, s.object(dir, ref.Name)); err != nil && !errors.Is(err, jetstream.ErrObjectNotFound) {
		return fmt.Errorf("checkpoint: discard: %w", err)
	}
	return nil
}

// NextID is one more than the highest id of a checkpoint or savepoint under
// the prefix, complete or not.
func (s *JetStream) NextID(ctx context.Context) (int64, error) {
	dirs, err := s.lister().listDirs(ctx, s.obs, s.prefix)
	if err != nil {
		return 0, err
	}
	next := int64(1)
	for _, d := range dirs {
		next = max(next, d.id+1)
	}
	return next, nil
}

// Resolve finds a completed checkpoint or savepoint at loc in this store's
// JetStream (see ResolveJetStream).
func (s *JetStream) Resolve(ctx context.Context, loc string) (*Metadata, error) {
	return ResolveJetStream(ctx, s.js, loc)
}

// ResolveJetStream finds a completed checkpoint or savepoint from
// jetstream://BUCKET/PATH: PATH is PREFIX/chk-ID, PREFIX/savepoint-ID-SUFFIX,
// either followed by /_metadata, or a PREFIX (then the completed checkpoint
// or savepoint with the highest id under it, as Resolve does for a
// directory). The metadata is read and verified; the blobs are not (see
// VerifyFrom).
func ResolveJetStream(ctx context.Context, js jetstream.JetStream, loc string) (*Metadata, error) {
	bucket, path, ok, err := ParseJetStreamLocation(strings.TrimSuffix(loc, "/"+MetadataFile))
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("checkpoint: %q is not a %s location", loc, JetStreamScheme)
	}
	obs, err := openBucket(ctx, js, bucket, false)
	if err != nil {
		return nil, err
	}
	prefix, last := "", path
	if i := strings.LastIndexByte(path, '/'); i >= 0 {
		prefix, last = path[:i], path[i+1:]
	}
	if prefix != "" && (strings.HasPrefix(last, chkPrefix) || strings.HasPrefix(last, savepointPrefix)) {
		return loadMeta(ctx, obs, bucket, prefix, last)
	}
	return latestJS(ctx, lister{nc: js.Conn()}, obs, bucket, path, true)
}

// NewerThanJetStream is NewerThan for md at jetstream://BUCKET/PREFIX/NAME:
// the newest completed checkpoint or savepoint of job md.Job under PREFIX
// with a higher id than md, or nil.
func NewerThanJetStream(ctx context.Context, js jetstream.JetStream, md *Metadata) (*Metadata, error) {
	bucket, path, ok, err := ParseJetStreamLocation(md.Location)
	if err != nil {
		return nil, err
	}
	i := strings.LastIndexByte(path, '/')
	if !ok || i < 0 {
		return nil, fmt.Errorf("checkpoint: newer than %q: want %sBUCKET/PREFIX/NAME", md.Location, JetStreamScheme)
	}
	prefix := path[:i]
	obs, err := openBucket(ctx, js, bucket, false)
	if err != nil {
		return nil, err
	}
	dirs, err := lister{nc: js.Conn()}.listDirs(ctx, obs, prefix)
	if err != nil {
		return nil, err
	}
	for i := len(dirs) - 1; i >= 0 && dirs[i].id > md.ID; i-- {
		if !dirs[i].complete {
			continue
		}
		n, err := loadMeta(ctx, obs, bucket, prefix, dirs[i].name)
		if err != nil {
			return nil, fmt.Errorf("checkpoint: newer than %s: %w", md.Location, err)
		}
		if n.Job == md.Job {
			return n, nil
		}
	}
	return nil, nil
}

// NewerThanIn is NewerThan for md as Resolve, ResolveJetStream or
// wire.ResolveIn returned it with r, its state reader: a JetStream
// location is listed through r (a JetStreamReader or a *JetStream).
func NewerThanIn(ctx context.Context, r StateReader, md *Metadata) (*Metadata, error) {
	if !strings.HasPrefix(md.Location, JetStreamScheme) {
		return NewerThan(md)
	}
	switch r := r.(type) {
	case JetStreamReader:
		return NewerThanJetStream(ctx, r.JS, md)
	case *JetStream:
		return NewerThanJetStream(ctx, r.js, md)
	}
	return nil, fmt.Errorf("checkpoint: newer than %s: no JetStream to list it", md.Location)
}

// JetStreamReader reads state blobs of checkpoints in any bucket of a
// JetStream, and of directories (a StateReader).
type JetStreamReader struct{ JS jetstream.JetStream }

// ReadState reads a blob of md (a jetstream:// location or a directory).
func (r JetStreamReader) ReadState(ctx context.Context, md *Metadata, sub SubtaskMeta) (*SubtaskState, error) {
	return readStateJS(ctx, r.JS, nil, "", md, sub)
}

// VerifyFrom checks that every blob md names can be read through r with
// the size and CRC32C the metadata records, and decodes (as a stream, for
// the readers of this package: memory does not grow with the state).
func VerifyFrom(ctx context.Context, r StateReader, md *Metadata) error {
	for _, op := range md.Operators {
		for _, sm := range op.Subtasks {
			var err error
			if o, ok := r.(stateOpener); ok {
				_, err = scanState(ctx, o, md, sm)
			} else {
				_, err = r.ReadState(ctx, md, sm)
			}
			if err != nil {
				return fmt.Errorf("checkpoint: operator %q: %w", op.UID, err)
			}
		}
	}
	return nil
}

// FileReader reads state blobs of checkpoints in directories (Resolve).
var FileReader StateReader = fileReader{}
