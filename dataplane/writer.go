package dataplane

import (
	"context"
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
}

// RecordWriter is the sending side of one job-graph edge for one subtask: it
// copies emitted records into one pending batch per output and sends a batch
// when it is full. Control events go to every output, after the pending
// records (Broadcast flushes first), so a watermark, barrier or end-of-data
// never overtakes a record emitted before it. One goroutine uses a writer.
// After a send fails, every method returns that error.
type RecordWriter struct {
	outs      []Output
	part      Partitioning
	maxPar    int
	batchSize int
	maxRecord int
	pending   []*Batch
	since     []time.Time // per output: when its pending batch got its first record
	timeout   time.Duration
	rr        int
	err       error
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

func (w *RecordWriter) send(ctx context.Context, t int) error {
	b := w.pending[t]
	w.pending[t] = nil
	if err := w.outs[t].Send(ctx, RecordsEvent(b)); err != nil {
		b.Release()
		w.err = err
		return err
	}
	return nil
}

// Flush sends every non-empty pending batch.
func (w *RecordWriter) Flush(ctx context.Context) error {
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
// ev must be a control event.
func (w *RecordWriter) Broadcast(ctx context.Context, ev Event) error {
	if ev.Kind == KindRecords {
		return fmt.Errorf("dataplane: record writer: broadcast of a records event")
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
		if b := w.pending[t]; b != nil && len(b.Records) > 0 {
			w.pending[t] = nil
			if err := SendNow(ctx, o, RecordsEvent(b)); err != nil {
				b.Release()
				w.err = err
				return err
			}
		}
		if err := SendNow(ctx, o, ev); err != nil {
			w.err = err
			return err
		}
	}
	return nil
}

// Discard releases the pending batches without sending them (on failure).
func (w *RecordWriter) Discard() {
	for t, b := range w.pending {
		if b != nil {
			b.Release()
			w.pending[t] = nil
		}
	}
}
