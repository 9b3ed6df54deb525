// Package dataplane carries records and control events between the subtasks
// of a streamd job: the event types of a channel, bounded in-process channels
// with per-message sequence numbers, the input gate that multiplexes a
// subtask's input channels, the partitioners and the record writer that
// batches records per target.
//
// A channel is point to point: one sending subtask, one receiving subtask. Its
// sending side (Output) stamps every message with the next sequence number; its
// receiving side (Input) checks it, so a lost or duplicated message fails the
// receiver instead of silently breaking exactly-once. Channels are bounded: a
// full channel blocks the sender, which back-pressures the whole upstream.
//
// Ownership: a Batch sent on a channel belongs to the receiver, which returns
// it to the pool with Release once it has processed the records.
//
// dataplane imports only abi.
package dataplane

import (
	"fmt"

	"github.com/streamd/streamd/abi"
)

// Kind says what an Event is.
type Kind uint8

const (
	KindRecords          Kind = iota + 1 // a batch of records
	KindWatermark                        // event time advanced
	KindBarrier                          // a checkpoint or savepoint barrier
	KindEndOfData                        // the sender will send no more records
	KindEndOfPartition                   // the sender will send nothing at all; the channel ends
	KindCancelCheckpoint                 // abort the alignment of a checkpoint
	KindWatermarkStatus                  // the sender went idle or active again
)

func (k Kind) String() string {
	switch k {
	case KindRecords:
		return "records"
	case KindWatermark:
		return "watermark"
	case KindBarrier:
		return "barrier"
	case KindEndOfData:
		return "end-of-data"
	case KindEndOfPartition:
		return "end-of-partition"
	case KindCancelCheckpoint:
		return "cancel-checkpoint"
	case KindWatermarkStatus:
		return "watermark-status"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// BarrierKind distinguishes checkpoints from savepoints.
type BarrierKind uint8

const (
	Checkpoint BarrierKind = iota
	Savepoint
)

func (k BarrierKind) String() string {
	if k == Savepoint {
		return "savepoint"
	}
	return "checkpoint"
}

// Watermark says no record with a smaller timestamp will follow on the channel.
type Watermark struct{ TS int64 }

// Barrier separates the records before checkpoint ID from those after it.
type Barrier struct {
	ID     int64
	Kind   BarrierKind
	IsSync bool // a synchronous savepoint (stop-with-savepoint): the job stops after it
	// Unaligned: the barrier of an unaligned checkpoint, which may overtake
	// the records queued before it (Overtakable); over NATS the header
	// Streamd-Unaligned: 1.
	Unaligned bool
	// Base is the newest completed checkpoint when this one was triggered
	// (0: none): an incremental checkpoint refers to the shared state
	// files of Base that the subtask still has, and uploads the others.
	// Over NATS the header Streamd-Checkpoint-Base.
	Base int64
	// Trace is the checkpoint's trace context (W3C traceparent, tracestate),
	// nil when tracing is off: subtasks start their alignment and snapshot
	// spans under it. Over NATS it travels in the message headers.
	Trace map[string]string
}

// EndOfData says the sender has emitted its last record. Drain is false only
// for stop-with-savepoint without --drain: then the receiver calls neither
// end_input nor finish.
type EndOfData struct{ Drain bool }

// EndOfPartition is the last message of a channel.
type EndOfPartition struct{}

// CancelCheckpoint aborts checkpoint ID: a receiver aligning it stops waiting.
type CancelCheckpoint struct{ ID int64 }

// WatermarkStatus says the sender is idle (it sends no records and does
// not hold back the receiver's watermark) or active again.
type WatermarkStatus struct{ Idle bool }

// Event is one message on a channel: a tagged union, so control events travel
// without allocation. Exactly the field that Kind names is meaningful.
type Event struct {
	Kind      Kind
	Batch     *Batch // KindRecords
	Watermark Watermark
	Barrier   Barrier
	EndOfData EndOfData
	Cancel    CancelCheckpoint
	Status    WatermarkStatus // KindWatermarkStatus
}

// RecordsEvent wraps a batch.
func RecordsEvent(b *Batch) Event { return Event{Kind: KindRecords, Batch: b} }

// WatermarkEvent returns a watermark event.
func WatermarkEvent(ts int64) Event { return Event{Kind: KindWatermark, Watermark: Watermark{ts}} }

// BarrierEvent returns a barrier event.
func BarrierEvent(b Barrier) Event { return Event{Kind: KindBarrier, Barrier: b} }

// EndOfDataEvent returns an end-of-data event.
func EndOfDataEvent(drain bool) Event { return Event{Kind: KindEndOfData, EndOfData: EndOfData{drain}} }

// EndOfPartitionEvent returns the end-of-partition event.
func EndOfPartitionEvent() Event { return Event{Kind: KindEndOfPartition} }

// CancelCheckpointEvent returns a cancel-checkpoint event.
func CancelCheckpointEvent(id int64) Event {
	return Event{Kind: KindCancelCheckpoint, Cancel: CancelCheckpoint{id}}
}

// WatermarkStatusEvent returns a watermark-status event.
func WatermarkStatusEvent(idle bool) Event {
	return Event{Kind: KindWatermarkStatus, Status: WatermarkStatus{idle}}
}

// IsControl reports whether e is a control event (anything but records).
func (e Event) IsControl() bool { return e.Kind != KindRecords }

func (e Event) String() string {
	switch e.Kind {
	case KindRecords:
		n := 0
		if e.Batch != nil {
			n = len(e.Batch.Records)
		}
		return fmt.Sprintf("records(%d)", n)
	case KindWatermark:
		switch e.Watermark.TS {
		case abi.MaxWatermark:
			return "watermark(MAX)"
		case abi.MinWatermark:
			return "watermark(MIN)"
		}
		return fmt.Sprintf("watermark(%d)", e.Watermark.TS)
	case KindBarrier:
		if e.Barrier.Unaligned {
			return fmt.Sprintf("barrier(%d, %s, sync=%v, unaligned)", e.Barrier.ID, e.Barrier.Kind, e.Barrier.IsSync)
		}
		return fmt.Sprintf("barrier(%d, %s, sync=%v)", e.Barrier.ID, e.Barrier.Kind, e.Barrier.IsSync)
	case KindEndOfData:
		return fmt.Sprintf("end-of-data(drain=%v)", e.EndOfData.Drain)
	case KindEndOfPartition:
		return "end-of-partition"
	case KindCancelCheckpoint:
		return fmt.Sprintf("cancel-checkpoint(%d)", e.Cancel.ID)
	case KindWatermarkStatus:
		if e.Status.Idle {
			return "watermark-status(idle)"
		}
		return "watermark-status(active)"
	}
	return e.Kind.String()
}
