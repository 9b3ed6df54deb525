package dataplane

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/streamd/streamd/abi"
)

// Partitioning says how a RecordWriter distributes records over its outputs.
type Partitioning uint8

const (
	Forward   Partitioning = iota // one output: subtask i -> subtask i
	Rebalance                     // round robin, record by record
	Hash                          // by key group of the key (of the value when the key is empty)
	Broadcast                     // every record to every output
)

func (p Partitioning) String() string {
	switch p {
	case Forward:
		return "forward"
	case Rebalance:
		return "rebalance"
	case Hash:
		return "hash"
	case Broadcast:
		return "broadcast"
	}
	return fmt.Sprintf("partitioning(%d)", uint8(p))
}

// HashTarget returns the receiver of r among n subtasks under hash
// partitioning with maxParallelism key groups: the subtask whose key-group
// range (abi.RangeForSubtask) holds the key group of r's key, or of r's value
// when r has no key.
func HashTarget(r abi.Record, maxParallelism, n int) int {
	key := r.Key
	if len(key) == 0 {
		key = r.Value
	}
	return abi.SubtaskForKeyGroup(abi.KeyGroup(key, maxParallelism), maxParallelism, n)
}

// DefaultBatchSize is the number of records per batch when none is set.
const DefaultBatchSize = 1024

// MaxBatchBytes caps the key and value bytes of one batch: a batch is sent
// when it reaches BatchSize records or this many bytes.
const MaxBatchBytes = 4 << 20

// DefaultBufferTimeout is how long a record waits at most, by default, in
// a writer's pending batch of a busy subtask before the batch goes out not
// full (Flink's execution.buffer-timeout, 100 ms there). An idle subtask
// sends what is pending at once, whatever the timeout.
const DefaultBufferTimeout = 2 * time.Millisecond

// WriterOptions configures a RecordWriter.
type WriterOptions struct {
	BatchSize int // records per batch; default DefaultBatchSize
	// BufferTimeout: FlushExpired sends a pending batch whose first record
	// came this long ago or longer; 0 means DefaultBufferTimeout, a
	// negative value never (batches go out full, or on Flush).
	BufferTimeout  time.Duration
	MaxParallelism int // key groups of the receiving operator (Hash); default abi.DefaultMaxParallelism
	Start          int // first output of Rebalance (spread senders: use the sender's subtask index)
	// MaxRecordBytes is max_record_bytes: a larger record (key and value
	// bytes) fails the emit; default abi.DefaultMaxRecordBytes.
	MaxRecordBytes int
	// Overdraft > 0 lets the writer keep up to this many events (full
	// batches, watermarks, end-of-data) per output that its channel has no room for,
	// instead of waiting for room inside Emit: the subtask sends them with
	// TryDrain while it waits for its mailbox and overtaking barriers too,
	// so a checkpoint trigger never waits for a send (Flink's mailbox loop,
	// which processes mail while it waits for output availability). Beyond
	// the overdraft Emit waits as with 0, where every send waits for room.
	Overdraft int
	// OverdraftBytes bounds the overdraft in bytes too: the key and value
	// bytes of the batches queued over all outputs of the writer; beyond it
	// Emit waits for room as beyond Overdraft, but for the newest batch,
	// which stays queued however large. 0 with an overdraft means
	// DefaultOverdraftBytes.
	OverdraftBytes int
}

// DefaultOverdraftBytes is a writer's overdraft in bytes by default (4 MiB,
// one full batch of MaxBatchBytes): what a back-pressured subtask may hold
// beyond its channels' capacity, and what an unaligned checkpoint taken
// then stores as its output buffers, at most (but for the newest batch).
const DefaultOverdraftBytes = 4 << 20

// RecordWriter is the sending side of one job-graph edge for one subtask: it
// copies emitted records into one pending batch per output and sends a batch
// when it is full. Control events go to every output, after the pending
// records (Broadcast flushes first), so a watermark, barrier or end-of-data
// never overtakes a record emitted before it. With an overdraft, full
// batches (and watermarks) the channel has no room for wait in a queue per
// output, in order, ahead of everything sent later; BroadcastAhead is the
// one send that goes ahead of them. One goroutine uses a writer.
// After a send fails, every method returns that error.
type RecordWriter struct {
	outs      []Output
	part      Partitioning
	maxPar    int
	batchSize int
	maxRecord int
	pending   []*Batch
	queued    [][]Event // per output: handed on, not sent yet (overdraft)
	overdraft int
	// queuedBytes: the key and value bytes of the batches queued, over all
	// outputs; overBytes bounds it (OverdraftBytes).
	queuedBytes int
	overBytes   int
	since       []time.Time // per output: when its pending batch got its first record
	timeout     time.Duration
	rr          int
	err         error
}

