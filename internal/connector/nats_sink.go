package connector

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/internal/natsutil"
)

// NATSSinkOptions configures the nats sink.
type NATSSinkOptions struct {
	Conn    natsutil.ConnectOptions // how to reach NATS (ignored by NewNATSSinkConn)
	Subject string                  // where to publish; a JetStream stream must capture it
	// CommitSubject is the prefix of the sink's commit-marker subjects;
	// default Subject + ".streamd-commit". The stream that captures
	// Subject must capture CommitSubject + ".>" too.
	CommitSubject string
	// Job and Operator name the writer: its commit markers go to
	// CommitSubject.<hash of Job and Operator>.<subtask>. Job must stay the
	// same across the attempts, failovers and restores of one job and
	// differ between jobs (the runtime gives a deployed job's id, or the
	// job's name for streamd run).
	Job, Operator string
	// Direct publishes every record at once, with no commit protocol (jobs
	// without checkpointing: at-least-once across a restart).
	Direct bool
	// MaxPending bounds the Direct publishes awaiting their ack; default 1024.
	MaxPending int
	// AckTimeout bounds the wait for an ack, and a commit's retries while
	// NATS is unreachable; default 30s.
	AckTimeout time.Duration
	// BatchSize is the number of messages in one atomic batch, its commit
	// marker included; default 1000, the server's default max_batch_size
	// (it must not exceed the server's).
	BatchSize int
}

// NATSSink is the exactly-once nats sink of one subtask. A record becomes a
// message on Subject: the value is the payload, a key goes in the
// Streamd-Key header and a timestamp in Streamd-Timestamp.
//
// # Two-phase commit
//
// Write stages records in memory; PreCommit(id) seals the records of the
// epoch that checkpoint id ends into an entry and returns every entry not
// yet committed as the sink's checkpoint state, so the checkpoint holds the
// records themselves. Commit(id), once checkpoint id is complete, publishes
// the entries of epochs <= id; CommitPending publishes, on restore, the
// entries recorded in the restored checkpoint that are not in the stream
// yet. Nothing is published before its checkpoint is durable, so records
// that a failed attempt produced after its last checkpoint never reach the
// stream, whatever order their replay comes in.
//
// An entry is cut, when it is sealed, into batches of at most BatchSize-1
// records (and about 8 MiB); the cut is part of the state. Each batch is
// one JetStream atomic batch (ADR-50) whose last message is a commit marker
// on the writer's marker subject
//
//	<CommitSubject>.<writer>.<subtask>
//
// with the header Streamd-Commit: "<nonce> <batch> <batches>" (nonce: 16
// random bytes, hex, drawn when the entry is sealed) and the header
// Nats-Expected-Last-Subject-Sequence set to the marker subject's last
// sequence as the sink last saw it. So:
//
//   - a batch's records and its marker are stored together or not at all;
//   - a batch is stored only if no other marker was stored on the subject
//     since the sink looked (compare-and-swap), so two tries of a commit (a
//     retry after a lost ack, a restored attempt racing a zombie of the
//     failed one) cannot both store a batch.
//
// Which batches of an entry are stored is read from the stream, not from a
// cache: the markers on the entry's subject after its floor (the subject's
// last sequence known when the entry was sealed; the entry's markers all
// come later). Batch b of nonce n is stored iff a marker "n b" is. A commit
// that is not sure how its last try ended (timeout, disconnect, NATS
// restart, a failed compare-and-swap) reads the markers again and
// continues with the first batch not stored. A try ends as soon as the
// connection it was sent on is lost or re-established (its reply, and
// its atomic batch, went with it), and no try starts while NATS is away,
// so a commit goes on as soon as NATS is back. The batches of one entry, and
// the entries of one state, are published in order, so a marker of a later
// batch or entry also proves the earlier ones (this covers streams whose
// limits keep only the last message per subject).
//
// Exactly-once follows: every staged record is in exactly one batch of one
// entry; an entry is in every checkpoint from its seal until it is
// committed, so a restore from any later checkpoint commits it again; a
// batch is published only after the markers say it is not stored, and the
// compare-and-swap makes "not stored" still true when it is stored; the
// markers are never removed by the sink. No message ids are used: the
// stream's duplicate window plays no part, and a commit retried days later
// publishes nothing twice.
//
// Limits: the markers must stay in the stream (limits that remove a
// writer's last marker, max_age for instance, can make a later retry
// publish again); a restore from a checkpoint older than the latest
// republishes what the newer ones committed (a replay the user asked for);
// an entry of several batches becomes visible batch by batch.
//
// On rescale the states of all old subtasks are spread over the new ones
// (checkpoint.Reassign); an entry keeps its marker subject, so it is
// committed under the writer that sealed it.
//
// Without checkpointing (Direct) records are published as they are
// written and CommitFinal waits for their acks.
type NATSSink struct {
	name                 string
	subject              string
	nc                   *nats.Conn
	ownConn              bool
	js                   jetstream.JetStream
	stream               jetstream.Stream
	streamName           string
	subtask, parallelism int
	job, operator        string
	marker               string // this writer's marker subject
	direct               bool
	maxPending           int
	ackTimeout           time.Duration
	batchSize            int
	maxMsg               int // largest message the server and stream take

	cur     stagedBuf         // records written since the last seal
	pending []*natsEntry      // sealed, not committed; epochs ascending
	known   map[string]uint64 // marker subject -> last sequence seen
	err     error             // a Direct publish failure; every later call returns it
	closed  bool

	// Direct mode.
	futures []jetstream.PubAckFuture // awaiting acks, oldest first
	head    int

	published, acked uint64 // records published in batches; Direct acks

	// failHook, when set (tests), is called before message msg (0-based;
	// msg == batch size is the marker) of batch b of an entry is sent; an
	// error stops the commit there as a crash would.
	failHook func(e *natsEntry, b, msg int) error
}

