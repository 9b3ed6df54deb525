package runtime

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/dataplane"
	"github.com/streamd/streamd/internal/checkpoint"
	"github.com/streamd/streamd/internal/connector"
	"github.com/streamd/streamd/internal/jobfile"
	"github.com/streamd/streamd/internal/telemetry"
)

// task is one subtask: a source loop or an operator loop, run by one goroutine.
type task struct {
	j       *job
	v       *control.Vertex
	sub     int
	id      control.SubtaskID
	info    SubtaskInfo
	stats   *opStats
	gate    *dataplane.InputGate      // nil for sources
	nData   int                       // data channels of the gate; the mailbox is channel nData
	writers []*dataplane.RecordWriter // one per output edge, main and side outputs
	// Side outputs (sideout.go): main are the writers of the main output
	// (emit), side those of each side output (emit_to).
	main []*dataplane.RecordWriter
	side map[string][]*dataplane.RecordWriter
	// Output watermark (sideout.go): outWM is the last watermark sent
	// downstream; ownWM: the operator called emit_watermark, so its
	// output watermark is its own; outIdle: it told its outputs it is idle.
	outWM   int64
	ownWM   bool
	outIdle bool
	op      NativeOperator // operators and sinks
	cp      checkpointer   // op's checkpoint side
	// newSource creates the source of a source subtask, resuming at pos.
	newSource func(pos []byte) (connector.Source, error)

	// Restore and checkpointing.
	ckpt             bool     // the job checkpoints: wait for a final checkpoint before closing
	mb               *mailbox // commands from the driver
	srcWake          chan struct{}
	srcPos           []byte // restored source position
	srcFinished      bool   // restored source subtask that had finished its input
	deployedFinished bool   // restored as finished: no user code runs

	ctx     context.Context // the run's context, for emit
	emit    Emitter
	emitErr error // first failed send of an emit (the Emitter cannot return it)
	cmds    []command
	// m is the subtask's side of the protocol (alignment, end of data, the
	// final checkpoint, stop); the task goroutine does its IO.
	m *control.SubtaskMachine
	// Of a source: the position after the records sent so far (what a
	// snapshot stores); its watermark is outWM.
	srcAt []byte
	// Of a source that hears of completed checkpoints
	// (connector.CheckpointSource): the positions its snapshots stored, by
	// checkpoint id, until that checkpoint (or a later one) completes.
	srcSnaps map[int64][]byte
	// Of a source, its watermark strategy (sideout.go): srcPend is the
	// source's watermark not sent yet (at most every wmInterval, srcSent
	// the last time); srcLastRec when the last record came, for
	// idleTimeout.
	srcPend     int64
	srcSent     time.Time
	srcLastRec  time.Time
	wmInterval  time.Duration
	idleTimeout time.Duration
	src         connector.Source
	reader      *sourceReader
	// Of an operator: the alignment in progress (spans and metrics).
	align alignObs
	// cmdTrace is the trace context of the command being applied.
	cmdTrace map[string]string
	// bg counts the snapshot writes running in the background; the subtask
	// waits for them before it returns.
	bg sync.WaitGroup
	// Unaligned checkpoints (unaligned.go).
	origins   []chanOrigin // per data channel: its sending end
	outDests  []chanOrigin // per output channel (writers in order): its receiving end
	overtakes bool         // the job's barriers may overtake (mode unaligned or an aligned timeout)
	ua        unalignedState
	inflight  []checkpoint.ChannelData // restored channel state, replayed first

	// Observability (observe.go).
	state      atomic.Int32 // index into stateWords, read by Stats
	tracer     trace.Tracer
	span       trace.Span // the task span
	attrs      []attribute.KeyValue
	om         *telemetry.OperatorMetrics // nil: metrics off
	records    int64                      // records processed: read (source) or received (operator)
	inBatch    bool                       // in a Process call: its emits count in the batch's metric
	batchOut   int                        // records emitted by the current Process call
	finalStart time.Time                  // end of data sent: the final-checkpoint wait began
	finalSpan  trace.Span

	pwake procWake // the wake-up for the earliest processing-time timer (proctime.go)
}

// setGate makes the input gate of an operator subtask over its data
// channels and, as the last channel, its mailbox.
func (t *task) setGate(data []dataplane.GateChannel) {
	t.nData = len(data)
	t.gate = dataplane.NewInputGate(append(data, dataplane.GateChannel{In: cmdInput{t.mb}, Input: -1}))
}

// fail wraps err with the subtask and phase, unless it is a *host.Error,
// which already names them.
func (t *task) fail(phase string, err error) error {
	if isHostError(err) {
		return err
	}
	return &TaskError{Job: t.info.Job, Operator: t.v.UID, Subtask: t.sub, Parallelism: t.v.Parallelism, Phase: phase, Err: err}
}

