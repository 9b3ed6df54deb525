package kafka

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/internal/connector"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Sink is the exactly-once kafka sink of one subtask
// (connector.TwoPhaseSink). A record becomes a Kafka record of Topic with
// its key (none when empty), value, headers and timestamp (the produce
// time when it has none); the partition is the murmur2 hash of the key, as Kafka's own
// clients choose it, so equal keys share a partition (records without a key
// are spread).
//
// # Two-phase commit
//
// Write stages records in memory; PreCommit(id) seals the records of the
// epoch that checkpoint id ends into an entry (with 16 random bytes, its
// nonce) and returns every entry not yet committed as the sink's
// checkpoint state, so the checkpoint holds the records themselves (the
// runtime takes it in parts, PreCommitParts: the staged records are
// written into the checkpoint where they are, never joined or copied).
// Commit(id), once checkpoint id is complete, produces each entry of an
// epoch <= id in one Kafka transaction of its own that also commits, with
// TxnOffsetCommit, the writer's marker: the offset of Topic's partition 0
// in the marker group
//
//	<prefix>-marker-<WriterID(job, operator)>-<subtask>
//
// with the entry's epoch as offset and "streamd-kafka-sink v1 epoch=E
// nonce=N records=R" as metadata. CommitPending, on restore, commits the
// entries recorded in the restored checkpoint that are not in Kafka yet.
// Nothing is committed before its checkpoint is durable, so records that
// a failed attempt wrote after its last checkpoint never reach a
// read_committed reader.
//
// While checkpoints come often (see goLive), the records of an epoch are
// also produced as they are written, into the transaction their entry
// will be committed in, opened when no entry waits for its commit; and
// the committer, once the due entries are committed, produces the next
// sealed one into its transaction while its checkpoint completes. The
// commit then only flushes them and adds the marker. This changes none
// of the argument below: the transaction holds exactly the entry's
// records and commits only once a checkpoint holding the entry is
// complete; a crash leaves it open, and the restore's InitProducerID
// aborts it before it commits the entry from the checkpoint.
//
// Commit returns at once and one committer goroutine produces in the
// background, so the subtask goes on processing while Kafka takes the
// transaction: an entry leaves the pending list (and so the states of later
// checkpoints) only once its transaction has committed. A Commit while
// the committer runs only raises the epoch it commits up to (it never
// waits for it: the subtask would stall for a transaction), and the
// committer always takes the head of the pending list, so a writer's
// entries are still committed one after the other, in order. Close waits
// for it. A failed background commit fails the next PreCommit, Commit or
// Close.
//
// The entries of writer w (the subtask that sealed them) are only ever
// produced with the transactional id
//
//	<prefix>-<WriterID(job, operator)>-<w>
//
// and in epoch order. So:
//
//   - an entry's records and its marker are committed together or not at
//     all (a transaction is atomic, and a read_committed reader sees
//     neither before the commit);
//   - the marker group of w names the last entry of w that is committed:
//     entries are committed one after the other, so every entry before it
//     is committed too, and none after it;
//   - a sink opening writer w first initializes that transactional id
//     (InitProducerID), which bumps its epoch: the broker aborts any
//     transaction of an older holder still open (or finishes one already
//     prepared to commit), and every later produce or commit of that
//     holder fails with PRODUCER_FENCED. A zombie of a failed attempt
//     can therefore not commit anything once the new attempt has opened.
//
// The restore (CommitPending) of writer w's entries is: initialize the
// transactional id (fence), then read the marker with RequireStable (no
// pending transactional offsets), then produce, in order, the entries
// after the one the marker names. The marker it read cannot change
// behind it, since only holders of w's transactional id write it and the
// older ones are fenced; so each entry is produced iff it is not in Kafka,
// exactly once. An entry is in every checkpoint from its seal until a
// PreCommit after its commit, so a restore from any checkpoint that holds
// it commits it if nobody did. If the marker names none of the restored
// entries, none of them is committed: the marker's entry came before the
// oldest of them (a later one would need every restored entry committed
// before it, and the restore checkpoint is the latest completed one).
// Nonces, not epochs, identify entries, so checkpoint ids that repeat after
// a restore cannot mistake a new entry for an old one.
//
// Limits: a restore from a checkpoint older than the latest completed one
// produces again what the newer ones committed (a replay the user asked
// for); the marker groups must not be deleted (their offsets expire with
// the broker's offsets.retention.minutes after the last commit, 7 days by
// default: a job stopped longer than that and restored from a checkpoint
// whose entries were committed produces them again); a transaction must
// end within TransactionTimeout, so an epoch must be produced in that time.
//
// On rescale the states of all old subtasks are spread over the new ones
// (old j to new j mod p); an entry keeps its writer, and CommitPending
// opens that writer's transactional id (fencing its zombies) to commit it.
//
// Without checkpointing, CommitFinal commits everything written as one
// entry at the end of the job.
type Sink struct {
	name                 string
	cfg                  SinkConfig
	subtask, parallelism int
	writer               string // WriterID(job, operator)
	prefix               string
	cl                   *kgo.Client // transactional id of this subtask
	adm                  *kadm.Client
	topicID              [16]byte

	cur    stagedBuf
	closed bool
	// live is the open transaction Write fills with cur's records (nil:
	// none, cur is only staged); lastSeal and epochDur time the epochs
	// (goLive); epochDur starts as the job's checkpoint interval, so that
	// the first epochs go live too.
	live     *txnRecords
	lastSeal time.Time
	epochDur time.Duration

	mu      sync.Mutex // the fields below, shared with the background committer
	pending []*entry   // sealed, not committed; epochs ascending
	// target is the newest completed checkpoint: the committer commits the
	// entries of epochs <= target.
	target int64
	// busy is closed when the committer ends; nil when none runs.
	busy chan struct{}
	err  error // a failed commit: the sink must be restored

	// skipMarkerCheck (tests only) commits restored entries without
	// reading the markers: it shows that the marker is what prevents
	// duplicates.
	skipMarkerCheck bool
	// failHook (tests only) is called at the named points of a commit;
	// an error stops the commit there, as a crash would.
	failHook func(point string, e *entry) error
}

