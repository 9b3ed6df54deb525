package runtime

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/dataplane"
	"github.com/streamd/streamd/internal/checkpoint"
	"github.com/streamd/streamd/internal/jobfile"
	"github.com/streamd/streamd/internal/telemetry"
)

// Observability (docs/observability.md): spans of the task lifecycle, of
// each checkpoint and of the job-level operations, and the metrics of
// telemetry.Metrics. Records are never traced one by one; the phase spans
// of a subtask are made only under its recording task span, so with tracing
// off a lifecycle call costs a context lookup, and the checkpoint's trace
// context (dataplane.Barrier.Trace) is nil.
//
// Span tree of a checkpoint (one trace, rooted in the driver):
//
//	checkpoint (driver, trigger to durable metadata)
//	  task.barrier_alignment (each non-source subtask, first barrier to aligned)
//	  task.snapshot (each subtask) -> guest.snapshot_state (wasm)
//	  task.notify_checkpoint_complete -> guest.notify_checkpoint_complete
//
// Span tree of a run: job -> task (each subtask attempt) -> task.open,
// task.end_input, task.finish, task.final_checkpoint_wait, task.close, and
// the guest.* spans under them. restore, failover and stop_with_savepoint
// start their own traces, linked to the job span; a savepoint's checkpoint
// span is a child of its stop_with_savepoint span.

// tracerOf is the tracer of Options.TracerProvider, else of the global provider.
func tracerOf(opts *Options) trace.Tracer {
	tp := opts.TracerProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	return tp.Tracer(telemetry.ScopeName)
}

// Subtask states as Stats show them: control's words (control.SubtaskState).
const (
	StateDeploying        = string(control.SubtaskDeploying)
	StateRunning          = string(control.SubtaskRunning)
	StateEndOfData        = string(control.SubtaskEndOfData)
	StateFinished         = string(control.SubtaskFinished)
	StateDeployedFinished = string(control.SubtaskDeployedFinished)
	StateFailed           = string(control.SubtaskFailed)
	StateCanceled         = string(control.SubtaskCanceled)
)

var stateWords = [...]string{StateDeploying, StateRunning, StateEndOfData, StateFinished,
	StateDeployedFinished, StateFailed, StateCanceled}

func stateIndex(s string) int32 {
	for i, x := range stateWords {
		if x == s {
			return int32(i)
		}
	}
	return 0
}

// setState records the subtask's state for Stats.
func (t *task) setState(s string) { t.state.Store(stateIndex(s)) }

// State is the subtask's state word.
func (t *task) State() string { return stateWords[t.state.Load()] }

// startTask starts the subtask's task span under ctx (the job span).
func (t *task) startTask(ctx context.Context) context.Context {
	t.initMetrics()
	if t.deployedFinished {
		t.setState(StateDeployedFinished)
	}
	t.tracer = tracerOf(&t.j.opts)
	t.attrs = telemetry.SubtaskAttrs(t.info.JobID, t.info.Job, t.v.UID, t.sub, t.info.Attempt)
	ctx, t.span = t.tracer.Start(ctx, telemetry.SpanTask, trace.WithAttributes(t.attrs...))
	return ctx
}

// endTask ends the task span (and a final-checkpoint wait still open).
func (t *task) endTask(err error) {
	if t.finalSpan != nil {
		if t.ctx.Err() != nil {
			t.finalSpan.AddEvent("canceled")
			t.finalSpan.End()
		} else {
			telemetry.EndSpan(t.finalSpan, err)
		}
		t.finalSpan = nil
	}
	switch {
	case err == nil:
		if t.deployedFinished {
			t.setState(StateDeployedFinished)
		} else {
			t.setState(StateFinished)
		}
	case t.ctx.Err() != nil: // another subtask failed first, or the run was canceled
		t.setState(StateCanceled)
	default:
		t.setState(StateFailed)
	}
	if t.span == nil {
		return
	}
	t.span.SetAttributes(telemetry.Records(t.records))
	if err != nil && t.ctx.Err() != nil {
		// Ended by a failure elsewhere (or a cancel), not failed itself:
		// status Unset, with the cause as an event.
		t.span.AddEvent("canceled", trace.WithAttributes(attribute.String("streamd.cause", context.Cause(t.ctx).Error())))
		t.span.End()
		return
	}
	telemetry.EndSpan(t.span, err)
}

