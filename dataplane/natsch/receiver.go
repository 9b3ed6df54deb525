package natsch

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/nats-io/nats.go"
	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/dataplane"
)

// Receiver is the receiving side of a NATS channel: a dataplane.Input. The
// subscription's goroutine queues arriving messages under mu; the subtask's
// goroutine takes them with TryRecv, checks their sequence numbers, decodes
// them and re-grants credit. It is a dataplane.Overtakable too: the
// receiving goroutine can take an overtaking barrier out of the middle of the
// queue (TakeBarrier).
type Receiver struct {
	t          *Transport
	id         ChannelID
	name       string
	creditSubj string
	window     uint64
	maxRecord  int // max_record_bytes: the most one reassembled record may hold
	// mergeRecords caps the records of a batch merged from queued messages.
	mergeRecords int
	sub          *nats.Subscription

	mu          sync.Mutex
	queue       []queued // queue[head:] is queued
	head        int
	queuedBytes uint64 // payload bytes arrived and not yet taken by TryRecv
	arrivedSeq  uint64 // highest sequence number arrived
	granted     uint64 // cumulative grant last published
	consumed    uint64 // payload bytes delivered by TryRecv
	err         error  // a failure reported asynchronously
	notify      chan<- struct{}
	want        int64       // the barrier the receiver waits for (WantBarrier); 0: none
	prio        atomic.Bool // an overtaking barrier may be queued (any goroutine reads it)

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
	// ahead is TakeBarrier's copy of the queue up to the barrier it takes.
	ahead []queued

	stats struct {
		messages, bytes, maxQueued, grants, parts, maxPartial atomic.Uint64
	}
}

// queued is a message in a receiver's queue, with what onData read of it.
type queued struct {
	m    *nats.Msg
	seq  uint64
	kind byte
	// barrier: a barrier message with a body of the right size, of
	// checkpoint id, unaligned when it has the header HeaderUnaligned (a
	// malformed one is never taken ahead: TryRecv reports it in order).
	barrier   bool
	unaligned bool
	id        int64
	// taken: TakeBarrier took the barrier ahead; TryRecv checks its sequence
	// number and counts its bytes, but does not deliver it again.
	taken bool
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
	r := &Receiver{t: t, id: id, name: "nats " + id.String(), creditSubj: id.CreditSubject(), window: uint64(o.Window), maxRecord: o.MaxRecord, mergeRecords: o.MergeRecords}
	sub, err := t.nc.Subscribe(id.DataSubject(), r.onData)
	if err != nil {
		return nil, fmt.Errorf("natsch: %s: subscribe: %w", r.name, err)
	}
	r.sub = sub
	// Messages wait here only until the callback queues them; credits bound
	// the bytes in flight to the window, plus one oversized message, plus
	// what the sender's SendNow put beyond the credit: an output buffer
	// (below dataplane.MaxBatchBytes, split into messages) and a barrier per
	// unaligned checkpoint. Room for the window twice and two such buffers.
	pending := 2*o.Window + 2*t.maxMessage + 2*dataplane.MaxBatchBytes + 1<<20
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
	e := queued{m: m, seq: seq, kind: kind}
	if kind == wireBarrier && len(body) == barrierBodyLen {
		e.barrier, e.id = true, int64(binary.LittleEndian.Uint64(body))
		e.unaligned = m.Header.Get(HeaderUnaligned) == "1"
	}
	r.mu.Lock()
	r.queue = append(r.queue, e)
	if r.overtakes(&e) {
		r.prio.Store(true)
	}
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
		e := r.popLocked()
		r.mu.Unlock()

		ev, ok, err := r.take(e)
		if err != nil {
			r.failed = err
			return dataplane.Event{}, false, err
		}
		if ok {
			if e.kind == wireRecords {
				if err := r.merge(ev.Batch); err != nil {
					ev.Batch.Release()
					r.failed = err
					return dataplane.Event{}, false, err
				}
			}
			return ev, true, nil
		}
	}
}

// popLocked removes the message at the head of the queue (r.mu held).
func (r *Receiver) popLocked() queued {
	e := r.queue[r.head]
	r.queue[r.head] = queued{}
	if r.head++; r.head == len(r.queue) {
		r.queue, r.head = r.queue[:0], 0
	}
	r.queuedBytes -= uint64(len(e.m.Data))
	return e
}