// Commit points at which failHook is called.
const (
	hookProduced = "produced" // records produced, marker not yet
	hookMarked   = "marked"   // marker committed in the transaction, not ended
)

// entry is a sealed epoch of one writer.
type entry struct {
	writer int // the subtask that sealed it
	epoch  int64
	nonce  [16]byte
	n      int    // records
	data   []byte // stagedBuf layout, without the header
	// state is the sink state of this entry alone (encodeEntries of
	// it), the records in place after its header; nil for an entry
	// read from a restored state. Never written after the seal.
	state []byte
	// live is the transaction Write filled with the entry's records as
	// they came (see goLive); nil: the commit produces them.
	live *txnRecords
}

// txnRecords produces records into a transaction of the sink's client,
// allocating their kgo.Records a chunk at a time, and keeps the first
// failure.
type txnRecords struct {
	topic string
	start time.Time // when the transaction began
	// stale: the transaction is too old to go on filling (goLive); its
	// commit aborts it and produces the entry anew. Set by the subtask
	// before the entry is sealed, read by the committer after.
	stale bool
	krs   []kgo.Record

	mu  sync.Mutex
	err error
}

func (p *txnRecords) produce(ctx context.Context, cl *kgo.Client, r abi.Record) {
	if len(p.krs) == 0 {
		p.krs = make([]kgo.Record, 1024)
	}
	kr := &p.krs[0]
	p.krs = p.krs[1:]
	kr.Topic, kr.Value = p.topic, r.Value
	if len(r.Key) > 0 {
		kr.Key = r.Key
	}
	if r.Timestamp != abi.NoTimestamp {
		kr.Timestamp = time.UnixMilli(r.Timestamp)
	}
	kr.Headers = kafkaHeaders(r.Headers)
	cl.Produce(ctx, kr, p.done)
}

func (p *txnRecords) done(_ *kgo.Record, err error) {
	if err == nil {
		return
	}
	p.mu.Lock()
	if p.err == nil {
		p.err = err
	}
	p.mu.Unlock()
}

func (p *txnRecords) failed() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// stagedBuf holds staged records (connector.AppendStaged's layout). The
// records follow stateHeader reserved bytes, where seal writes the header
// of a sink state of one entry (encodeEntries' layout), so that the state
// of a checkpoint whose only pending entry is this one is the buffer
// itself, not a copy.
type stagedBuf struct {
	data []byte // stateHeader bytes, then the records
	n    int
	// hint is the length of the previous epoch's buffer: a new one starts
	// a quarter larger, so that an epoch like the last never moves it.
	hint int
}