// emitRecords is the Emitter of the subtask: it copies recs into every output
// edge's pending batches.
func (t *task) emitRecords(recs []abi.Record) {
	if t.emitErr != nil {
		return
	}
	t.countOut(len(recs))
	for _, w := range t.main {
		if err := w.EmitBatch(t.ctx, recs); err != nil {
			t.emitErr = err
			return
		}
	}
}

// broadcast sends a control event on every output edge, after the pending records.
func (t *task) broadcast(ev dataplane.Event) error {
	for _, w := range t.writers {
		if err := w.Broadcast(t.ctx, ev); err != nil {
			return err
		}
	}
	return nil
}

func (t *task) flush() error {
	for _, w := range t.writers {
		if err := w.Flush(t.ctx); err != nil {
			return err
		}
	}
	return nil
}

// outputOverdraft is the writers' overdraft (dataplane.WriterOptions):
// events per output channel handed on while the channel is full. A source's
// batch fills one or two batches per output, more with large records. In
// bytes the overdraft is dataplane.DefaultOverdraftBytes a writer (4 MiB):
// what a back-pressured subtask holds beyond its channels, and stores as
// output buffers in an unaligned checkpoint, at most (but for its newest
// batch).
const outputOverdraft = 8

// submit hands the pending batches on without waiting for room; what does
// not fit stays queued for sendQueued.
func (t *task) submit() error {
	for _, w := range t.writers {
		if err := w.Submit(t.ctx); err != nil {
			return err
		}
	}
	return nil
}

// outputsQueued reports whether a writer holds events its channels had no
// room for.
func (t *task) outputsQueued() bool {
	for _, w := range t.writers {
		if w.Queued() {
			return true
		}
	}
	return false
}

// sendQueued sends what the writers queued as far as the channels have
// room; when one has none it waits for room there or for wake (the
// mailbox's, or the input gate's, which brings commands and overtaking
// barriers too), once: the caller's loop takes what woke it. This is
// where a back-pressured subtask waits, so a checkpoint trigger or an
// unaligned barrier never waits for a send (Flink's mailbox loop, which
// processes mail while it waits for output availability).
func (t *task) sendQueued(ctx context.Context, wake <-chan struct{}) error {
	var room <-chan struct{}
	for _, w := range t.writers {
		r, err := w.TryDrain(ctx)
		if err != nil {
			return t.fail(phaseOutput, err)
		}
		if room == nil {
			room = r
		}
	}
	if room == nil {
		return nil
	}
	start := time.Now()
	select {
	case <-room:
	case <-wake:
	case <-ctx.Done():
		return t.fail(phaseOutput, context.Cause(ctx))
	}
	t.om.BackPressure(ctx, time.Since(start))
	return nil
}

// flushExpired sends the pending batches older than the buffer timeout
// (dataplane.RecordWriter.FlushExpired), after a batch of work of a busy
// subtask.
func (t *task) flushExpired() error {
	if t.j.opts.BufferTimeout < 0 || len(t.writers) == 0 {
		return nil
	}
	now := time.Now()
	for _, w := range t.writers {
		if err := w.FlushExpired(t.ctx, now); err != nil {
			return err
		}
	}
	return nil
}

// call runs one operator call and checks the sends its emits made.
func (t *task) call(phase string, err error) error {
	if err == nil {
		err = t.emitErr
	}
	if err != nil {
		return t.fail(phase, err)
	}
	return nil
}

// report tells the driver about the subtask (checkpointing jobs only).
func (t *task) report(ev control.Event) {
	if !t.ckpt {
		return
	}
	select {
	case t.j.events <- ev:
	case <-t.ctx.Done():
	}
}

func (t *task) run(ctx context.Context) (err error) {
	t.ctx = ctx
	ctx = t.startTask(ctx)
	t.ctx = ctx
	defer func() { t.endTask(err) }()
	t.emit = t.emitRecords
	log := t.j.log.With("operator", t.v.UID, "subtask", t.sub)
	log.Debug("subtask started")
	defer func() {
		t.mb.close()
		t.stopTimers()
		t.bg.Wait()
		if err != nil {
			for _, w := range t.writers {
				w.Discard()
			}
			log.Debug("subtask failed", "err", err)
		} else {
			log.Debug("subtask finished")
		}
	}()
	if t.newSource != nil {
		return t.runSource(ctx)
	}
	return t.runOperator(ctx)
}