// startPhase starts a lifecycle phase span under the task span, only if that
// is recording; ctx is the context to call the operator with.
func (t *task) startPhase(name string, extra ...attribute.KeyValue) (context.Context, trace.Span) {
	if t.span == nil || !t.span.IsRecording() {
		return t.ctx, nil
	}
	attrs := append(append(t.attrs[:len(t.attrs):len(t.attrs)], extra...), telemetry.Records(t.records))
	return t.tracer.Start(t.ctx, name, trace.WithAttributes(attrs...))
}

// endPhase ends a phase span (nil: nothing) with the records processed so far.
func (t *task) endPhase(span trace.Span, err error) {
	if span == nil {
		return
	}
	span.SetAttributes(telemetry.Records(t.records))
	telemetry.EndSpan(span, err)
}

// startCheckpointSpan starts a span of checkpoint id under the trace context
// tr that came with the barrier or command (the driver's checkpoint span,
// possibly on another host); without one, under the task span if recording.
func (t *task) startCheckpointSpan(name string, id int64, tr map[string]string) (context.Context, trace.Span) {
	if tr == nil {
		if t.span == nil || !t.span.IsRecording() {
			return t.ctx, nil
		}
	}
	ctx := telemetry.ExtractMap(t.ctx, tr)
	attrs := append(append(t.attrs[:len(t.attrs):len(t.attrs)], telemetry.CheckpointID(id)), telemetry.Records(t.records))
	return t.tracer.Start(ctx, name, trace.WithAttributes(attrs...))
}

// alignObs is the span and clock of the alignment in progress.
type alignObs struct {
	start time.Time
	span  trace.Span // nil: tracing off
}

// beginAlignment starts aligning barrier b: the alignment span and clock.
func (t *task) beginAlignment(b control.Barrier) {
	t.align.start = time.Now()
	_, t.align.span = t.startCheckpointSpan(telemetry.SpanBarrierAlignment, b.ID, b.Trace)
}

// endAlignment: every channel delivered the barrier or ended (aligned), or
// the alignment was aborted.
func (t *task) endAlignment(aligned bool) {
	if aligned {
		t.om.Alignment(t.ctx, time.Since(t.align.start))
	}
	if t.align.span != nil {
		if !aligned {
			t.align.span.AddEvent("aborted")
		}
		t.align.span.End()
	}
	t.align = alignObs{}
}

// startFinalWait: the subtask sent EndOfData and waits for its final checkpoint.
func (t *task) startFinalWait() {
	if !t.ckpt || !t.finalStart.IsZero() {
		return
	}
	t.finalStart = time.Now()
	_, t.finalSpan = t.startPhase(telemetry.SpanFinalCheckpointWait)
}

// endFinalWait: the final checkpoint is complete.
func (t *task) endFinalWait() {
	if t.finalStart.IsZero() {
		return
	}
	t.om.FinalCheckpointWait(t.ctx, time.Since(t.finalStart))
	if t.finalSpan != nil {
		if id := t.m.FinalCheckpoint(); id != 0 {
			t.finalSpan.SetAttributes(telemetry.CheckpointID(id))
		}
		t.endPhase(t.finalSpan, nil)
		t.finalSpan = nil
	}
}

// timedOutput adds the time a Send blocks to the subtask's back-pressure
// metric (once per batch or control event).
type timedOutput struct {
	dataplane.Output
	om *telemetry.OperatorMetrics
}

func (o timedOutput) Send(ctx context.Context, ev dataplane.Event) error {
	start := time.Now()
	err := o.Output.Send(ctx, ev)
	o.om.BackPressure(ctx, time.Since(start))
	return err
}

// SendNow passes an unaligned checkpoint's sends, which must not wait for
// room, through to the output (dataplane.Overtaker): without it they would
// fall back to Send and wait behind the back-pressure they overtake.
func (o timedOutput) SendNow(ctx context.Context, ev dataplane.Event) error {
	return dataplane.SendNow(ctx, o.Output, ev)
}

