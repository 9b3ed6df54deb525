package connector

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/internal/natsutil"
	"github.com/streamd/streamd/internal/roundrobin"
)

// Headers the NATS connectors read and write.
const (
	// HeaderKey carries a record's key (absent: no key).
	HeaderKey = "Streamd-Key"
	// HeaderTimestamp carries a record's event time in ms, as a decimal
	// integer (absent: the source uses the message's stream time).
	HeaderTimestamp = "Streamd-Timestamp"
)

// Where the NATS source takes a record's key from.
const (
	KeyFromHeader  = "header"  // the Streamd-Key header; no key without it
	KeyFromSubject = "subject" // the last token of the message's subject
)

// NATSSourceOptions configures the nats source.
type NATSSourceOptions struct {
	Conn    natsutil.ConnectOptions // how to reach NATS (ignored by NewNATSSourceConn)
	Stream  string                  // the JetStream stream to read
	Subject string                  // filter subject (wildcards allowed); "" = every message of the stream
	// Bounded: read up to the last stream sequence present when the source
	// first started (kept in the position, so a restored source stops at the
	// same place), then end. Otherwise read forever.
	Bounded bool
	KeyFrom string // KeyFromHeader (default) or KeyFromSubject
	// WatermarkLag: the watermark is the largest timestamp read minus this.
	WatermarkLag time.Duration
	// TimestampField: the event time is this JSON field of the payload (a
	// number of ms or an RFC 3339 string) instead of the header or the
	// stream time; a message without a valid one fails Read, naming the
	// stream and sequence.
	TimestampField string
	// Start is where a source without a position starts (the zero value:
	// the first message); a position resumes where it says instead.
	Start NATSStart
}

// NATSSource reads a JetStream stream with an ordered consumer (ephemeral,
// no acks, redelivery-free: it recreates itself on a gap). The record value is
// the payload; the key comes from the Streamd-Key header or the subject's last
// token (KeyFrom); the timestamp from the Streamd-Timestamp header, else the
// message's stream time in ms.
//
// With parallelism p every subtask reads the whole stream and subtask i keeps
// the messages whose stream sequence is i modulo p (like FileSource with
// lines). The position is the next stream sequence to read (and the bound of
// a bounded source); resuming starts the consumer there. Without a position
// the source starts at Start, resolved to a stream sequence when it opens
// (each subtask resolves new and time: itself, when it opens).
type NATSSource struct {
	name                 string
	nc                   *nats.Conn
	ownConn              bool
	subtask, parallelism int
	keyFromSubject       bool
	lag                  int64

	next     uint64 // next stream sequence to read
	bounded  bool
	bound    uint64 // bounded: last sequence to read
	restored bool
	eof      bool
	// skip: the sequences subtasks before a rescale read (an n that
	// Covers), until the subtask is past them.
	skip roundrobin.Layers

	cc   jetstream.ConsumeContext
	msgs chan jetstream.Msg
	done chan struct{}

	mu      sync.Mutex
	lastErr error // last error reported by the consumer (informational)

	// pending is the source lag (Lag): the messages of the stream (matching
	// the filter) after the last one read, as the server counted when it
	// delivered that one; -1 while unknown.
	pending atomic.Int64

	et     EventTime
	stream string
	// headers holds the records' header blocks.
	headers HeaderArena
}

// NewNATSSource connects with o.Conn and opens a source subtask; pos is nil
// to start at the beginning of the stream, or a Position() to resume from.
func NewNATSSource(ctx context.Context, o NATSSourceOptions, subtask, parallelism int, pos []byte) (*NATSSource, error) {
	nc, err := o.Conn.Connect(nats.Name(fmt.Sprintf("streamd nats source %s[%d]", o.Stream, subtask)))
	if err != nil {
		return nil, fmt.Errorf("connector: nats source %s: %w", o.Stream, err)
	}
	s, err := newNATSSource(ctx, nc, true, o, subtask, parallelism, pos)
	if err != nil {
		nc.Close()
		return nil, err
	}
	return s, nil
}

// NewNATSSourceConn opens a source subtask over an existing connection,
// which stays the caller's.
func NewNATSSourceConn(ctx context.Context, nc *nats.Conn, o NATSSourceOptions, subtask, parallelism int, pos []byte) (*NATSSource, error) {
	return newNATSSource(ctx, nc, false, o, subtask, parallelism, pos)
}

const natsPositionLen = 18 // version, flags, next sequence, bound

