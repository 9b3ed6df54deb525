package runtime

import (
	"context"
	"time"

	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/host"
)

// Processing-time timers (ABI.md "Processing time"): a wasm operator's
// instance holds them as keyed state; the task loop fires the due ones
// between batches and arranges to be woken (through its mailbox) when the
// earliest one is due, reading the instance's clock, the one the host's
// state TTL and the processing_time import read.

// procTimed is an operator with processing-time timers.
type procTimed interface {
	// NextProcessingTimer is the earliest timer; false: none (or the
	// operator finished: pending timers are dropped).
	NextProcessingTimer() (int64, bool)
	// ProcessingTime is the operator's processing time in ms.
	ProcessingTime() int64
	// FireProcessingTimers fires the timers due at now.
	FireProcessingTimers(ctx context.Context, now int64, emit Emitter) error
}

func (w *wasmOperator) NextProcessingTimer() (int64, bool) {
	if w.inst == nil {
		return 0, false
	}
	return w.inst.NextProcessingTimer()
}

func (w *wasmOperator) ProcessingTime() int64 { return w.inst.ProcessingTime() }

func (w *wasmOperator) FireProcessingTimers(ctx context.Context, now int64, emit Emitter) error {
	return w.inst.FireProcessingTimers(ctx, now, host.Emitter(emit))
}

// procWake is the wake-up of a task for its earliest processing-time timer.
type procWake struct {
	timer *time.Timer
	armed bool  // timer is pending (not fired, not stopped)
	at    int64 // the timer ts it is armed for
}

// processingTimers fires the operator's due processing-time timers and
// arms the wake-up for the next one. Called between batches and events;
// cheap when there is no timer.
func (t *task) processingTimers() error {
	pt, ok := t.op.(procTimed)
	if !ok {
		return nil
	}
	next, ok := pt.NextProcessingTimer()
	if !ok {
		t.disarmProcWake()
		return nil
	}
	now := pt.ProcessingTime()
	if next <= now {
		err := pt.FireProcessingTimers(t.ctx, now, t.emit)
		if err := t.call(string(abi.PhaseProcessingTime), err); err != nil {
			return err
		}
		if next, ok = pt.NextProcessingTimer(); !ok {
			t.disarmProcWake()
			return nil
		}
	}
	t.armProcWake(next, now)
	return nil
}

// armProcWake makes sure a wake-up comes when the timer at ts is due (in
// the clock's milliseconds from now; at once if overdue).
func (t *task) armProcWake(ts, now int64) {
	w := &t.pwake
	if w.armed && w.at == ts {
		return
	}
	t.disarmProcWake()
	d := time.Duration(max(ts-now, 0)) * time.Millisecond
	mb := t.mb
	w.armed, w.at = true, ts
	w.timer = time.AfterFunc(d, func() { mb.send(command{kind: cmdProcTime}) })
}

func (t *task) disarmProcWake() {
	w := &t.pwake
	if w.timer != nil {
		w.timer.Stop()
		w.timer = nil
	}
	w.armed = false
}