// newMachine makes the subtask's protocol machine (setup).
func (t *task) newMachine() error {
	cfg := control.SubtaskConfig{ID: t.id, Inputs: len(t.v.Inputs), Checkpointing: t.ckpt,
		DeployedFinished: t.deployedFinished, InputEnded: t.srcFinished}
	if co := t.j.opts.Checkpoint; co != nil {
		cfg.Alignment, cfg.AlignedTimeout = co.Mode, co.AlignedTimeout
		t.overtakes = t.gate != nil && (co.Mode == control.AlignUnaligned || co.AlignedTimeout > 0)
		if t.gate != nil && co.Mode == control.AlignAligned && co.AlignedTimeout > 0 {
			// The aligned timeout counts from when a barrier is queued,
			// not from when it comes out of a back-pressured queue.
			t.gate.AnnounceBarriers()
		}
	}
	for c := 0; c < t.nData; c++ {
		cfg.Channels = append(cfg.Channels, t.gate.Input(c))
	}
	for _, w := range t.writers {
		cfg.Outputs += w.NumOutputs()
	}
	m, err := control.NewSubtaskMachine(cfg)
	if err != nil {
		return err
	}
	t.m = m
	return nil
}

// step feeds ev to the protocol machine and carries out its actions.
func (t *task) step(ev control.SubtaskEvent) error {
	if err := t.m.Step(ev); err != nil {
		if ch, ok := control.ChannelOf(ev); ok && errors.Is(err, control.ErrChannelProtocol) && t.gate != nil {
			return t.fail(phaseInput, fmt.Errorf("%s: %w", t.gate.Name(ch), err))
		}
		return t.fail(phaseInput, err)
	}
	for _, a := range t.m.Ready() {
		if err := t.perform(a); err != nil {
			t.m.Advance()
			return err
		}
	}
	t.m.Advance()
	return nil
}

func toDataplaneBarrier(b control.Barrier) dataplane.Barrier {
	kind := dataplane.Checkpoint
	if b.Kind == control.KindSavepoint {
		kind = dataplane.Savepoint
	}
	return dataplane.Barrier{ID: b.ID, Kind: kind, IsSync: b.Sync, Unaligned: b.Unaligned, Base: b.Base, Trace: b.Trace}
}

func fromDataplaneBarrier(b dataplane.Barrier) control.Barrier {
	kind := control.KindCheckpoint
	if b.Kind == dataplane.Savepoint {
		kind = control.KindSavepoint
	}
	return control.Barrier{ID: b.ID, Kind: kind, Sync: b.IsSync, Unaligned: b.Unaligned, Base: b.Base, Trace: b.Trace}
}

// perform carries out one action of the protocol machine.
func (t *task) perform(a control.SubtaskAction) error {
	switch x := a.(type) {
	case control.Report:
		t.report(x.Event)
	case control.BlockChannel:
		t.gate.Block(x.Channel)
	case control.UnblockChannels:
		t.gate.UnblockAll()
	case control.AlignmentStarted:
		t.beginAlignment(x.B)
	case control.AlignmentEnded:
		t.endAlignment(x.Aligned)
	case control.ForwardBarrier:
		ev := dataplane.BarrierEvent(toDataplaneBarrier(x.B))
		var err error
		if x.Overtake {
			err = t.broadcastNow(ev)
		} else {
			err = t.broadcast(ev)
		}
		if err != nil {
			return t.fail(phaseOutput, err)
		}
	case control.TakeSnapshot:
		if x.Unaligned {
			return t.startUnaligned(x)
		}
		return t.snapshot(x)
	case control.CaptureOutputs:
		t.captureOutputs()
	case control.StartCapture:
		t.startCapture(x.Channel, x.ID)
	case control.StopCapture:
		t.stopCapture(x.Channel)
	case control.CaptureOvertaken:
		t.captureOvertaken(x.Channel, x.ID)
	case control.FinishSnapshot:
		return t.finishUnaligned(x.ID)
	case control.AbortSnapshot:
		t.abortUnaligned(x.ID)
	case control.ArmAlignmentTimer:
		t.armAlignmentTimer(x.ID)
	case control.ForwardCancel:
		if err := t.broadcast(dataplane.CancelCheckpointEvent(x.ID)); err != nil {
			return t.fail(phaseOutput, err)
		}
	case control.AdvanceWatermark:
		t.om.Watermark(t.ctx, x.TS)
		if err := t.call(string(abi.PhaseWatermark), t.op.AdvanceWatermark(t.ctx, x.TS, t.emit)); err != nil {
			return err
		}
		if t.ownWM {
			return nil // the operator's output watermark is its own (emit_watermark)
		}
		if err := t.sendWatermark(x.TS); err != nil {
			return t.fail(phaseOutput, err)
		}
	case control.EmitWatermarkStatus:
		if err := t.sendStatus(x.Idle); err != nil {
			return t.fail(phaseOutput, err)
		}
	case control.EndInput:
		ectx, span := t.startPhase(telemetry.SpanTaskEndInput, telemetry.AttrInput.Int(x.Input))
		err := t.op.EndInput(ectx, x.Input, t.emit)
		t.endPhase(span, err)
		return t.call(string(abi.PhaseEndInput), err)
	case control.FinishOperator:
		fctx, span := t.startPhase(telemetry.SpanTaskFinish)
		err := t.op.Finish(fctx, t.emit)
		t.endPhase(span, err)
		return t.call(string(abi.PhaseFinish), err)
	case control.EmitEndOfData:
		return t.endData(x)
	case control.AckEndOfData:
		if err := dataplane.AckEndOfData(t.gate.In(x.Channel)); err != nil {
			return t.fail(phaseInput, err)
		}
	case control.NotifyOperator:
		if t.cp == nil {
			return t.notifySource(x.ID)
		}
		nctx, span := t.startCheckpointSpan(telemetry.SpanTaskNotifyComplete, x.ID, t.cmdTrace)
		err := t.cp.notify(nctx, x.ID)
		telemetry.EndSpan(span, err)
		if err != nil {
			return t.fail(string(abi.PhaseNotify), err)
		}
	case control.CloseSubtask:
		return t.closeSubtask()
	default:
		return t.fail(phaseSetup, fmt.Errorf("unknown protocol action %T", a))
	}
	return nil
}

