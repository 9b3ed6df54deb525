package runtime

import (
	"context"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/dataplane"
	"github.com/streamd/streamd/internal/checkpoint"
	"github.com/streamd/streamd/internal/telemetry"
)

// Unaligned checkpoints at a subtask (DESIGN.md "Unaligned checkpoints";
// the decisions are the SubtaskMachine's, this is their IO).
//
// The barrier of an unaligned checkpoint travels ahead of the sender's
// output buffers and behind the records already in the channels, but
// nothing waits for those records: the sender keeps its output buffers
// (the pending and queued batches of its writers, CaptureOutputs) as
// output channel state, puts the barrier into the channels without
// waiting for room (RecordWriter.BroadcastAhead) and sends the buffers
// after it; since a back-pressured subtask waits for room in its loop, not
// inside a send (task.sendQueued), it takes a trigger or barrier at once.
// The receiver's input gate takes the
// barrier out of the queue as soon as it is there (InputGate.TakeOvertaking),
// visiting the records and watermarks queued before it. Those are the
// channel's state in the checkpoint (CaptureOvertaken), held, not copied: the
// state refers to the records in their batches, which it retains
// (dataplane.Batch.Retain) until the write is done; the records stay queued
// and are processed as usual afterwards. On a channel whose
// barrier has not arrived when the subtask takes its snapshot, what it
// processes until the barrier arrives (or the channel's end of data) is
// captured too (StartCapture .. StopCapture), and the channel is asked to
// flag that barrier (WantBarrier), so it is taken ahead as well. The state is
// snapshotted at the first barrier (TakeSnapshot); it is written, with the
// channel state, and acknowledged once every capture has stopped
// (FinishSnapshot). A restored subtask replays the channel state of its
// input channels before anything new (replayInFlight); the output buffers
// of its senders come to it as part of that (checkpoint.ReassignChannels
// puts them after the receiver's own).

// chanOrigin is the sending end of a data channel of the gate: the
// upstream operator, its subtask and the edge's input index.
type chanOrigin struct {
	op    string
	sub   int
	input int
}

// unalignedState is the unaligned checkpoint in progress at a subtask.
type unalignedState struct {
	id        int64
	x         control.TakeSnapshot
	st        *checkpoint.SubtaskState
	span      trace.Span
	chans     [][]checkpoint.Element // per data channel
	capturing []bool                 // per data channel
	// held are the batches whose records chans refers to: retained
	// (dataplane.Batch.Retain) instead of copied, released once the
	// channel state is written or dropped.
	held heldBatches
	// overtaken holds what the barrier being taken (by takeOvertaking)
	// overtook, for CaptureOvertaken.
	overtaken     []checkpoint.Element
	overtakenHeld heldBatches
	// outs are the output buffers the barrier overtook, per output
	// channel (task.outDests); captured (CaptureOutputs) just before the
	// snapshot starts, in capOuts and capHeld.
	outs    [][]checkpoint.Element
	capOuts [][]checkpoint.Element
	capHeld heldBatches
	timers  []*time.Timer
}

// heldBatches are retained batches that records of channel state point into.
type heldBatches []*dataplane.Batch

// appendEvent appends the records (retaining their batch, not copying them)
// or the watermark of ev to elems.
func (h *heldBatches) appendEvent(elems []checkpoint.Element, ev dataplane.Event) []checkpoint.Element {
	switch ev.Kind {
	case dataplane.KindRecords:
		if b := ev.Batch; b != nil && b.Len() > 0 {
			b.Retain()
			*h = append(*h, b)
			for _, r := range b.Records {
				elems = append(elems, checkpoint.RecordElement(r))
			}
		}
	case dataplane.KindWatermark:
		elems = append(elems, checkpoint.WatermarkElement(ev.Watermark.TS))
	}
	return elems
}

// release lets go of the batches (the records pointing into them are no
// longer read).
func (h *heldBatches) release() {
	for i, b := range *h {
		b.Release()
		(*h)[i] = nil
	}
	*h = (*h)[:0]
}

// captureOutputs keeps what the writers hold and have not sent (their
// pending and queued batches, watermarks) as the output buffers of the
// unaligned checkpoint about to start: its barrier goes ahead of them
// (broadcastNow), they go out after it, and a restore replays them to
// their receivers after those receivers' own channel state
// (checkpoint.ReassignChannels).
func (t *task) captureOutputs() {
	u := &t.ua
	u.capHeld.release()
	u.capOuts = make([][]checkpoint.Element, len(t.outDests))
	k := 0
	for _, w := range t.writers {
		base := k
		w.CaptureBuffers(func(o int, ev dataplane.Event) {
			u.capOuts[base+o] = u.capHeld.appendEvent(u.capOuts[base+o], ev)
		})
		k += w.NumOutputs()
	}
}