// stagedBuf holds staged records: per record u32 key length, key, u32
// value length, value, i64 timestamp (big-endian).
type stagedBuf struct {
	data []byte
	n    int
}

// natsEntry is a sealed epoch of one writer.
type natsEntry struct {
	subject string // the marker subject of the writer that sealed it
	floor   uint64 // the marker subject's last sequence when sealed
	epoch   int64  // the checkpoint that sealed it
	nonce   [16]byte
	batches []uint32 // records per batch
	data    []byte   // the records (stagedBuf layout)

	done    int  // batches known to be stored
	recheck bool // done may be stale: read the markers before publishing
}

// Headers of the sink's messages.
const (
	// HeaderCommit marks a commit marker: "<nonce> <batch> <batches>".
	// The nats source skips such messages.
	HeaderCommit = "Streamd-Commit"
	headerEpoch  = "Streamd-Epoch"
)

const (
	defaultNATSBatchSize = 1000
	natsBatchBytes       = 8 << 20 // a batch is cut before it grows past this
	natsFlowEvery        = 100     // every this many messages of a batch wait for an ack
	natsRecordOverhead   = 512     // headers of a record message, bounded
)

// NewNATSSink connects with o.Conn (reconnecting forever, as
// natsutil.KeepReconnecting) and opens a sink subtask.
func NewNATSSink(ctx context.Context, o NATSSinkOptions, subtask, parallelism int) (*NATSSink, error) {
	opts := append(natsutil.KeepReconnecting(), nats.Name(fmt.Sprintf("streamd nats sink %s[%d]", o.Operator, subtask)))
	nc, err := o.Conn.Connect(opts...)
	if err != nil {
		return nil, fmt.Errorf("connector: nats sink %s: %w", o.Subject, err)
	}
	s, err := newNATSSink(ctx, nc, true, o, subtask, parallelism)
	if err != nil {
		nc.Close()
		return nil, err
	}
	return s, nil
}

// NewNATSSinkConn opens a sink subtask over an existing connection, which
// stays the caller's.
func NewNATSSinkConn(ctx context.Context, nc *nats.Conn, o NATSSinkOptions, subtask, parallelism int) (*NATSSink, error) {
	return newNATSSink(ctx, nc, false, o, subtask, parallelism)
}

// DefaultCommitSubject is the commit-marker prefix of a sink publishing to subject.
func DefaultCommitSubject(subject string) string { return subject + ".streamd-commit" }

// NATSWriterSubject is the marker subject of subtask of the nats sink
// operator of job under prefix.
func NATSWriterSubject(prefix, job, operator string, subtask int) string {
	h := sha256.Sum256([]byte(job + "\x00" + operator))
	return prefix + "." + hex.EncodeToString(h[:8]) + "." + strconv.Itoa(subtask)
}

