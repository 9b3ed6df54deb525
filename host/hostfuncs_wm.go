package host

import (
	"github.com/tetratelabs/wazero/api"

	"github.com/streamd/streamd/abi"
)

// Watermarks and side outputs (ABI.md "Watermarks and side outputs").

// Outputs is where an instance sends what its guest passes to
// emit_watermark and emit_to, and what answers input_watermark. The runtime
// implements it per subtask (InstanceConfig.Outputs); every method is called
// from the goroutine driving the instance, inside the guest call.
type Outputs interface {
	// EmitWatermark: the guest called emit_watermark(ts). From the first
	// call on the operator's output watermark is its own; a ts not above
	// the last one emitted is for the receiver to ignore.
	EmitWatermark(ts int64)
	// EmitTo: records for the side output name (a valid name, see
	// abi.CheckOutputName). The records are owned as with Emitter.
	EmitTo(name string, recs []abi.Record)
	// InputWatermark is the current watermark of input (0 <= input <
	// NumInputs): the minimum over its channels that are neither ended nor
	// idle, abi.MinWatermark before any.
	InputWatermark(input int) int64
}

func addWatermarkImports(add func(name string, f hostFunc, params, results []api.ValueType, names ...string)) {
	add(abi.ImportEmitWatermark, hostEmitWatermark, []api.ValueType{i64}, nil, "ts")
	add(abi.ImportInputWatermark, hostInputWatermark, []api.ValueType{i32}, []api.ValueType{i64}, "input")
	add(abi.ImportEmitTo, hostEmitTo, []api.ValueType{i32, i32, i32, i32}, nil, "name_ptr", "name_len", "batch_ptr", "batch_len")
}

// emit_watermark(ts i64): open, process, on_watermark, on_timer,
// on_processing_time, end_input.
func hostEmitWatermark(i *Instance, stack []uint64) {
	i.allowIn(abi.ImportEmitWatermark, watermarkPhases)
	ts := int64(stack[0])
	i.ownsWatermark = true
	if o := i.cfg.Outputs; o != nil {
		i.waitingOutside(func() { o.EmitWatermark(ts) })
	}
}

// watermarkPhases are the phases emit_watermark is allowed in.
var watermarkPhases = []abi.Phase{abi.PhaseOpen, abi.PhaseProcess, abi.PhaseWatermark, abi.PhaseTimer, abi.PhaseProcessingTime, abi.PhaseEndInput}

// input_watermark(input i32) -> i64: every phase.
func hostInputWatermark(i *Instance, stack []uint64) {
	in := int32(uint32(stack[0]))
	if n := max(i.cfg.NumInputs, 1); in < 0 || int(in) >= n {
		i.misuse("input_watermark: input %d outside [0, %d)", in, n)
	}
	wm := abi.MinWatermark
	if o := i.cfg.Outputs; o != nil {
		wm = o.InputWatermark(int(in))
	}
	stack[0] = uint64(wm)
}

// emit_to(name_ptr, name_len, batch_ptr, batch_len): like emit.
func hostEmitTo(i *Instance, stack []uint64) {
	i.allowIn(abi.ImportEmitTo, emitPhases)
	name := string(i.read(uint32(stack[0]), uint32(stack[1]), abi.ImportEmitTo, "name"))
	if err := abi.CheckOutputName(name); err != nil {
		i.misuse("emit_to: %v", err)
	}
	frame := i.read(uint32(stack[2]), uint32(stack[3]), abi.ImportEmitTo, "batch")
	recs, err := i.decodeEmit(frame)
	if err != nil {
		i.misuse("emit_to %s: %v", name, err)
	}
	i.checkRecordSizes("emit_to "+name, recs)
	if o := i.cfg.Outputs; o != nil && len(recs) > 0 {
		i.waitingOutside(func() { o.EmitTo(name, recs) })
	}
}

// OwnsWatermark reports whether the guest called emit_watermark: its output
// watermark is its own, and the host no longer forwards the combined input
// watermark.
func (i *Instance) OwnsWatermark() bool { return i.ownsWatermark }
