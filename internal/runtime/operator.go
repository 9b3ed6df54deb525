package runtime

import (
	"context"
	"sync"
	"time"

	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/host"
	"github.com/streamd/streamd/internal/checkpoint"
	"github.com/streamd/streamd/internal/connector"
)

// Emitter receives the records an operator emits. The runtime copies them
// into its outgoing batches before it returns, so the caller may reuse the
// slices afterwards. It has the same type as host.Emitter.
type Emitter func(recs []abi.Record)

// SubtaskInfo describes the subtask a NativeOperator runs as.
type SubtaskInfo struct {
	Job, Operator  string
	JobID          string // a deployed job's id (Options.JobID); streamd run: the job's name
	Subtask        int
	Parallelism    int
	MaxParallelism int
	Attempt        int
	NumInputs      int
}

// NativeOperator is an operator written in Go, with the lifecycle of a wasm
// instance; tests and benchmarks use it. The runtime calls, from the
// subtask's goroutine only: Open once; then Process (once per input batch;
// recs are valid only during the call and read-only: an unaligned checkpoint
// may hold them as channel state) and AdvanceWatermark (with strictly
// increasing timestamps) any number of times; EndInput once per input that
// ended with drain; Finish once, after all inputs ended with drain, after
// which nothing may be emitted; Close always last, also after a failure or
// cancel (then possibly without Open having succeeded), to release resources.
//
// A Vertex.Spec that is a NativeOperator is shared by all subtasks of the
// vertex (so it must be safe for concurrent use when parallelism > 1); one
// that is a NativeFactory gets a fresh operator per subtask.
type NativeOperator interface {
	Open(ctx context.Context, info SubtaskInfo) error
	Process(ctx context.Context, input int, recs []abi.Record, emit Emitter) error
	AdvanceWatermark(ctx context.Context, ts int64, emit Emitter) error
	EndInput(ctx context.Context, input int, emit Emitter) error
	Finish(ctx context.Context, emit Emitter) error
	Close(ctx context.Context) error
}

// NativeCheckpointer is implemented by a NativeOperator that wants to hear of
// checkpoints: SnapshotState at each aligned barrier (native operators keep
// no checkpointed state; tests record the call), NotifyCheckpointComplete
// when a checkpoint it took part in is durable.
type NativeCheckpointer interface {
	SnapshotState(ctx context.Context, checkpointID int64) error
	NotifyCheckpointComplete(ctx context.Context, checkpointID int64) error
}

// checkpointer is what the runtime asks of an operator at a checkpoint.
type checkpointer interface {
	snapshot(ctx context.Context, b control.Barrier) (*checkpoint.SubtaskState, error)
	notify(ctx context.Context, id int64) error
}

// nativeCheckpointer adapts a NativeOperator (a NativeCheckpointer or not).
type nativeCheckpointer struct{ op NativeOperator }

func (n nativeCheckpointer) snapshot(ctx context.Context, b control.Barrier) (*checkpoint.SubtaskState, error) {
	if c, ok := n.op.(NativeCheckpointer); ok {
		return nil, c.SnapshotState(ctx, b.ID)
	}
	return nil, nil
}

func (n nativeCheckpointer) notify(ctx context.Context, id int64) error {
	if c, ok := n.op.(NativeCheckpointer); ok {
		return c.NotifyCheckpointComplete(ctx, id)
	}
	return nil
}

func checkpointerOf(op NativeOperator) checkpointer {
	if c, ok := op.(checkpointer); ok {
		return c
	}
	return nativeCheckpointer{op}
}

// NativeFactory makes the NativeOperator of one subtask.
type NativeFactory func(info SubtaskInfo) NativeOperator

// wasmOperator drives one host instance.
type wasmOperator struct {
	mod  *host.Module
	cfg  host.InstanceConfig
	inst *host.Instance
	dl   *deadLetters // on_error skip or dead_letter (deadletter.go); nil: fail
	// root is the checkpoint store's root ("" without one): restored
	// state files from there may be referred to by the next incremental
	// checkpoint.
	root       string
	restoredID int64    // the checkpoint cfg.Restore is from
	stats      *opStats // with a restore: its time goes to stats.restore
	// shared holds, by checkpoint id, the shared files the incremental
	// checkpoints this subtask took (or restored) refer to, by local file
	// name: a checkpoint with Barrier.Base B reuses those of B the subtask
	// still has. Written by the background writer, hence the mutex.
	mu     sync.Mutex
	shared map[int64]map[string]host.StateFile
	// holding: a process call runs whose emits the dead letters hold
	// until it succeeds (emit_to goes there too, taskOutputs).
	holding bool
}