func newNATSSink(ctx context.Context, nc *nats.Conn, own bool, o NATSSinkOptions, subtask, parallelism int) (*NATSSink, error) {
	name := "nats sink " + o.Subject
	if parallelism < 1 || subtask < 0 || subtask >= parallelism {
		return nil, fmt.Errorf("connector: %s: subtask %d of parallelism %d", name, subtask, parallelism)
	}
	if o.Subject == "" {
		return nil, errors.New("connector: nats sink: no subject")
	}
	if o.Job == "" || o.Operator == "" {
		return nil, fmt.Errorf("connector: %s: job and operator are needed to name the writer", name)
	}
	if o.CommitSubject == "" {
		o.CommitSubject = DefaultCommitSubject(o.Subject)
	}
	if o.MaxPending <= 0 {
		o.MaxPending = 1024
	}
	if o.AckTimeout <= 0 {
		o.AckTimeout = 30 * time.Second
	}
	if o.BatchSize <= 0 {
		o.BatchSize = defaultNATSBatchSize
	}
	if o.BatchSize < 2 {
		return nil, fmt.Errorf("connector: %s: batch size %d: a batch needs a record and its marker", name, o.BatchSize)
	}
	// Twice our own bound, so the library never stalls a publish.
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(2*o.MaxPending))
	if err != nil {
		return nil, fmt.Errorf("connector: %s: %w", name, err)
	}
	s := &NATSSink{
		name: name, subject: o.Subject, nc: nc, ownConn: own, js: js,
		subtask: subtask, parallelism: parallelism, job: o.Job, operator: o.Operator,
		marker: NATSWriterSubject(o.CommitSubject, o.Job, o.Operator, subtask),
		direct: o.Direct, maxPending: o.MaxPending, ackTimeout: o.AckTimeout, batchSize: o.BatchSize,
		maxMsg: int(nc.MaxPayload()), known: map[string]uint64{},
	}
	stream, err := js.StreamNameBySubject(ctx, o.Subject)
	if err != nil {
		return nil, fmt.Errorf("connector: %s: no JetStream stream captures the subject: %w", name, err)
	}
	s.streamName = stream
	if o.Direct {
		return s, nil
	}
	if s.stream, err = js.Stream(ctx, stream); err != nil {
		return nil, fmt.Errorf("connector: %s: stream %s: %w", name, stream, err)
	}
	cfg := s.stream.CachedInfo().Config
	if err := checkSinkStream(ctx, js, &cfg, s.marker, o.CommitSubject); err != nil {
		return nil, fmt.Errorf("connector: %s: %w", name, err)
	}
	if cfg.MaxMsgSize > 0 && int(cfg.MaxMsgSize) < s.maxMsg {
		s.maxMsg = int(cfg.MaxMsgSize)
	}
	if _, err := s.lastMarker(ctx, s.marker); err != nil {
		return nil, err
	}
	return s, nil
}

// checkSinkStream checks that the stream of cfg, which captures a nats
// sink's subject, allows atomic publish and captures marker, a commit-marker
// subject under commitPrefix.
func checkSinkStream(ctx context.Context, js jetstream.JetStream, cfg *jetstream.StreamConfig, marker, commitPrefix string) error {
	if !cfg.AllowAtomicPublish {
		return fmt.Errorf("stream %s does not allow atomic publish; the sink commits each checkpoint's records in atomic batches: set allow_atomic (AllowAtomicPublish) in the stream's configuration", cfg.Name)
	}
	if ms, err := js.StreamNameBySubject(ctx, marker); err != nil || ms != cfg.Name {
		return fmt.Errorf("stream %s does not capture the commit subject %s.>; add it to the stream's subjects, or set commit_subject to a prefix the stream captures", cfg.Name, commitPrefix)
	}
	return nil
}

// Marker is the subtask's commit-marker subject.
func (s *NATSSink) Marker() string { return s.marker }

// Write stages recs (Direct: publishes them, waiting for old acks when
// MaxPending are outstanding). A record that cannot fit in one message is
// refused here, before a checkpoint could hold it.
func (s *NATSSink) Write(recs []abi.Record) error {
	if s.err != nil {
		return s.err
	}
	if s.closed {
		return fmt.Errorf("connector: %s: write after close", s.name)
	}
	// Every record is checked before any is staged or sent.
	for i := range recs {
		r := &recs[i]
		if size := natsRecordSize(r.Key, r.Value, r.Headers); size > s.maxMsg {
			return fmt.Errorf("connector: %s: a record of %d bytes (key %d, value %d, headers %d) does not fit in a message of the stream %s (at most %d bytes with headers)",
				s.name, abi.RecordBytes(*r), len(r.Key), len(r.Value), len(r.Headers), s.streamName, s.maxMsg)
		}
		if err := checkNATSHeaders(r.Headers); err != nil {
			return fmt.Errorf("connector: %s: record %d of the batch: %w", s.name, i, err)
		}
	}
	for i := range recs {
		r := &recs[i]
		if s.direct {
			if err := s.publishDirect(r); err != nil {
				return err
			}
			continue
		}
		s.cur.data = AppendStaged(s.cur.data, r)
		s.cur.n++
	}
	return nil
}

// natsRecordSize bounds the size of a record's message: key, value, its
// headers as NATS headers (a name, ": ", a value and CRLF each) and the
// sink's own headers.
func natsRecordSize(key, value, headers []byte) int {
	return len(key) + len(value) + len(headers) + natsRecordOverhead
}