// TrySend and Room pass the overdraft's sends through (dataplane.TrySender):
// the subtask measures the back-pressure of its wait for room itself
// (task.sendQueued).
func (o timedOutput) TrySend(ctx context.Context, ev dataplane.Event) (bool, error) {
	if _, ok := o.Output.(dataplane.TrySender); !ok {
		return true, o.Send(ctx, ev) // it cannot say: send, waiting, timed
	}
	return dataplane.TrySend(ctx, o.Output, ev)
}

func (o timedOutput) Room() <-chan struct{} { return dataplane.Room(o.Output) }

// NotifyEndOfDataAck passes the finishing handshake through to the output.
func (o timedOutput) NotifyEndOfDataAck(f func()) bool {
	return dataplane.NotifyEndOfDataAck(o.Output, f)
}

// initMetrics makes the subtask's metric handle: its live counters (Stats,
// the REST API), exported when metrics are on until the attempt ends.
func (t *task) initMetrics() {
	if t.om == nil {
		t.om = t.j.metrics().Operator(telemetry.SubtaskLabels{JobID: t.info.JobID, Job: t.info.Job, Attempt: t.info.Attempt,
			Host: t.j.opts.Host, Operator: t.v.UID, Subtask: t.sub})
		if ws, ok := t.v.Spec.(*jobfile.WasmSpec); ok && ws.OnError != nil {
			t.om.OnError(ws.OnError.Mode)
		}
	}
}

// metrics are the run's metrics (Options.Metrics, else the global ones; nil: off).
func (j *job) metrics() *telemetry.Metrics {
	if m := j.opts.Metrics; m != nil {
		return m
	}
	return telemetry.GlobalMetrics()
}

// endMetrics ends the series of the attempt's subtasks: every one of them
// ended (the job finished, failed or was canceled, or a failover replaces
// the attempt).
func (j *job) endMetrics() {
	for _, t := range j.tasks {
		t.om.Close()
	}
}

// timeOutputs wraps outs to measure back-pressure.
func (t *task) timeOutputs(outs []dataplane.Output) []dataplane.Output {
	t.initMetrics()
	for i, o := range outs {
		outs[i] = timedOutput{o, t.om}
	}
	return outs
}

// CheckpointStats describes one completed checkpoint or savepoint.
type CheckpointStats struct {
	ID       int64         `json:"id"`
	Kind     string        `json:"kind"`        // checkpoint or savepoint
	Time     time.Time     `json:"time"`        // when it completed
	Duration time.Duration `json:"duration_ns"` // trigger to durable metadata
	Size     int64         `json:"size_bytes"`  // state bytes
	// InFlight is the channel state of an unaligned checkpoint (part of
	// Size); 0 for an aligned one.
	InFlight int64  `json:"inflight_bytes,omitempty"`
	Location string `json:"location,omitempty"`
	// FinishedSubtasks counts the subtasks that had finished at this
	// checkpoint (FLIP-147), FinishedOperators names the operators all of
	// whose subtasks had.
	FinishedSubtasks  int      `json:"finished_subtasks,omitempty"`
	FinishedOperators []string `json:"finished_operators,omitempty"`
	// Incremental is what an incremental checkpoint wrote itself (Size is
	// its whole state, the shared files it refers to included); 0 for a
	// full one.
	Incremental int64 `json:"incremental_bytes,omitempty"`
}

// RecentCheckpoints is how many completed checkpoints Stats keeps.
const RecentCheckpoints = 10

// ckptTrace is a pending checkpoint in the driver: when it was triggered and
// its span, whose context goes with the barriers and notifications.
type ckptTrace struct {
	start time.Time
	ctx   context.Context // carries span
	span  trace.Span
	trace map[string]string // telemetry.InjectMap of the span; nil when tracing is off
	done  bool              // persisted: the span ended, the trace is kept for the notifications
	// pending are the subtasks whose acknowledgement has not come yet.
	pending map[control.SubtaskID]bool
	// persisted is when the metadata was written: the checkpoint's end.
	persisted time.Time
}