// endData sends what ends a subtask's data: with MaxWatermark (or drain,
// for an operator with its own output watermark) the MAX watermark unless
// it was sent already, then EndOfData(drain) (DESIGN.md "Finishing" 1b, 3b).
func (t *task) endData(x control.EmitEndOfData) error {
	// An operator with its own output watermark (emit_watermark) gets MAX
	// after finish too.
	if (x.MaxWatermark || x.Drain && t.ownWM) && t.outWM < abi.MaxWatermark {
		if err := t.broadcast(dataplane.WatermarkEvent(abi.MaxWatermark)); err != nil {
			return t.fail(phaseOutput, err)
		}
		t.outWM = abi.MaxWatermark
	}
	if err := t.broadcast(dataplane.EndOfDataEvent(x.Drain)); err != nil {
		return t.fail(phaseOutput, err)
	}
	t.j.log.Debug("end of data sent", "operator", t.v.UID, "subtask", t.sub, "drain", x.Drain)
	t.watchAcks()
	t.startFinalWait()
	if !t.deployedFinished {
		t.setState(StateEndOfData)
	}
	return nil
}

// watchAcks arranges for the acknowledgement of the EndOfData just sent on
// each output channel to reach the machine (OutputAcked through the
// mailbox). A channel whose receiver does not acknowledge (an older NATS
// peer) counts as acknowledged at once: the subtask then closes as it did
// before the handshake, after its final checkpoint.
func (t *task) watchAcks() {
	k := 0
	for _, w := range t.writers {
		for i := 0; i < w.NumOutputs(); i++ {
			ack := command{kind: cmdAck, id: int64(k)}
			if !dataplane.NotifyEndOfDataAck(w.Output(i), func() { t.mb.send(ack) }) {
				t.mb.send(ack)
			}
			k++
		}
	}
}

// snapshot takes this subtask's part of checkpoint x.B after its barrier went
// downstream: the operator's state (or the source position), written to the
// store, then the acknowledgement.
func (t *task) snapshot(x control.TakeSnapshot) error {
	sctx, span := t.startCheckpointSpan(telemetry.SpanTaskSnapshot, x.B.ID, x.B.Trace)
	st, err := t.takeState(sctx, x.B)
	if err != nil {
		telemetry.EndSpan(span, err)
		return err
	}
	t.writeSnapshot(x, st, span, nil)
	return nil
}

// takeState snapshots the operator's state (a source: its position) for
// checkpoint id; nil for a deployed-finished subtask, which has none.
func (t *task) takeState(ctx context.Context, b control.Barrier) (*checkpoint.SubtaskState, error) {
	start := time.Now()
	defer func() { t.stats.addPause(time.Since(start)) }()
	switch {
	case t.deployedFinished:
		return nil, nil
	case t.newSource != nil:
		if _, ok := t.src.(connector.CheckpointSource); ok {
			if t.srcSnaps == nil {
				t.srcSnaps = map[int64][]byte{}
			}
			t.srcSnaps[b.ID] = t.srcAt
		}
		return &checkpoint.SubtaskState{SourcePosition: t.srcAt}, nil
	}
	st, err := t.cp.snapshot(ctx, b)
	if err != nil {
		return nil, t.fail(string(abi.PhaseSnapshot), err)
	}
	return st, nil
}

