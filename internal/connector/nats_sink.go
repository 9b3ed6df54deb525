package connector

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
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
	// Job and Operator name the writer in message ids. Job must stay the same
	// across failovers and restores of one job (not the attempt number), or
	// replays are not deduplicated.
	Job, Operator string
	// MaxPending bounds the publishes awaiting their ack; default 1024.
	MaxPending int
	// AckTimeout bounds the wait for acks in Flush and PreCommit; default 30s.
	AckTimeout time.Duration
}

// NATSSink publishes every record to a subject with a JetStream publish. The
// value is the payload; a key goes in the Streamd-Key header and a timestamp
// in Streamd-Timestamp. Every message has a Nats-Msg-Id
//
//	<job>:<operator>:p<parallelism>:<subtask>:<epoch>:<index>
//
// where index counts the subtask's records from the start of the epoch and
// is checkpointed (PreCommit). A subtask restored from a checkpoint with the
// same parallelism continues the epoch and index it stored, so the records it
// replays get the ids they had before and the stream's duplicate window
// drops them. A rescaled subtask starts epoch = the restored checkpoint's id
// at index 0. Exactly-once therefore holds when the replay is deterministic
// (same records in the same order per sink subtask) and finishes within the
// stream's duplicate window; otherwise the sink is at-least-once.
//
// PreCommit waits until every record written so far is acked (stored by
// JetStream); Commit has nothing to do.
type NATSSink struct {
	name                 string
	subject              string
	nc                   *nats.Conn
	ownConn              bool
	js                   jetstream.JetStream
	subtask, parallelism int
	idPrefix             string
	maxPending           int
	ackTimeout           time.Duration

	epoch int64
	index uint64

	futures []jetstream.PubAckFuture // awaiting acks, oldest first
	head    int
	err     error // the first publish failure; every later call returns it
	closed  bool
	idBuf   []byte

	acked, duplicates uint64
}

// NewNATSSink connects with o.Conn and opens a sink subtask.
func NewNATSSink(ctx context.Context, o NATSSinkOptions, subtask, parallelism int) (*NATSSink, error) {
	nc, err := o.Conn.Connect(nats.Name(fmt.Sprintf("streamd nats sink %s[%d]", o.Operator, subtask)))
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

func newNATSSink(ctx context.Context, nc *nats.Conn, own bool, o NATSSinkOptions, subtask, parallelism int) (*NATSSink, error) {
	name := "nats sink " + o.Subject
	if parallelism < 1 || subtask < 0 || subtask >= parallelism {
		return nil, fmt.Errorf("connector: %s: subtask %d of parallelism %d", name, subtask, parallelism)
	}
	if o.Subject == "" {
		return nil, errors.New("connector: nats sink: no subject")
	}
	if o.Job == "" || o.Operator == "" {
		return nil, fmt.Errorf("connector: %s: job and operator are needed for message ids", name)
	}
	if o.MaxPending <= 0 {
		o.MaxPending = 1024
	}
	if o.AckTimeout <= 0 {
		o.AckTimeout = 30 * time.Second
	}
	// Twice our own bound, so the library never stalls a publish.
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(2*o.MaxPending))
	if err != nil {
		return nil, fmt.Errorf("connector: %s: %w", name, err)
	}
	if _, err := js.StreamNameBySubject(ctx, o.Subject); err != nil {
		return nil, fmt.Errorf("connector: %s: no JetStream stream captures the subject: %w", name, err)
	}
	return &NATSSink{
		name: name, subject: o.Subject, nc: nc, ownConn: own, js: js,
		subtask: subtask, parallelism: parallelism,
		idPrefix:   o.Job + ":" + o.Operator + ":p" + strconv.Itoa(parallelism) + ":" + strconv.Itoa(subtask) + ":",
		maxPending: o.MaxPending, ackTimeout: o.AckTimeout,
	}, nil
}

// MsgID is the message id of the record at index in epoch.
func (s *NATSSink) MsgID(epoch int64, index uint64) string {
	return string(s.appendID(nil, epoch, index))
}

func (s *NATSSink) appendID(b []byte, epoch int64, index uint64) []byte {
	b = append(b, s.idPrefix...)
	b = strconv.AppendInt(b, epoch, 10)
	b = append(b, ':')
	return strconv.AppendUint(b, index, 10)
}