// stateHeader is the size of a one-entry sink state's header: version,
// entry count, then the entry's writer, epoch, nonce, record count and
// length.
const stateHeader = 1 + 4 + 4 + 8 + 16 + 4 + 4

// records is the staged records (stagedBuf layout without the header).
func (b *stagedBuf) records() []byte {
	if len(b.data) < stateHeader {
		return nil
	}
	return b.data[stateHeader:]
}

// reserve makes room for extra more bytes. A buffer that must move at
// least doubles (append grows a large one by a quarter, which copied an
// epoch of tens of MB five times over), so the records are copied about
// once more at most.
func (b *stagedBuf) reserve(extra int) {
	if len(b.data) == 0 {
		b.data = make([]byte, stateHeader, max(64<<10, b.hint+b.hint/4, stateHeader+extra))
	}
	if cap(b.data)-len(b.data) >= extra {
		return
	}
	grown := make([]byte, len(b.data), max(2*cap(b.data), len(b.data)+extra))
	copy(grown, b.data)
	b.data = grown
}

func (b *stagedBuf) add(r abi.Record) {
	b.reserve(connector.StagedSize(&r))
	b.data = connector.AppendStaged(b.data, &r)
	b.n++
}

// eachStaged calls fn for every record of data (stagedBuf layout); the
// slices alias data.
func eachStaged(data []byte, fn func(r abi.Record)) error {
	return connector.EachStaged(data, func(r abi.Record) error { fn(r); return nil })
}

// WriterID names a sink operator of a job in its transactional ids and
// marker groups: 16 hex digits of the SHA-256 of job and operator.
func WriterID(job, operator string) string {
	h := sha256.Sum256([]byte(job + "\x00" + operator))
	return hex.EncodeToString(h[:8])
}

// TransactionalID is the transactional id of writer (subtask) of a sink
// operator.
func TransactionalID(prefix, writerID string, writer int) string {
	return prefix + "-" + writerID + "-" + strconv.Itoa(writer)
}

// MarkerGroup is the consumer group holding the marker of writer (subtask)
// of a sink operator.
func MarkerGroup(prefix, writerID string, writer int) string {
	return prefix + "-marker-" + writerID + "-" + strconv.Itoa(writer)
}

const markerPrefix = "streamd-kafka-sink v1 "

func markerMetadata(e *entry) string {
	return fmt.Sprintf("%sepoch=%d nonce=%s records=%d", markerPrefix, e.epoch, hex.EncodeToString(e.nonce[:]), e.n)
}

// markerNonce extracts the nonce of a marker's metadata; "" when it is not
// one of ours.
func markerNonce(meta string) string {
	rest, ok := strings.CutPrefix(meta, markerPrefix)
	if !ok {
		return ""
	}
	for f := range strings.FieldsSeq(rest) {
		if v, ok := strings.CutPrefix(f, "nonce="); ok {
			return v
		}
	}
	return ""
}

// NewSink opens an exactly-once sink subtask (cfg.Delivery must be
// ExactlyOnce or empty); NewAnySink picks by cfg.Delivery. It initializes
// the subtask's transactional id at once, which fences every older holder
// of it.
func NewSink(ctx context.Context, cfg SinkConfig, subtask, parallelism int) (*Sink, error) {
	name := "kafka sink " + cfg.Topic
	if parallelism < 1 || subtask < 0 || subtask >= parallelism {
		return nil, fmt.Errorf("kafka: %s: subtask %d of parallelism %d", name, subtask, parallelism)
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("kafka: %s: %w", name, err)
	}
	if cfg.Delivery == AtLeastOnce {
		return nil, fmt.Errorf("kafka: %s: NewSink is the exactly-once sink; delivery is %s", name, cfg.Delivery)
	}
	if cfg.TransactionalIDPrefix == "" {
		cfg.TransactionalIDPrefix = "streamd"
	}
	if cfg.TransactionTimeout == 0 {
		cfg.TransactionTimeout = 60 * time.Second
	}
	s := &Sink{
		name: name, cfg: cfg, subtask: subtask, parallelism: parallelism,
		writer: WriterID(cfg.Job, cfg.Operator), prefix: cfg.TransactionalIDPrefix,
		target: -1, epochDur: cfg.CheckpointInterval,
	}
	cl, err := s.txnClient(ctx, subtask)
	if err != nil {
		return nil, err
	}
	s.cl, s.adm = cl, kadm.NewClient(cl)
	if err := s.testHooksFromEnv(); err != nil {
		cl.Close()
		return nil, fmt.Errorf("kafka: %s: %w", name, err)
	}
	tds, err := s.adm.ListTopics(ctx, cfg.Topic)
	if err == nil {
		err = tds.Error()
	}
	if err != nil {
		cl.Close()
		return nil, fmt.Errorf("kafka: %s: topic %q: %w", name, cfg.Topic, err)
	}
	s.topicID = tds[cfg.Topic].ID
	return s, nil
}