func newNATSSource(ctx context.Context, nc *nats.Conn, own bool, o NATSSourceOptions, subtask, parallelism int, pos []byte) (*NATSSource, error) {
	name := "nats source " + o.Stream
	if o.Subject != "" {
		name += " (" + o.Subject + ")"
	}
	if parallelism < 1 || subtask < 0 || subtask >= parallelism {
		return nil, fmt.Errorf("connector: %s: subtask %d of parallelism %d", name, subtask, parallelism)
	}
	if o.Stream == "" {
		return nil, fmt.Errorf("connector: nats source: no stream")
	}
	switch o.KeyFrom {
	case "", KeyFromHeader, KeyFromSubject:
	default:
		return nil, fmt.Errorf("connector: %s: key from %q, want %q or %q", name, o.KeyFrom, KeyFromHeader, KeyFromSubject)
	}
	if o.WatermarkLag < 0 {
		return nil, fmt.Errorf("connector: %s: negative watermark lag %s", name, o.WatermarkLag)
	}
	s := &NATSSource{
		name: name, nc: nc, ownConn: own, subtask: subtask, parallelism: parallelism,
		keyFromSubject: o.KeyFrom == KeyFromSubject,
		et:             EventTime{Field: o.TimestampField, Lag: o.WatermarkLag.Milliseconds()},
		next:           1, stream: o.Stream,
		msgs: make(chan jetstream.Msg, 1024), done: make(chan struct{}),
	}
	s.pending.Store(-1)
	if pos != nil {
		var bounded bool
		var err error
		if bounded, s.next, s.bound, s.skip, err = parseNATSPosition(pos); err != nil {
			return nil, fmt.Errorf("connector: %s: %w", name, err)
		}
		s.restored = true
		if bounded != o.Bounded {
			return nil, fmt.Errorf("connector: %s: position %x is of a %s source, this one is %s", name, pos, boundedName(bounded), boundedName(o.Bounded))
		}
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("connector: %s: %w", name, err)
	}
	stream, err := js.Stream(ctx, o.Stream)
	if err != nil {
		return nil, fmt.Errorf("connector: %s: %w", name, err)
	}
	var filter []string
	if o.Subject != "" {
		filter = []string{o.Subject}
	}
	if !s.restored {
		if s.next, err = startSeq(ctx, stream, o.Start, filter); err != nil {
			return nil, fmt.Errorf("connector: %s: start %s: %w", name, o.Start, err)
		}
	}
	s.bounded = o.Bounded
	if o.Bounded {
		if !s.restored {
			info, err := stream.Info(ctx)
			if err != nil {
				return nil, fmt.Errorf("connector: %s: stream info: %w", name, err)
			}
			s.bound = info.State.LastSeq
		}
		// Is there anything left to read up to the bound? The consumer
		// would otherwise wait forever for a message that tells.
		left, err := pendingFrom(ctx, stream, s.next, filter)
		if err != nil {
			return nil, fmt.Errorf("connector: %s: %w", name, err)
		}
		if s.next > s.bound || left == 0 {
			s.eof = true
			s.pending.Store(0)
			return s, nil
		}
		s.pending.Store(int64(min(left, s.bound-s.next+1)))
	} else if left, err := pendingFrom(ctx, stream, s.next, filter); err == nil {
		s.pending.Store(int64(left)) // else unknown until the first message
	}
	cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		FilterSubjects: filter,
		DeliverPolicy:  jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:    s.next,
	})
	if err != nil {
		return nil, fmt.Errorf("connector: %s: consumer: %w", name, err)
	}
	s.cc, err = cons.Consume(s.deliver, jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
		// The ordered consumer recovers by itself (it recreates its server
		// consumer); keep the error for the message of a later failure.
		s.mu.Lock()
		s.lastErr = err
		s.mu.Unlock()
	}))
	if err != nil {
		return nil, fmt.Errorf("connector: %s: consume: %w", name, err)
	}
	return s, nil
}

func boundedName(b bool) string {
	if b {
		return "bounded"
	}
	return "unbounded"
}

// startSeq is the stream sequence a source starting at st reads first. The
// server resolves new and time: for a short-lived consumer, whose first
// sequence to deliver its info tells.
func startSeq(ctx context.Context, stream jetstream.Stream, st NATSStart, filter []string) (uint64, error) {
	cfg := jetstream.ConsumerConfig{FilterSubjects: filter, AckPolicy: jetstream.AckNonePolicy, InactiveThreshold: 10 * time.Second}
	switch st.Kind {
	case "", StartFirst:
		return 1, nil
	case StartSeq:
		return st.Seq, nil
	case StartNew:
		cfg.DeliverPolicy = jetstream.DeliverNewPolicy
	case StartTime:
		cfg.DeliverPolicy = jetstream.DeliverByStartTimePolicy
		t := st.Time
		cfg.OptStartTime = &t
	default:
		return 0, fmt.Errorf("unknown start %q", st.Kind)
	}
	info, err := tempConsumer(ctx, stream, cfg)
	if err != nil {
		return 0, fmt.Errorf("find the start sequence: %w", err)
	}
	return info.Delivered.Stream + 1, nil
}

