package telemetry

import (
	"context"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// ScopeName is the instrumentation scope of every streamd span and instrument.
const ScopeName = "github.com/streamd/streamd"

// Attribute keys. Records are never an attribute one by one: Records is a count.
const (
	AttrJob            = attribute.Key("streamd.job")
	AttrJobID          = attribute.Key("streamd.job.id")   // a deployed job's id; streamd run: the job's name
	AttrJobName        = attribute.Key("streamd.job.name") // the job file's name
	AttrOperator       = attribute.Key("streamd.operator") // the operator uid
	AttrSubtask        = attribute.Key("streamd.subtask")
	AttrAttempt        = attribute.Key("streamd.attempt")
	AttrCheckpointID   = attribute.Key("streamd.checkpoint_id")
	AttrStateBytes     = attribute.Key("streamd.state_bytes")
	AttrInFlightBytes  = attribute.Key("streamd.inflight_bytes") // channel state of an unaligned checkpoint
	AttrAlignment      = attribute.Key("streamd.alignment")      // aligned | unaligned
	AttrRecords        = attribute.Key("streamd.records")        // records processed so far
	AttrHost           = attribute.Key("streamd.host")
	AttrInput          = attribute.Key("streamd.input")
	AttrPhase          = attribute.Key("streamd.phase")      // ABI phase of a guest error
	AttrErrorKind      = attribute.Key("streamd.error_kind") // e.g. "guest trap"
	AttrGuestMessage   = attribute.Key("streamd.guest.message")
	AttrWasmStack      = attribute.Key("streamd.wasm.stack")
	AttrGuestStderr    = attribute.Key("streamd.guest.stderr")
	AttrSavepoint      = attribute.Key("streamd.savepoint")       // savepoint path or id
	AttrCheckpointKind = attribute.Key("streamd.checkpoint_kind") // checkpoint or savepoint
)

// Span names. The guest.* spans are made by package host around each
// lifecycle export; the others by the runtime and the coordinator.
const (
	// per checkpoint, one trace: checkpoint (coordinator, root)
	//   -> task.barrier_alignment, task.snapshot (each subtask, any host)
	//        -> guest.snapshot_state
	//   -> task.notify_checkpoint_complete (after completion)
	//        -> guest.notify_checkpoint_complete
	// A subtask on another host starts its task.* span from the context
	// extracted from the barrier's NATS headers or the control message:
	// the host makes guest.* spans only under a recording (local) span.
	SpanCheckpoint         = "checkpoint"
	SpanCheckpointSubtask  = "checkpoint.subtask" // one subtask's part: trigger to its acknowledgement
	SpanCheckpointPersist  = "checkpoint.persist" // writing the metadata (the commit point)
	SpanBarrierAlignment   = "task.barrier_alignment"
	SpanTaskSnapshot       = "task.snapshot"
	SpanTaskNotifyComplete = "task.notify_checkpoint_complete"

	// per subtask attempt: task (runtime) -> these phases
	SpanTask                = "task"
	SpanTaskOpen            = "task.open"
	SpanTaskEndInput        = "task.end_input"
	SpanTaskFinish          = "task.finish"
	SpanFinalCheckpointWait = "task.final_checkpoint_wait"
	SpanTaskClose           = "task.close"

	// one run of a job (runtime.Run), parent of its task spans; a child of
	// the span in Run's ctx (the controller's, carried in the assignment)
	SpanJob = "job"

	// job-level operations, each its own trace
	SpanStopWithSavepoint = "stop_with_savepoint"
	SpanRestore           = "restore"
	SpanFailover          = "failover"
	SpanRescale           = "rescale"   // the adaptive scheduler ran a job at another parallelism
	SpanAutoscale         = "autoscale" // the autoscaler decided to rescale operators of a job

	// guest exports (package host)
	SpanGuestOpen             = "guest.open"
	SpanGuestEndInput         = "guest.end_input"
	SpanGuestFinish           = "guest.finish"
	SpanGuestSnapshotState    = "guest.snapshot_state"
	SpanGuestNotifyCheckpoint = "guest.notify_checkpoint_complete"
	SpanGuestClose            = "guest.close"
)

// Job etc. build the attributes above.
func Job(job string) attribute.KeyValue            { return AttrJob.String(job) }
func Operator(uid string) attribute.KeyValue       { return AttrOperator.String(uid) }
func Subtask(i int) attribute.KeyValue             { return AttrSubtask.Int(i) }
func Attempt(n int) attribute.KeyValue             { return AttrAttempt.Int(n) }
func CheckpointID(id int64) attribute.KeyValue     { return AttrCheckpointID.Int64(id) }
func StateBytes(n int64) attribute.KeyValue        { return AttrStateBytes.Int64(n) }
func InFlightBytes(n int64) attribute.KeyValue     { return AttrInFlightBytes.Int64(n) }
func Records(n int64) attribute.KeyValue           { return AttrRecords.Int64(n) }
func Host(id string) attribute.KeyValue            { return AttrHost.String(id) }
func Savepoint(pathOrID string) attribute.KeyValue { return AttrSavepoint.String(pathOrID) }

// SubtaskAttrs are the attributes naming one subtask attempt.
func SubtaskAttrs(jobID, job, operator string, subtask, attempt int) []attribute.KeyValue {
	return append(JobAttrs(jobID, job), Operator(operator), Subtask(subtask), Attempt(attempt))
}

// JobAttrs name a job on a span: streamd.job (the name, as before),
// streamd.job.id (id, or the name when the job has no id: streamd run) and
// streamd.job.name.
func JobAttrs(id, name string) []attribute.KeyValue {
	if id == "" {
		id = name
	}
	return []attribute.KeyValue{Job(name), AttrJobID.String(id), AttrJobName.String(name)}
}

// Tracer is streamd's tracer from the global provider (a no-op until Setup
// or Install with tracing on). It is looked up on every call, so a provider
// installed later is used.
func Tracer() trace.Tracer { return otel.GetTracerProvider().Tracer(ScopeName) }

// StartSpan starts a span, a child of ctx's span if any, from the global provider.
func StartSpan(ctx context.Context, name string, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	return Tracer().Start(ctx, name, trace.WithAttributes(attrs...))
}

// StartRoot starts a span that begins a new trace (a checkpoint, a
// stop-with-savepoint, a restore, a failover); if ctx carries a span (say the
// job's), the new root links to it.
func StartRoot(ctx context.Context, name string, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	opts := []trace.SpanStartOption{trace.WithNewRoot(), trace.WithAttributes(attrs...)}
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: sc}))
	}
	return Tracer().Start(ctx, name, opts...)
}

