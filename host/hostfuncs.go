package host

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/tetratelabs/wazero/api"

	"github.com/streamd/streamd/abi"
)

var (
	i32 = api.ValueTypeI32
	i64 = api.ValueTypeI64
)

type hostFunc func(i *Instance, stack []uint64)

// instantiateHostModule registers the streamd_v1 imports once per runtime. Each
// finds its calling Instance from the api.Module it is called with.
func (e *Engine) instantiateHostModule(ctx context.Context) (api.Module, error) {
	b := e.runtime.NewHostModuleBuilder(abi.ImportModule)
	add := func(name string, f hostFunc, params, results []api.ValueType, names ...string) {
		b.NewFunctionBuilder().
			WithGoModuleFunction(api.GoModuleFunc(func(ctx context.Context, mod api.Module, stack []uint64) {
				v, ok := e.instances.Load(mod)
				if !ok {
					e.callOutsideSubtask(name, mod, stack)
					return
				}
				f(v.(*Instance), stack)
			}), params, results).
			WithParameterNames(names...).
			Export(name)
	}
	add(abi.ImportEmit, hostEmit, []api.ValueType{i32, i32}, nil, "batch_ptr", "batch_len")
	add(abi.ImportStateGet, hostStateGet, []api.ValueType{i32, i32, i32, i32, i32, i32}, []api.ValueType{i32},
		"name_ptr", "name_len", "key_ptr", "key_len", "buf_ptr", "buf_cap")
	add(abi.ImportStatePut, hostStatePut, []api.ValueType{i32, i32, i32, i32, i32, i32}, nil,
		"name_ptr", "name_len", "key_ptr", "key_len", "val_ptr", "val_len")
	add(abi.ImportStateDelete, hostStateDelete, []api.ValueType{i32, i32, i32, i32}, nil,
		"name_ptr", "name_len", "key_ptr", "key_len")
	add(abi.ImportListStateAdd, hostListStateAdd, []api.ValueType{i32, i32, i32, i32, i32}, nil,
		"name_ptr", "name_len", "mode", "val_ptr", "val_len")
	add(abi.ImportListStateGet, hostListStateGet, []api.ValueType{i32, i32, i32, i32, i32}, []api.ValueType{i32},
		"name_ptr", "name_len", "index", "buf_ptr", "buf_cap")
	add(abi.ImportTimerRegister, hostTimerRegister, []api.ValueType{i32, i32, i64}, nil, "key_ptr", "key_len", "ts")
	add(abi.ImportTimerDelete, hostTimerDelete, []api.ValueType{i32, i32, i64}, nil, "key_ptr", "key_len", "ts")
	add(abi.ImportCurrentWatermark, hostCurrentWatermark, nil, []api.ValueType{i64})
	add(abi.ImportLog, hostLog, []api.ValueType{i32, i32, i32}, nil, "level", "msg_ptr", "msg_len")
	add(abi.ImportFail, hostFail, []api.ValueType{i32, i32}, nil, "msg_ptr", "msg_len")
	add(abi.ImportReject, hostReject, []api.ValueType{i32, i32}, nil, "msg_ptr", "msg_len")
	addWatermarkImports(add)
	addStructuredState(add)
	return b.Instantiate(ctx)
}

// callOutsideSubtask serves imports called by the load-time throwaway instance
// (during _initialize or streamd_abi_version): log and current_watermark work,
// fail and the rest fail the call.
func (e *Engine) callOutsideSubtask(name string, mod api.Module, stack []uint64) {
	switch name {
	case abi.ImportLog:
		if msg, ok := mod.Memory().Read(uint32(stack[1]), uint32(stack[2])); ok {
			e.cfg.logger.Log(context.Background(), logLevel(int32(stack[0])), string(msg), "module", mod.Name())
		}
		return
	case abi.ImportCurrentWatermark, abi.ImportInputWatermark:
		stack[0] = api.EncodeI64(abi.MinWatermark)
		return
	case abi.ImportFail:
		if msg, ok := mod.Memory().Read(uint32(stack[0]), uint32(stack[1])); ok {
			panic(&hostCallPanic{ErrGuestFailed, string(msg)})
		}
	}
	panic(&hostCallPanic{ErrHostCall, fmt.Sprintf("%s.%s called outside a subtask (while loading)", abi.ImportModule, name)})
}