// merge adds to b the records of the records messages queued right behind
// it, up to the channel's MergeRecords (a message that would take the batch
// beyond it starts the next one): a sender cuts a batch into messages of about 16
// KiB (SplitMessage), and a receiving subtask that has fallen behind then
// gets them back as one batch, one call into its operator, not one per
// message. Each message is checked, counted and credited as if taken
// alone; a message with headers (a hook's, a part, a barrier taken ahead)
// is left for the next TryRecv, and so is everything while a RecvHeader
// hook wants an event per message.
func (r *Receiver) merge(b *dataplane.Batch) error {
	if r.t.opts.RecvHeader != nil {
		return nil
	}
	for b.Len() < r.mergeRecords {
		r.mu.Lock()
		if r.err != nil || r.head == len(r.queue) {
			r.mu.Unlock()
			return nil
		}
		if e := r.queue[r.head]; e.kind != wireRecords || e.taken || e.m.Header != nil || r.part != nil ||
			b.Len()+recordsIn(e.m.Data) > r.mergeRecords {
			r.mu.Unlock()
			return nil
		}
		e := r.popLocked()
		r.mu.Unlock()
		ev, ok, err := r.take(e)
		if err != nil {
			return err
		}
		if !ok {
			continue
		}
		b.Records = append(b.Records, ev.Batch.Records...)
		ev.Batch.Release()
	}
	return nil
}

// recordsIn is the record count a records message's batch frame starts
// with (0 for a message too short to hold one: take reports it).
func recordsIn(data []byte) int {
	if len(data) < HeaderLen+4 {
		return 0
	}
	return int(binary.LittleEndian.Uint32(data[HeaderLen:]))
}

