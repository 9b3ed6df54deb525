package runtime

import (
	"context"
	"errors"
	"fmt"
	"io"
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
	writers []*dataplane.RecordWriter // one per output edge
	op      NativeOperator            // operators and sinks
	cp      checkpointer              // op's checkpoint side
	// newSource creates the source of a source subtask, resuming at pos.
	newSource func(pos []byte) (connector.Source, error)

	// Restore and checkpointing.
	ckpt             bool     // the job checkpoints: wait for a final checkpoint before closing
	mb               *mailbox // commands from the driver
	srcWake          chan struct{}
	srcPos           []byte // restored source position
	srcFinished      bool   // restored source subtask that had finished its input
	deployedFinished bool   // restored as finished: no user code runs

	ctx      context.Context // the run's context, for emit
	emit     Emitter
	emitErr  error // first failed send of an emit (the Emitter cannot return it)
	cmds     []command
	eodSent  bool  // EndOfData went downstream
	finalAck int64 // first checkpoint acknowledged after end of data
	stopID   int64 // stop-with-savepoint: the savepoint to wait for (sources)
	final    bool  // the final checkpoint is complete: the subtask may close
	finalID  int64 // that final checkpoint (the one notified; finalAck may have been aborted)
	closed   bool  // the subtask closed and sent EndOfPartition

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
	t.stats.out.Add(int64(len(recs)))
	if t.inBatch {
		t.batchOut += len(recs)
	} else {
		t.om.RecordsOut(t.ctx, len(recs))
	}
	for _, w := range t.writers {
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

// endData sends what ends a subtask's data: with drain the MAX watermark
// (sources only: an operator forwards the one it received), then
// EndOfData(drain) (DESIGN.md "Finishing" 1b, 3b).
func (t *task) endData(maxWM, drain bool) error {
	if maxWM {
		if err := t.broadcast(dataplane.WatermarkEvent(abi.MaxWatermark)); err != nil {
			return t.fail(phaseOutput, err)
		}
	}
	if err := t.broadcast(dataplane.EndOfDataEvent(drain)); err != nil {
		return t.fail(phaseOutput, err)
	}
	t.eodSent = true
	t.startFinalWait()
	if !t.deployedFinished {
		t.setState(StateEndOfData)
		t.report(control.TaskEndOfData{Subtask: t.id, Drain: drain})
	}
	return nil
}

// snapshot takes this subtask's part of checkpoint b after its barrier went
// downstream: the operator's state (or the source position), written to the
// store, then the acknowledgement.
func (t *task) snapshot(b dataplane.Barrier, srcPos []byte) (err error) {
	sctx, span := t.startCheckpointSpan(telemetry.SpanTaskSnapshot, b.ID, b.Trace)
	var stateBytes int64
	defer func() {
		if span != nil {
			span.SetAttributes(telemetry.StateBytes(stateBytes))
			telemetry.EndSpan(span, err)
		}
	}()
	kind := control.KindCheckpoint
	if b.Kind == dataplane.Savepoint {
		kind = control.KindSavepoint
	}
	ack := control.Ack{CheckpointID: b.ID, Subtask: t.id, AfterEndOfData: t.eodSent, DeployedFinished: t.deployedFinished}
	var st *checkpoint.SubtaskState
	switch {
	case t.deployedFinished:
	case t.newSource != nil:
		st = &checkpoint.SubtaskState{SourcePosition: srcPos}
	default:
		var err error
		if st, err = t.cp.snapshot(sctx, b.ID); err != nil {
			return t.fail(string(abi.PhaseSnapshot), err)
		}
	}
	if st != nil {
		data, err := checkpoint.EncodeState(st)
		var ref checkpoint.BlobRef
		if err == nil {
			ref, err = t.j.store.WriteState(t.ctx, kind, b.ID, t.id, data)
		}
		if err != nil {
			telemetry.RecordError(span, err)
			t.report(control.Decline{CheckpointID: b.ID, Subtask: t.id, Kind: control.DeclineFailure, Reason: err.Error()})
			return nil
		}
		ack.StateRef, ack.Size = ref.String(), ref.Size
		stateBytes = ref.Size
		if st.Operator != nil {
			for _, l := range st.Operator.Lists {
				if l != nil && l.Mode == abi.ListUnion {
					ack.UnionState = true
				}
			}
		}
	}
	if t.eodSent && t.finalAck == 0 {
		t.finalAck = b.ID
	}
	t.report(ack)
	return nil
}

// onNotify: checkpoint id is complete. The operator hears of it; if the
// subtask acknowledged a checkpoint <= id after its end of data (for a
// stopping source: exactly its savepoint), that was its final checkpoint.
func (t *task) onNotify(id int64, tr map[string]string) error {
	if !t.deployedFinished && t.cp != nil {
		nctx, span := t.startCheckpointSpan(telemetry.SpanTaskNotifyComplete, id, tr)
		err := t.cp.notify(nctx, id)
		telemetry.EndSpan(span, err)
		if err != nil {
			return t.fail(string(abi.PhaseNotify), err)
		}
	}
	if t.finalAck != 0 && id >= t.finalAck && (t.stopID == 0 || id == t.stopID) {
		if !t.final {
			t.finalID = id
		}
		t.final = true
	}
	return nil
}

// finishSubtask closes a subtask whose data ended (DESIGN.md "Finishing" 1d, 4).
func (t *task) finishSubtask(closeFn func(ctx context.Context) error) error {
	t.closed = true
	t.endFinalWait()
	if closeFn != nil {
		cctx, span := t.startPhase(telemetry.SpanTaskClose)
		err := closeFn(cctx)
		t.endPhase(span, err)
		if err := t.call(string(abi.PhaseClose), err); err != nil {
			return err
		}
	}
	if err := t.broadcast(dataplane.EndOfPartitionEvent()); err != nil {
		return t.fail(phaseOutput, err)
	}
	t.report(control.TaskFinished{Subtask: t.id})
	return nil
}

// runSource is the loop of a source subtask: read batches and send them
// downstream, with the source's watermark after each batch, and start
// checkpoints the driver triggers; at the end the MAX watermark,
// EndOfData(drain), the wait for the final checkpoint and EndOfPartition
// (DESIGN.md "Finishing" 1).
func (t *task) runSource(ctx context.Context) error {
	if t.deployedFinished {
		if err := t.endData(true, true); err != nil {
			return err
		}
		t.report(control.TaskRunning{Subtask: t.id, DeployedFinished: true})
		if t.ckpt {
			if err := t.waitFinal(ctx, nil); err != nil {
				return err
			}
		}
		return t.finishSubtask(nil)
	}
	_, span := t.startPhase(telemetry.SpanTaskOpen)
	src, err := t.newSource(t.srcPos)
	t.endPhase(span, err)
	if err != nil {
		return t.fail(string(abi.PhaseOpen), err)
	}
	closed := false
	defer func() {
		if !closed {
			_ = src.Close()
		}
	}()
	t.setState(StateRunning)
	t.report(control.TaskRunning{Subtask: t.id})
	buf := make([]abi.Record, t.j.opts.BatchSize)
	wm := abi.MinWatermark
	drain := true
	for !t.srcFinished {
		if t.mb.n.Load() > 0 {
			stop, d, err := t.sourceCommands(src)
			if err != nil {
				return err
			}
			if stop {
				drain = d
				break
			}
		}
		n, err := src.Read(ctx, buf)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return t.fail(phaseRead, err)
		}
		t.records += int64(n)
		t.emitRecords(buf[:n])
		if t.emitErr != nil {
			return t.fail(phaseRead, t.emitErr)
		}
		if w := src.Watermark(); w > wm {
			wm = w
			if err := t.broadcast(dataplane.WatermarkEvent(wm)); err != nil {
				return t.fail(phaseOutput, err)
			}
		} else if n < len(buf) {
			// A short read: the source is slow or rate-limited; do not hold
			// its records back waiting for a full batch.
			if err := t.flush(); err != nil {
				return t.fail(phaseOutput, err)
			}
		}
	}
	// Input exhausted (or stopped): end of event time with drain, end of data.
	if err := t.endData(drain && wm < abi.MaxWatermark, drain); err != nil {
		return err
	}
	if t.ckpt {
		if err := t.waitFinal(ctx, src); err != nil {
			return err
		}
	}
	closed = true
	return t.finishSubtask(func(context.Context) error { return src.Close() })
}

// sourceCommands handles the driver's commands to a source that is reading.
// stop reports a stop-with-savepoint (the savepoint's trigger stays queued).
func (t *task) sourceCommands(src connector.Source) (stop, drain bool, err error) {
	t.cmds = t.mb.take(t.cmds[:0])
	for i, c := range t.cmds {
		switch c.kind {
		case cmdTrigger:
			if err := t.broadcast(dataplane.BarrierEvent(c.barrier)); err != nil {
				return false, false, t.fail(phaseOutput, err)
			}
			if err := t.snapshot(c.barrier, src.Position()); err != nil {
				return false, false, err
			}
		case cmdNotify:
			if err := t.onNotify(c.id, c.trace); err != nil {
				return false, false, err
			}
		case cmdStop:
			// The rest (the savepoint's trigger) is handled after EndOfData.
			t.stopID = c.id
			for _, rest := range t.cmds[i+1:] {
				t.mb.send(rest)
			}
			return true, c.drain, nil
		}
	}
	return false, false, nil
}

// waitFinal waits, after a source's end of data, until its final checkpoint
// is complete, taking part in the checkpoints triggered meanwhile.
func (t *task) waitFinal(ctx context.Context, src connector.Source) error {
	for !t.final {
		if t.mb.n.Load() == 0 {
			select {
			case <-t.srcWake:
			case <-ctx.Done():
				return t.fail(phaseFinalWait, context.Cause(ctx))
			}
			continue
		}
		t.cmds = t.mb.take(t.cmds[:0])
		for _, c := range t.cmds {
			switch c.kind {
			case cmdTrigger:
				if err := t.broadcast(dataplane.BarrierEvent(c.barrier)); err != nil {
					return t.fail(phaseOutput, err)
				}
				var pos []byte
				if src != nil {
					pos = src.Position()
				}
				if err := t.snapshot(c.barrier, pos); err != nil {
					return err
				}
			case cmdNotify:
				if err := t.onNotify(c.id, c.trace); err != nil {
					return err
				}
			case cmdStop:
				t.stopID = c.id // already at end of data: wait for exactly this savepoint
				if t.finalAck != 0 && t.finalAck < c.id {
					t.finalAck = 0
				}
			}
		}
	}
	return nil
}

// inputState is what the operator loop tracks about its input channels.
type inputState struct {
	chanWM    []int64 // last watermark per channel
	chanEOD   []bool  // channel delivered EndOfData
	noDrain   []bool  // per input: a channel ended without drain
	eod       []int   // per input: channels that delivered EndOfData
	chans     []int   // per input: number of channels
	inputsEnd int     // inputs whose channels all delivered EndOfData
	wm        int64   // the subtask's watermark

	// Barrier alignment.
	aligning   bool
	barrier    dataplane.Barrier
	arrived    []bool
	lastCancel int64
	alignStart time.Time  // the alignment began (first barrier, or the trigger)
	alignSpan  trace.Span // nil: tracing off
}

// runOperator is the loop of an operator or sink subtask.
func (t *task) runOperator(ctx context.Context) (err error) {
	opened := false
	defer func() {
		if opened && !t.closed {
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
	st := &inputState{
		chanWM:  make([]int64, nc),
		chanEOD: make([]bool, nc),
		noDrain: make([]bool, len(t.v.Inputs)),
		eod:     make([]int, len(t.v.Inputs)),
		chans:   make([]int, len(t.v.Inputs)),
		wm:      abi.MinWatermark,
		arrived: make([]bool, nc),
	}
	for c := 0; c < nc; c++ {
		st.chanWM[c] = abi.MinWatermark
		st.chans[g.Input(c)]++
	}
	if t.deployedFinished {
		// Restored as finished: no user code; end of data at once. A file
		// sink's last pending files may not have been committed before the
		// failure, and a fully finished operator keeps no state: commit them.
		if spec, ok := t.v.Spec.(*jobfile.SinkSpec); ok && spec.Type == "file" && t.sub == 0 && t.j.restore != nil {
			if err := connector.CommitPendingUpTo(spec.Path, t.j.restore.Metadata.ID); err != nil {
				return t.fail(string(abi.PhaseOpen), err)
			}
		}
		if err := t.endData(true, true); err != nil {
			return err
		}
		t.report(control.TaskRunning{Subtask: t.id, DeployedFinished: true})
	} else {
		opened = true
		octx, span := t.startPhase(telemetry.SpanTaskOpen)
		err := t.op.Open(octx, t.info)
		t.endPhase(span, err)
		if err := t.call(string(abi.PhaseOpen), err); err != nil {
			return err
		}
		t.setState(StateRunning)
		t.report(control.TaskRunning{Subtask: t.id})
	}
	for {
		ch, ev, ok, err := g.TryNext()
		if err == nil && !ok {
			// Nothing ready: send what is pending before waiting, so a slow
			// stream is not held back until a batch fills.
			if err := t.flush(); err != nil {
				return t.fail(phaseOutput, err)
			}
			ch, ev, err = g.Next(ctx)
		}
		if err != nil {
			return t.fail(phaseInput, err)
		}
		if ch == nc {
			if err := t.operatorCommands(st); err != nil {
				return err
			}
		} else {
			switch ev.Kind {
			case dataplane.KindRecords:
				if st.chanEOD[ch] || t.deployedFinished {
					ev.Batch.Release()
					return t.fail(phaseInput, fmt.Errorf("%s: records after end-of-data", g.Name(ch)))
				}
				b := ev.Batch
				n := len(b.Records)
				t.stats.in.Add(int64(n))
				t.records += int64(n)
				var start time.Time
				if t.om != nil {
					start, t.inBatch, t.batchOut = time.Now(), true, 0
				}
				err := t.op.Process(ctx, g.Input(ch), b.Records, t.emit)
				if t.om != nil {
					t.inBatch = false
					t.om.Batch(ctx, n, t.batchOut, time.Since(start))
				}
				b.Release()
				if err := t.call(string(abi.PhaseProcess), err); err != nil {
					return err
				}
			case dataplane.KindWatermark:
				if ev.Watermark.TS > st.chanWM[ch] {
					st.chanWM[ch] = ev.Watermark.TS
					if err := t.advanceWatermark(st); err != nil {
						return err
					}
				}
			case dataplane.KindBarrier:
				if err := t.onBarrier(st, ch, ev.Barrier); err != nil {
					return err
				}
			case dataplane.KindCancelCheckpoint:
				if err := t.onCancel(st, ev.Cancel.ID, true); err != nil {
					return err
				}
			case dataplane.KindEndOfData:
				if err := t.onEndOfData(st, ch, ev.EndOfData.Drain); err != nil {
					return err
				}
			case dataplane.KindEndOfPartition:
				if !st.chanEOD[ch] {
					return t.fail(phaseInput, fmt.Errorf("%s: end-of-partition before end-of-data", g.Name(ch)))
				}
				// An ended channel no longer holds back the watermark, and
				// counts as aligned for a pending barrier.
				if err := t.advanceWatermark(st); err != nil {
					return err
				}
				if st.aligning {
					if err := t.maybeAligned(st); err != nil {
						return err
					}
				}
			default:
				return t.fail(phaseInput, fmt.Errorf("%s: unknown event %s", g.Name(ch), ev))
			}
		}
		// Every channel ended and the final checkpoint (with checkpointing)
		// is complete: close (DESIGN.md "Finishing" 4).
		if g.Open() == 1 && t.eodSent && (!t.ckpt || t.final) {
			var closeFn func(context.Context) error
			if !t.deployedFinished {
				closeFn = t.op.Close
			}
			return t.finishSubtask(closeFn)
		}
	}
}

// operatorCommands handles the driver's commands to an operator subtask.
func (t *task) operatorCommands(st *inputState) error {
	t.cmds = t.mb.take(t.cmds[:0])
	for _, c := range t.cmds {
		switch c.kind {
		case cmdTrigger:
			// Its predecessors have finished: the barrier goes behind the
			// data already queued on each channel that has not ended.
			b := c.barrier
			if (st.aligning && b.ID <= st.barrier.ID) || (!st.aligning && b.ID <= st.barrier.ID) || b.ID <= st.lastCancel {
				continue
			}
			if st.aligning {
				t.endAlignment(st)
			}
			t.beginAlignment(st, b)
			if err := t.maybeAligned(st); err != nil {
				return err
			}
		case cmdNotify:
			if err := t.onNotify(c.id, c.trace); err != nil {
				return err
			}
		case cmdAbort:
			if err := t.onCancel(st, c.id, false); err != nil {
				return err
			}
		}
	}
	return nil
}

// onCancel aborts the alignment of checkpoint id; a CancelCheckpoint that
// came on a channel is forwarded once.
func (t *task) onCancel(st *inputState, id int64, forward bool) error {
	if st.aligning && st.barrier.ID == id {
		t.endAlignment(st)
	}
	if id > st.lastCancel {
		st.lastCancel = id
		if forward {
			if err := t.broadcast(dataplane.CancelCheckpointEvent(id)); err != nil {
				return t.fail(phaseOutput, err)
			}
		}
	}
	return nil
}

// advanceWatermark recomputes the subtask watermark, the minimum over the
// channels that have not ended; when it advanced, the operator fires its
// timers and the watermark goes downstream. With every channel ended it stays.
func (t *task) advanceWatermark(st *inputState) error {
	if t.deployedFinished {
		return nil
	}
	g := t.gate
	min, any := abi.MaxWatermark, false
	for c, w := range st.chanWM {
		if g.Ended(c) {
			continue
		}
		any = true
		if w < min {
			min = w
		}
	}
	if !any || min <= st.wm {
		return nil
	}
	st.wm = min
	if err := t.call(string(abi.PhaseWatermark), t.op.AdvanceWatermark(t.ctx, min, t.emit)); err != nil {
		return err
	}
	if err := t.broadcast(dataplane.WatermarkEvent(min)); err != nil {
		return t.fail(phaseOutput, err)
	}
	return nil
}

// onEndOfData: when every channel of an input delivered EndOfData, end that
// input; when every input ended, finish and send EndOfData on
// (DESIGN.md "Finishing" 3). Without drain neither end_input nor finish runs.
func (t *task) onEndOfData(st *inputState, ch int, drain bool) error {
	if st.chanEOD[ch] {
		return t.fail(phaseInput, fmt.Errorf("%s: second end-of-data", t.gate.Name(ch)))
	}
	st.chanEOD[ch] = true
	if t.deployedFinished {
		return nil // it sent its EndOfData when deployed
	}
	in := t.gate.Input(ch)
	if !drain {
		st.noDrain[in] = true
	}
	st.eod[in]++
	if st.eod[in] < st.chans[in] {
		return nil
	}
	if !st.noDrain[in] {
		ectx, span := t.startPhase(telemetry.SpanTaskEndInput, telemetry.AttrInput.Int(in))
		err := t.op.EndInput(ectx, in, t.emit)
		t.endPhase(span, err)
		if err := t.call(string(abi.PhaseEndInput), err); err != nil {
			return err
		}
	}
	st.inputsEnd++
	if st.inputsEnd < len(st.chans) {
		return nil
	}
	drainAll := true
	for _, nd := range st.noDrain {
		drainAll = drainAll && !nd
	}
	if drainAll {
		fctx, span := t.startPhase(telemetry.SpanTaskFinish)
		err := t.op.Finish(fctx, t.emit)
		t.endPhase(span, err)
		if err := t.call(string(abi.PhaseFinish), err); err != nil {
			return err
		}
	}
	return t.endData(false, drainAll)
}

// onBarrier aligns barriers: a channel that delivered the barrier is blocked
// until every channel that has not ended delivered it; then the barrier goes
// downstream, the channels are unblocked and the subtask takes its snapshot.
// A newer barrier aborts an older alignment.
func (t *task) onBarrier(st *inputState, ch int, b dataplane.Barrier) error {
	switch {
	case st.aligning && b.ID == st.barrier.ID:
	case st.aligning && b.ID < st.barrier.ID, !st.aligning && b.ID <= st.barrier.ID, b.ID <= st.lastCancel:
		return nil // a late barrier of an aborted, cancelled or completed checkpoint
	default:
		if st.aligning {
			t.endAlignment(st)
		}
		t.beginAlignment(st, b)
	}
	st.arrived[ch] = true
	t.gate.Block(ch)
	return t.maybeAligned(st)
}

func (t *task) maybeAligned(st *inputState) error {
	for c, a := range st.arrived {
		if !a && !t.gate.Ended(c) {
			return nil
		}
	}
	b := st.barrier
	t.alignmentDone(st)
	t.endAlignment(st)
	if err := t.broadcast(dataplane.BarrierEvent(b)); err != nil {
		return t.fail(phaseOutput, err)
	}
	if !t.ckpt {
		return nil
	}
	return t.snapshot(b, nil)
}

func (t *task) endAlignment(st *inputState) {
	st.alignmentAborted()
	st.aligning = false
	clear(st.arrived)
	t.gate.UnblockAll()
}