// txnClient opens the transactional client of writer and initializes its
// producer id: from then on older holders of the id are fenced.
func (s *Sink) txnClient(ctx context.Context, writer int) (*kgo.Client, error) {
	tid := TransactionalID(s.prefix, s.writer, writer)
	cl, err := s.cfg.Client.newClient(
		kgo.TransactionalID(tid),
		kgo.TransactionTimeout(s.cfg.TransactionTimeout),
		kgo.DefaultProduceTopic(s.cfg.Topic),
		kgo.ProducerLinger(0),
	)
	if err != nil {
		return nil, fmt.Errorf("kafka: %s: %w", s.name, err)
	}
	if err := ping(ctx, cl, s.name, s.cfg.Client.Brokers); err != nil {
		cl.Close()
		return nil, err
	}
	ictx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if _, _, err := cl.ProducerID(ictx); err != nil {
		cl.Close()
		return nil, fmt.Errorf("kafka: %s: init transactional id %s: %w", s.name, tid, err)
	}
	return cl, nil
}

// Write stages recs (copied) for the next PreCommit and, while a
// transaction is live (goLive), produces them into it.
func (s *Sink) Write(recs []abi.Record) error {
	if s.closed {
		return fmt.Errorf("kafka: %s subtask %d: write after close", s.name, s.subtask)
	}
	if err := s.goLive(); err != nil {
		return err
	}
	size := 0
	for i := range recs {
		size += connector.StagedSize(&recs[i])
	}
	s.cur.reserve(size)
	at := len(s.cur.data)
	for i := range recs {
		s.cur.add(recs[i])
	}
	if s.live != nil && !s.live.stale && len(s.cur.data) > at {
		// The records alias the staged bytes, which are never changed
		// (an append that moves them leaves the old array as it was).
		_ = eachStaged(s.cur.data[at:], func(r abi.Record) { s.live.produce(context.Background(), s.cl, r) })
	}
	return nil
}

// goLive begins a transaction that Write fills with the current epoch's
// records as they come, so that Kafka takes them while the subtask works
// and the commit is only the flush, the marker and the end of the
// transaction. It begins one when none is live, no entry waits for its
// commit (the transactional id holds one transaction at a time, and the
// entries go in order) and epochs last less than an eighth of
// TransactionTimeout (the transaction stays open until the epoch's
// checkpoint completes): the last epoch as timed from seal to seal, or,
// before two seals, the job's checkpoint interval (CheckpointInterval).
// A live transaction older than a quarter of TransactionTimeout is no
// longer filled: its commit aborts it and produces the entry anew. The transaction holds exactly the records of
// one entry: those staged before it began, then every record written
// until the seal.
func (s *Sink) goLive() error {
	if s.live != nil {
		if !s.live.stale && time.Since(s.live.start) > s.cfg.TransactionTimeout/4 {
			s.live.stale = true
		}
		return nil
	}
	s.mu.Lock()
	idle := s.frequent() && len(s.pending) == 0 && s.busy == nil && s.err == nil
	s.mu.Unlock()
	if !idle {
		return nil
	}
	if err := s.cl.BeginTransaction(); err != nil {
		return fmt.Errorf("kafka: %s subtask %d: begin transaction: %w", s.name, s.subtask, err)
	}
	s.live = &txnRecords{topic: s.cfg.Topic, start: time.Now()}
	return eachStaged(s.cur.records(), func(r abi.Record) { s.live.produce(context.Background(), s.cl, r) })
}

// Flush does nothing: staged records become durable in the checkpoint.
func (s *Sink) Flush() error { return nil }

// frequent reports whether epochs last less than an eighth of
// TransactionTimeout, so a transaction opened before its checkpoint
// completes can wait for it (under mu).
func (s *Sink) frequent() bool {
	return s.epochDur > 0 && s.epochDur <= s.cfg.TransactionTimeout/8
}

