package natsch

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/nats-io/nats.go"
	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/dataplane"
)

// Receiver is the receiving side of a NATS channel: a dataplane.Input. The
// subscription's goroutine queues arriving messages under mu; the subtask's
// goroutine takes them with TryRecv, checks their sequence numbers, decodes
// them and re-grants credit.
type Receiver struct {
	t          *Transport
	id         ChannelID
	name       string
	creditSubj string
	window     uint64
	maxRecord  int // max_record_bytes: the most one reassembled record may hold
	sub        *nats.Subscription

	mu          sync.Mutex
	queue       []*nats.Msg
	head        int
	queuedBytes uint64 // payload bytes arrived and not yet taken by TryRecv
	arrivedSeq  uint64 // highest sequence number arrived
	granted     uint64 // cumulative grant last published
	consumed    uint64 // payload bytes delivered by TryRecv
	err         error  // a failure reported asynchronously
	notify      chan<- struct{}

	// Owned by the receiving goroutine.
	seq    uint64 // last sequence number delivered
	ended  bool
	failed error // sticky: TryRecv keeps returning it
	closed atomic.Bool
	// The record being reassembled from record parts: part holds the bytes
	// so far (its capacity is the announced total, allocated once), partSeq
	// is the sequence number of its first part. nil: none.
	part    []byte
	partSeq uint64
	// ackSeq is the sequence number of the EndOfData whose sender asked for
	// an acknowledgement (0: none asked); acked, it was sent.
	ackSeq uint64
	acked  bool
	// ackSent is ackSeq once the acknowledgement was published: a credit
	// request after it (the sender still waits: it was lost) repeats it.
	ackSent atomic.Uint64

	stats struct {
		messages, bytes, maxQueued, grants, parts, maxPartial atomic.Uint64
	}
}