// NewRecordWriter returns a writer over outs, indexed by receiving subtask.
func NewRecordWriter(outs []Output, p Partitioning, o WriterOptions) (*RecordWriter, error) {
	if len(outs) == 0 {
		return nil, fmt.Errorf("dataplane: record writer: no outputs")
	}
	if p == Forward && len(outs) != 1 {
		return nil, fmt.Errorf("dataplane: record writer: forward needs exactly one output, got %d", len(outs))
	}
	if o.BatchSize <= 0 {
		o.BatchSize = DefaultBatchSize
	}
	if o.MaxParallelism <= 0 {
		o.MaxParallelism = abi.DefaultMaxParallelism
	}
	if o.MaxRecordBytes <= 0 {
		o.MaxRecordBytes = abi.DefaultMaxRecordBytes
	}
	if o.BufferTimeout == 0 {
		o.BufferTimeout = DefaultBufferTimeout
	}
	if o.Overdraft > 0 && o.OverdraftBytes <= 0 {
		o.OverdraftBytes = DefaultOverdraftBytes
	}
	if p == Hash && o.MaxParallelism < len(outs) {
		return nil, fmt.Errorf("dataplane: record writer: max parallelism %d < %d receivers", o.MaxParallelism, len(outs))
	}
	return &RecordWriter{
		outs:      outs,
		part:      p,
		maxPar:    o.MaxParallelism,
		batchSize: o.BatchSize,
		maxRecord: o.MaxRecordBytes,
		pending:   make([]*Batch, len(outs)),
		queued:    make([][]Event, len(outs)),
		overdraft: max(o.Overdraft, 0),
		overBytes: o.OverdraftBytes,
		since:     make([]time.Time, len(outs)),
		timeout:   o.BufferTimeout,
		rr:        o.Start % len(outs),
	}, nil
}

// Err returns the error of the first failed send, if any.
func (w *RecordWriter) Err() error { return w.err }

// NumOutputs is the number of receivers.
func (w *RecordWriter) NumOutputs() int { return len(w.outs) }

// Output returns the output to receiver i.
func (w *RecordWriter) Output(i int) Output { return w.outs[i] }

// Emit copies r into the batch of its receiver(s).
func (w *RecordWriter) Emit(ctx context.Context, r abi.Record) error {
	return w.EmitBatch(ctx, []abi.Record{r})
}

// EmitBatch copies recs into the batches of their receivers, sending each
// batch that fills up. The caller keeps ownership of recs. A record over
// max_record_bytes fails the writer (an error wrapping abi.ErrRecordTooLarge)
// before any record of recs is taken.
func (w *RecordWriter) EmitBatch(ctx context.Context, recs []abi.Record) error {
	if w.err != nil {
		return w.err
	}
	for i := range recs {
		if len(recs[i].Key)+len(recs[i].Value) > w.maxRecord {
			w.err = fmt.Errorf("dataplane: record writer: record %d of %d: %w", i, len(recs), abi.CheckRecordBytes(recs[i], w.maxRecord))
			return w.err
		}
	}
	switch w.part {
	case Forward:
		for i := range recs {
			if err := w.add(ctx, 0, &recs[i]); err != nil {
				return err
			}
		}
	case Rebalance:
		n := len(w.outs)
		for i := range recs {
			t := w.rr
			if w.rr++; w.rr == n {
				w.rr = 0
			}
			if err := w.add(ctx, t, &recs[i]); err != nil {
				return err
			}
		}
	case Hash:
		n := len(w.outs)
		for i := range recs {
			if err := w.add(ctx, HashTarget(recs[i], w.maxPar, n), &recs[i]); err != nil {
				return err
			}
		}
	case Broadcast:
		for i := range recs {
			for t := range w.outs {
				if err := w.add(ctx, t, &recs[i]); err != nil {
					return err
				}
			}
		}
	default:
		w.err = fmt.Errorf("dataplane: record writer: unknown %s", w.part)
		return w.err
	}
	return nil
}

func (w *RecordWriter) add(ctx context.Context, t int, r *abi.Record) error {
	b := w.pending[t]
	if b == nil {
		b = GetBatch()
		w.pending[t] = b
	}
	if len(b.Records) == 0 && w.timeout > 0 {
		w.since[t] = time.Now()
	}
	b.Append(*r)
	if len(b.Records) >= w.batchSize || b.bytes >= MaxBatchBytes {
		return w.send(ctx, t)
	}
	return nil
}

// send hands output t's pending batch on: with an overdraft to the queue
// (sent as far as the channel has room), else sent, waiting for room.
func (w *RecordWriter) send(ctx context.Context, t int) error {
	b := w.pending[t]
	w.pending[t] = nil
	return w.enqueue(ctx, t, RecordsEvent(b))
}