// StartChild starts a span only under a recording parent, from the parent's
// own provider; otherwise it returns ctx and a nil span, allocating nothing.
// This is how the host spans guest calls: no trace, no cost. EndSpan accepts
// the nil span.
func StartChild(ctx context.Context, name string, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	parent := trace.SpanFromContext(ctx)
	if !parent.IsRecording() {
		return ctx, nil
	}
	return parent.TracerProvider().Tracer(ScopeName).Start(ctx, name, trace.WithAttributes(attrs...))
}

// EndSpan records err (if any) on span, sets its status, and ends it. A nil
// span is ignored. Errors that describe themselves to spans (a *host.Error:
// guest message, wasm stack) add their attributes to the error event.
func EndSpan(span trace.Span, err error) {
	if span == nil {
		return
	}
	if err != nil {
		RecordError(span, err)
	}
	span.End()
}

// SpanError is implemented by errors that carry more for a span's error event
// than their text, such as *host.Error (the guest's message and wasm stack).
// One that also has a method MarkRecorded(trace.SpanContext) bool (reporting
// false when already recorded on that span) gets one event per span however
// often it is recorded.
type SpanError interface {
	error
	// SpanErrorAttributes are added to the "exception" event.
	SpanErrorAttributes() []attribute.KeyValue
	// SpanStatus is the span status description (short: kind and message).
	SpanStatus() string
}

// RecordError adds an "exception" event for err to span (with the
// attributes of a SpanError found in err's chain) and sets the span's status
// to Error. The exception.message is err.Error().
func RecordError(span trace.Span, err error) {
	if span == nil || err == nil || !span.IsRecording() {
		return
	}
	desc := err.Error()
	var opts []trace.EventOption
	se, ok := asSpanError(err)
	if ok {
		desc = se.SpanStatus()
		if m, ok := se.(interface {
			MarkRecorded(trace.SpanContext) bool
		}); ok && !m.MarkRecorded(span.SpanContext()) {
			span.SetStatus(codes.Error, desc) // already has its event
			return
		}
		opts = append(opts, trace.WithAttributes(se.SpanErrorAttributes()...))
	}
	span.RecordError(err, opts...)
	span.SetStatus(codes.Error, desc)
}

func asSpanError(err error) (SpanError, bool) {
	for err != nil {
		if se, ok := err.(SpanError); ok {
			return se, true
		}
		switch u := err.(type) {
		case interface{ Unwrap() error }:
			err = u.Unwrap()
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				if se, ok := asSpanError(e); ok {
					return se, true
				}
			}
			return nil, false
		default:
			return nil, false
		}
	}
	return nil, false
}