// seal makes the staged records an entry of epoch.
func (s *Sink) seal(epoch int64) {
	now := time.Now()
	if !s.lastSeal.IsZero() {
		s.mu.Lock()
		s.epochDur = now.Sub(s.lastSeal)
		s.mu.Unlock()
	}
	s.lastSeal = now
	if s.cur.n == 0 {
		return // nothing to commit: an empty epoch needs no entry (a live transaction has nothing either, and goes on)
	}
	e := &entry{writer: s.subtask, epoch: epoch, n: s.cur.n, data: s.cur.records(), live: s.live}
	s.live = nil
	rand.Read(e.nonce[:])
	e.state = putStateHeader(s.cur.data[:stateHeader], e)[:len(s.cur.data)]
	s.mu.Lock()
	s.pending = append(s.pending, e)
	s.mu.Unlock()
	s.cur = stagedBuf{hint: len(s.cur.data)}
}

// PreCommit seals the records written since the last checkpoint into the
// entry of checkpoint id and returns every entry not committed yet.
func (s *Sink) PreCommit(id int64) ([]byte, error) {
	parts, err := s.PreCommitParts(id)
	switch {
	case err != nil:
		return nil, err
	case len(parts) == 1:
		return parts[0], nil // the usual case, one entry: its staged buffer, no copy
	}
	return slices.Concat(parts...), nil
}

// PreCommitParts is PreCommit with the state in parts
// (connector.PartedSink): the entries' records as they were staged,
// between their headers, never copied. Epochs are staged in tens of MB
// while checkpoints are frequent, and the entries not yet committed are
// in every state, so joining them at each barrier stopped the subtask
// for a copy of all of them.
func (s *Sink) PreCommitParts(id int64) ([][]byte, error) {
	if err := s.failed(); err != nil {
		return nil, err
	}
	s.seal(id)
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.pending) == 1 && s.pending[0].state != nil {
		return [][]byte{s.pending[0].state}, nil
	}
	return entryParts(s.pending), nil
}

// failed is the error of a failed commit, nil while none failed.
func (s *Sink) failed() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// wait waits for the committer, if one runs, and returns the sink's
// error.
func (s *Sink) wait() error {
	s.mu.Lock()
	busy := s.busy
	s.mu.Unlock()
	if busy != nil {
		<-busy
	}
	return s.failed()
}

// Commit has the entries of every epoch <= id produced, each in its own
// transaction with its marker, in order, in the background, after those
// of earlier Commits; it does not wait for them.
func (s *Sink) Commit(id int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return s.err
	}
	s.target = max(s.target, id)
	if s.busy == nil && s.nextToCommit() != nil {
		s.busy = make(chan struct{})
		go s.commitLoop(s.busy)
	}
	return nil
}

// nextToCommit is the head of the pending list when its epoch is <=
// target; nil otherwise (under mu).
func (s *Sink) nextToCommit() *entry {
	if len(s.pending) == 0 || s.pending[0].epoch > s.target {
		return nil
	}
	return s.pending[0]
}

// commitLoop is the committer: it commits the head of the pending list
// until none is due or a commit fails, then closes done.
func (s *Sink) commitLoop(done chan struct{}) {
	defer close(done)
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		e := s.nextToCommit()
		if e == nil && s.err == nil && s.frequent() && len(s.pending) > 0 && s.pending[0].live == nil {
			// The next entry waits for its checkpoint: produce it into
			// its transaction meanwhile; its commit ends it.
			e = s.pending[0]
			s.mu.Unlock()
			p, err := s.produceEntry(context.Background(), s.cl, e)
			s.mu.Lock()
			e.live = p // read by the commit, after this loop's mu
			if err != nil {
				s.err = err
			}
			continue
		}
		if e == nil || s.err != nil {
			s.busy = nil
			return
		}
		s.mu.Unlock()
		err := s.outsideHook(hookCommit, e)
		if err == nil {
			err = s.commitEntry(context.Background(), s.cl, e)
		}
		s.mu.Lock()
		if err != nil {
			s.err = err
		} else {
			s.pending = s.pending[1:] // e: only the committer removes entries
		}
	}
}