// misuse fails the calling guest with ErrHostCall; it does not return.
func (i *Instance) misuse(format string, args ...any) {
	i.failure = &hostCallPanic{ErrHostCall, fmt.Sprintf(format, args...)}
	panic(i.failure)
}

// read returns a view of guest memory [ptr, ptr+n) or fails the guest.
func (i *Instance) read(ptr, n uint32, import_, what string) []byte {
	b, ok := i.mem.Read(ptr, n)
	if !ok {
		i.misuse("%s: %s [%#x, +%d) is outside memory (%d bytes)", import_, what, ptr, n, i.mem.Size())
	}
	return b
}

// keyGroup checks key against this subtask's key groups and returns its group.
func (i *Instance) keyGroup(import_ string, key []byte) int {
	if len(key) == 0 {
		i.misuse("%s: empty key (keyed state and timers need the record's key)", import_)
	}
	kg := abi.KeyGroup(key, i.maxP)
	if !i.rng.Contains(kg) {
		i.misuse("%s: key %q is in key group %d, outside this subtask's key groups %s", import_, key, kg, i.rng)
	}
	return kg
}

// stateFailed fails the calling guest with ErrState; it does not return.
func (i *Instance) stateFailed(import_ string, err error) {
	i.failure = &hostCallPanic{ErrState, fmt.Sprintf("%s: %v", import_, err)}
	panic(i.failure)
}

func (i *Instance) requireStateWrite(import_ string) {
	if i.writesAllowed() {
		return
	}
	if i.finished && (i.phase == abi.PhaseSnapshot || i.phase == abi.PhaseNotify) {
		i.misuse("%s not allowed after finish", import_)
	}
	i.misuse("%s not allowed in phase %s", import_, i.phase)
}

// writesAllowed: the current phase allows keyed-state writes ("writes" in ABI.md).
func (i *Instance) writesAllowed() bool {
	switch i.phase {
	case abi.PhaseOpen, abi.PhaseProcess, abi.PhaseWatermark, abi.PhaseTimer, abi.PhaseProcessingTime, abi.PhaseEndInput, abi.PhaseFinish:
		return true
	case abi.PhaseSnapshot, abi.PhaseNotify:
		return !i.finished
	}
	return false
}

// emit(batch_ptr, batch_len): allowed in process, on_watermark, on_timer, end_input, finish.
func hostEmit(i *Instance, stack []uint64) {
	i.allowIn(abi.ImportEmit, emitPhases)
	frame := i.read(uint32(stack[0]), uint32(stack[1]), abi.ImportEmit, "batch")
	recs, err := i.decodeEmit(frame)
	if err != nil {
		i.misuse("emit: %v", err)
	}
	i.checkRecordSizes("emit", recs)
	if i.emit != nil && len(recs) > 0 {
		i.waitingOutside(func() { i.emit(recs) })
	}
}

// emitPhases are the phases emit and emit_to are allowed in.
var emitPhases = []abi.Phase{abi.PhaseProcess, abi.PhaseWatermark, abi.PhaseTimer, abi.PhaseProcessingTime, abi.PhaseEndInput, abi.PhaseFinish}

// allowIn fails the guest (misuse) unless the call of import_ is in one of
// phases.
func (i *Instance) allowIn(import_ string, phases []abi.Phase) {
	if slices.Contains(phases, i.phase) {
		return
	}
	if i.finished {
		i.misuse("%s after finish (phase %s)", import_, i.phase)
	}
	i.misuse("%s not allowed in phase %s", import_, i.phase)
}

// checkRecordSizes fails the guest with abi.ErrRecordTooLarge if a record
// of recs (emitted by import what) is over max_record_bytes.
func (i *Instance) checkRecordSizes(what string, recs []abi.Record) {
	limit := i.cfg.MaxRecordBytes
	if limit <= 0 {
		limit = abi.DefaultMaxRecordBytes
	}
	for n := range recs {
		if r := recs[n]; abi.RecordBytes(r) > limit {
			hdr := ""
			if len(r.Headers) > 0 {
				hdr = fmt.Sprintf(", headers %d", len(r.Headers))
			}
			i.failure = &hostCallPanic{abi.ErrRecordTooLarge, fmt.Sprintf("%s: record %d of %d has %d bytes (key %d, value %d%s), over max_record_bytes %d",
				what, n, len(recs), abi.RecordBytes(r), len(r.Key), len(r.Value), hdr, limit)}
			panic(i.failure)
		}
	}
}

