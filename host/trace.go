package host

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/streamd/streamd/internal/telemetry"
)

// Tracing. Each lifecycle export (open, end_input, finish, snapshot_state,
// notify_checkpoint_complete, close) gets a span named telemetry.SpanGuest*,
// a child of the span in the call's ctx, and only if that span is recording:
// without tracing (or in an unsampled trace) a lifecycle call costs one
// context lookup. process, on_watermark and on_timer get no span (records are
// never traced one by one); when they fail, the error is recorded as an event
// on the ctx span. A failing call's span gets an "exception" event with the
// guest's message and wasm stack (see Error.SpanErrorAttributes) and status Error.

// startSpan starts the span of a lifecycle call, or returns nil when ctx
// carries no recording span. checkpointID < 0: none.
func (i *Instance) startSpan(ctx context.Context, name string, checkpointID int64) trace.Span {
	parent := trace.SpanFromContext(ctx)
	if !parent.IsRecording() {
		return nil
	}
	attrs := make([]attribute.KeyValue, 0, 6)
	attrs = append(attrs, telemetry.SubtaskAttrs(i.cfg.JobID, i.cfg.Job, i.cfg.Operator, i.cfg.Subtask, i.cfg.Attempt)...)
	attrs = append(attrs, telemetry.Records(i.records))
	if checkpointID >= 0 {
		attrs = append(attrs, telemetry.CheckpointID(checkpointID))
	}
	_, span := parent.TracerProvider().Tracer(telemetry.ScopeName).Start(ctx, name, trace.WithAttributes(attrs...))
	return span
}

// endSpan records err on span (if any) and ends it; nil span: nothing.
func (i *Instance) endSpan(span trace.Span, err error) {
	if span == nil {
		return
	}
	span.SetAttributes(telemetry.Records(i.records))
	telemetry.EndSpan(span, err)
}

// traceFailure records the failure of an unspanned call (process,
// watermark) on the ctx span, if it is recording.
func traceFailure(ctx context.Context, err error) {
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		telemetry.RecordError(span, err)
	}
}

// SpanErrorAttributes (telemetry.SpanError) describe the failure on a span's
// exception event: the ABI phase, the kind, the guest's message, its wasm
// stack (also as exception.stacktrace) and its last stderr lines.
func (e *Error) SpanErrorAttributes() []attribute.KeyValue {
	attrs := []attribute.KeyValue{
		telemetry.AttrPhase.String(string(e.Phase)),
		telemetry.AttrErrorKind.String(kindLabel(e.Kind)),
		telemetry.AttrGuestMessage.String(e.Message),
		telemetry.Job(e.Job), telemetry.Operator(e.Operator), telemetry.Subtask(e.Subtask),
	}
	if e.Stack != "" {
		attrs = append(attrs, telemetry.AttrWasmStack.String(e.Stack), attribute.String("exception.stacktrace", e.Stack))
	}
	if e.Stderr != "" {
		attrs = append(attrs, telemetry.AttrGuestStderr.String(e.Stderr))
	}
	return attrs
}

// SpanStatus (telemetry.SpanError) is "<kind>: <message>", e.g. "guest trap: out of bounds memory access".
func (e *Error) SpanStatus() string {
	if e.Message == "" {
		return kindLabel(e.Kind)
	}
	return kindLabel(e.Kind) + ": " + e.Message
}

// MarkRecorded remembers that e was recorded on the span sc and reports
// whether it was not already (telemetry.RecordError records an error once per span).
func (e *Error) MarkRecorded(sc trace.SpanContext) bool {
	if e.recordedOn.Equal(sc) {
		return false
	}
	e.recordedOn = sc
	return true
}

// Size is the number of bytes MarshalBinary produces, computed without
// marshaling (the streamd.state_bytes of a snapshot span).
func (s *Snapshot) Size() int64 {
	if s == nil {
		return 0
	}
	n := int64(4 + 4 + 4 + 4) // magic, version, group count, list count
	for _, f := range s.Files {
		for _, sf := range f.Files {
			n += sf.Size
		}
	}
	v2 := SnapshotVersionFor(s) >= 2
	for _, g := range s.KeyGroups {
		n += 4 + 4 + 4 // key group, state count, timer count
		if v2 {
			n += 4 // processing-time timer count
		}
		if g == nil {
			continue
		} // key group, state count, timer count
		for name, entries := range g.Entries {
			n += 4 + int64(len(name)) + 4
			for k, v := range entries {
				n += 8 + int64(len(k)+len(v))
			}
		}
		for _, proc := range []bool{false, true} {
			g.EachTimer(proc, func(key []byte, _ int64) { n += 4 + int64(len(key)) + 8 })
		}
	}
	for name, l := range s.Lists {
		n += 4 + int64(len(name)) + 4 + 4
		if l == nil {
			continue
		}
		for _, e := range l.Entries {
			n += 4 + int64(len(e))
		}
	}
	return n + 4 // crc
}