func (w *wasmOperator) Open(ctx context.Context, _ SubtaskInfo) error {
	start := time.Now()
	inst, err := w.mod.NewInstance(ctx, w.cfg)
	if err != nil {
		if cannotInstantiate(err) {
			err = control.NonRecoverable(err)
		}
		return err
	}
	if w.stats != nil {
		storeMax(&w.stats.restore, time.Since(start))
	}
	w.inst = inst
	if part := inst.AdoptedFiles(); part != nil && w.cfg.Restore != nil && part.Root != "" && part.Root == w.root {
		// Restored from a checkpoint of this store: its files are shared.
		w.recordShared(w.restoredID, part)
	}
	if err := inst.Open(ctx); err != nil {
		return err
	}
	if w.dl != nil {
		return w.dl.openSink()
	}
	return nil
}

func (w *wasmOperator) Process(ctx context.Context, input int, recs []abi.Record, emit Emitter) error {
	if w.dl == nil {
		return w.inst.Process(ctx, input, recs, host.Emitter(emit))
	}
	w.holding = true
	defer func() { w.holding = false }()
	err := w.inst.Process(ctx, input, recs, w.dl.hold)
	if err == nil {
		w.dl.release(emit)
		return nil
	}
	w.dl.drop()
	if !isolatable(err) {
		return err
	}
	if len(recs) == 1 {
		if err := w.dl.failed(ctx, input, recs[0], err); err != nil {
			return err
		}
		return w.replace(ctx)
	}
	// Replay the batch record by record from the state before it.
	if err := w.replace(ctx); err != nil {
		return err
	}
	for k := range recs {
		err := w.inst.Process(ctx, input, recs[k:k+1], w.dl.hold)
		if err == nil {
			w.dl.release(emit)
			continue
		}
		w.dl.drop()
		if !isolatable(err) {
			return err
		}
		if err := w.dl.failed(ctx, input, recs[k], err); err != nil {
			return err
		}
		if err := w.replace(ctx); err != nil {
			return err
		}
	}
	return nil
}

// replace swaps the failed instance for a fresh one on the state before
// the failed call.
func (w *wasmOperator) replace(ctx context.Context) error {
	n, err := w.inst.Replace(ctx)
	_ = w.inst.Close(ctx) // discarded: releases what is left
	if err != nil {
		return err
	}
	w.inst = n
	return nil
}

func (w *wasmOperator) AdvanceWatermark(ctx context.Context, ts int64, emit Emitter) error {
	return w.inst.AdvanceWatermark(ctx, ts, host.Emitter(emit))
}

func (w *wasmOperator) EndInput(ctx context.Context, input int, emit Emitter) error {
	return w.inst.EndInput(ctx, input, host.Emitter(emit))
}

func (w *wasmOperator) Finish(ctx context.Context, emit Emitter) error {
	if err := w.inst.Finish(ctx, host.Emitter(emit)); err != nil {
		return err
	}
	if w.dl != nil {
		return w.dl.finish()
	}
	return nil
}

func (w *wasmOperator) snapshot(ctx context.Context, b control.Barrier) (*checkpoint.SubtaskState, error) {
	var snap *host.Snapshot
	var err error
	if b.Kind == control.KindSavepoint {
		snap, err = w.inst.SnapshotState(ctx, b.ID) // full and portable
	} else {
		snap, err = w.inst.SnapshotCheckpoint(ctx, b.ID)
	}
	if err != nil {
		return nil, err
	}
	st := &checkpoint.SubtaskState{Operator: snap}
	if snap.Empty() {
		snap.Release()
		st.Operator = nil
	}
	if w.dl != nil {
		if st.SinkPending, err = w.dl.preCommit(b.ID); err != nil {
			return nil, err
		}
	}
	if st.Operator == nil && st.SinkPending == nil {
		return nil, nil
	}
	if st.Operator != nil && len(snap.Files) > 0 {
		w.reuseShared(snap.Files[0], b)
	}
	return st, nil
}

// stateWritten is called once st, the state of checkpoint id, is durable.
func (w *wasmOperator) stateWritten(id int64, st *checkpoint.SubtaskState) {
	if st.Operator != nil && len(st.Operator.Files) > 0 {
		w.recordShared(id, st.Operator.Files[0])
	}
}