// CommitPending commits the entries of a restored checkpoint (PreCommit
// states of this and other old subtasks) that are not in Kafka yet: per
// writer, fence its transactional id, read its marker, produce the entries
// after the marked one. Call it before the first Write.
func (s *Sink) CommitPending(states [][]byte) error {
	byWriter := map[int][]*entry{}
	for _, st := range states {
		es, err := decodeEntries(st)
		if err != nil {
			return fmt.Errorf("kafka: %s subtask %d: restore: %w", s.name, s.subtask, err)
		}
		for _, e := range es {
			byWriter[e.writer] = append(byWriter[e.writer], e)
		}
	}
	ctx := context.Background()
	for _, w := range slices.Sorted(maps.Keys(byWriter)) {
		es := byWriter[w]
		slices.SortStableFunc(es, func(a, b *entry) int { return cmp.Compare(a.epoch, b.epoch) })
		cl := s.cl
		if w != s.subtask {
			var err error
			if cl, err = s.txnClient(ctx, w); err != nil {
				return err
			}
		}
		err := s.commitRestored(ctx, cl, w, es)
		if cl != s.cl {
			cl.Close()
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// commitRestored commits, with writer w's fenced client, the entries of w
// after the one its marker names.
func (s *Sink) commitRestored(ctx context.Context, cl *kgo.Client, w int, es []*entry) error {
	from := 0
	if !s.skipMarkerCheck {
		nonce, err := s.readMarker(ctx, w)
		if err != nil {
			return err
		}
		for i, e := range es {
			if hex.EncodeToString(e.nonce[:]) == nonce {
				from = i + 1
			}
		}
	}
	for _, e := range es[from:] {
		if err := s.commitEntry(ctx, cl, e); err != nil {
			return err
		}
	}
	return nil
}

// readMarker returns the nonce of the last committed entry of writer w;
// "" when it has none.
func (s *Sink) readMarker(ctx context.Context, w int) (string, error) {
	group := MarkerGroup(s.prefix, s.writer, w)
	fctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	for {
		r, err := s.adm.FetchOffsets(kadm.RequireStable(fctx), group)
		if err == nil {
			err = r.Error()
		}
		if errors.Is(err, kerr.UnstableOffsetCommit) || errors.Is(err, kerr.CoordinatorLoadInProgress) {
			select {
			case <-fctx.Done():
				return "", fmt.Errorf("kafka: %s subtask %d: marker group %s: %w", s.name, s.subtask, group, err)
			case <-time.After(50 * time.Millisecond):
				continue
			}
		}
		if errors.Is(err, kerr.GroupIDNotFound) {
			return "", nil // never committed (some brokers answer so, others with no offsets)
		}
		if err != nil {
			return "", fmt.Errorf("kafka: %s subtask %d: read marker group %s: %w", s.name, s.subtask, group, err)
		}
		o, ok := r.Lookup(s.cfg.Topic, 0)
		if !ok || o.At < 0 {
			return "", nil
		}
		return markerNonce(o.Metadata), nil
	}
}

// commitEntry produces e and its marker in one transaction of cl.
func (s *Sink) commitEntry(ctx context.Context, cl *kgo.Client, e *entry) (err error) {
	where := fmt.Sprintf("kafka: %s subtask %d: commit epoch %d of writer %d", s.name, s.subtask, e.epoch, e.writer)
	// Records not acknowledged within the transaction timeout fail the
	// commit (and the subtask) instead of waiting for ever; the restore
	// commits them. (kgo's RecordDeliveryTimeout counts from the record's
	// timestamp, an event time here, so a context bounds it instead.)
	ctx, cancel := context.WithTimeout(ctx, s.cfg.TransactionTimeout)
	defer cancel()
	p := e.live
	if p != nil && (p.stale || time.Since(p.start) > s.cfg.TransactionTimeout/2) {
		// Too old to be sure the broker has not timed it out: abort it,
		// produce the entry anew.
		if err := abortTxn(ctx, cl); err != nil {
			return fmt.Errorf("%s: abort the live transaction: %w", where, err)
		}
		p = nil
	}
	if p == nil {
		if p, err = s.produceEntry(ctx, cl, e); err != nil {
			return fmt.Errorf("%s: %w", where, err)
		}
	}
	ended := false
	defer func() {
		if !ended {
			actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			defer cancel()
			_ = cl.EndTransaction(actx, kgo.TryAbort)
		}
	}()
	if err := cl.Flush(ctx); err != nil {
		return fmt.Errorf("%s: flush: %w", where, err)
	}
	if err := p.failed(); err != nil {
		return fmt.Errorf("%s: produce: %w", where, err)
	}
	if err := s.hook(hookProduced, e, &ended); err != nil {
		return err
	}
	if err := s.commitMarker(ctx, cl, e); err != nil {
		return fmt.Errorf("%s: %w", where, err)
	}
	if err := s.hook(hookMarked, e, &ended); err != nil {
		return err
	}
	ended = true
	if err := cl.EndTransaction(ctx, kgo.TryCommit); err != nil {
		// The outcome is unknown (or the writer is fenced): a restore
		// reads the marker and knows.
		return fmt.Errorf("%s: end transaction: %w", where, err)
	}
	return s.outsideHook(hookCommitted, e)
}

// produceEntry begins a transaction of cl and produces e's records into
// it (their outcome is the returned txnRecords').
func (s *Sink) produceEntry(ctx context.Context, cl *kgo.Client, e *entry) (*txnRecords, error) {
	if err := cl.BeginTransaction(); err != nil {
		return nil, fmt.Errorf("begin transaction: %w", err)
	}
	p := &txnRecords{topic: s.cfg.Topic, start: time.Now()}
	if err := eachStaged(e.data, func(r abi.Record) { p.produce(ctx, cl, r) }); err != nil {
		abortTxn(ctx, cl)
		return nil, err
	}
	return p, nil
}

// abortTxn drops the records cl buffers and aborts its transaction.
func abortTxn(ctx context.Context, cl *kgo.Client) error {
	if err := cl.AbortBufferedRecords(ctx); err != nil {
		return err
	}
	return cl.EndTransaction(ctx, kgo.TryAbort)
}

// hook calls failHook; its error leaves the transaction open, as a crash
// would (the next holder of the transactional id aborts it).
func (s *Sink) hook(point string, e *entry, ended *bool) error {
	if s.failHook == nil {
		return nil
	}
	err := s.failHook(point, e)
	if err != nil {
		*ended = true
	}
	return err
}

// outsideHook calls failHook at a point outside a transaction.
func (s *Sink) outsideHook(point string, e *entry) error {
	if s.failHook == nil {
		return nil
	}
	return s.failHook(point, e)
}

// commitMarker adds writer e.writer's marker group to cl's transaction and
// commits e's marker in it.
func (s *Sink) commitMarker(ctx context.Context, cl *kgo.Client, e *entry) error {
	group := MarkerGroup(s.prefix, s.writer, e.writer)
	pid, epoch, err := cl.ProducerID(ctx)
	if err != nil {
		return fmt.Errorf("producer id: %w", err)
	}
	tid := TransactionalID(s.prefix, s.writer, e.writer)
	err = retryConcurrent(ctx, func() error {
		req := kmsg.NewPtrAddOffsetsToTxnRequest()
		req.TransactionalID, req.ProducerID, req.ProducerEpoch, req.Group = tid, pid, epoch, group
		resp, err := req.RequestWith(ctx, cl)
		if err != nil {
			return err
		}
		return kerr.ErrorForCode(resp.ErrorCode)
	})
	if err != nil {
		return fmt.Errorf("add marker group %s to the transaction: %w", group, err)
	}
	meta := markerMetadata(e)
	return retryConcurrent(ctx, func() error {
		req := kmsg.NewPtrTxnOffsetCommitRequest()
		req.TransactionalID, req.Group, req.ProducerID, req.ProducerEpoch = tid, group, pid, epoch
		req.Generation, req.MemberID = -1, ""
		t := kmsg.NewTxnOffsetCommitRequestTopic()
		t.Topic, t.TopicID = s.cfg.Topic, s.topicID
		p := kmsg.NewTxnOffsetCommitRequestTopicPartition()
		p.Partition, p.Offset, p.LeaderEpoch, p.Metadata = 0, e.epoch, -1, &meta
		t.Partitions = append(t.Partitions, p)
		req.Topics = append(req.Topics, t)
		resp, err := req.RequestWith(ctx, cl)
		if err != nil {
			return err
		}
		for _, rt := range resp.Topics {
			for _, rp := range rt.Partitions {
				if err := kerr.ErrorForCode(rp.ErrorCode); err != nil {
					return fmt.Errorf("marker group %s: %w", group, err)
				}
			}
		}
		return nil
	})
}

// retryConcurrent retries fn while the coordinator answers that another
// transaction step is still in progress.
func retryConcurrent(ctx context.Context, fn func() error) error {
	for i := 0; ; i++ {
		err := fn()
		if i >= 100 || !(errors.Is(err, kerr.ConcurrentTransactions) || errors.Is(err, kerr.CoordinatorLoadInProgress)) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// CommitFinal, without checkpointing, commits everything written as one
// entry.
func (s *Sink) CommitFinal() error {
	if err := s.wait(); err != nil {
		return err
	}
	s.seal(0)
	if err := s.Commit(0); err != nil {
		return err
	}
	return s.wait()
}

// Close waits for the commit running in the background, then releases
// the client; staged and pending records stay in the checkpoints that hold
// them. It returns the error of a failed background commit.
func (s *Sink) Close() error {
	if s.closed {
		return nil
	}
	s.closed = true
	err := s.wait()
	s.mu.Lock()
	if len(s.pending) > 0 && s.pending[0].live != nil {
		s.live = s.pending[0].live // produced ahead of its commit: open
	}
	s.mu.Unlock()
	if s.live != nil {
		// Its records are staged, in no checkpoint yet: the restore
		// replays them. Aborted, the transaction does not hold back
		// read_committed readers until it times out.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_ = abortTxn(ctx, s.cl)
		cancel()
		s.live = nil
	}
	s.cl.Close()
	return err
}

// Pending is the number of sealed entries not committed yet.
func (s *Sink) Pending() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.pending)
}

const entriesVersion = 1

// encodeEntries encodes entries as the sink's checkpoint state: u8
// version, u32 count, then per entry: u32 writer, i64 epoch, 16 bytes nonce,
// u32 records, u32 data length, data (big-endian).
func encodeEntries(es []*entry) []byte { return slices.Concat(entryParts(es)...) }

// entryParts is encodeEntries(es) in parts: the headers, and the
// entries' records in place.
func entryParts(es []*entry) [][]byte {
	hdr := binary.BigEndian.AppendUint32([]byte{entriesVersion}, uint32(len(es)))
	parts := make([][]byte, 0, 2*len(es))
	for _, e := range es {
		hdr = appendEntryHeader(hdr, e)
		parts = append(parts, hdr, e.data)
		hdr = nil
	}
	if len(es) == 0 {
		parts = append(parts, hdr)
	}
	return parts
}

// appendEntryHeader appends e's header in encodeEntries' layout.
func appendEntryHeader(b []byte, e *entry) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(e.writer))
	b = binary.BigEndian.AppendUint64(b, uint64(e.epoch))
	b = append(b, e.nonce[:]...)
	b = binary.BigEndian.AppendUint32(b, uint32(e.n))
	return binary.BigEndian.AppendUint32(b, uint32(len(e.data)))
}

// putStateHeader writes the header of a state of e alone into hdr
// (stateHeader bytes) and returns hdr.
func putStateHeader(hdr []byte, e *entry) []byte {
	b := append(hdr[:0], entriesVersion)
	b = binary.BigEndian.AppendUint32(b, 1)
	return appendEntryHeader(b, e)
}

// decodeEntries decodes encodeEntries' output; the entries alias b.
func decodeEntries(b []byte) ([]*entry, error) {
	bad := func(why string) ([]*entry, error) {
		return nil, fmt.Errorf("kafka: bad sink state: %s", why)
	}
	if len(b) < 5 || b[0] != entriesVersion {
		return bad("no version header")
	}
	n := binary.BigEndian.Uint32(b[1:])
	b = b[5:]
	var out []*entry
	for i := uint32(0); i < n; i++ {
		if len(b) < 36 {
			return bad("truncated")
		}
		e := &entry{writer: int(binary.BigEndian.Uint32(b)), epoch: int64(binary.BigEndian.Uint64(b[4:]))}
		copy(e.nonce[:], b[12:28])
		e.n = int(binary.BigEndian.Uint32(b[28:]))
		l := int(binary.BigEndian.Uint32(b[32:]))
		if len(b)-36 < l {
			return bad("truncated")
		}
		e.data = b[36 : 36+l]
		b = b[36+l:]
		count := 0
		if err := eachStaged(e.data, func(abi.Record) { count++ }); err != nil || count != e.n {
			return bad(fmt.Sprintf("epoch %d of writer %d: records do not parse (%d of %d)", e.epoch, e.writer, count, e.n))
		}
		out = append(out, e)
	}
	if len(b) != 0 {
		return bad("trailing bytes")
	}
	return out, nil
}