// Write publishes recs, waiting for old acks when MaxPending are
// outstanding.
func (s *NATSSink) Write(recs []abi.Record) error {
	if s.err != nil {
		return s.err
	}
	if s.closed {
		return fmt.Errorf("connector: %s: write after close", s.name)
	}
	for i := range recs {
		if len(s.futures)-s.head >= s.maxPending {
			if err := s.waitOldest(time.Now().Add(s.ackTimeout)); err != nil {
				return err
			}
		}
		r := &recs[i]
		m := &nats.Msg{Subject: s.subject, Data: r.Value, Header: nats.Header{}}
		if len(r.Key) > 0 {
			m.Header.Set(HeaderKey, string(r.Key))
		}
		if r.Timestamp != abi.NoTimestamp {
			m.Header.Set(HeaderTimestamp, strconv.FormatInt(r.Timestamp, 10))
		}
		s.idBuf = s.appendID(s.idBuf[:0], s.epoch, s.index)
		f, err := s.js.PublishMsgAsync(m, jetstream.WithMsgID(string(s.idBuf)))
		if err != nil {
			s.err = fmt.Errorf("connector: %s: publish record %d of epoch %d: %w", s.name, s.index, s.epoch, err)
			return s.err
		}
		s.index++
		s.futures = append(s.futures, f)
	}
	return nil
}

// waitOldest waits for the ack of the oldest outstanding publish.
func (s *NATSSink) waitOldest(deadline time.Time) error {
	f := s.futures[s.head]
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case ack := <-f.Ok():
		s.acked++
		if ack.Duplicate {
			s.duplicates++
		}
	case err := <-f.Err():
		s.err = fmt.Errorf("connector: %s: publish of %s: %w", s.name, f.Msg().Header.Get(jetstream.MsgIDHeader), err)
		return s.err
	case <-t.C:
		s.err = fmt.Errorf("connector: %s: no ack for %s within %s", s.name, f.Msg().Header.Get(jetstream.MsgIDHeader), s.ackTimeout)
		return s.err
	}
	s.futures[s.head] = nil
	if s.head++; s.head == len(s.futures) {
		s.futures, s.head = s.futures[:0], 0
	}
	return nil
}

// Flush waits until every record written is acked by JetStream.
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

const natsSinkStateLen = 1 + 8 + 8 + 8 + 4 + 4

// PreCommit flushes and returns the sink's state for checkpoint id:
//
//	u8 version (1), i64 checkpoint id, i64 epoch, u64 next index, u32 subtask, u32 parallelism (big-endian)
func (s *NATSSink) PreCommit(id int64) ([]byte, error) {
	if err := s.Flush(); err != nil {
		return nil, err
	}
	b := make([]byte, natsSinkStateLen)
	b[0] = positionVersion
	binary.BigEndian.PutUint64(b[1:], uint64(id))
	binary.BigEndian.PutUint64(b[9:], uint64(s.epoch))
	binary.BigEndian.PutUint64(b[17:], s.index)
	binary.BigEndian.PutUint32(b[25:], uint32(s.subtask))
	binary.BigEndian.PutUint32(b[29:], uint32(s.parallelism))
	return b, nil
}

// Commit has nothing to do: records are published as they are written.
func (s *NATSSink) Commit(int64) error { return s.err }

// CommitPending restores the message-id numbering from the PreCommit states
// of the restored checkpoint: the same subtask at the same parallelism
// continues its epoch and index; otherwise (rescaled) the epoch becomes the
// restored checkpoint's id and the index starts at 0.
func (s *NATSSink) CommitPending(states [][]byte) error {
	if len(states) == 0 {
		return nil
	}
	var ckpt int64
	for _, st := range states {
		if len(st) != natsSinkStateLen || st[0] != positionVersion {
			return fmt.Errorf("connector: %s: bad checkpoint state %x", s.name, st)
		}
		ckpt = max(ckpt, int64(binary.BigEndian.Uint64(st[1:])))
	}
	st := states[0]
	if len(states) == 1 && int(binary.BigEndian.Uint32(st[25:])) == s.subtask && int(binary.BigEndian.Uint32(st[29:])) == s.parallelism {
		s.epoch = int64(binary.BigEndian.Uint64(st[9:]))
		s.index = binary.BigEndian.Uint64(st[17:])
		return nil
	}
	s.epoch, s.index = ckpt, 0
	return nil
}

// CommitFinal waits for the acks of everything written.
func (s *NATSSink) CommitFinal() error { return s.Flush() }

// Epoch and Index say which message id the next record gets.
func (s *NATSSink) Epoch() int64  { return s.epoch }
func (s *NATSSink) Index() uint64 { return s.index }

// Acked and Duplicates count the acks received and those JetStream flagged
// as duplicates (dropped by its duplicate window).
func (s *NATSSink) Acked() uint64      { return s.acked }
func (s *NATSSink) Duplicates() uint64 { return s.duplicates }

// Close closes the connection if the sink made it. It does not wait for
// outstanding acks: PreCommit and CommitFinal do, and what a failed subtask
// published without a checkpoint is replayed after restore.
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