// writeSnapshot writes st (nil: no state) as this subtask's part of
// checkpoint x.B and reports the Ack, or a Decline when the write fails; it
// ends span (nil: tracing off) with the state and in-flight bytes. A wasm
// operator's state (a copy-on-write cut, see host.Snapshot) and channel
// state are encoded and written in the background, while the subtask goes
// on processing: the barrier has gone on already, and the checkpoint
// completes only once the Ack is in, i.e. when the write is durable. A
// two-phase-commit sink's pending data goes in the background too (its
// PreCommit state is never changed after it returned): the sink commits
// only after the checkpoint completes, after the Ack, after the write, and
// its subtask does not stop for the write and fsync of an epoch's records
// (the Kafka and NATS sinks keep them in their state). written (nil: none)
// runs once the write is done or failed: the channel state's batches are
// released then.
func (t *task) writeSnapshot(x control.TakeSnapshot, st *checkpoint.SubtaskState, span trace.Span, written func()) {
	if st != nil && (st.Operator != nil || !st.Channels.Empty() || st.HasSinkPending()) {
		t.bg.Add(1)
		go func() {
			defer t.bg.Done()
			t.writeSnapshotNow(x, st, span)
			if written != nil {
				written()
			}
		}()
		return
	}
	t.writeSnapshotNow(x, st, span)
	if written != nil {
		written()
	}
}

func (t *task) writeSnapshotNow(x control.TakeSnapshot, st *checkpoint.SubtaskState, span trace.Span) {
	if st != nil {
		defer st.Operator.Release() // written (or failed): the cut is no longer read
	}
	b := x.B
	var err error
	var ref checkpoint.BlobRef
	defer func() {
		if span != nil {
			span.SetAttributes(telemetry.StateBytes(ref.Size))
			if x.Unaligned {
				span.SetAttributes(telemetry.InFlightBytes(ref.InFlight), telemetry.AttrAlignment.String("unaligned"))
			}
			telemetry.EndSpan(span, err)
		}
	}()
	ack := control.Ack{CheckpointID: b.ID, Subtask: t.id, AfterEndOfData: x.AfterEndOfData, DeployedFinished: x.DeployedFinished}
	if st != nil {
		if ref, err = checkpoint.WriteSubtaskState(t.ctx, t.j.store, b.Kind, b.ID, t.id, st); err != nil {
			t.report(control.Decline{CheckpointID: b.ID, Subtask: t.id, Kind: control.DeclineFailure, Reason: err.Error()})
			return
		}
		ack.StateRef, ack.Size = ref.String(), ref.Size
		if w, ok := t.cp.(interface {
			stateWritten(id int64, st *checkpoint.SubtaskState)
		}); ok {
			w.stateWritten(b.ID, st)
		}
		if st.Operator != nil {
			for _, l := range st.Operator.Lists {
				if l != nil && l.Mode == abi.ListUnion {
					ack.UnionState = true
				}
			}
		}
	}
	t.report(ack)
}

// closeSubtask closes a subtask whose data ended and whose final checkpoint
// (with checkpointing) is complete, then sends EndOfPartition (DESIGN.md
// "Finishing" 1d, 4).
func (t *task) closeSubtask() error {
	t.endFinalWait()
	if !t.deployedFinished {
		cctx, span := t.startPhase(telemetry.SpanTaskClose)
		var err error
		if t.newSource != nil {
			err = t.closeSource()
		} else {
			err = t.op.Close(cctx)
		}
		t.endPhase(span, err)
		if err := t.call(string(abi.PhaseClose), err); err != nil {
			return err
		}
	}
	if err := t.broadcast(dataplane.EndOfPartitionEvent()); err != nil {
		return t.fail(phaseOutput, err)
	}
	return nil
}

// command turns a driver command into the machine's event.
func (t *task) command(c command) control.SubtaskEvent {
	switch c.kind {
	case cmdTrigger:
		return control.Trigger{B: fromDataplaneBarrier(c.barrier)}
	case cmdNotify:
		return control.CheckpointComplete{ID: c.id}
	case cmdAbort:
		return control.CheckpointAborted{ID: c.id}
	case cmdStop:
		return control.StopSource{SavepointID: c.id, Drain: c.drain}
	case cmdAck:
		return control.OutputAcked{Channel: int(c.id)}
	case cmdAlignTimeout:
		return control.AlignmentTimedOut{ID: c.id}
	case cmdProcTime:
		t.pwake.armed = false // fired: the loop fires the due timers and re-arms
	}
	return nil
}

// commands applies the queued driver commands.
func (t *task) commands() error {
	t.cmds = t.mb.take(t.cmds[:0])
	for _, c := range t.cmds {
		ev := t.command(c)
		if ev == nil {
			continue
		}
		t.cmdTrace = c.trace // the notify span's parent
		err := t.step(ev)
		t.cmdTrace = nil
		if err != nil {
			return err
		}
		if t.m.Done() {
			return nil
		}
	}
	return nil
}