// driverObs is the observability state of a Driver: checkpoint spans and
// durations, the stop-with-savepoint span, the recent checkpoints.
type driverObs struct {
	tracer   trace.Tracer       // nil: the global provider's
	metrics  *telemetry.Metrics // nil: off
	parent   context.Context    // carries the job span the checkpoint traces link to
	ckpts    map[int64]*ckptTrace
	stopCtx  context.Context
	stopSpan trace.Span
	history  []CheckpointStats // guarded by Driver.mu
}

// Observe sets where the driver's spans go (tp nil: the global provider),
// the metrics it records (nil: none) and the context whose span (a job's)
// the checkpoint, stop-with-savepoint traces link to.
func (d *Driver) Observe(ctx context.Context, tp trace.TracerProvider, m *telemetry.Metrics) {
	if tp != nil {
		d.obs.tracer = tp.Tracer(telemetry.ScopeName)
	}
	d.obs.metrics, d.obs.parent = m, ctx
	d.obs.meter().StartJob(d.jobID(), d.g.Name) // its counters exist from the start, at 0
}

// meter is the driver's metrics (the global ones when none were given).
func (o *driverObs) meter() *telemetry.Metrics {
	if o.metrics == nil {
		return telemetry.GlobalMetrics()
	}
	return o.metrics
}

func (o *driverObs) tr() trace.Tracer {
	if o.tracer == nil {
		return otel.GetTracerProvider().Tracer(telemetry.ScopeName)
	}
	return o.tracer
}

func (o *driverObs) ctx() context.Context {
	if o.parent == nil {
		return context.Background()
	}
	return o.parent
}

// rootOpts start a new trace linked to the parent's span, if any.
func (o *driverObs) rootOpts(attrs ...attribute.KeyValue) []trace.SpanStartOption {
	opts := []trace.SpanStartOption{trace.WithNewRoot(), trace.WithAttributes(attrs...)}
	if sc := trace.SpanContextFromContext(o.ctx()); sc.IsValid() {
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: sc}))
	}
	return opts
}

// Recent returns the latest completed checkpoints, oldest first.
func (d *Driver) Recent() []CheckpointStats {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]CheckpointStats(nil), d.obs.history...)
}

// observeEvent starts the stop-with-savepoint span when the coordinator
// takes a stop, and records each subtask's part of a pending checkpoint as
// a span from the trigger to its acknowledgement (or decline): the
// subtask's start delay (the barrier's way to it), alignment, synchronous
// snapshot and upload together, with its own spans as the detail.
func (d *Driver) observeEvent(ev control.Event) {
	o := &d.obs
	switch x := ev.(type) {
	case control.StopWithSavepoint:
		if o.stopSpan == nil {
			o.stopCtx, o.stopSpan = o.tr().Start(o.ctx(), telemetry.SpanStopWithSavepoint,
				o.rootOpts(append(telemetry.JobAttrs(d.jobID(), d.g.Name), attribute.Bool("streamd.drain", x.Drain))...)...)
		}
	case control.Ack:
		d.subtaskAnswered(x.CheckpointID, x.Subtask, func(span trace.Span) {
			span.SetAttributes(telemetry.StateBytes(x.Size), attribute.Bool("streamd.after_end_of_data", x.AfterEndOfData))
			if ref, err := checkpoint.ParseBlobRef(x.StateRef); err == nil && ref.InFlight > 0 {
				span.SetAttributes(telemetry.InFlightBytes(ref.InFlight))
			}
		})
	case control.TaskFinished:
		// A subtask that finishes counts as acknowledged in the checkpoints
		// pending (FLIP-147): its part ends here.
		for id, c := range o.ckpts {
			if c.pending[x.Subtask] {
				d.subtaskAnswered(id, x.Subtask, func(span trace.Span) {
					span.SetAttributes(attribute.Bool("streamd.finished", true))
				})
			}
		}
	case control.Decline:
		o.meter().CheckpointDeclined(o.ctx(), d.jobID(), d.g.Name)
		d.subtaskAnswered(x.CheckpointID, x.Subtask, func(span trace.Span) {
			span.SetStatus(codes.Error, "declined: "+x.Reason)
		})
	}
}

