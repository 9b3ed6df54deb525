package runtime

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/dataplane"
	"github.com/streamd/streamd/internal/connector"
)

// task is one subtask: a source loop or an operator loop, run by one goroutine.
type task struct {
	j       *job
	v       *control.Vertex
	sub     int
	info    SubtaskInfo
	stats   *opStats
	gate    *dataplane.InputGate      // nil for sources
	writers []*dataplane.RecordWriter // one per output edge
	op      NativeOperator            // operators and sinks
	// newSource creates the source of a source subtask.
	newSource func() (connector.Source, error)

	ctx     context.Context // the run's context, for emit
	emit    Emitter
	emitErr error // first failed send of an emit (the Emitter cannot return it)
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

func (t *task) run(ctx context.Context) (err error) {
	t.ctx = ctx
	t.emit = t.emitRecords
	log := t.j.log.With("operator", t.v.UID, "subtask", t.sub)
	log.Debug("subtask started")
	defer func() {
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

// runSource is the loop of a source subtask: read batches and send them
// downstream, with the source's watermark after each batch; at the end the
// MAX watermark, EndOfData(drain) and EndOfPartition (DESIGN.md "Finishing" 1).
func (t *task) runSource(ctx context.Context) error {
	src, err := t.newSource()
	if err != nil {
		return t.fail(string(abi.PhaseOpen), err)
	}
	closed := false
	defer func() {
		if !closed {
			_ = src.Close()
		}
	}()
	buf := make([]abi.Record, t.j.opts.BatchSize)
	wm := abi.MinWatermark
	for {
		n, err := src.Read(ctx, buf)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return t.fail(phaseRead, err)
		}
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
	// Input exhausted: end of event time, end of data.
	if wm < abi.MaxWatermark {
		if err := t.broadcast(dataplane.WatermarkEvent(abi.MaxWatermark)); err != nil {
			return t.fail(phaseOutput, err)
		}
	}
	if err := t.broadcast(dataplane.EndOfDataEvent(true)); err != nil {
		return t.fail(phaseOutput, err)
	}
	// (A final checkpoint will be awaited here.)
	closed = true
	if err := src.Close(); err != nil {
		return t.fail(string(abi.PhaseClose), err)
	}
	if err := t.broadcast(dataplane.EndOfPartitionEvent()); err != nil {
		return t.fail(phaseOutput, err)
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

	// Barrier alignment (no snapshots yet: an aligned barrier is forwarded).
	aligning   bool
	barrier    dataplane.Barrier
	arrived    []bool
	lastCancel int64
}

// runOperator is the loop of an operator or sink subtask.
func (t *task) runOperator(ctx context.Context) (err error) {
	closed := false
	defer func() {
		if !closed {
			// Close is always called, also after a failure or cancel.
			if cerr := t.op.Close(context.WithoutCancel(ctx)); cerr != nil && err == nil {
				err = t.fail(string(abi.PhaseClose), cerr)
			}
		}
	}()
	if err := t.call(string(abi.PhaseOpen), t.op.Open(ctx, t.info)); err != nil {
		return err
	}
	g := t.gate
	nc := g.NumChannels()
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
		switch ev.Kind {
		case dataplane.KindRecords:
			if st.chanEOD[ch] {
				ev.Batch.Release()
				return t.fail(phaseInput, fmt.Errorf("%s: records after end-of-data", g.Name(ch)))
			}
			b := ev.Batch
			t.stats.in.Add(int64(len(b.Records)))
			err := t.op.Process(ctx, g.Input(ch), b.Records, t.emit)
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
			if st.aligning && st.barrier.ID == ev.Cancel.ID {
				t.endAlignment(st)
			}
			if ev.Cancel.ID > st.lastCancel {
				st.lastCancel = ev.Cancel.ID
				if err := t.broadcast(ev); err != nil {
					return t.fail(phaseOutput, err)
				}
			}
		case dataplane.KindEndOfData:
			if err := t.onEndOfData(st, ch, ev.EndOfData.Drain); err != nil {
				return err
			}
		case dataplane.KindEndOfPartition:
			if !st.chanEOD[ch] {
				return t.fail(phaseInput, fmt.Errorf("%s: end-of-partition before end-of-data", g.Name(ch)))
			}
			if g.Open() > 0 {
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
				continue
			}
			// Every channel ended (DESIGN.md "Finishing" 4).
			closed = true
			if err := t.call(string(abi.PhaseClose), t.op.Close(ctx)); err != nil {
				return err
			}
			if err := t.broadcast(dataplane.EndOfPartitionEvent()); err != nil {
				return t.fail(phaseOutput, err)
			}
			return nil
		default:
			return t.fail(phaseInput, fmt.Errorf("%s: unknown event %s", g.Name(ch), ev))
		}
	}
}

// advanceWatermark recomputes the subtask watermark, the minimum over the
// channels that have not ended; when it advanced, the operator fires its
// timers and the watermark goes downstream. With every channel ended it stays.
func (t *task) advanceWatermark(st *inputState) error {
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
	in := t.gate.Input(ch)
	if !drain {
		st.noDrain[in] = true
	}
	st.eod[in]++
	if st.eod[in] < st.chans[in] {
		return nil
	}
	if !st.noDrain[in] {
		if err := t.call(string(abi.PhaseEndInput), t.op.EndInput(t.ctx, in, t.emit)); err != nil {
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
		if err := t.call(string(abi.PhaseFinish), t.op.Finish(t.ctx, t.emit)); err != nil {
			return err
		}
	}
	if err := t.broadcast(dataplane.EndOfDataEvent(drainAll)); err != nil {
		return t.fail(phaseOutput, err)
	}
	return nil
}

// onBarrier aligns barriers: a channel that delivered the barrier is blocked
// until every channel that has not ended delivered it; then the barrier goes
// downstream and the channels are unblocked. (Taking a snapshot at that point
// comes with checkpointing.) A newer barrier aborts an older alignment.
func (t *task) onBarrier(st *inputState, ch int, b dataplane.Barrier) error {
	switch {
	case st.aligning && b.ID == st.barrier.ID:
	case st.aligning && b.ID < st.barrier.ID, !st.aligning && b.ID <= st.lastAligned(), b.ID <= st.lastCancel:
		return nil // a late barrier of an aborted, cancelled or completed checkpoint
	default:
		if st.aligning {
			t.endAlignment(st)
		}
		st.aligning, st.barrier = true, b
	}
	st.arrived[ch] = true
	t.gate.Block(ch)
	return t.maybeAligned(st)
}

func (st *inputState) lastAligned() int64 { return st.barrier.ID }

func (t *task) maybeAligned(st *inputState) error {
	for c, a := range st.arrived {
		if !a && !t.gate.Ended(c) {
			return nil
		}
	}
	b := st.barrier
	t.endAlignment(st)
	if err := t.broadcast(dataplane.BarrierEvent(b)); err != nil {
		return t.fail(phaseOutput, err)
	}
	return nil
}

func (t *task) endAlignment(st *inputState) {
	st.aligning = false
	clear(st.arrived)
	t.gate.UnblockAll()
}