// waitingOutside runs f, which may wait for downstream: that is not guest
// time (the call deadline).
func (i *Instance) waitingOutside(f func()) {
	if i.callStart.IsZero() {
		f()
		return
	}
	t := time.Now()
	f()
	i.callStart = i.callStart.Add(time.Since(t))
}

// state_get(name_ptr, name_len, key_ptr, key_len, buf_ptr, buf_cap) -> len | -1
func hostStateGet(i *Instance, stack []uint64) {
	if i.phase == abi.PhaseClose || i.phase == abi.PhaseLoad {
		i.misuse("state_get not allowed in phase %s", i.phase)
	}
	name := i.read(uint32(stack[0]), uint32(stack[1]), abi.ImportStateGet, "name")
	i.checkStateName(abi.ImportStateGet, name)
	key := i.read(uint32(stack[2]), uint32(stack[3]), abi.ImportStateGet, "key")
	v, ok, err := i.state.get(i.keyGroup(abi.ImportStateGet, key), name, key)
	if err != nil {
		i.stateFailed(abi.ImportStateGet, err)
	}
	if !ok {
		stack[0] = api.EncodeI32(abi.AbsentLength)
		return
	}
	if uint32(len(v)) <= uint32(stack[5]) {
		copy(i.read(uint32(stack[4]), uint32(len(v)), abi.ImportStateGet, "buffer"), v)
	}
	stack[0] = api.EncodeI32(int32(len(v)))
}

// state_put(name_ptr, name_len, key_ptr, key_len, val_ptr, val_len)
func hostStatePut(i *Instance, stack []uint64) {
	i.requireStateWrite(abi.ImportStatePut)
	name := i.read(uint32(stack[0]), uint32(stack[1]), abi.ImportStatePut, "name")
	i.checkStateName(abi.ImportStatePut, name)
	key := i.read(uint32(stack[2]), uint32(stack[3]), abi.ImportStatePut, "key")
	val := i.read(uint32(stack[4]), uint32(stack[5]), abi.ImportStatePut, "value")
	kg := i.keyGroup(abi.ImportStatePut, key)
	i.journalEntry(abi.ImportStatePut, kg, name, key)
	if err := i.state.put(kg, name, key, val); err != nil {
		i.stateFailed(abi.ImportStatePut, err)
	}
}

// state_delete(name_ptr, name_len, key_ptr, key_len)
func hostStateDelete(i *Instance, stack []uint64) {
	i.requireStateWrite(abi.ImportStateDelete)
	name := i.read(uint32(stack[0]), uint32(stack[1]), abi.ImportStateDelete, "name")
	i.checkStateName(abi.ImportStateDelete, name)
	key := i.read(uint32(stack[2]), uint32(stack[3]), abi.ImportStateDelete, "key")
	kg := i.keyGroup(abi.ImportStateDelete, key)
	i.journalEntry(abi.ImportStateDelete, kg, name, key)
	if err := i.state.del(kg, name, key); err != nil {
		i.stateFailed(abi.ImportStateDelete, err)
	}
}

// list_state_add(name_ptr, name_len, mode, val_ptr, val_len): snapshot_state only.
func hostListStateAdd(i *Instance, stack []uint64) {
	if i.phase != abi.PhaseSnapshot || i.pendingLists == nil {
		i.misuse("list_state_add not allowed in phase %s (only in snapshot_state)", i.phase)
	}
	name := i.read(uint32(stack[0]), uint32(stack[1]), abi.ImportListStateAdd, "name")
	mode := abi.ListMode(int32(uint32(stack[2])))
	if !mode.Valid() {
		i.misuse("list_state_add: invalid mode %d for list state %q", int32(mode), name)
	}
	val := i.read(uint32(stack[3]), uint32(stack[4]), abi.ImportListStateAdd, "value")
	l := i.pendingLists[string(name)]
	if l == nil {
		l = &ListState{Mode: mode}
		i.pendingLists[string(name)] = l
	} else if l.Mode != mode {
		i.misuse("list_state_add: list state %q used with modes %s and %s", name, l.Mode, mode)
	}
	l.Entries = append(l.Entries, append(make([]byte, 0, len(val)), val...))
}