// subtaskAnswered ends the pending part of subtask sub in checkpoint id.
func (d *Driver) subtaskAnswered(id int64, sub control.SubtaskID, set func(trace.Span)) {
	c := d.obs.ckpts[id]
	if c == nil || c.done || !c.pending[sub] || !c.span.IsRecording() {
		return
	}
	delete(c.pending, sub)
	attempt := 0
	if d.lc != nil {
		attempt = d.lc.Attempt()
	}
	attrs := append(telemetry.SubtaskAttrs(d.jobID(), d.g.Name, sub.Operator, sub.Index, attempt), telemetry.CheckpointID(id))
	_, span := d.obs.tr().Start(c.ctx, telemetry.SpanCheckpointSubtask, trace.WithTimestamp(c.start), trace.WithAttributes(attrs...))
	set(span)
	span.End()
}

// startPersist starts the span of writing checkpoint id's metadata (nil
// when it is not traced).
func (d *Driver) startPersist(id int64) trace.Span {
	c := d.obs.ckpts[id]
	if c == nil || !c.span.IsRecording() {
		return nil
	}
	_, span := d.obs.tr().Start(c.ctx, telemetry.SpanCheckpointPersist, trace.WithAttributes(append(telemetry.JobAttrs(d.jobID(), d.g.Name), telemetry.CheckpointID(id))...))
	return span
}

// endPersist ends the persist span and records its end as the
// checkpoint's (the bookkeeping after it is not part of the checkpoint).
func (d *Driver) endPersist(id int64, span trace.Span, err error) {
	if span == nil {
		return
	}
	now := time.Now()
	if err != nil {
		telemetry.RecordError(span, err)
	}
	span.End(trace.WithTimestamp(now))
	if c := d.obs.ckpts[id]; c != nil {
		c.persisted = now
	}
}

// pendingList names the subtasks checkpoint c still waits for.
func (c *ckptTrace) pendingList() string {
	var names []string
	for id := range c.pending {
		names = append(names, id.String())
	}
	slices.Sort(names)
	return strings.Join(names, ",")
}

// endStop ends the stop-with-savepoint span: the job stopped with savepoint
// path, or (err) it did not.
func (d *Driver) endStop(path string, err error) {
	o := &d.obs
	if o.stopSpan == nil {
		return
	}
	if err == nil {
		o.stopSpan.SetAttributes(telemetry.Savepoint(path))
	}
	telemetry.EndSpan(o.stopSpan, err)
	o.stopSpan = nil
}

// startCheckpoint starts the span of a triggered checkpoint and returns the
// trace context its barriers carry (nil when tracing is off). A savepoint of
// a stop-with-savepoint is a child of the stop_with_savepoint span; any other
// checkpoint starts a trace.
func (d *Driver) startCheckpoint(x control.TriggerCheckpoint) map[string]string {
	o := &d.obs
	if o.ckpts == nil {
		o.ckpts = map[int64]*ckptTrace{}
	}
	if c := o.ckpts[x.ID]; c != nil {
		return c.trace
	}
	attrs := append(telemetry.JobAttrs(d.jobID(), d.g.Name), telemetry.CheckpointID(x.ID),
		telemetry.AttrCheckpointKind.String(string(x.Kind)), attribute.Int("streamd.tasks", len(x.Tasks)))
	var ctx context.Context
	var span trace.Span
	now := time.Now()
	if x.Kind == control.KindSavepoint && o.stopSpan != nil {
		ctx, span = o.tr().Start(o.stopCtx, telemetry.SpanCheckpoint, trace.WithAttributes(attrs...), trace.WithTimestamp(now))
	} else {
		ctx, span = o.tr().Start(o.ctx(), telemetry.SpanCheckpoint, append(o.rootOpts(attrs...), trace.WithTimestamp(now))...)
	}
	c := &ckptTrace{start: now, ctx: ctx, span: span}
	if span.IsRecording() {
		c.trace = telemetry.InjectMap(ctx)
		c.pending = make(map[control.SubtaskID]bool, len(x.Wait))
		for _, id := range x.Wait {
			c.pending[id] = true
		}
	}
	o.ckpts[x.ID] = c
	return c.trace
}