// runSource is the loop of a source subtask. It sends the source's batches
// downstream, with the source's watermark after each batch, and takes the
// driver's commands at any time: between batches and while the source
// waits for input (a throttled generator, a file or stdin waiting for a
// line, an empty nats stream), so checkpoints and stops never wait for the
// next record. A source that says a Read returns at once
// (connector.ReadySource) is read here; otherwise the read goes to a
// reader goroutine (sourceReader) while this one waits for its batch and
// the commands together. At the end the MAX watermark, EndOfData(drain),
// the wait for the final checkpoint and EndOfPartition (DESIGN.md
// "Finishing" 1).
func (t *task) runSource(ctx context.Context) error {
	t.srcPend = abi.MinWatermark
	t.initSourceWatermarks()
	tick := time.NewTimer(time.Hour)
	defer tick.Stop()
	var rd *sourceReader
	var ready connector.ReadySource
	var buf []abi.Record
	if !t.deployedFinished {
		_, span := t.startPhase(telemetry.SpanTaskOpen)
		src, err := t.newSource(t.srcPos)
		t.endPhase(span, err)
		if err != nil {
			return t.fail(string(abi.PhaseOpen), err)
		}
		t.src, t.srcAt = src, src.Position()
		defer func() {
			if t.src != nil {
				_ = t.closeSource()
			}
		}()
		t.setState(StateRunning)
		ready, _ = src.(connector.ReadySource)
		if l, ok := src.(connector.LagSource); ok {
			t.om.SourceLag(l.Lag)
		}
		buf = make([]abi.Record, t.j.opts.BatchSize)
		rd = startSourceReader(ctx, src, t.j.opts.BatchSize)
		t.reader = rd
	}
	if err := t.step(control.Opened{}); err != nil {
		return err
	}
	inflight := false // the reader has a Read to do or done
	for !t.m.Done() {
		if t.mb.n.Load() > 0 {
			if err := t.commands(); err != nil {
				return err
			}
			continue
		}
		if t.outputsQueued() {
			// Back-pressured: no next batch until the last one is sent.
			if err := t.sendQueued(ctx, t.srcWake); err != nil {
				return err
			}
			continue
		}
		var results <-chan readResult
		if t.m.Reading() {
			if !inflight && ready != nil && ready.Ready() {
				start, bp := time.Now(), t.om.BackPressured()
				err := t.sourceBatch(t.readInline(ctx, buf))
				t.om.BusySince(ctx, start, bp)
				if err != nil {
					return err
				}
				continue
			}
			if !inflight {
				rd.request()
				inflight = true
			}
			results = rd.results
		}
		var tickC <-chan time.Time
		if d, ok := t.sourceDeadline(); ok {
			tick.Reset(d)
			tickC = tick.C
		}
		idle := time.Now()
		select {
		case <-tickC:
			if err := t.sourceTick(); err != nil {
				return err
			}
		case res := <-results:
			inflight = false
			t.om.Idle(ctx, time.Since(idle)) // waiting for the source
			start, bp := time.Now(), t.om.BackPressured()
			err := t.sourceBatch(res)
			t.om.BusySince(ctx, start, bp)
			if err != nil {
				return err
			}
		case <-t.srcWake:
		case <-ctx.Done():
			phase := phaseFinalWait
			if t.m.Reading() {
				phase = phaseRead
			}
			return t.fail(phase, context.Cause(ctx))
		}
	}
	return nil
}

// readInline reads one batch on the subtask's goroutine.
func (t *task) readInline(ctx context.Context, buf []abi.Record) readResult {
	return readOnce(ctx, t.src, buf)
}

// readOnce reads one batch of src into buf, with the position and
// watermark after it.
func readOnce(ctx context.Context, src connector.Source, buf []abi.Record) readResult {
	n, err := src.Read(ctx, buf)
	res := readResult{recs: buf, n: n, err: err}
	if err == nil {
		res.pos, res.wm = src.Position(), src.Watermark()
	}
	return res
}