// checkNATSHeaders refuses a record header that NATS cannot carry, or that
// would change what the sink or JetStream do: an empty name, a name with a
// colon, a space or a control character, a value with a line break, and
// the names of streamd's and NATS' own headers (Streamd-*, Nats-*).
func checkNATSHeaders(h []byte) error {
	if len(h) == 0 {
		return nil
	}
	if err := abi.CheckHeaders(h); err != nil {
		return err
	}
	var bad error
	abi.EachHeader(h, func(name, value []byte) bool {
		switch {
		case len(name) == 0:
			bad = errors.New("a header without a name cannot be a NATS header")
		case bytes.ContainsFunc(name, func(r rune) bool { return r == ':' || r <= ' ' || r == 0x7f }):
			bad = fmt.Errorf("header name %q cannot be a NATS header name (no colon, space or control character)", name)
		case reservedHeader(string(name)):
			bad = fmt.Errorf("header %q: names starting with Streamd- or Nats- are the sink's and NATS' own", name)
		case bytes.ContainsAny(value, "\r\n"):
			bad = fmt.Errorf("header %q: a NATS header value cannot hold a line break", name)
		}
		return bad == nil
	})
	return bad
}

// reservedHeader reports whether a header called name is streamd's or
// NATS' own (Streamd-*, Nats-*, any case): a nats source does not make it
// a record header, and a nats sink refuses a record header of that name.
func reservedHeader(name string) bool {
	return hasPrefixFold(name, "Streamd-") || hasPrefixFold(name, "Nats-")
}

func hasPrefixFold(s, prefix string) bool {
	return len(s) >= len(prefix) && strings.EqualFold(s[:len(prefix)], prefix)
}

// recordMsg is the message of a record: its value, and its key, timestamp
// and headers as headers (checked by checkNATSHeaders).
func (s *NATSSink) recordMsg(key, value []byte, ts int64, headers []byte) *nats.Msg {
	m := &nats.Msg{Subject: s.subject, Data: value, Header: nats.Header{}}
	if len(key) > 0 {
		m.Header.Set(HeaderKey, string(key))
	}
	if ts != abi.NoTimestamp {
		m.Header.Set(HeaderTimestamp, strconv.FormatInt(ts, 10))
	}
	abi.EachHeader(headers, func(name, value []byte) bool {
		m.Header.Add(string(name), string(value))
		return true
	})
	return m
}

func (s *NATSSink) publishDirect(r *abi.Record) error {
	if len(s.futures)-s.head >= s.maxPending {
		if err := s.waitOldest(time.Now().Add(s.ackTimeout)); err != nil {
			return err
		}
	}
	f, err := s.js.PublishMsgAsync(s.recordMsg(r.Key, r.Value, r.Timestamp, r.Headers))
	if err != nil {
		s.err = fmt.Errorf("connector: %s: publish: %w", s.name, err)
		return s.err
	}
	s.futures = append(s.futures, f)
	return nil
}

// waitOldest waits for the ack of the oldest outstanding Direct publish.
func (s *NATSSink) waitOldest(deadline time.Time) error {
	f := s.futures[s.head]
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case <-f.Ok():
		s.acked++
	case err := <-f.Err():
		s.err = fmt.Errorf("connector: %s: publish: %w", s.name, err)
		return s.err
	case <-t.C:
		s.err = fmt.Errorf("connector: %s: no ack within %s", s.name, s.ackTimeout)
		return s.err
	}
	s.futures[s.head] = nil
	if s.head++; s.head == len(s.futures) {
		s.futures, s.head = s.futures[:0], 0
	}
	return nil
}

// Flush waits for the acks of the Direct publishes. Staged records become
// durable in the checkpoint (PreCommit), not here.
func (s *NATSSink) Flush() error {
	if s.err != nil {
		return s.err
	}
	deadline := time.Now().Add(s.ackTimeout)
	for s.head < len(s.futures) {
		if err := s.waitOldest(deadline); err != nil {
			return err
		}
	}
	return nil
}

// seal turns the staged records into the entry of epoch id.
func (s *NATSSink) seal(id int64) error {
	if s.cur.n == 0 {
		return nil
	}
	e := &natsEntry{subject: s.marker, floor: s.known[s.marker], epoch: id, data: s.cur.data}
	if _, err := rand.Read(e.nonce[:]); err != nil {
		return fmt.Errorf("connector: %s: nonce: %w", s.name, err)
	}
	var n, bytes uint32
	err := EachStaged(e.data, func(r abi.Record) error {
		sz := uint32(natsRecordSize(r.Key, r.Value, r.Headers))
		if n > 0 && (int(n) == s.batchSize-1 || bytes+sz > natsBatchBytes) {
			e.batches = append(e.batches, n)
			n, bytes = 0, 0
		}
		n++
		bytes += sz
		return nil
	})
	if err != nil {
		return err
	}
	e.batches = append(e.batches, n)
	s.pending = append(s.pending, e)
	s.cur = stagedBuf{}
	return nil
}