// enqueue queues ev on output t behind what is queued there and sends as
// much as the channel takes without waiting; it waits for room only for
// what exceeds the overdraft, in events on t or in bytes on the writer.
func (w *RecordWriter) enqueue(ctx context.Context, t int, ev Event) error {
	w.queue(t, ev)
	if err := w.tryDrain(ctx, t); err != nil {
		return err
	}
	for len(w.queued[t]) > w.overdraft {
		if err := w.sendFirst(ctx, t, true); err != nil {
			return err
		}
	}
	for w.queuedBytes > w.overBytes {
		u := w.olderQueued(t)
		if u < 0 {
			break // only ev is queued: it stays, however large
		}
		if err := w.sendFirst(ctx, u, true); err != nil {
			return err
		}
	}
	return nil
}

// queue appends ev to output t's queue.
func (w *RecordWriter) queue(t int, ev Event) {
	w.queued[t] = append(w.queued[t], ev)
	w.queuedBytes += eventBytes(ev)
}

// olderQueued is the output whose first queued event to send, waiting, to
// bring the queued bytes down after ev was queued on output t: t while it
// holds more than ev, else the first other output holding any; -1 when
// only ev is queued.
func (w *RecordWriter) olderQueued(t int) int {
	if len(w.queued[t]) > 1 {
		return t
	}
	for u, q := range w.queued {
		if u != t && len(q) > 0 {
			return u
		}
	}
	return -1
}

// eventBytes is what ev counts in the queued bytes: its batch's key and
// value bytes.
func eventBytes(ev Event) int {
	if ev.Kind == KindRecords && ev.Batch != nil {
		return ev.Batch.Bytes()
	}
	return 0
}

// sendFirst sends the first queued event of output t, waiting for room
// when wait; false: the channel had no room (wait unset).
func (w *RecordWriter) sendFirst(ctx context.Context, t int, wait bool) error {
	ev := w.queued[t][0]
	n := eventBytes(ev) // before the send hands the batch on
	var err error
	if wait {
		err = w.outs[t].Send(ctx, ev)
	} else {
		var ok bool
		if ok, err = TrySend(ctx, w.outs[t], ev); err == nil && !ok {
			return errNoRoom
		}
	}
	if err != nil {
		w.err = err
		return err // stays queued: Discard releases it
	}
	w.queuedBytes -= n
	w.queued[t][0] = Event{}
	w.queued[t] = w.queued[t][1:]
	if len(w.queued[t]) == 0 {
		w.queued[t] = nil
	}
	return nil
}

var errNoRoom = errors.New("dataplane: no room")

// tryDrain sends the queued events of output t while its channel has room.
func (w *RecordWriter) tryDrain(ctx context.Context, t int) error {
	for len(w.queued[t]) > 0 {
		if err := w.sendFirst(ctx, t, false); err == errNoRoom {
			return nil
		} else if err != nil {
			return err
		}
	}
	return nil
}

// drain sends the queued events of output t, waiting for room.
func (w *RecordWriter) drain(ctx context.Context, t int) error {
	for len(w.queued[t]) > 0 {
		if err := w.sendFirst(ctx, t, true); err != nil {
			return err
		}
	}
	return nil
}

// queuePending moves output t's non-empty pending batch to its queue.
func (w *RecordWriter) queuePending(t int) {
	if b := w.pending[t]; b != nil && len(b.Records) > 0 {
		w.pending[t] = nil
		w.queue(t, RecordsEvent(b))
	}
}

// Queued reports whether events wait in the queue of an output.
func (w *RecordWriter) Queued() bool {
	for _, q := range w.queued {
		if len(q) > 0 {
			return true
		}
	}
	return false
}

// TryDrain sends the queued events as far as the channels have room,
// without waiting. It returns nil when nothing is queued any more, else a
// channel that is ready when an output still queued may have room
// (dataplane.Room; for an output that cannot say, TryDrain sends waiting).
func (w *RecordWriter) TryDrain(ctx context.Context) (<-chan struct{}, error) {
	if w.err != nil {
		return nil, w.err
	}
	var room <-chan struct{}
	for t := range w.queued {
		if err := w.tryDrain(ctx, t); err != nil {
			return nil, err
		}
		if len(w.queued[t]) > 0 && room == nil {
			room = Room(w.outs[t])
		}
	}
	return room, nil
}

// Submit hands every non-empty pending batch on as a full one would be:
// with an overdraft queued, sent as far as the channels have room.
func (w *RecordWriter) Submit(ctx context.Context) error {
	if w.err != nil {
		return w.err
	}
	for t, b := range w.pending {
		if b != nil && len(b.Records) > 0 {
			if err := w.send(ctx, t); err != nil {
				return err
			}
		}
	}
	return nil
}