// sourceBatch sends one batch downstream, or ends the input.
func (t *task) sourceBatch(res readResult) error {
	if errors.Is(res.err, io.EOF) {
		return t.step(control.SourceEnded{})
	}
	if res.err != nil {
		return t.fail(phaseRead, res.err)
	}
	if res.n > 0 {
		t.srcLastRec = time.Now()
		if err := t.sendStatus(false); err != nil { // active again before its records
			return t.fail(phaseOutput, err)
		}
	}
	t.records += int64(res.n)
	t.emitRecords(res.recs[:res.n])
	t.srcAt = res.pos
	if t.emitErr != nil {
		return t.fail(phaseRead, t.emitErr)
	}
	t.srcPend = max(t.srcPend, res.wm)
	if sent, err := t.sourceWatermark(); err != nil {
		return t.fail(phaseOutput, err)
	} else if !sent && res.n < len(res.recs) {
		// A short read: the source is slow or rate-limited; do not hold
		// its records back waiting for a full batch.
		if err := t.submit(); err != nil {
			return t.fail(phaseOutput, err)
		}
	} else if err := t.flushExpired(); err != nil {
		return t.fail(phaseOutput, err)
	}
	return nil
}

// notifySource tells a connector.CheckpointSource that checkpoint id is
// complete, with the position of the newest of its snapshots <= id (none:
// the checkpoint completed without this subtask's part, nothing to say).
func (t *task) notifySource(id int64) error {
	l, ok := t.src.(connector.CheckpointSource)
	if !ok {
		return nil
	}
	var pos []byte
	at := int64(-1)
	for sid, p := range t.srcSnaps {
		if sid <= id {
			if sid > at {
				at, pos = sid, p
			}
			delete(t.srcSnaps, sid)
		}
	}
	if at < 0 {
		return nil
	}
	if err := l.NotifyCheckpointComplete(at, pos); err != nil {
		return t.fail(string(abi.PhaseNotify), err)
	}
	return nil
}

// closeSource stops the reader and closes the source (once).
func (t *task) closeSource() error {
	src := t.src
	if src == nil {
		return nil
	}
	t.src = nil
	if t.reader != nil && !t.reader.stop() {
		// The reader is inside a Read that does not end with the context
		// (a blocked stdin): it closes the source when that Read returns.
		return nil
	}
	return src.Close()
}

// readResult is one Read of a source, with the position and watermark after it.
type readResult struct {
	recs []abi.Record
	n    int
	pos  []byte
	wm   int64
	err  error // io.EOF at the end of a bounded source
}

// sourceReader reads a source on a goroutine of its own, one batch for each
// request: the subtask asks only when it has sent the batch before
// downstream, because a batch aliases the source's memory until the next
// Read, and it never reads itself while a request is open.
type sourceReader struct {
	results chan readResult
	req     chan struct{}
	cancel  context.CancelFunc
	done    chan struct{}

	mu       sync.Mutex
	inRead   bool
	stopping bool
}

func startSourceReader(ctx context.Context, src connector.Source, batch int) *sourceReader {
	rctx, cancel := context.WithCancel(ctx)
	r := &sourceReader{results: make(chan readResult, 1), req: make(chan struct{}, 1), cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		var buf []abi.Record
		for {
			select {
			case <-r.req:
			case <-rctx.Done():
				return
			}
			r.mu.Lock()
			if r.stopping {
				r.mu.Unlock()
				return
			}
			r.inRead = true
			r.mu.Unlock()
			if buf == nil {
				buf = make([]abi.Record, batch)
			}
			res := readOnce(rctx, src, buf)
			r.mu.Lock()
			r.inRead = false
			if r.stopping {
				r.mu.Unlock()
				_ = src.Close() // stop() left the source to us
				return
			}
			r.mu.Unlock()
			r.results <- res
			if res.err != nil {
				return
			}
		}
	}()
	return r
}

// request asks the reader for the next batch.
func (r *sourceReader) request() { r.req <- struct{}{} }

// stop ends the reader. It reports whether the reader has ended, so the
// caller closes the source; false: the reader is inside a Read and closes
// the source itself when the Read returns.
func (r *sourceReader) stop() bool {
	r.mu.Lock()
	r.stopping = true
	reading := r.inRead
	r.mu.Unlock()
	r.cancel()
	if reading {
		return false
	}
	<-r.done
	return true
}