const natsSinkStateV2 = 2

// PreCommit seals the records written since the last checkpoint as the
// entry of epoch id and returns the sink's checkpoint state: every entry
// not committed yet (format in encodeNATSState).
func (s *NATSSink) PreCommit(id int64) ([]byte, error) {
	if s.direct {
		return nil, fmt.Errorf("connector: %s: a checkpoint of a sink opened without checkpointing (Direct)", s.name)
	}
	if err := s.seal(id); err != nil {
		return nil, err
	}
	return encodeNATSState(s.pending), nil
}

// encodeNATSState: u8 version (2), u32 entry count, then per entry: u16
// length + marker subject, u64 floor, i64 epoch, 16 bytes nonce, u32 batch
// count, u32 records per batch, u64 length + records (per record: u32
// length + key, u32 length + value, i64 timestamp); big-endian.
func encodeNATSState(es []*natsEntry) []byte {
	size := 5
	for _, e := range es {
		size += 2 + len(e.subject) + 8 + 8 + 16 + 4 + 4*len(e.batches) + 8 + len(e.data)
	}
	b := make([]byte, 0, size)
	b = append(b, natsSinkStateV2)
	b = binary.BigEndian.AppendUint32(b, uint32(len(es)))
	for _, e := range es {
		b = binary.BigEndian.AppendUint16(b, uint16(len(e.subject)))
		b = append(b, e.subject...)
		b = binary.BigEndian.AppendUint64(b, e.floor)
		b = binary.BigEndian.AppendUint64(b, uint64(e.epoch))
		b = append(b, e.nonce[:]...)
		b = binary.BigEndian.AppendUint32(b, uint32(len(e.batches)))
		for _, n := range e.batches {
			b = binary.BigEndian.AppendUint32(b, n)
		}
		b = binary.BigEndian.AppendUint64(b, uint64(len(e.data)))
		b = append(b, e.data...)
	}
	return b
}

// natsSinkStateV1Len is the length of the state of the sink before
// version 2, which published at once: nothing of it is left to commit.
const natsSinkStateV1Len = 1 + 8 + 8 + 8 + 4 + 4

// decodeNATSState decodes encodeNATSState's output; the entries alias b.
func decodeNATSState(b []byte) ([]*natsEntry, error) {
	bad := func(why string) ([]*natsEntry, error) {
		return nil, fmt.Errorf("bad nats sink state: %s", why)
	}
	if len(b) == natsSinkStateV1Len && b[0] == 1 {
		return nil, nil
	}
	if len(b) < 5 || b[0] != natsSinkStateV2 {
		return bad("no version header")
	}
	n := binary.BigEndian.Uint32(b[1:])
	b = b[5:]
	var out []*natsEntry
	for i := uint32(0); i < n; i++ {
		if len(b) < 2 {
			return bad("truncated")
		}
		l := int(binary.BigEndian.Uint16(b))
		if len(b) < 2+l+8+8+16+4 {
			return bad("truncated")
		}
		e := &natsEntry{subject: string(b[2 : 2+l])}
		b = b[2+l:]
		if !validPublishSubject(e.subject) {
			return bad(fmt.Sprintf("marker subject %q", e.subject))
		}
		e.floor = binary.BigEndian.Uint64(b)
		e.epoch = int64(binary.BigEndian.Uint64(b[8:]))
		copy(e.nonce[:], b[16:32])
		nb := binary.BigEndian.Uint32(b[32:])
		b = b[36:]
		if uint64(len(b)) < 4*uint64(nb)+8 || nb == 0 {
			return bad("truncated batches")
		}
		var total uint64
		for j := uint32(0); j < nb; j++ {
			e.batches = append(e.batches, binary.BigEndian.Uint32(b))
			total += uint64(e.batches[j])
			b = b[4:]
		}
		dl := binary.BigEndian.Uint64(b)
		b = b[8:]
		if uint64(len(b)) < dl {
			return bad("truncated records")
		}
		e.data = b[:dl:dl]
		b = b[dl:]
		var cnt uint64
		if err := EachStaged(e.data, func(abi.Record) error { cnt++; return nil }); err != nil {
			return bad(err.Error())
		}
		if cnt != total {
			return bad(fmt.Sprintf("%d records for batches of %d", cnt, total))
		}
		out = append(out, e)
	}
	if len(b) != 0 {
		return bad("trailing bytes")
	}
	return out, nil
}

func validPublishSubject(s string) bool {
	if s == "" || strings.ContainsAny(s, " \t\r\n*>") || strings.HasPrefix(s, ".") || strings.HasSuffix(s, ".") {
		return false
	}
	return !strings.Contains(s, "..")
}

