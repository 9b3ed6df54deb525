package host

import (
	"context"
	"fmt"

	"github.com/streamd/streamd/abi"
)

// Isolating a failing record (InstanceConfig.Isolate).
//
// A guest that fails in streamd_process leaves its instance in an unknown
// state, and the keyed state holds the writes of the records of the batch
// before the failing one. To replay the batch record by record from the
// state as it was before it, the instance journals every keyed-state write
// and timer change of a process call (the before-image of each key, whether
// each timer existed), and Replace undoes the journal and opens a fresh
// wasm instance on the rolled-back state. The journal costs one state read
// per write, and only for operators with on_error skip or dead_letter.
//
// The guest's own memory cannot be rolled back: the fresh instance starts
// from _initialize and streamd_open, with the operator list state the
// subtask was restored with (ABI.md, "Errors and what the host does").

// undoEntry reverts one keyed-state write or timer change.
type undoEntry struct {
	op        string // the import that made the change
	kg        int
	name, key []byte
	old       []byte // the value before (nil with !existed)
	existed   bool   // the key (or timer) existed before
	ts        int64  // timers
	kind      timerKind
}

// journalEntry records the value of (name, key) before a state_put or
// state_delete of a process call, or before each stored entry an mstate_*
// import writes or removes (name and key are then the stored ones).
func (i *Instance) journalEntry(import_ string, kg int, name, key []byte) {
	if !i.cfg.Isolate || i.phase != abi.PhaseProcess {
		return
	}
	old, ok, err := i.state.get(kg, name, key)
	if err != nil {
		i.stateFailed(import_, err)
	}
	e := undoEntry{op: import_, kg: kg, name: clone(name), key: clone(key), existed: ok}
	if ok {
		e.old = clone(old)
	}
	i.undo = append(i.undo, e)
}

// journalTimer records whether timer (key, ts) of kind k existed before a
// timer_register, timer_delete, ptimer_register or ptimer_delete of a
// process call.
func (i *Instance) journalTimer(import_ string, k timerKind, key []byte, ts int64) {
	if !i.cfg.Isolate || i.phase != abi.PhaseProcess {
		return
	}
	ok, err := i.state.hasTimer(k, timerID{key: string(key), ts: ts})
	if err != nil {
		i.stateFailed(import_, err)
	}
	i.undo = append(i.undo, undoEntry{op: import_, key: clone(key), ts: ts, kind: k, existed: ok})
}

func clone(b []byte) []byte { return append(make([]byte, 0, len(b)), b...) }

// rollback undoes the journal, newest change first.
func (i *Instance) rollback() error {
	for k := len(i.undo) - 1; k >= 0; k-- {
		e := i.undo[k]
		var err error
		switch {
		case e.op == abi.ImportTimerRegister || e.op == abi.ImportTimerDelete ||
			e.op == abi.ImportPTimerRegister || e.op == abi.ImportPTimerDelete:
			if e.existed {
				err = i.state.registerTimer(e.kind, e.key, e.ts)
			} else {
				err = i.state.deleteTimer(e.kind, e.key, e.ts)
			}
		case e.existed:
			err = i.state.put(e.kg, e.name, e.key, e.old)
		default:
			err = i.state.del(e.kg, e.name, e.key)
		}
		if err != nil {
			return fmt.Errorf("host: job %q operator %q subtask %d/%d: rolling back the failed batch's state: %w", i.cfg.Job, i.cfg.Operator, i.cfg.Subtask, i.cfg.Parallelism, err)
		}
	}
	i.undo = i.undo[:0]
	return nil
}

// Replace returns an open, fresh instance of i's subtask that goes on from
// the keyed state and timers as they were before the process call that
// discarded i (made with InstanceConfig.Isolate): it undoes that call's
// state changes and hands the state to a new wasm instance, which gets
// _initialize and streamd_open (with the open context and restored list
// state of i) and i's watermark. i keeps nothing; Close it as usual. Replace
// fails on an instance that is alive, not isolating, or failed in another
// phase than process (its state changes were not journalled).
func (i *Instance) Replace(ctx context.Context) (*Instance, error) {
	switch {
	case !i.cfg.Isolate:
		return nil, fmt.Errorf("host: operator %q subtask %d: Replace of an instance made without Isolate", i.cfg.Operator, i.cfg.Subtask)
	case i.dead == nil || i.closed:
		return nil, fmt.Errorf("host: operator %q subtask %d: Replace of an instance that did not fail", i.cfg.Operator, i.cfg.Subtask)
	case i.dead.Phase != abi.PhaseProcess || i.state == nil:
		return nil, fmt.Errorf("host: operator %q subtask %d: Replace after a failure in phase %s", i.cfg.Operator, i.cfg.Subtask, i.dead.Phase)
	}
	if err := i.rollback(); err != nil {
		return nil, err
	}
	state := i.state
	i.state = nil
	n, err := i.module.newInstance(ctx, i.cfg, state, i.restoredLists)
	if err != nil {
		return nil, err
	}
	n.watermark = i.watermark
	n.ownsWatermark = i.ownsWatermark
	if err := n.Open(ctx); err != nil {
		_ = n.Close(ctx)
		return nil, err
	}
	return n, nil
}
