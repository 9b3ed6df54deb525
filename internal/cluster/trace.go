package cluster

// Tracing of jobs spread over hosts (docs/observability.md). The controller
// makes, for each attempt, a `job` span (streamd.attempt, streamd.hosts):
// the root of the attempt's trace. Its context goes to the hosts in the
// Assignment, so every host's `task` spans are its children: the subtasks of
// one attempt, on whatever host, are one trace. A failover (a failed task or
// a lost host) is a `failover` span, its own trace linked to the failed
// attempt's span, with the failure as an exception event; the next attempt's
// `restore` (from the checkpoint it restores from) is its child; both last
// until every subtask runs again. Checkpoint and stop_with_savepoint spans
// are made by the runtime.Driver the controller runs, linked to the current
// attempt's span.

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/internal/telemetry"
)

// distObs is a distJob's tracing state (guarded by distJob.mu).
type distObs struct {
	attemptCtx  context.Context // carries the current attempt's job span
	attemptSpan trace.Span
	trace       map[string]string // the attempt span's context for the Assignment; nil: tracing off

	failCtx context.Context // the failover span's context, until the next attempt runs
	pending []trace.Span    // failover and restore spans: end when every subtask runs
	running map[string]bool // without a driver: the hosts that reported running
}

// startAttemptSpan starts the job span of the attempt just deployed (dj.mu
// held): a new trace, linked to the failover that caused it, if any. A
// restore (restore != "") starts under the failover span, or as its own
// trace linked to the attempt.
func (dj *distJob) startAttemptSpan(restore string) {
	o := &dj.obs
	attrs := []attribute.KeyValue{telemetry.Job(dj.id), telemetry.AttrJobID.String(dj.id), telemetry.AttrJobName.String(dj.g.Name), telemetry.Attempt(dj.attempt),
		attribute.StringSlice("streamd.hosts", dj.placement.Hosts())}
	opts := []trace.SpanStartOption{trace.WithNewRoot(), trace.WithAttributes(attrs...)}
	if o.failCtx != nil {
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: trace.SpanContextFromContext(o.failCtx)}))
	}
	o.attemptCtx, o.attemptSpan = telemetry.Tracer().Start(context.Background(), telemetry.SpanJob, opts...)
	o.trace = nil
	if o.attemptSpan.IsRecording() {
		o.trace = telemetry.InjectMap(o.attemptCtx)
	}
	o.running = map[string]bool{}
	if dj.d != nil {
		dj.d.Observe(o.attemptCtx, nil, nil) // checkpoint traces link to the attempt
	}
	if restore != "" {
		rattrs := []attribute.KeyValue{telemetry.Job(dj.id), telemetry.AttrJobID.String(dj.id), telemetry.AttrJobName.String(dj.g.Name), telemetry.Attempt(dj.attempt), telemetry.Savepoint(restore)}
		if dj.d != nil {
			if md := dj.d.Latest(); md != nil && md.Location == restore {
				rattrs = append(rattrs, telemetry.CheckpointID(md.ID), telemetry.AttrCheckpointKind.String(string(md.Kind)))
			}
		}
		var span trace.Span
		if o.failCtx != nil {
			_, span = telemetry.Tracer().Start(o.failCtx, telemetry.SpanRestore, trace.WithAttributes(rattrs...))
		} else {
			_, span = telemetry.StartRoot(o.attemptCtx, telemetry.SpanRestore, rattrs...)
		}
		o.pending = append(o.pending, span)
	}
	o.failCtx = nil
}

// attemptTrace is the trace context for the current attempt's Assignment
// (in the loop).
func (dj *distJob) attemptTrace() map[string]string { return dj.obs.trace }

// failoverSpans (in the loop): the attempt failed for reason. The checkpoint
// and stop spans still open and the attempt span end with the failure; the
// failover span starts, linked to the attempt's span.
func (dj *distJob) failoverSpans(reason string) {
	o := &dj.obs
	err := errors.New(reason)
	o.endPending(err) // an earlier failover whose attempt never ran
	if dj.d != nil {
		dj.d.EndSpans("the attempt failed: " + reason)
	}
	if o.attemptSpan != nil {
		telemetry.EndSpan(o.attemptSpan, err)
		o.attemptSpan = nil
	}
	parent := o.attemptCtx
	if parent == nil {
		parent = context.Background()
	}
	var span trace.Span
	o.failCtx, span = telemetry.StartRoot(parent, telemetry.SpanFailover, telemetry.Job(dj.id), telemetry.AttrJobID.String(dj.id), telemetry.AttrJobName.String(dj.g.Name), telemetry.Attempt(dj.attempt+1))
	telemetry.RecordError(span, err)
	o.pending = append(o.pending, span)
}

// endSpans (in the loop): the job ended; final is the coordinator's last
// event (nil: finished or stopped).
func (dj *distJob) endSpans(final control.Event) {
	o := &dj.obs
	var err error
	switch x := final.(type) {
	case control.Cancel:
		err = errors.New("canceled")
	case control.RestartsExhausted:
		err = errors.New(x.Reason)
	}
	o.endPending(err)
	if dj.d != nil {
		reason := "the job ended"
		if err != nil {
			reason = err.Error()
		}
		dj.d.EndSpans(reason)
	}
	if o.attemptSpan != nil {
		if dj.d != nil {
			o.attemptSpan.SetAttributes(attribute.Int("streamd.checkpoints", dj.d.Checkpoints()))
		}
		telemetry.EndSpan(o.attemptSpan, err)
		o.attemptSpan = nil
	}
}

// endPending ends the failover and restore spans.
func (o *distObs) endPending(err error) {
	for i := len(o.pending) - 1; i >= 0; i-- {
		telemetry.EndSpan(o.pending[i], err)
	}
	o.pending = o.pending[:0]
	o.failCtx = nil
}

// checkRunning (in the loop) ends the failover and restore spans once the
// coordinator sees every subtask running.
func (dj *distJob) checkRunning() {
	if len(dj.obs.pending) == 0 || !dj.ckpt {
		return
	}
	dj.mu.Lock()
	active := dj.active
	dj.mu.Unlock()
	if !active {
		return
	}
	if st := dj.d.State(); st == control.JobRunning || st == control.JobFinishing {
		dj.obs.endPending(nil)
	}
}

// hostRunning: host reported its part of the current attempt running.
// Without a driver (no checkpointing) the failover and restore spans end
// when every host of the attempt has.
func (dj *distJob) hostRunning(host string) {
	if dj.ckpt {
		return
	}
	dj.post(func() {
		dj.mu.Lock()
		active, p := dj.active, dj.placement
		dj.mu.Unlock()
		o := &dj.obs
		if !active || len(o.pending) == 0 {
			return
		}
		o.running[host] = true
		for _, h := range p.Hosts() {
			if !o.running[h] {
				return
			}
		}
		o.endPending(nil)
	})
}