// list_state_get(name_ptr, name_len, index, buf_ptr, buf_cap) -> len | -1
func hostListStateGet(i *Instance, stack []uint64) {
	name := i.read(uint32(stack[0]), uint32(stack[1]), abi.ImportListStateGet, "name")
	idx := int32(uint32(stack[2]))
	l := i.restoredLists[string(name)]
	if l == nil || idx < 0 || int(idx) >= len(l.Entries) {
		stack[0] = api.EncodeI32(abi.AbsentLength)
		return
	}
	v := l.Entries[idx]
	if uint32(len(v)) <= uint32(stack[4]) {
		copy(i.read(uint32(stack[3]), uint32(len(v)), abi.ImportListStateGet, "buffer"), v)
	}
	stack[0] = api.EncodeI32(int32(len(v)))
}

// timer_register(key_ptr, key_len, ts i64)
func hostTimerRegister(i *Instance, stack []uint64) {
	i.requireStateWrite(abi.ImportTimerRegister)
	key := i.read(uint32(stack[0]), uint32(stack[1]), abi.ImportTimerRegister, "key")
	i.keyGroup(abi.ImportTimerRegister, key)
	i.journalTimer(abi.ImportTimerRegister, eventTime, key, int64(stack[2]))
	if err := i.state.registerTimer(eventTime, key, int64(stack[2])); err != nil {
		i.stateFailed(abi.ImportTimerRegister, err)
	}
}

// timer_delete(key_ptr, key_len, ts i64)
func hostTimerDelete(i *Instance, stack []uint64) {
	i.requireStateWrite(abi.ImportTimerDelete)
	key := i.read(uint32(stack[0]), uint32(stack[1]), abi.ImportTimerDelete, "key")
	i.keyGroup(abi.ImportTimerDelete, key)
	i.journalTimer(abi.ImportTimerDelete, eventTime, key, int64(stack[2]))
	if err := i.state.deleteTimer(eventTime, key, int64(stack[2])); err != nil {
		i.stateFailed(abi.ImportTimerDelete, err)
	}
}

// current_watermark() -> i64
func hostCurrentWatermark(i *Instance, stack []uint64) {
	stack[0] = uint64(i.watermark)
}

// log(level, msg_ptr, msg_len)
func hostLog(i *Instance, stack []uint64) {
	level := logLevel(int32(uint32(stack[0])))
	msg := i.read(uint32(stack[1]), uint32(stack[2]), abi.ImportLog, "message")
	if i.logger.Enabled(context.Background(), level) {
		i.logger.Log(context.Background(), level, string(msg), "phase", string(i.phase))
	}
}

// fail(msg_ptr, msg_len): fails the subtask; never returns.
func hostFail(i *Instance, stack []uint64) {
	msg := i.read(uint32(stack[0]), uint32(stack[1]), abi.ImportFail, "message")
	i.failure = &hostCallPanic{ErrGuestFailed, string(msg)}
	panic(i.failure)
}

// reject(msg_ptr, msg_len): process only; the reason of the REJECT status
// the current streamd_process returns. It returns.
func hostReject(i *Instance, stack []uint64) {
	if i.phase != abi.PhaseProcess {
		i.misuse("reject not allowed in phase %s (only in process)", i.phase)
	}
	i.rejectMsg = string(i.read(uint32(stack[0]), uint32(stack[1]), abi.ImportReject, "message"))
}

func logLevel(l int32) slog.Level {
	switch abi.LogLevel(l) {
	case abi.LogDebug:
		return slog.LevelDebug
	case abi.LogInfo:
		return slog.LevelInfo
	case abi.LogWarn:
		return slog.LevelWarn
	}
	if l > int32(abi.LogError) {
		return slog.LevelError
	}
	if l < 0 {
		return slog.LevelDebug
	}
	return slog.LevelError
}