// reuseShared sets the keys of the files of part that checkpoint b.Base
// refers to as well (same name, same size: sstables never change), and
// forgets the files of checkpoints older than the base.
func (w *wasmOperator) reuseShared(part *host.FileState, b control.Barrier) {
	w.mu.Lock()
	defer w.mu.Unlock()
	base := w.shared[b.Base]
	for i := range part.Files {
		f := &part.Files[i]
		if prev, ok := base[f.Name]; ok && f.Shared && prev.Size == f.Size {
			f.Key, f.CRC32C = prev.Key, prev.CRC32C
		}
	}
	for id := range w.shared {
		if id < b.Base {
			delete(w.shared, id)
		}
	}
}

// recordShared remembers the shared files of checkpoint id once its state
// is written.
func (w *wasmOperator) recordShared(id int64, part *host.FileState) {
	m := make(map[string]host.StateFile, len(part.Files))
	for _, f := range part.Files {
		if f.Shared && f.Key != "" {
			m[f.Name] = host.StateFile{Name: f.Name, Shared: true, Key: f.Key, Size: f.Size, CRC32C: f.CRC32C}
		}
	}
	w.mu.Lock()
	if w.shared == nil {
		w.shared = map[int64]map[string]host.StateFile{}
	}
	w.shared[id] = m
	w.mu.Unlock()
}

func (w *wasmOperator) notify(ctx context.Context, id int64) error {
	if err := w.inst.NotifyCheckpointComplete(ctx, id); err != nil {
		return err
	}
	if w.dl != nil {
		return w.dl.commit(id)
	}
	return nil
}

func (w *wasmOperator) Close(ctx context.Context) error {
	var err error
	if w.inst != nil {
		err = w.inst.Close(ctx)
	}
	if w.dl != nil {
		if cerr := w.dl.close(); err == nil {
			err = cerr
		}
	}
	return err
}

// sinkOperator runs a built-in sink with the operator lifecycle: the sink is
// created in Open (a two-phase-commit sink first commits the pending data of
// the checkpoint it restores from), written in Process, pre-committed at each
// checkpoint and committed when the checkpoint is complete. Without
// checkpointing (ckpt false) Finish commits everything. Close releases it.
type sinkOperator struct {
	open    func() (connector.Sink, error)
	ckpt    bool
	pending [][]byte // restored pending-commit states
	sink    connector.Sink
}

func (s *sinkOperator) Open(context.Context, SubtaskInfo) error {
	sink, err := s.open()
	if err != nil {
		return err
	}
	s.sink = sink
	if tp, ok := sink.(connector.TwoPhaseSink); ok {
		return tp.CommitPending(s.pending)
	}
	return nil
}

func (s *sinkOperator) snapshot(_ context.Context, b control.Barrier) (*checkpoint.SubtaskState, error) {
	if ps, ok := s.sink.(connector.PartedSink); ok {
		parts, err := ps.PreCommitParts(b.ID)
		if err != nil {
			return nil, err
		}
		return &checkpoint.SubtaskState{SinkPendingParts: parts}, nil
	}
	if tp, ok := s.sink.(connector.TwoPhaseSink); ok {
		st, err := tp.PreCommit(b.ID)
		if err != nil {
			return nil, err
		}
		return &checkpoint.SubtaskState{SinkPending: st}, nil
	}
	return nil, s.sink.Flush()
}

func (s *sinkOperator) notify(_ context.Context, id int64) error {
	if tp, ok := s.sink.(connector.TwoPhaseSink); ok {
		return tp.Commit(id)
	}
	return nil
}

func (s *sinkOperator) Process(_ context.Context, _ int, recs []abi.Record, _ Emitter) error {
	return s.sink.Write(recs)
}

func (s *sinkOperator) AdvanceWatermark(context.Context, int64, Emitter) error { return nil }
func (s *sinkOperator) EndInput(context.Context, int, Emitter) error           { return nil }
func (s *sinkOperator) Finish(context.Context, Emitter) error {
	if tp, ok := s.sink.(connector.TwoPhaseSink); ok {
		if s.ckpt {
			return nil // the final checkpoint commits the rest
		}
		return tp.CommitFinal()
	}
	return s.sink.Flush()
}

func (s *sinkOperator) Close(context.Context) error {
	if s.sink == nil {
		return nil
	}
	return s.sink.Close()
}