// runOperator is the loop of an operator or sink subtask.
func (t *task) runOperator(ctx context.Context) (err error) {
	opened := false
	defer func() {
		if opened && !t.m.Done() {
			// Close is always called, also after a failure or cancel.
			cctx, span := t.startPhase(telemetry.SpanTaskClose)
			cerr := t.op.Close(context.WithoutCancel(cctx))
			t.endPhase(span, cerr)
			if cerr != nil && err == nil {
				err = t.fail(string(abi.PhaseClose), cerr)
			}
		}
	}()
	g := t.gate
	nc := t.nData
	if t.deployedFinished {
		// Restored as finished: no user code. A sink's last pending data
		// may not have been committed before the failure, and a fully
		// finished operator keeps no state: its connector commits them
		// (connector.RestoreFinishedSink).
		if so, ok := t.op.(*sinkOperator); ok && t.j.restore != nil {
			spec := t.v.Spec.(*jobfile.SinkSpec)
			md := t.j.restore.Metadata
			r := connector.FinishedRestore{JobID: md.JobID, CheckpointID: md.ID, Pending: so.pending}
			if err := connector.RestoreFinishedSink(spec, t.j.sinkEnv(t, t.v.UID), r); err != nil {
				return t.fail(string(abi.PhaseOpen), err)
			}
		}
		// A wasm operator's dead letters not committed before the failure.
		if wo, ok := t.op.(*wasmOperator); ok && wo.dl != nil {
			if err := wo.dl.commitRestored(); err != nil {
				return t.fail(string(abi.PhaseOpen), err)
			}
		}
	} else {
		opened = true
		octx, span := t.startPhase(telemetry.SpanTaskOpen)
		err := t.op.Open(octx, t.info)
		t.endPhase(span, err)
		if err := t.call(string(abi.PhaseOpen), err); err != nil {
			return err
		}
		t.setState(StateRunning)
	}
	if err := t.step(control.Opened{}); err != nil {
		return err
	}
	if err := t.replayInFlight(ctx); err != nil {
		return err
	}
	defer t.disarmProcWake()
	for !t.m.Done() {
		if err := t.processingTimers(); err != nil {
			return err
		}
		if t.overtakes && g.Overtaking() {
			if took, err := t.takeOvertaking(); err != nil {
				return err
			} else if took {
				continue
			}
		}
		if t.outputsQueued() {
			// Back-pressured: no input until the output is sent, but
			// commands and overtaking barriers at once.
			if t.mb.n.Load() > 0 {
				if err := t.commands(); err != nil {
					return err
				}
				continue
			}
			if err := t.sendQueued(ctx, g.Notify()); err != nil {
				return err
			}
			continue
		}
		ch, ev, ok, err := g.TryNext()
		if err == nil && !ok {
			// Nothing ready: send what is pending before waiting, so a slow
			// stream is not held back until a batch fills.
			if err := t.submit(); err != nil {
				return t.fail(phaseOutput, err)
			}
			if t.outputsQueued() {
				continue
			}
			idle := time.Now()
			ch, ev, err = g.Next(ctx)
			t.om.Idle(ctx, time.Since(idle))
		}
		if err != nil {
			return t.fail(phaseInput, err)
		}
		if ch == nc {
			if err := t.commands(); err != nil {
				return err
			}
			continue
		}
		var pev control.SubtaskEvent
		switch ev.Kind {
		case dataplane.KindRecords:
			if err := t.m.CheckRecords(ch); err != nil {
				ev.Batch.Release()
				return t.fail(phaseInput, fmt.Errorf("%s: %w", g.Name(ch), err))
			}
			if t.capturing(ch) {
				t.capture(ch, ev)
			}
			if err := t.process(ctx, ch, ev.Batch); err != nil {
				return err
			}
			if err := t.flushExpired(); err != nil {
				return t.fail(phaseOutput, err)
			}
			continue
		case dataplane.KindWatermark:
			if t.capturing(ch) {
				t.capture(ch, ev)
			}
			pev = control.ChannelWatermark{Channel: ch, TS: ev.Watermark.TS}
		case dataplane.KindBarrier:
			pev = control.ChannelBarrier{Channel: ch, B: fromDataplaneBarrier(ev.Barrier)}
		case dataplane.KindCancelCheckpoint:
			pev = control.ChannelCancel{Channel: ch, ID: ev.Cancel.ID}
		case dataplane.KindWatermarkStatus:
			pev = control.ChannelWatermarkStatus{Channel: ch, Idle: ev.Status.Idle}
		case dataplane.KindEndOfData:
			pev = control.ChannelEndOfData{Channel: ch, Drain: ev.EndOfData.Drain}
		case dataplane.KindEndOfPartition:
			pev = control.ChannelEndOfPartition{Channel: ch}
		default:
			return t.fail(phaseInput, fmt.Errorf("%s: unknown event %s", g.Name(ch), ev))
		}
		if err := t.step(pev); err != nil {
			return err
		}
	}
	return nil
}

// process hands one batch of channel ch to the operator.
func (t *task) process(ctx context.Context, ch int, b *dataplane.Batch) error {
	n := len(b.Records)
	t.stats.in.Add(int64(n))
	t.records += int64(n)
	start, bp := time.Now(), t.om.BackPressured()
	t.inBatch, t.batchOut = true, 0
	err := t.op.Process(ctx, t.gate.Input(ch), b.Records, t.emit)
	t.inBatch = false
	t.om.Batch(ctx, n, t.batchOut, time.Since(start))
	t.om.BusySince(ctx, start, bp)
	b.Release()
	return t.call(string(abi.PhaseProcess), err)
}