// Commit publishes the entries of every checkpoint <= id.
func (s *NATSSink) Commit(id int64) error {
	if s.err != nil {
		return s.err
	}
	ctx := context.Background()
	for len(s.pending) > 0 && s.pending[0].epoch <= id {
		if err := s.commitEntry(ctx, s.pending[0]); err != nil {
			return err
		}
		s.pending[0] = nil
		s.pending = s.pending[1:]
	}
	return nil
}

// CommitPending publishes what the entries of the restored states (of this
// or other subtasks, of this or an earlier run) have not yet put in the
// stream. It is idempotent and is called before the first Write.
func (s *NATSSink) CommitPending(states [][]byte) error {
	if s.direct {
		return nil
	}
	ctx := context.Background()
	var chains [][]*natsEntry
	floors := map[string]uint64{} // marker subject -> lowest floor
	for _, st := range states {
		es, err := decodeNATSState(st)
		if err != nil {
			return fmt.Errorf("connector: %s subtask %d: restore: %w", s.name, s.subtask, err)
		}
		for _, e := range es {
			if f, ok := floors[e.subject]; !ok || e.floor < f {
				floors[e.subject] = e.floor
			}
		}
		chains = append(chains, es)
	}
	progress := map[string]map[[16]byte]int{}
	for subj, floor := range floors {
		p, err := s.scanMarkers(ctx, subj, floor)
		if err != nil {
			return err
		}
		progress[subj] = p
	}
	for _, es := range chains {
		for i, e := range es {
			e.done = min(progress[e.subject][e.nonce], len(e.batches))
			if e.done > 0 {
				// Published in order: a later entry's marker proves the earlier ones.
				for _, p := range es[:i] {
					p.done = len(p.batches)
				}
			}
		}
		for _, e := range es {
			if err := s.commitEntry(ctx, e); err != nil {
				return err
			}
		}
	}
	return nil
}

// CommitFinal, without checkpointing, waits for the acks of everything
// written (Direct); a staged sink publishes what it staged.
func (s *NATSSink) CommitFinal() error {
	if s.direct {
		return s.Flush()
	}
	var epoch int64
	if len(s.pending) > 0 {
		epoch = s.pending[len(s.pending)-1].epoch + 1
	}
	if err := s.seal(epoch); err != nil {
		return err
	}
	return s.Commit(epoch)
}

// errPermanent wraps a publish error that a retry cannot fix.
type errPermanent struct{ error }

func (e errPermanent) Unwrap() error { return e.error }

// errWrongLast: the marker subject moved since the sink looked.
var errWrongLast = errors.New("another commit marker was stored meanwhile")

// errConnLost: the connection to NATS broke (or was re-established) during
// a request, so its reply will not come; an atomic batch is also lost with
// the connection it was started on.
var errConnLost = errors.New("connection to NATS lost")

// natsConnPoll is how often a request in flight checks its connection.
const natsConnPoll = 20 * time.Millisecond

// requestTimeout bounds one request of a commit: a sixth of the ack
// timeout, at least 2s (never more than the ack timeout). A reply can be
// lost without the connection breaking (NATS replies are at most once);
// the commit then reads the markers and retries within its ack timeout,
// which the markers and the expected last sequence make safe, instead of
// spending the whole ack timeout on the one lost reply.
func (s *NATSSink) requestTimeout() time.Duration {
	return min(s.ackTimeout, max(s.ackTimeout/6, 2*time.Second))
}

// callCtx bounds one request: requestTimeout, or until the connection is
// lost or reconnected after session (a Stats().Reconnects), whichever is
// first. A reply lost with a connection is then retried when NATS is back,
// not after a whole ack timeout.
func (s *NATSSink) callCtx(ctx context.Context, session uint64) (context.Context, context.CancelFunc) {
	ctx, cancelTimeout := context.WithTimeout(ctx, s.requestTimeout())
	ctx, cancel := context.WithCancelCause(ctx)
	go func() {
		t := time.NewTicker(natsConnPoll)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if !s.nc.IsConnected() || s.nc.Stats().Reconnects != session {
					cancel(errConnLost)
					return
				}
			}
		}
	}()
	return ctx, func() { cancel(nil); cancelTimeout() }
}

// callErr names the cause of err when callCtx's ctx ended it.
func callErr(ctx context.Context, err error) error {
	if err != nil && ctx.Err() != nil {
		cause := context.Cause(ctx)
		if errors.Is(cause, errConnLost) {
			return fmt.Errorf("%w: %w", errConnLost, err)
		}
		if errors.Is(cause, context.DeadlineExceeded) {
			return fmt.Errorf("no reply from NATS in time: %w", err)
		}
	}
	return err
}