// NewReceiver subscribes to id's data subject and grants the sender the
// transport's window. The subscription's pending limits are set far above
// what credits allow to queue, so NATS does not drop its messages. opts
// override the transport's options for this channel (MaxRecord, Window).
func (t *Transport) NewReceiver(id ChannelID, opts ...Option) (*Receiver, error) {
	if err := id.Validate(); err != nil {
		return nil, err
	}
	o, err := t.channelOptions(opts)
	if err != nil {
		return nil, err
	}
	r := &Receiver{t: t, id: id, name: "nats " + id.String(), creditSubj: id.CreditSubject(), window: uint64(o.Window), maxRecord: o.MaxRecord}
	sub, err := t.nc.Subscribe(id.DataSubject(), r.onData)
	if err != nil {
		return nil, fmt.Errorf("natsch: %s: subscribe: %w", r.name, err)
	}
	r.sub = sub
	// Messages wait here only until the callback queues them; credits bound
	// the bytes in flight to the window (plus one oversized message).
	pending := 2*o.Window + 2*t.maxMessage + 1<<20
	if err := sub.SetPendingLimits(-1, pending); err != nil {
		sub.Unsubscribe()
		return nil, fmt.Errorf("natsch: %s: pending limits: %w", r.name, err)
	}
	if err := t.register(sub, r); err != nil {
		sub.Unsubscribe()
		return nil, err
	}
	// Make sure the server knows the subscription before the sender can get
	// credit to publish.
	if err := t.nc.Flush(); err != nil {
		r.Close()
		return nil, fmt.Errorf("natsch: %s: flush subscription: %w", r.name, err)
	}
	r.mu.Lock()
	r.granted = r.window
	r.mu.Unlock()
	if err := r.publishCredit(r.window); err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

// Name names the channel in errors.
func (r *Receiver) Name() string { return r.name }

// ID is the channel's id.
func (r *Receiver) ID() ChannelID { return r.id }

func (r *Receiver) publishCredit(granted uint64) error {
	r.stats.grants.Add(1)
	var b [creditLen]byte // TryRecv and onData both grant: no shared buffer
	// The header tells the sender this receiver acknowledges EndOfData; an
	// older sender reads the payload only.
	m := &nats.Msg{Subject: r.creditSubj, Data: appendCredit(b[:0], granted, uint32(r.window)), Header: nats.Header{HeaderAcks: {"1"}}}
	if err := r.t.nc.PublishMsg(m); err != nil {
		return fmt.Errorf("natsch: %s: grant credit: %w", r.name, err)
	}
	return nil
}

// onData runs on the subscription's goroutine, one message at a time, in
// arrival order.
func (r *Receiver) onData(m *nats.Msg) {
	kind, seq, body, err := decodeHeader(m.Data)
	if err != nil {
		r.fail(fmt.Errorf("natsch: %s: %w", r.name, err))
		return
	}
	if kind == wireCreditRequest {
		if len(body) != 8 {
			r.fail(fmt.Errorf("natsch: %s: %w: credit request of %d bytes", r.name, ErrWire, len(m.Data)))
			return
		}
		lastSent := binary.LittleEndian.Uint64(body)
		// The sender waits for credit: grant all that has been consumed, not
		// only the last re-grant (which waits for a quarter of the window).
		r.mu.Lock()
		arrived := r.arrivedSeq
		if g := r.consumed + r.window; g > r.granted {
			r.granted = g
		}
		granted := r.granted
		r.mu.Unlock()
		if lastSent > arrived {
			// The request follows the sender's messages on the same subject,
			// so they should all have arrived before it.
			r.fail(fmt.Errorf("%w: %s: gap: the sender has sent %d messages but only %d arrived (%d lost)", dataplane.ErrSequence, r.name, lastSent, arrived, lastSent-arrived))
			return
		}
		if !r.closed.Load() {
			// A failure shows in the sender's next request or in TryRecv.
			_ = r.publishCredit(granted)
			if seq := r.ackSent.Load(); seq != 0 {
				_ = r.publishAck(seq)
			}
		}
		return
	}
	r.mu.Lock()
	r.queue = append(r.queue, m)
	if seq > r.arrivedSeq {
		r.arrivedSeq = seq
	}
	r.queuedBytes += uint64(len(m.Data))
	if r.queuedBytes > r.stats.maxQueued.Load() {
		r.stats.maxQueued.Store(r.queuedBytes)
	}
	n := r.notify
	r.mu.Unlock()
	wake(n)
}

func wake(n chan<- struct{}) {
	if n != nil {
		select {
		case n <- struct{}{}:
		default:
		}
	}
}

func (r *Receiver) fail(err error) {
	r.mu.Lock()
	if r.err == nil {
		r.err = err
	}
	n := r.notify
	r.mu.Unlock()
	wake(n)
}

// SetNotify registers the channel the receiver wakes when a message arrives
// (or the channel fails).
func (r *Receiver) SetNotify(c chan<- struct{}) {
	r.mu.Lock()
	r.notify = c
	ready := r.head < len(r.queue) || r.err != nil
	r.mu.Unlock()
	if ready {
		wake(c)
	}
}

// TryRecv returns the next event if one has arrived. It fails, for good, when
// the message's sequence number is not the next one (an error wrapping
// dataplane.ErrSequence), when a message is malformed, when a run of record
// parts is broken off or announces a record over max_record_bytes, or when
// NATS reported an error for the subscription (e.g. a slow consumer). The
// parts of a record are taken as they arrive (and credited, so the sender
// keeps sending); the record is returned with its last part.
func (r *Receiver) TryRecv() (dataplane.Event, bool, error) {
	for {
		if r.failed != nil {
			return dataplane.Event{}, false, r.failed
		}
		r.mu.Lock()
		if r.err != nil {
			r.failed = r.err
			r.mu.Unlock()
			return dataplane.Event{}, false, r.failed
		}
		if r.head == len(r.queue) {
			r.mu.Unlock()
			return dataplane.Event{}, false, nil
		}
		m := r.queue[r.head]
		r.queue[r.head] = nil
		if r.head++; r.head == len(r.queue) {
			r.queue, r.head = r.queue[:0], 0
		}
		r.queuedBytes -= uint64(len(m.Data))
		r.mu.Unlock()

		ev, ok, err := r.take(m)
		if err != nil {
			r.failed = err
			return dataplane.Event{}, false, err
		}
		if ok {
			return ev, true, nil
		}
	}
}

// take checks and decodes one message: an event (ok), or a record part that
// does not end its record (not ok, no error).
func (r *Receiver) take(m *nats.Msg) (ev dataplane.Event, ok bool, err error) {
	kind, seq, body, err := decodeHeader(m.Data)
	if err == nil {
		if kind == wireRecordPart {
			return r.takePart(m, seq, body)
		}
		if r.part != nil {
			return ev, false, r.brokenParts(fmt.Sprintf("a message of kind %d (seq %d)", kind, seq))
		}
		ev, err = decodeBody(kind, body)
	}
	if err != nil {
		return ev, false, fmt.Errorf("natsch: %s: message after %d: %w", r.name, r.seq, err)
	}
	if r.ended {
		return ev, false, fmt.Errorf("%w: %s: received %s (seq %d) after end-of-partition", dataplane.ErrChannelEnded, r.name, ev, seq)
	}
	if err := dataplane.CheckSeq(r.name, r.seq, seq); err != nil {
		if ev.Kind == dataplane.KindRecords {
			ev.Batch.Release()
		}
		return ev, false, err
	}
	r.seq = seq
	if ev.Kind == dataplane.KindBarrier && len(m.Header) > 0 {
		ev.Barrier.Trace = make(map[string]string, len(m.Header))
		for k, v := range m.Header {
			if len(v) > 0 {
				ev.Barrier.Trace[k] = v[0]
			}
		}
	}
	if h := r.t.opts.RecvHeader; h != nil {
		h(ev, m.Header)
	}
	if ev.Kind == dataplane.KindEndOfData && m.Header.Get(HeaderAckRequest) == "1" {
		r.ackSeq = seq
	}
	if ev.Kind == dataplane.KindEndOfPartition {
		r.count(m, false)
		r.ended = true
		r.Close()
		return ev, true, nil
	}
	if err := r.count(m, true); err != nil {
		if ev.Kind == dataplane.KindRecords {
			ev.Batch.Release()
		}
		return dataplane.Event{}, false, err
	}
	return ev, true, nil
}

// takePart adds a record part to the record being reassembled; with its
// last part the record is the event returned (ok).
func (r *Receiver) takePart(m *nats.Msg, seq uint64, body []byte) (ev dataplane.Event, ok bool, err error) {
	total, off, data, err := decodePart(body)
	if err != nil {
		return ev, false, fmt.Errorf("natsch: %s: message after %d: %w", r.name, r.seq, err)
	}
	if r.ended {
		return ev, false, fmt.Errorf("%w: %s: received a record part (seq %d) after end-of-partition", dataplane.ErrChannelEnded, r.name, seq)
	}
	if err := dataplane.CheckSeq(r.name, r.seq, seq); err != nil {
		return ev, false, err
	}
	if r.part == nil {
		if off != 0 {
			return ev, false, fmt.Errorf("natsch: %s: %w: record part (seq %d) at offset %d of %d bytes, but no record is being reassembled (a first part has offset 0)", r.name, ErrWire, seq, off, total)
		}
		if limit := uint64(r.maxRecord) + recordFrameOverhead; total > limit || total < recordFrameOverhead {
			if total > limit {
				return ev, false, fmt.Errorf("natsch: %s: record parts (seq %d) announce a record of %d bytes: %w: over max_record_bytes %d", r.name, seq, total-recordFrameOverhead, abi.ErrRecordTooLarge, r.maxRecord)
			}
			return ev, false, fmt.Errorf("natsch: %s: %w: record parts (seq %d) announce %d bytes, less than one record's frame", r.name, ErrWire, seq, total)
		}
		r.part, r.partSeq = make([]byte, 0, total), seq
		r.stats.parts.Add(1)
		if total > r.stats.maxPartial.Load() {
			r.stats.maxPartial.Store(total)
		}
	} else if have := uint64(len(r.part)); total != uint64(cap(r.part)) || off != have {
		return ev, false, r.brokenParts(fmt.Sprintf("a part (seq %d) at offset %d of %d bytes", seq, off, total))
	}
	if uint64(len(data)) > total-off {
		return ev, false, fmt.Errorf("natsch: %s: %w: record part (seq %d) of %d bytes at offset %d runs past the announced %d bytes", r.name, ErrWire, seq, len(data), off, total)
	}
	r.seq = seq
	r.part = append(r.part, data...)
	done := len(r.part) == cap(r.part)
	if done {
		b := dataplane.GetBatch()
		recs, err := abi.DecodeBatch(r.part, b.Records[:0])
		b.Records = recs
		if err != nil {
			b.Release()
			return ev, false, fmt.Errorf("natsch: %s: %w: the record of parts %d to %d: %w", r.name, ErrWire, r.partSeq, seq, err)
		}
		r.part = nil
		ev = dataplane.RecordsEvent(b)
		if h := r.t.opts.RecvHeader; h != nil {
			h(ev, m.Header)
		}
	}
	if err := r.count(m, true); err != nil {
		if done {
			ev.Batch.Release()
		}
		return dataplane.Event{}, false, err
	}
	return ev, done, nil
}

// brokenParts is the error for a run of record parts that got is not the
// next part of.
func (r *Receiver) brokenParts(got string) error {
	return fmt.Errorf("natsch: %s: %w: the record of parts from seq %d is broken off after %d of its %d bytes by %s", r.name, ErrWire, r.partSeq, len(r.part), cap(r.part), got)
}

// count records m as consumed and, with regrant, grants credit again once a
// quarter of the window has been consumed.
func (r *Receiver) count(m *nats.Msg, regrant bool) error {
	size := uint64(len(m.Data))
	r.stats.messages.Add(1)
	r.stats.bytes.Add(size)
	r.mu.Lock()
	r.consumed += size
	if !regrant || r.consumed+r.window-r.granted < r.window/4 {
		r.mu.Unlock()
		return nil
	}
	r.granted = r.consumed + r.window
	g := r.granted
	r.mu.Unlock()
	return r.publishCredit(g)
}

// AckEndOfData implements dataplane.EndOfDataAcker: it acknowledges the
// EndOfData received to a sender that asked for it (an older sender did
// not, and does not wait: nothing is sent).
func (r *Receiver) AckEndOfData() error {
	if r.acked {
		return fmt.Errorf("natsch: %s: end-of-data acknowledged twice", r.name)
	}
	r.acked = true
	if r.ackSeq == 0 {
		return nil
	}
	r.ackSent.Store(r.ackSeq)
	return r.publishAck(r.ackSeq)
}

func (r *Receiver) publishAck(seq uint64) error {
	var b [creditAckLen]byte
	if err := r.t.nc.Publish(r.creditSubj, appendCreditAck(b[:0], seq)); err != nil {
		return fmt.Errorf("natsch: %s: acknowledge end-of-data: %w", r.name, err)
	}
	return nil
}

// ReceiverStats are counters of a Receiver.
type ReceiverStats struct {
	Messages, Bytes uint64 // data messages and payload bytes delivered
	// MaxQueued is the most payload bytes ever queued at the receiver
	// (arrived, not yet taken by TryRecv): at most the window.
	MaxQueued uint64
	Grants    uint64 // credit messages published
	Window    uint64
	// Parted is the number of records reassembled from record parts (or
	// being reassembled); MaxPartial the largest such record's frame in
	// bytes, which is what its reassembly buffer holds: never more than
	// max_record_bytes plus a 20-byte frame header.
	Parted, MaxPartial uint64
}

// Stats returns the receiver's counters; any goroutine may call it.
func (r *Receiver) Stats() ReceiverStats {
	return ReceiverStats{
		Messages: r.stats.messages.Load(), Bytes: r.stats.bytes.Load(), MaxQueued: r.stats.maxQueued.Load(),
		Grants: r.stats.grants.Load(), Window: r.window,
		Parted: r.stats.parts.Load(), MaxPartial: r.stats.maxPartial.Load(),
	}
}

// Close unsubscribes. The receiver closes itself after delivering
// EndOfPartition; call Close when abandoning it earlier.
func (r *Receiver) Close() error {
	if r.closed.Swap(true) {
		return nil
	}
	r.t.unregister(r.sub)
	if err := r.sub.Unsubscribe(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) && !errors.Is(err, nats.ErrBadSubscription) {
		return fmt.Errorf("natsch: %s: %w", r.name, err)
	}
	return nil
}

var (
	_ dataplane.Input          = (*Receiver)(nil)
	_ dataplane.EndOfDataAcker = (*Receiver)(nil)
)