// CaptureBuffers calls visit with each event of output out handed to the
// writer and not sent yet (the pending batch included, which is closed
// and queued), in order: the output buffers an unaligned checkpoint's
// barrier overtakes (BroadcastAhead). The events stay queued; visit must
// retain what it keeps.
func (w *RecordWriter) CaptureBuffers(visit func(out int, ev Event)) {
	for t := range w.outs {
		w.queuePending(t)
		for _, ev := range w.queued[t] {
			visit(t, ev)
		}
	}
}

// BroadcastAhead sends ev on every output ahead of the events queued there
// and without waiting for room (Overtaker.SendNow): the barrier of an
// unaligned checkpoint, after CaptureBuffers took what it overtakes.
func (w *RecordWriter) BroadcastAhead(ctx context.Context, ev Event) error {
	if w.err != nil {
		return w.err
	}
	if ev.Kind == KindRecords {
		return fmt.Errorf("dataplane: record writer: broadcast of a records event")
	}
	for _, o := range w.outs {
		if err := SendNow(ctx, o, ev); err != nil {
			w.err = err
			return err
		}
	}
	return nil
}

// Flush sends every non-empty pending batch.
func (w *RecordWriter) Flush(ctx context.Context) error {
	if w.err != nil {
		return w.err
	}
	for t := range w.pending {
		w.queuePending(t)
		if err := w.drain(ctx, t); err != nil {
			return err
		}
	}
	return nil
}

// FlushExpired sends every pending batch whose first record came the
// buffer timeout or longer before now. A busy subtask calls it after each
// batch of work, so that a slow-filling output (a selective filter, one of
// many hash targets) does not hold its records back until the batch is
// full or the subtask idles.
func (w *RecordWriter) FlushExpired(ctx context.Context, now time.Time) error {
	if w.err != nil || w.timeout <= 0 {
		return w.err
	}
	for t, b := range w.pending {
		if b != nil && len(b.Records) > 0 && now.Sub(w.since[t]) >= w.timeout {
			if err := w.send(ctx, t); err != nil {
				return err
			}
		}
	}
	return nil
}

// Broadcast flushes the pending records, then sends ev to every receiver.
// ev must be a control event. With an overdraft a watermark or an
// end-of-data is queued behind the pending records instead, like a full
// batch (a barrier that overtakes a queued end-of-data is one that
// overtook it in the channel: InputGate.TakeOvertaking).
func (w *RecordWriter) Broadcast(ctx context.Context, ev Event) error {
	if ev.Kind == KindRecords {
		return fmt.Errorf("dataplane: record writer: broadcast of a records event")
	}
	if w.overdraft > 0 && (ev.Kind == KindWatermark || ev.Kind == KindEndOfData) {
		if w.err != nil {
			return w.err
		}
		for t := range w.outs {
			w.queuePending(t)
			if err := w.enqueue(ctx, t, ev); err != nil {
				return err
			}
		}
		return nil
	}
	if err := w.Flush(ctx); err != nil {
		return err
	}
	for _, o := range w.outs {
		if err := o.Send(ctx, ev); err != nil {
			w.err = err
			return err
		}
	}
	return nil
}

// BroadcastNow is Broadcast without back-pressure (Overtaker.SendNow): the
// pending records and then ev go out on every output even when its channel
// is full. It sends the barrier of an unaligned checkpoint, which overtakes
// everything queued and must not wait for the receivers to make room.
func (w *RecordWriter) BroadcastNow(ctx context.Context, ev Event) error {
	if w.err != nil {
		return w.err
	}
	if ev.Kind == KindRecords {
		return fmt.Errorf("dataplane: record writer: broadcast of a records event")
	}
	for t, o := range w.outs {
		w.queuePending(t)
		for len(w.queued[t]) > 0 {
			n := eventBytes(w.queued[t][0])
			if err := SendNow(ctx, o, w.queued[t][0]); err != nil {
				w.err = err
				return err
			}
			w.queuedBytes -= n
			w.queued[t][0] = Event{}
			w.queued[t] = w.queued[t][1:]
		}
		w.queued[t] = nil
		if err := SendNow(ctx, o, ev); err != nil {
			w.err = err
			return err
		}
	}
	return nil
}

// Discard releases the pending and queued batches without sending them
// (on failure).
func (w *RecordWriter) Discard() {
	for t, b := range w.pending {
		if b != nil {
			b.Release()
			w.pending[t] = nil
		}
	}
	for t, q := range w.queued {
		for _, ev := range q {
			if ev.Kind == KindRecords && ev.Batch != nil {
				ev.Batch.Release()
			}
		}
		w.queued[t] = nil
	}
	w.queuedBytes = 0
}