// broadcastNow sends ev (an overtaking barrier) on every output edge,
// ahead of the output buffers (captureOutputs took them) and without
// waiting for room.
func (t *task) broadcastNow(ev dataplane.Event) error {
	for _, w := range t.writers {
		if err := w.BroadcastAhead(t.ctx, ev); err != nil {
			return err
		}
	}
	return nil
}

// startUnaligned snapshots the state for unaligned checkpoint x.B; the
// write and the Ack wait for finishUnaligned.
func (t *task) startUnaligned(x control.TakeSnapshot) error {
	u := &t.ua
	u.dropCheckpoint()
	sctx, span := t.startCheckpointSpan(telemetry.SpanTaskSnapshot, x.B.ID, x.B.Trace)
	st, err := t.takeState(sctx, x.B)
	if err != nil {
		telemetry.EndSpan(span, err)
		return err
	}
	u.id, u.x, u.st, u.span = x.B.ID, x, st, span
	u.outs, u.capOuts = u.capOuts, nil
	u.held = append(u.held, u.capHeld...)
	clear(u.capHeld)
	u.capHeld = u.capHeld[:0]
	if n := t.nData; len(u.chans) != n {
		u.chans, u.capturing = make([][]checkpoint.Element, n), make([]bool, n)
	}
	return nil
}

// dropCheckpoint forgets the checkpoint in progress (its span ends aborted).
func (u *unalignedState) dropCheckpoint() {
	if u.span != nil {
		telemetry.EndSpan(u.span, fmt.Errorf("unaligned checkpoint %d ended unfinished here", u.id))
	}
	if u.st != nil {
		u.st.Operator.Release() // dropped unwritten; finishUnaligned hands it on first
	}
	u.id, u.st, u.span, u.outs = 0, nil, nil, nil
	for i := range u.chans {
		u.chans[i] = nil
		u.capturing[i] = false
	}
	u.held.release()
}

func (t *task) startCapture(ch int, id int64) {
	if t.ua.id != id || ch >= len(t.ua.capturing) {
		return
	}
	t.ua.capturing[ch] = true
	t.gate.WantBarrier(ch, id)
}

func (t *task) stopCapture(ch int) {
	if ch < len(t.ua.capturing) {
		t.ua.capturing[ch] = false
		t.gate.WantBarrier(ch, 0)
	}
}

// capturing reports whether what channel ch delivers is channel state.
func (t *task) capturing(ch int) bool {
	return t.ua.id != 0 && ch < len(t.ua.capturing) && t.ua.capturing[ch]
}

// capture adds what channel ch delivered to the channel state.
func (t *task) capture(ch int, ev dataplane.Event) {
	t.ua.chans[ch] = t.ua.held.appendEvent(t.ua.chans[ch], ev)
}

func (t *task) captureOvertaken(ch int, id int64) {
	u := &t.ua
	if u.id == id && ch < len(u.chans) {
		u.chans[ch] = append(u.chans[ch], u.overtaken...)
		u.held = append(u.held, u.overtakenHeld...)
		clear(u.overtakenHeld)
		u.overtakenHeld = u.overtakenHeld[:0]
	}
	clear(u.overtaken)
	u.overtaken = u.overtaken[:0]
}

// takeOvertaking takes an overtaking barrier out of an input channel, if
// one is queued, and feeds it to the machine; false when there was none.
func (t *task) takeOvertaking() (bool, error) {
	u := &t.ua
	u.overtaken = u.overtaken[:0]
	ch, b, ok, err := t.gate.TakeOvertaking(func(_ int, ev dataplane.Event) {
		u.overtaken = u.overtakenHeld.appendEvent(u.overtaken, ev)
	})
	if err != nil {
		u.overtakenHeld.release()
		return false, t.fail(phaseInput, fmt.Errorf("%s: %w", t.gate.Name(ch), err))
	}
	if ok {
		err = t.step(control.ChannelBarrier{Channel: ch, B: fromDataplaneBarrier(b), Overtook: true})
		// What CaptureOvertaken did not take is not channel state.
		clear(u.overtaken)
		u.overtaken = u.overtaken[:0]
		u.overtakenHeld.release()
		if err != nil {
			return true, err
		}
	}
	// Aligned barriers queued behind records (with an aligned timeout):
	// their alignment starts now. After TakeOvertaking, which cleared the
	// flag: an announcement queued since sets it again.
	took := ok
	t.gate.Announced(func(ch int, b dataplane.Barrier) {
		if err == nil {
			took = true
			err = t.step(control.ChannelAnnounced{Channel: ch, B: fromDataplaneBarrier(b)})
		}
	})
	return took, err
}