// checkpointPersisted: checkpoint x's metadata md is durable (err nil), or
// could not be written.
func (d *Driver) checkpointPersisted(x control.PersistMetadata, md *checkpoint.Metadata, err error) {
	o := &d.obs
	c := o.ckpts[x.ID]
	if c == nil {
		return
	}
	if err != nil {
		telemetry.EndSpan(c.span, fmt.Errorf("runtime: persist checkpoint %d: %w", x.ID, err))
		delete(o.ckpts, x.ID)
		return
	}
	dur := time.Since(c.start)
	m := o.metrics
	if m == nil {
		m = telemetry.GlobalMetrics()
	}
	m.Checkpoint(o.ctx(), d.jobID(), d.g.Name, x.ID, dur, x.Size)
	c.span.SetAttributes(telemetry.StateBytes(x.Size), telemetry.InFlightBytes(md.InFlightBytes()))
	if x.Kind == control.KindSavepoint {
		c.span.SetAttributes(telemetry.Savepoint(md.Location))
	} else {
		c.span.SetAttributes(attribute.String("streamd.location", md.Location))
	}
	if c.persisted.IsZero() {
		c.span.End()
	} else {
		c.span.End(trace.WithTimestamp(c.persisted))
	}
	c.done = true
	d.mu.Lock()
	cs := CheckpointStats{ID: x.ID, Kind: string(x.Kind), Time: time.Now(),
		Duration: dur, Size: x.Size, InFlight: md.InFlightBytes(), Location: md.Location}
	for i := range md.Operators {
		op := &md.Operators[i]
		if op.Finished == control.OperatorFullyFinished {
			cs.FinishedOperators = append(cs.FinishedOperators, op.UID)
			cs.FinishedSubtasks += op.Parallelism
		} else {
			cs.FinishedSubtasks += op.FinishedSubtasks()
		}
	}
	if len(md.SharedFiles()) > 0 {
		cs.Size, cs.Incremental = md.FullSize(), md.IncrementalSize()
	}
	o.history = append(o.history, cs)
	if n := len(o.history); n > RecentCheckpoints {
		o.history = append(o.history[:0], o.history[n-RecentCheckpoints:]...)
	}
	d.mu.Unlock()
}

// notifyTrace is the trace context of checkpoint id's notifications; the
// driver forgets the checkpoint afterwards.
func (d *Driver) notifyTrace(id int64) map[string]string {
	c := d.obs.ckpts[id]
	if c == nil {
		return nil
	}
	delete(d.obs.ckpts, id)
	return c.trace
}

// checkpointAborted ends the span of an aborted checkpoint.
func (d *Driver) checkpointAborted(id int64, reason string) {
	c := d.obs.ckpts[id]
	if c == nil {
		return
	}
	delete(d.obs.ckpts, id)
	if !c.done {
		d.obs.meter().CheckpointFailed(d.obs.ctx(), d.jobID(), d.g.Name, reason)
		if len(c.pending) > 0 {
			c.span.SetAttributes(attribute.String("streamd.pending", c.pendingList()), attribute.Int("streamd.pending_count", len(c.pending)))
		}
		c.span.SetStatus(codes.Error, "aborted: "+reason)
		c.span.End()
	}
}

// EndSpans ends the spans of the checkpoints still pending and of a
// stop-with-savepoint (an attempt or the job ended: they will not complete).
func (d *Driver) EndSpans(reason string) {
	for id := range d.obs.ckpts {
		d.checkpointAborted(id, reason)
	}
	d.endStop("", errors.New(reason))
}

// runObs is the observability state of a Run: the job span and the restore
// and failover spans that last until every subtask runs again.
type runObs struct {
	tracer  trace.Tracer
	jobCtx  context.Context
	jobSpan trace.Span
	pending []trace.Span
}

// startJob starts the job span, a child of ctx's span if any (a controller's).
func (r *runner) startJob(ctx context.Context) context.Context {
	r.obs.tracer = tracerOf(&r.opts)
	ctx, r.obs.jobSpan = r.obs.tracer.Start(ctx, telemetry.SpanJob, trace.WithAttributes(telemetry.JobAttrs(r.opts.JobID, r.g.Name)...))
	r.obs.jobCtx = ctx
	return ctx
}