// tempConsumer creates a consumer with cfg, deletes it and returns its
// info as created.
func tempConsumer(ctx context.Context, stream jetstream.Stream, cfg jetstream.ConsumerConfig) (*jetstream.ConsumerInfo, error) {
	c, err := stream.CreateConsumer(ctx, cfg)
	if err != nil {
		return nil, err
	}
	info := c.CachedInfo()
	if err := stream.DeleteConsumer(ctx, info.Name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return nil, fmt.Errorf("delete the consumer: %w", err)
	}
	return info, nil
}

// pendingFrom counts the messages matching filter from sequence seq on, with
// a short-lived consumer.
func pendingFrom(ctx context.Context, stream jetstream.Stream, seq uint64, filter []string) (uint64, error) {
	info, err := tempConsumer(ctx, stream, jetstream.ConsumerConfig{
		DeliverPolicy:     jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:       seq,
		FilterSubjects:    filter,
		AckPolicy:         jetstream.AckNonePolicy,
		InactiveThreshold: 10 * time.Second,
	})
	if err != nil {
		return 0, fmt.Errorf("count pending messages: %w", err)
	}
	return info.NumPending, nil
}

// deliver runs on the consumer's goroutine; a full buffer back-pressures it.
func (s *NATSSource) deliver(m jetstream.Msg) {
	select {
	case s.msgs <- m:
	case <-s.done:
	}
}

// Read returns the next records, waiting for at least one. A bounded source
// returns io.EOF after the last message up to its bound.
// Ready reports whether Read returns at once: messages are buffered, or the
// bounded stream has ended.
func (s *NATSSource) Ready() bool { return s.eof || len(s.msgs) > 0 }

func (s *NATSSource) Read(ctx context.Context, recs []abi.Record) (int, error) {
	n := 0
	for n == 0 {
		if s.eof {
			return 0, io.EOF
		}
		var m jetstream.Msg
		select {
		case m = <-s.msgs:
		case <-ctx.Done():
			return 0, fmt.Errorf("connector: %s: %w", s.name, context.Cause(ctx))
		}
		for {
			var err error
			if n, err = s.take(m, recs, n); err != nil {
				return n, err
			}
			if n == len(recs) || s.eof {
				break
			}
			select {
			case m = <-s.msgs:
				continue
			default:
			}
			break
		}
	}
	return n, nil
}

// take handles one message: it advances the position and, when the message
// belongs to this subtask, appends its record at recs[n].
func (s *NATSSource) take(m jetstream.Msg, recs []abi.Record, n int) (int, error) {
	meta, err := m.Metadata()
	if err != nil {
		return n, fmt.Errorf("connector: %s: message metadata: %w", s.name, err)
	}
	seq := meta.Sequence.Stream
	if s.bounded && seq > s.bound {
		s.eof = true
		s.pending.Store(0)
		return n, nil
	}
	if seq < s.next {
		return n, fmt.Errorf("connector: %s: stream sequence %d after %d", s.name, seq, s.next-1)
	}
	s.next = seq + 1
	pending := meta.NumPending
	if s.bounded {
		pending = min(pending, s.bound-seq)
	}
	s.pending.Store(int64(pending))
	if s.bounded && (seq == s.bound || meta.NumPending == 0) {
		s.eof = true
	}
	mine := seq%uint64(s.parallelism) == uint64(s.subtask)
	if len(s.skip) > 0 {
		mine = mine && !s.skip.Covers(int64(seq))
		s.skip = s.skip.Trim(int64(seq) + 1)
	}
	if !mine {
		return n, nil
	}
	h := m.Headers()
	if len(h.Values(HeaderCommit)) > 0 {
		return n, nil // a nats sink's commit marker, not a record
	}
	r := abi.Record{Value: m.Data(), Timestamp: meta.Timestamp.UnixMilli(), Headers: natsHeaderBlock(&s.headers, h)}
	if s.keyFromSubject {
		subj := m.Subject()
		r.Key = []byte(subj[strings.LastIndexByte(subj, '.')+1:])
	} else if k := h.Get(HeaderKey); k != "" {
		r.Key = []byte(k)
	}
	if ts := h.Get(HeaderTimestamp); ts != "" {
		v, err := strconv.ParseInt(ts, 10, 64)
		if err != nil {
			return n, fmt.Errorf("connector: %s: message %d: header %s %q: %w", s.name, seq, HeaderTimestamp, ts, err)
		}
		r.Timestamp = v
	}
	if err := s.et.stamp(&r); err != nil {
		return n, fmt.Errorf("connector: %s: stream %s sequence %d: %w", s.name, s.stream, seq, err)
	}
	recs[n] = r
	return n + 1, nil
}