// take checks and decodes one message: an event (ok), or a record part that
// does not end its record or a barrier taken ahead (not ok, no error).
func (r *Receiver) take(e queued) (ev dataplane.Event, ok bool, err error) {
	m := e.m
	kind, seq, body, err := decodeHeader(m.Data)
	if err == nil {
		if kind == wireRecordPart {
			return r.takePart(m, seq, body)
		}
		if r.part != nil {
			return ev, false, r.brokenParts(r.part, r.partSeq, fmt.Sprintf("a message of kind %d (seq %d)", kind, seq))
		}
		if e.taken {
			return ev, false, r.skipTaken(m, seq)
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
	if ev.Kind == dataplane.KindBarrier {
		barrierHeaders(&ev.Barrier, m.Header)
	}
	if ev.Kind == dataplane.KindWatermark {
		ev = watermarkHeaders(ev, m.Header)
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
	first := r.part == nil
	buf, err := r.continuePart(r.part, r.partSeq, seq, total, off, len(data))
	if err != nil {
		return ev, false, err
	}
	if first {
		r.partSeq = seq
		r.stats.parts.Add(1)
		if total > r.stats.maxPartial.Load() {
			r.stats.maxPartial.Store(total)
		}
	}
	r.seq = seq
	r.part = append(buf, data...)
	done := len(r.part) == cap(r.part)
	if done {
		b, err := r.decodeParts(r.part, r.partSeq, seq)
		if err != nil {
			return ev, false, err
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

// continuePart checks that the record part seq (total, offset off, n bytes
// of data) continues the record reassembled in cur, whose first part was
// partSeq (cur nil: none, so the part must be a first part), and returns the
// buffer to append its bytes to: cur, or for a first part a new one with
// room for the total announced.
func (r *Receiver) continuePart(cur []byte, partSeq, seq, total, off uint64, n int) ([]byte, error) {
	if cur == nil {
		if off != 0 {
			return nil, fmt.Errorf("natsch: %s: %w: record part (seq %d) at offset %d of %d bytes, but no record is being reassembled (a first part has offset 0)", r.name, ErrWire, seq, off, total)
		}
		if limit := uint64(r.maxRecord) + recordFrameOverhead + 4; total > limit || total < recordFrameOverhead {
			if total > limit {
				return nil, fmt.Errorf("natsch: %s: record parts (seq %d) announce a record of %d bytes: %w: over max_record_bytes %d", r.name, seq, total-recordFrameOverhead, abi.ErrRecordTooLarge, r.maxRecord)
			}
			return nil, fmt.Errorf("natsch: %s: %w: record parts (seq %d) announce %d bytes, less than one record's frame", r.name, ErrWire, seq, total)
		}
		cur = make([]byte, 0, total)
	} else if have := uint64(len(cur)); total != uint64(cap(cur)) || off != have {
		return nil, r.brokenParts(cur, partSeq, fmt.Sprintf("a part (seq %d) at offset %d of %d bytes", seq, off, total))
	}
	if uint64(n) > total-off {
		return nil, fmt.Errorf("natsch: %s: %w: record part (seq %d) of %d bytes at offset %d runs past the announced %d bytes", r.name, ErrWire, seq, n, off, total)
	}
	return cur, nil
}

// decodeParts decodes the reassembled records body of parts partSeq to seq:
// a batch whose record aliases buf.
func (r *Receiver) decodeParts(buf []byte, partSeq, seq uint64) (*dataplane.Batch, error) {
	b := dataplane.GetBatch()
	if err := b.DecodeFrame(buf); err != nil {
		b.Release()
		return nil, fmt.Errorf("natsch: %s: %w: the record of parts %d to %d: %w", r.name, ErrWire, partSeq, seq, err)
	}
	return b, nil
}

// brokenParts is the error for the run of record parts from partSeq,
// reassembled so far in cur, that got is not the next part of.
func (r *Receiver) brokenParts(cur []byte, partSeq uint64, got string) error {
	return fmt.Errorf("natsch: %s: %w: the record of parts from seq %d is broken off after %d of its %d bytes by %s", r.name, ErrWire, partSeq, len(cur), cap(cur), got)
}

// watermarkHeaders turns a watermark message with HeaderWatermarkStatus
// into the watermark-status event it carries.
func watermarkHeaders(ev dataplane.Event, h nats.Header) dataplane.Event {
	switch h.Get(HeaderWatermarkStatus) {
	case "idle":
		return dataplane.WatermarkStatusEvent(true)
	case "active":
		return dataplane.WatermarkStatusEvent(false)
	}
	return ev
}

func statusWord(idle bool) string {
	if idle {
		return "idle"
	}
	return "active"
}

// barrierHeaders sets what a barrier message's headers say: Unaligned
// (HeaderUnaligned), and the trace context (every other header; nil when
// there is none).
func barrierHeaders(b *dataplane.Barrier, h nats.Header) {
	for k, v := range h {
		if len(v) == 0 {
			continue
		}
		if k == HeaderUnaligned {
			b.Unaligned = v[0] == "1"
			continue
		}
		if k == HeaderCheckpointBase {
			if n, err := strconv.ParseInt(v[0], 10, 64); err == nil && n > 0 {
				b.Base = n // anything else: no base, every file is uploaded
			}
			continue
		}
		if b.Trace == nil {
			b.Trace = make(map[string]string, len(h))
		}
		b.Trace[k] = v[0]
	}
}

// skipTaken is what TryRecv does with a barrier TakeBarrier took: it checks
// its sequence number and counts it as consumed.
func (r *Receiver) skipTaken(m *nats.Msg, seq uint64) error {
	if r.ended {
		return fmt.Errorf("%w: %s: received a barrier (seq %d) after end-of-partition", dataplane.ErrChannelEnded, r.name, seq)
	}
	if err := dataplane.CheckSeq(r.name, r.seq, seq); err != nil {
		return err
	}
	r.seq = seq
	return r.count(m, true)
}

// overtakes reports whether e is an overtaking barrier not taken yet: sent
// unaligned, or the one WantBarrier asked for. Call with mu held.
func (r *Receiver) overtakes(e *queued) bool {
	return e.barrier && !e.taken && (e.unaligned || r.want != 0 && e.id == r.want)
}

// WantBarrier implements dataplane.Overtakable.
func (r *Receiver) WantBarrier(id int64) {
	r.mu.Lock()
	r.want = id
	for i := r.head; i < len(r.queue); i++ {
		if e := &r.queue[i]; e.barrier && !e.taken && e.id == id {
			r.prio.Store(true)
		}
	}
	r.mu.Unlock()
}

// Overtaking implements dataplane.Overtakable; any goroutine may call it.
func (r *Receiver) Overtaking() bool { return r.prio.Load() }

// TakeBarrier implements dataplane.Overtakable, on the receiving goroutine
// (that of TryRecv). It takes the first overtaking barrier queued, unless
// end-of-partition comes before it (it overtakes an end-of-data, which
// stays queued and is delivered in order), after calling visit with
// each records and watermark event before it, in order: the batches queued,
// and a record whose parts are all queued before the barrier, reassembled
// (from the parts TryRecv has taken so far, r.part, and the parts queued,
// leaving TryRecv's state as it was). The barrier's message stays queued,
// marked taken: TryRecv checks its sequence number and counts it for credit
// when it gets there, and delivers what follows it. The sequence numbers up
// to the barrier are checked here already, so that no checkpoint takes the
// state of a channel that lost a message; that, or a malformed message
// before the barrier, fails the channel (as TryRecv would).
func (r *Receiver) TakeBarrier(visit func(dataplane.Event)) (dataplane.Barrier, bool, error) {
	if r.failed != nil {
		return dataplane.Barrier{}, false, r.failed
	}
	r.mu.Lock()
	r.prio.Store(false)
	if r.err != nil {
		r.failed = r.err
		r.mu.Unlock()
		return dataplane.Barrier{}, false, r.failed
	}
	at := -1
	if !r.ended {
		q := r.queue[r.head:]
	scan:
		for i := range q {
			switch e := &q[i]; {
			case e.taken:
			case e.kind == wireEndOfPartition:
				break scan
			case r.overtakes(e):
				at = i
				break scan
			}
		}
		if at >= 0 {
			// Only this goroutine removes messages, and onData only appends:
			// the copy stays what is queued up to the barrier.
			r.ahead = append(r.ahead[:0], q[:at+1]...)
		}
	}
	r.mu.Unlock()
	if at < 0 {
		return dataplane.Barrier{}, false, nil
	}
	b, err := r.overtake(r.ahead, visit)
	clear(r.ahead)
	if err != nil {
		r.failed = err
		return dataplane.Barrier{}, false, err
	}
	r.mu.Lock()
	r.queue[r.head+at].taken = true
	r.mu.Unlock()
	return b, true, nil
}

// overtake checks the messages of ahead, the queue up to an overtaking
// barrier (its last), visits the records and watermarks among them and
// returns the barrier.
func (r *Receiver) overtake(ahead []queued, visit func(dataplane.Event)) (dataplane.Barrier, error) {
	prev := r.seq
	// The record being reassembled. Appending to r.part writes past its
	// length only, the very bytes takePart appends there later from the
	// same messages: TryRecv's state is untouched.
	part, partSeq := r.part, r.partSeq
	for i, e := range ahead {
		kind, seq, body, err := decodeHeader(e.m.Data)
		if err != nil {
			return dataplane.Barrier{}, fmt.Errorf("natsch: %s: message after %d: %w", r.name, prev, err)
		}
		if err := dataplane.CheckSeq(r.name, prev, seq); err != nil {
			return dataplane.Barrier{}, err
		}
		prev = seq
		if kind == wireRecordPart {
			total, off, data, err := decodePart(body)
			if err != nil {
				return dataplane.Barrier{}, fmt.Errorf("natsch: %s: message after %d: %w", r.name, seq-1, err)
			}
			if part == nil {
				partSeq = seq
			}
			if part, err = r.continuePart(part, partSeq, seq, total, off, len(data)); err != nil {
				return dataplane.Barrier{}, err
			}
			if part = append(part, data...); len(part) == cap(part) {
				b, err := r.decodeParts(part, partSeq, seq)
				if err != nil {
					return dataplane.Barrier{}, err
				}
				visit(dataplane.RecordsEvent(b))
				b.Release()
				part = nil
			}
			continue
		}
		if part != nil {
			return dataplane.Barrier{}, r.brokenParts(part, partSeq, fmt.Sprintf("a message of kind %d (seq %d)", kind, seq))
		}
		switch {
		case e.taken: // a barrier taken before
		case kind == wireRecords || kind == wireWatermark:
			ev, err := decodeBody(kind, body)
			if err != nil {
				return dataplane.Barrier{}, fmt.Errorf("natsch: %s: message after %d: %w", r.name, seq-1, err)
			}
			visit(ev)
			if ev.Kind == dataplane.KindRecords {
				ev.Batch.Release()
			}
		case i == len(ahead)-1:
			ev, err := decodeBody(kind, body)
			if err != nil {
				return dataplane.Barrier{}, fmt.Errorf("natsch: %s: message after %d: %w", r.name, seq-1, err)
			}
			barrierHeaders(&ev.Barrier, e.m.Header)
			if h := r.t.opts.RecvHeader; h != nil {
				h(ev, e.m.Header)
			}
			return ev.Barrier, nil
		}
	}
	// Cannot happen: ahead ends with the barrier to take.
	return dataplane.Barrier{}, fmt.Errorf("natsch: %s: no barrier to take", r.name)
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
	// (arrived, not yet taken by TryRecv): at most the window, but for
	// what the sender's SendNow sent beyond the credit.
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
	_ dataplane.Overtakable    = (*Receiver)(nil)
	_ dataplane.EndOfDataAcker = (*Receiver)(nil)
)
