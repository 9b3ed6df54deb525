package runtime

import (
	"context"

	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/host"
	"github.com/streamd/streamd/internal/connector"
)

// Emitter receives the records an operator emits. The runtime copies them
// into its outgoing batches before it returns, so the caller may reuse the
// slices afterwards. It has the same type as host.Emitter.
type Emitter func(recs []abi.Record)

// SubtaskInfo describes the subtask a NativeOperator runs as.
type SubtaskInfo struct {
	Job, Operator  string
	Subtask        int
	Parallelism    int
	MaxParallelism int
	Attempt        int
	NumInputs      int
}

// NativeOperator is an operator written in Go, with the lifecycle of a wasm
// instance; tests and benchmarks use it. The runtime calls, from the
// subtask's goroutine only: Open once; then Process (once per input batch;
// recs are valid only during the call) and AdvanceWatermark (with strictly
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

// NativeFactory makes the NativeOperator of one subtask.
type NativeFactory func(info SubtaskInfo) NativeOperator

// wasmOperator drives one host instance.
type wasmOperator struct {
	mod  *host.Module
	cfg  host.InstanceConfig
	inst *host.Instance
}

func (w *wasmOperator) Open(ctx context.Context, _ SubtaskInfo) error {
	inst, err := w.mod.NewInstance(ctx, w.cfg)
	if err != nil {
		return err
	}
	w.inst = inst
	return inst.Open(ctx)
}

func (w *wasmOperator) Process(ctx context.Context, input int, recs []abi.Record, emit Emitter) error {
	return w.inst.Process(ctx, input, recs, host.Emitter(emit))
}

func (w *wasmOperator) AdvanceWatermark(ctx context.Context, ts int64, emit Emitter) error {
	return w.inst.AdvanceWatermark(ctx, ts, host.Emitter(emit))
}

func (w *wasmOperator) EndInput(ctx context.Context, input int, emit Emitter) error {
	return w.inst.EndInput(ctx, input, host.Emitter(emit))
}

func (w *wasmOperator) Finish(ctx context.Context, emit Emitter) error {
	return w.inst.Finish(ctx, host.Emitter(emit))
}

func (w *wasmOperator) Close(ctx context.Context) error {
	if w.inst == nil {
		return nil
	}
	return w.inst.Close(ctx)
}

// sinkOperator runs a built-in sink with the operator lifecycle: the sink is
// created in Open, written in Process, made durable in Finish, closed in Close.
type sinkOperator struct {
	open func() (connector.Sink, error)
	sink connector.Sink
}

func (s *sinkOperator) Open(context.Context, SubtaskInfo) error {
	sink, err := s.open()
	if err != nil {
		return err
	}
	s.sink = sink
	return nil
}

func (s *sinkOperator) Process(_ context.Context, _ int, recs []abi.Record, _ Emitter) error {
	return s.sink.Write(recs)
}

func (s *sinkOperator) AdvanceWatermark(context.Context, int64, Emitter) error { return nil }
func (s *sinkOperator) EndInput(context.Context, int, Emitter) error           { return nil }
func (s *sinkOperator) Finish(context.Context, Emitter) error                  { return s.sink.Flush() }

func (s *sinkOperator) Close(context.Context) error {
	if s.sink == nil {
		return nil
	}
	return s.sink.Close()
}