// Lag is how many messages the source has yet to read: those of the stream
// (matching its filter; a bounded source's up to its bound) after the last
// one read, as the server counted when it delivered that one, so messages
// published since then are counted once the next one is read (for every
// subtask: each reads the whole stream). ok is false while unknown
// (connector.LagSource).
func (s *NATSSource) Lag() (int64, bool) {
	n := s.pending.Load()
	return n, n >= 0
}

// Watermark is the largest timestamp read minus the lag.
func (s *NATSSource) Watermark() int64 { return s.et.Watermark() }

// Position encodes the next stream sequence and the bound:
//
//	u8 version (1), u8 flags (1: bounded), u64 next sequence, u64 bound, big-endian
//
// and after a rescale what the subtask has yet to skip: version 2, then
// the layers (roundrobin.AppendLayers).
func (s *NATSSource) Position() []byte { return natsPosition(s.bounded, s.next, s.bound, s.skip) }

const natsPositionVersion2 = 2

func natsPosition(bounded bool, next, bound uint64, skip roundrobin.Layers) []byte {
	b := make([]byte, natsPositionLen, 32)
	b[0] = positionVersion
	if bounded {
		b[1] = 1
	}
	binary.BigEndian.PutUint64(b[2:], next)
	binary.BigEndian.PutUint64(b[10:], bound)
	if len(skip) == 0 {
		return b
	}
	b[0] = natsPositionVersion2
	return roundrobin.AppendLayers(b, skip)
}

func parseNATSPosition(pos []byte) (bounded bool, next, bound uint64, skip roundrobin.Layers, err error) {
	bad := fmt.Errorf("bad position %x", pos)
	if len(pos) < natsPositionLen || (pos[0] != positionVersion && pos[0] != natsPositionVersion2) ||
		(pos[0] == positionVersion && len(pos) != natsPositionLen) || pos[1] > 1 {
		return false, 0, 0, nil, bad
	}
	bounded, next, bound = pos[1] == 1, binary.BigEndian.Uint64(pos[2:]), binary.BigEndian.Uint64(pos[10:])
	if next == 0 || next > math.MaxInt64 {
		return false, 0, 0, nil, bad
	}
	if pos[0] == natsPositionVersion2 {
		if skip, err = roundrobin.ParseLayers(pos[natsPositionLen:]); err == nil && len(skip) == 0 {
			err = errors.New("no layers")
		}
		if err != nil {
			return false, 0, 0, nil, fmt.Errorf("%w: %w", bad, err)
		}
	}
	return bounded, next, bound, skip, nil
}

// rescaleNATSPositions is the nats source's RescalePositions. Old subtask
// j of q, its next sequence next_j, read every sequence below it and kept
// those ≡ j (mod q) (package roundrobin's model: every subtask reads the
// whole stream); the new subtasks all start at the least next sequence of
// the old ones and skip what the old subtasks kept. A bounded source's
// subtasks each resolved their bound when they first opened: the new ones
// read up to the largest (an old subtask's class up to its own bound was
// read; past it, nothing of it was).
func rescaleNATSPositions(positions [][]byte, parallelism int) ([][]byte, error) {
	next := make([]int64, len(positions))
	old := make([]roundrobin.Layers, len(positions))
	var bound uint64
	bounded := -1 // unknown
	for j, pos := range positions {
		if pos == nil {
			next[j] = roundrobin.Finished
			continue
		}
		b, n, bd, skip, err := parseNATSPosition(pos)
		if err != nil {
			return nil, fmt.Errorf("subtask %d: %w", j, err)
		}
		bi := 0
		if b {
			bi = 1
		}
		if bounded >= 0 && bi != bounded {
			return nil, fmt.Errorf("subtask %d: a %s position among %s ones", j, boundedName(b), boundedName(bounded == 1))
		}
		bounded = bi
		next[j], old[j], bound = int64(n), skip, max(bound, bd)
	}
	if bounded < 0 {
		return nil, errors.New("no subtask has a position (all had finished)")
	}
	if bounded == 0 && slices.Contains(next, roundrobin.Finished) {
		return nil, fmt.Errorf("subtask %d of an unbounded source has no position", slices.Index(next, roundrobin.Finished))
	}
	base, skip := roundrobin.Merge(next, old)
	if base == roundrobin.Finished {
		return nil, errors.New("no subtask has a position (all had finished)")
	}
	out := make([][]byte, parallelism)
	for j := range out {
		out[j] = natsPosition(bounded == 1, uint64(base), bound, skip)
	}
	return out, nil
}

// Close stops the consumer and closes the connection if the source made it.
func (s *NATSSource) Close() error {
	select {
	case <-s.done:
		return nil
	default:
	}
	close(s.done)
	if s.cc != nil {
		s.cc.Stop()
	}
	if s.ownConn {
		s.nc.Close()
	}
	return nil
}

var _ Source = (*NATSSource)(nil)