// endJob ends the job span and any operation still open.
func (r *runner) endJob(err error) {
	r.endPending(err)
	if r.coord != nil {
		if err == nil && r.Savepoint() != "" {
			r.endStop(r.Savepoint(), nil)
		}
		reason := "the job ended"
		if err != nil {
			reason = err.Error()
		}
		r.EndSpans(reason)
	}
	// The job's series (checkpoints, restarts) end with it.
	m := r.opts.Metrics
	if m == nil {
		m = telemetry.GlobalMetrics()
	}
	m.EndJob(r.opts.JobID, r.g.Name)
	if r.coord != nil {
		if id := r.Driver.jobID(); id != r.opts.JobID && id != r.g.Name {
			m.EndJob(id, r.g.Name)
		}
	}
	r.obs.jobSpan.SetAttributes(attribute.Int("streamd.restarts", r.restarts), attribute.Int("streamd.checkpoints", r.Checkpoints()))
	telemetry.EndSpan(r.obs.jobSpan, err)
}

// startPending starts a job-level operation that lasts until every subtask
// runs again (restore, failover): a child of parent when parent carries a
// span, else a new trace linked to the job span.
func (r *runner) startPending(parent context.Context, name string, attrs ...attribute.KeyValue) context.Context {
	attrs = append(attrs, telemetry.JobAttrs(r.opts.JobID, r.g.Name)...)
	var span trace.Span
	var ctx context.Context
	if parent != nil {
		ctx, span = r.obs.tracer.Start(parent, name, trace.WithAttributes(attrs...))
	} else {
		opts := []trace.SpanStartOption{trace.WithNewRoot(), trace.WithAttributes(attrs...)}
		if sc := trace.SpanContextFromContext(r.obs.jobCtx); sc.IsValid() {
			opts = append(opts, trace.WithLinks(trace.Link{SpanContext: sc}))
		}
		ctx, span = r.obs.tracer.Start(r.obs.jobCtx, name, opts...)
	}
	r.obs.pending = append(r.obs.pending, span)
	return ctx
}

// startRestore starts the restore span of rs (under parent, else its own trace).
func (r *runner) startRestore(parent context.Context, rs *checkpoint.Restore) {
	md := rs.Metadata
	r.startPending(parent, telemetry.SpanRestore, telemetry.CheckpointID(md.ID),
		telemetry.AttrCheckpointKind.String(string(md.Kind)), telemetry.Savepoint(md.Location))
}

// endPending ends the restore and failover spans: every subtask runs (err
// nil) or the attempt ended first.
func (r *runner) endPending(err error) {
	for i := len(r.obs.pending) - 1; i >= 0; i-- {
		telemetry.EndSpan(r.obs.pending[i], err)
	}
	r.obs.pending = r.obs.pending[:0]
}

// checkRunning ends the pending spans once the coordinator sees every subtask running.
func (r *runner) checkRunning() {
	if len(r.obs.pending) == 0 || r.coord == nil {
		return
	}
	if st := r.coord.State(); st == control.JobRunning || st == control.JobFinishing {
		r.endPending(nil)
	}
}

// subtaskStates fills in each operator's subtask states from attempt j (nil:
// none started yet, every subtask deploying).
func subtaskStates(s *Stats, g *control.JobGraph, j *job) {
	for i, v := range g.Vertices {
		states := make([]string, v.Parallelism)
		var live []telemetry.SubtaskLive
		for k := range states {
			if j == nil {
				states[k] = StateDeploying
			} else if t := j.byID[control.SubtaskID{Operator: v.UID, Index: k}]; t != nil {
				states[k] = t.State()
				if live == nil {
					live = make([]telemetry.SubtaskLive, v.Parallelism)
				}
				live[k] = t.om.Live()
			}
		}
		s.Operators[i].Subtasks, s.Operators[i].Live = states, live
	}
}

// jobID is the job's id for spans: a deployed job's (CheckpointOptions.JobID),
// else its name.
func (d *Driver) jobID() string {
	if d.co != nil && d.co.JobID != "" {
		return d.co.JobID
	}
	return d.g.Name
}