// commitEntry publishes the batches of e not stored yet, reading the
// markers again whenever it cannot be sure where the stream is.
func (s *NATSSink) commitEntry(ctx context.Context, e *natsEntry) error {
	deadline := time.Now().Add(s.ackTimeout)
	backoff := 50 * time.Millisecond
	var lastErr error
	for e.done < len(e.batches) {
		if !s.nc.IsConnected() {
			if s.nc.IsClosed() {
				return fmt.Errorf("connector: %s: commit of epoch %d: %w", s.name, e.epoch, nats.ErrConnectionClosed)
			}
			// Reconnecting: a try now would only fill the reconnect
			// buffer with a batch the next server does not know.
			lastErr, e.recheck = errConnLost, true
		} else if e.recheck {
			p, err := s.scanMarkers(ctx, e.subject, e.floor)
			if err == nil {
				e.done, e.recheck = max(e.done, min(p[e.nonce], len(e.batches))), false
				continue
			}
			lastErr = err
		} else {
			err := s.publishBatch(ctx, e, e.done, s.known[e.subject])
			if err == nil {
				e.done++
				continue
			}
			var perm errPermanent
			if errors.As(err, &perm) || s.closed {
				return err
			}
			lastErr, e.recheck = err, true
			if errors.Is(err, errWrongLast) {
				continue // no wait: read the markers and go on
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("connector: %s: commit of epoch %d (batch %d of %d) not done within %s: %w", s.name, e.epoch, e.done+1, len(e.batches), s.ackTimeout, lastErr)
		}
		time.Sleep(backoff)
		backoff = min(2*backoff, time.Second)
	}
	return nil
}

// publishBatch publishes batch b of e as one atomic batch closed by its
// marker, expecting the marker subject's last sequence to be expect.
func (s *NATSSink) publishBatch(ctx context.Context, e *natsEntry, b int, expect uint64) error {
	first := 0
	for _, n := range e.batches[:b] {
		first += int(n)
	}
	count := int(e.batches[b])
	var idb [12]byte
	rand.Read(idb[:])
	batchID := hex.EncodeToString(idb[:])
	session := s.nc.Stats().Reconnects // the batch lives on this connection only
	seq, i := 0, 0
	send := func(m *nats.Msg, commit bool) ([]byte, error) {
		seq++
		m.Header.Set("Nats-Batch-Id", batchID)
		m.Header.Set("Nats-Batch-Sequence", strconv.Itoa(seq))
		if commit {
			m.Header.Set("Nats-Batch-Commit", "1")
		}
		if commit || seq == 1 || seq%natsFlowEvery == 0 {
			rctx, cancel := s.callCtx(ctx, session)
			defer cancel()
			r, err := s.nc.RequestMsgWithContext(rctx, m)
			if err != nil {
				return nil, callErr(rctx, err)
			}
			return r.Data, nil
		}
		if s.nc.Stats().Reconnects != session {
			return nil, errConnLost
		}
		return nil, s.nc.PublishMsg(m)
	}
	var stop = errors.New("stop")
	err := EachStaged(e.data, func(r abi.Record) error {
		j := i
		i++
		if j < first {
			return nil
		}
		if j >= first+count {
			return stop
		}
		if s.failHook != nil {
			if err := s.failHook(e, b, j-first); err != nil {
				return errPermanent{err}
			}
		}
		reply, err := send(s.recordMsg(r.Key, r.Value, r.Timestamp, r.Headers), false)
		if err != nil {
			return err
		}
		if len(reply) > 0 {
			if _, err := s.parseAck(reply, e, b); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil && err != stop {
		return err
	}
	if s.failHook != nil {
		if err := s.failHook(e, b, count); err != nil {
			return errPermanent{err}
		}
	}
	body, _ := json.Marshal(map[string]any{"job": s.job, "operator": s.operator, "epoch": e.epoch, "batch": b, "batches": len(e.batches), "records": count})
	m := &nats.Msg{Subject: e.subject, Data: body, Header: nats.Header{}}
	m.Header.Set(HeaderCommit, hex.EncodeToString(e.nonce[:])+" "+strconv.Itoa(b)+" "+strconv.Itoa(len(e.batches)))
	m.Header.Set(headerEpoch, strconv.FormatInt(e.epoch, 10))
	m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(expect, 10))
	reply, err := send(m, true)
	if err != nil {
		return err
	}
	ack, err := s.parseAck(reply, e, b)
	if err != nil {
		return err
	}
	if ack.Seq == 0 {
		return fmt.Errorf("connector: %s: commit of epoch %d batch %d: no sequence in the ack %q", s.name, e.epoch, b, reply)
	}
	s.known[e.subject] = ack.Seq
	s.published += uint64(count)
	return nil
}

// batchAck is JetStream's reply to a batch message.
type batchAck struct {
	Stream string `json:"stream"`
	Seq    uint64 `json:"seq"`
	Count  int    `json:"count"`
	Error  *struct {
		Code        int    `json:"code"`
		ErrCode     int    `json:"err_code"`
		Description string `json:"description"`
	} `json:"error"`
}

// JetStream error codes the sink tells apart.
const (
	jsErrWrongLastSeq      = 10071
	jsErrWrongLastSeqConst = 10164
	jsErrAtomicDisabled    = 10174
	jsErrBatchTooLarge     = 10199
	jsErrMsgTooLarge       = 10054
	jsErrUnsupportedHeader = 10177
)

func (s *NATSSink) parseAck(reply []byte, e *natsEntry, b int) (*batchAck, error) {
	var ack batchAck
	if err := json.Unmarshal(reply, &ack); err != nil {
		return nil, fmt.Errorf("connector: %s: commit of epoch %d batch %d: bad reply %q: %w", s.name, e.epoch, b, reply, err)
	}
	if ack.Error == nil {
		return &ack, nil
	}
	err := fmt.Errorf("connector: %s: commit of epoch %d batch %d of %d to stream %s: %s (JetStream error %d)",
		s.name, e.epoch, b+1, len(e.batches), s.streamName, ack.Error.Description, ack.Error.ErrCode)
	switch ack.Error.ErrCode {
	case jsErrWrongLastSeq, jsErrWrongLastSeqConst:
		return nil, fmt.Errorf("%w: %w", errWrongLast, err)
	case jsErrAtomicDisabled:
		return nil, errPermanent{fmt.Errorf("%w; set allow_atomic (AllowAtomicPublish) in the stream's configuration", err)}
	case jsErrBatchTooLarge:
		return nil, errPermanent{fmt.Errorf("%w; the server's max_batch_size is lower than the sink's batch size %d", err, s.batchSize)}
	case jsErrMsgTooLarge, jsErrUnsupportedHeader:
		return nil, errPermanent{err}
	}
	return nil, err
}

// lastMarker reads the last sequence of a marker subject (0: none) and
// remembers it.
func (s *NATSSink) lastMarker(ctx context.Context, subj string) (uint64, error) {
	ctx, cancel := s.callCtx(ctx, s.nc.Stats().Reconnects)
	defer cancel()
	m, err := s.stream.GetLastMsgForSubject(ctx, subj)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		s.known[subj] = 0
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("connector: %s: read the commit marker %s: %w", s.name, subj, callErr(ctx, err))
	}
	s.known[subj] = m.Sequence
	return m.Sequence, nil
}

// scanMarkers reads the markers of subj after floor and returns, per
// nonce, how many batches are stored (one more than the highest batch
// index seen).
func (s *NATSSink) scanMarkers(ctx context.Context, subj string, floor uint64) (map[[16]byte]int, error) {
	last, err := s.lastMarker(ctx, subj)
	if err != nil {
		return nil, err
	}
	done := map[[16]byte]int{}
	for seq := floor + 1; seq <= last; {
		gctx, cancel := s.callCtx(ctx, s.nc.Stats().Reconnects)
		m, err := s.stream.GetMsg(gctx, seq, jetstream.WithGetMsgSubject(subj))
		err = callErr(gctx, err)
		cancel()
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("connector: %s: read the commit markers %s: %w", s.name, subj, err)
		}
		if nonce, b, ok := parseCommitHeader(m.Header.Get(HeaderCommit)); ok {
			done[nonce] = max(done[nonce], b+1)
		}
		seq = m.Sequence + 1
	}
	return done, nil
}

// parseCommitHeader parses "<nonce hex> <batch> <batches>".
func parseCommitHeader(h string) (nonce [16]byte, batch int, ok bool) {
	f := strings.Fields(h)
	if len(f) != 3 {
		return nonce, 0, false
	}
	n, err := hex.DecodeString(f[0])
	if err != nil || len(n) != 16 {
		return nonce, 0, false
	}
	copy(nonce[:], n)
	batch, err = strconv.Atoi(f[1])
	return nonce, batch, err == nil && batch >= 0
}

// Published counts the records this sink published in committed batches.
func (s *NATSSink) Published() uint64 { return s.published }

// Pending is the number of sealed entries not committed yet.
func (s *NATSSink) Pending() int { return len(s.pending) }

// Close closes the connection if the sink made it. Staged and pending
// records stay in the checkpoints that hold them; what was staged after the
// last checkpoint is dropped (a restore replays it).
func (s *NATSSink) Close() error {
	if s.closed {
		return nil
	}
	s.closed = true
	if s.ownConn {
		s.nc.Close()
	}
	return nil
}

var _ TwoPhaseSink = (*NATSSink)(nil)
