package runtime

import (
	"time"

	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/dataplane"
	"github.com/streamd/streamd/internal/jobfile"
)

// Side outputs and operator watermarks (SPEC14 §3, ABI.md "Watermarks and
// side outputs"). A side-output edge is one more output edge of the
// operator: its writer is in t.writers like the others, so watermarks,
// barriers, cancels, end of data, end of partition, the finishing
// handshake and unaligned checkpoints cover it as they cover the main
// output; only records are routed by output (t.main for emit, t.side for
// emit_to).

// addWriter adds the writer of output edge e, whose outputs go to dests.
func (t *task) addWriter(e control.Edge, w *dataplane.RecordWriter, dests []chanOrigin) {
	t.writers = append(t.writers, w)
	t.outDests = append(t.outDests, dests...)
	if e.Output == "" {
		t.main = append(t.main, w)
		return
	}
	if t.side == nil {
		t.side = map[string][]*dataplane.RecordWriter{}
	}
	t.side[e.Output] = append(t.side[e.Output], w)
}

// emitTo sends recs to the side output name; with no edge reading it they
// are dropped and counted.
func (t *task) emitTo(name string, recs []abi.Record) {
	if t.emitErr != nil {
		return
	}
	ws := t.side[name]
	if len(ws) == 0 {
		t.stats.sideDropped.Add(int64(len(recs)))
		t.om.SideOutputDropped(name, len(recs))
		return
	}
	t.countOut(len(recs))
	for _, w := range ws {
		if err := w.EmitBatch(t.ctx, recs); err != nil {
			t.emitErr = err
			return
		}
	}
}

// countOut counts n records emitted (in the current batch's metric while
// in a Process call).
func (t *task) countOut(n int) {
	t.stats.out.Add(int64(n))
	if t.inBatch {
		t.batchOut += n
	} else {
		t.om.RecordsOut(t.ctx, n)
	}
}

// sendWatermark sends watermark ts on every output (after the pending
// records) if it is above the last one sent.
func (t *task) sendWatermark(ts int64) error {
	if ts <= t.outWM {
		return nil
	}
	t.outWM = ts
	t.outIdle = false // a watermark makes the receivers count the channel again
	if err := t.broadcast(dataplane.WatermarkEvent(ts)); err != nil {
		return err
	}
	if len(t.writers) > 0 {
		t.om.OutputWatermark(t.ctx, ts, t.newSource != nil)
	}
	return nil
}

// sendStatus tells every output the subtask is idle or active again.
func (t *task) sendStatus(idle bool) error {
	if t.outIdle == idle {
		return nil
	}
	t.outIdle = idle
	return t.broadcast(dataplane.WatermarkStatusEvent(idle))
}

// emitOwnWatermark is emit_watermark(ts): from now on the operator's
// output watermark is its own.
func (t *task) emitOwnWatermark(ts int64) {
	t.ownWM = true
	if t.emitErr != nil {
		return
	}
	if err := t.sendWatermark(ts); err != nil {
		t.emitErr = err
	}
}

// taskOutputs is a wasm operator's host.Outputs: the subtask's side
// outputs, its own watermark and its input watermarks.
type taskOutputs struct {
	t *task
	w *wasmOperator
}

func (o taskOutputs) EmitWatermark(ts int64) { o.t.emitOwnWatermark(ts) }

func (o taskOutputs) EmitTo(name string, recs []abi.Record) {
	if o.w.dl != nil && o.w.holding {
		o.w.dl.holdSide(name, recs) // sent only if the call succeeds (on_error)
		return
	}
	o.t.emitTo(name, recs)
}

func (o taskOutputs) InputWatermark(in int) int64 { return o.t.m.InputWatermark(in) }

// initSourceWatermarks reads a source subtask's watermark strategy.
func (t *task) initSourceWatermarks() {
	t.wmInterval = jobfile.DefaultWatermarkInterval
	if spec, ok := t.v.Spec.(*jobfile.SourceSpec); ok {
		t.wmInterval, t.idleTimeout = spec.Interval(), spec.IdleTimeout
	}
	t.srcLastRec = time.Now()
}

// sourceWatermark sends the source's pending watermark if it advanced and
// the interval since the last one passed.
func (t *task) sourceWatermark() (bool, error) {
	if t.srcPend <= t.outWM || time.Since(t.srcSent) < t.wmInterval {
		return false, nil
	}
	t.srcSent = time.Now()
	if err := t.sendStatus(false); err != nil {
		return false, err
	}
	return true, t.sendWatermark(t.srcPend)
}

// sourceDeadline is how long a reading source waits at most before
// sourceTick: for its pending watermark's interval, or to go idle.
func (t *task) sourceDeadline() (time.Duration, bool) {
	if !t.m.Reading() {
		return 0, false
	}
	var at time.Time
	if t.srcPend > t.outWM {
		at = t.srcSent.Add(t.wmInterval)
	}
	if t.idleTimeout > 0 && !t.outIdle {
		if idle := t.srcLastRec.Add(t.idleTimeout); at.IsZero() || idle.Before(at) {
			at = idle
		}
	}
	if at.IsZero() {
		return 0, false
	}
	return max(time.Until(at), 0), true
}

// sourceTick sends the pending watermark once its interval passed and
// makes the source idle once it read nothing for the idle timeout.
func (t *task) sourceTick() error {
	if _, err := t.sourceWatermark(); err != nil {
		return t.fail(phaseOutput, err)
	}
	if t.idleTimeout > 0 && !t.outIdle && t.m.Reading() && time.Since(t.srcLastRec) >= t.idleTimeout {
		if err := t.flush(); err != nil {
			return t.fail(phaseOutput, err)
		}
		if err := t.sendStatus(true); err != nil {
			return t.fail(phaseOutput, err)
		}
	}
	return nil
}