// finishUnaligned writes unaligned checkpoint id, its state with the channel
// state captured, and reports the Ack.
func (t *task) finishUnaligned(id int64) error {
	u := &t.ua
	if u.id != id {
		return t.fail(phaseSetup, fmt.Errorf("finish of unaligned checkpoint %d, but %d is in progress", id, u.id))
	}
	st := u.st
	var cs checkpoint.ChannelState
	for ch, elems := range u.chans {
		if len(elems) > 0 {
			o := t.origins[ch]
			cs.Inputs = append(cs.Inputs, checkpoint.ChannelData{Operator: o.op, Subtask: o.sub, Input: o.input, Elements: elems})
		}
	}
	for k, elems := range u.outs {
		if len(elems) > 0 {
			d := t.outDests[k]
			cs.Outputs = append(cs.Outputs, checkpoint.ChannelData{Operator: d.op, Subtask: d.sub, Input: d.input, Elements: elems})
		}
	}
	if !cs.Empty() {
		if st == nil {
			st = &checkpoint.SubtaskState{}
		}
		st.Channels = &cs
	}
	x, span := u.x, u.span
	held := u.held
	u.span, u.st, u.held = nil, nil, nil
	u.dropCheckpoint()
	t.writeSnapshot(x, st, span, held.release)
	return nil
}

func (t *task) abortUnaligned(id int64) {
	if t.ua.id == id {
		t.ua.dropCheckpoint()
	}
}

// armAlignmentTimer fires AlignmentTimedOut{id} after the aligned timeout,
// through the mailbox.
func (t *task) armAlignmentTimer(id int64) {
	d := t.j.opts.Checkpoint.AlignedTimeout
	if d <= 0 {
		return
	}
	u := &t.ua
	// One alignment is in progress at a time: an older timer can only fire
	// for a checkpoint that no longer aligns here (the machine ignores it).
	for _, tm := range u.timers {
		tm.Stop()
	}
	u.timers = u.timers[:0]
	u.timers = append(u.timers, time.AfterFunc(d, func() { t.mb.send(command{kind: cmdAlignTimeout, id: id}) }))
}

// stopTimers stops the alignment timers (the subtask exits).
func (t *task) stopTimers() {
	for _, tm := range t.ua.timers {
		tm.Stop()
	}
	t.ua.timers = nil
	t.ua.dropCheckpoint()
	t.ua.capHeld.release()
}

// replayInFlight processes the restored channel state before anything new:
// per channel, in order, its records and watermarks, as if they had just
// arrived there.
func (t *task) replayInFlight(ctx context.Context) error {
	chans := t.inflight
	t.inflight = nil
	for _, cd := range chans {
		ch := -1
		for c, o := range t.origins {
			if o.op == cd.Operator && o.sub == cd.Subtask && o.input == cd.Input {
				ch = c
				break
			}
		}
		if ch < 0 {
			return t.fail(phaseSetup, fmt.Errorf("restored channel state from %s[%d] (input %d): no such input channel", cd.Operator, cd.Subtask, cd.Input))
		}
		batch := dataplane.GetBatch()
		flush := func() error {
			if batch.Len() == 0 {
				return nil
			}
			b := batch
			batch = dataplane.GetBatch()
			return t.process(ctx, ch, b)
		}
		for _, e := range cd.Elements {
			switch e.Kind {
			case checkpoint.ElementRecord:
				batch.Append(e.Record)
				if batch.Len() >= t.j.opts.BatchSize {
					if err := flush(); err != nil {
						batch.Release()
						return err
					}
				}
			case checkpoint.ElementWatermark:
				if err := flush(); err != nil {
					batch.Release()
					return err
				}
				if err := t.step(control.ChannelWatermark{Channel: ch, TS: e.Watermark}); err != nil {
					batch.Release()
					return err
				}
			}
		}
		if err := flush(); err != nil {
			batch.Release()
			return err
		}
		batch.Release()
	}
	return nil
}
