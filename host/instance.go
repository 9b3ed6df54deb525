package host

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/sys"

	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/internal/telemetry"
)

// InstanceConfig describes the subtask an instance runs.
type InstanceConfig struct {
	Job, Operator  string
	JobID          string // a deployed job's id, for spans ("": Job)
	Subtask        int
	Parallelism    int
	MaxParallelism int // 0 -> abi.DefaultMaxParallelism
	Attempt        int
	NumInputs      int
	Config         map[string]string // flattened operator config
	Restore        *Snapshot         // nil: fresh state. Already redistributed for this subtask.
	AllowClock     bool              // real wall and monotonic clocks for this instance (the job's allow_clock)
	// LendEmits makes the Emitter's records a loan: their slices point into
	// guest memory and a reused record slice, valid only until the Emitter
	// returns, so the host copies nothing. For receivers that copy what they
	// keep (the task runtime's record writers do); false hands out copies.
	LendEmits bool
	// MaxRecordBytes is max_record_bytes: an emit of a larger record (key
	// and value bytes) fails the call with an *Error of kind
	// abi.ErrRecordTooLarge; 0 means abi.DefaultMaxRecordBytes.
	MaxRecordBytes int
	// State selects the keyed-state backend (the zero value: memory).
	State StateConfig
	// Isolate journals the keyed-state writes and timer changes of each
	// process call, so that after a failure in it Replace can open a fresh
	// instance on the state as it was before the call (isolate.go). For
	// operators with on_error skip or dead_letter.
	Isolate bool
	// Clock is the host's processing-time clock of this instance (state
	// TTL, processing-time timers, processing_time); nil: the engine's
	// (WithClock, default time.Now).
	Clock func() time.Time
	// GuestLog, if set, also gets the guest's log calls and output lines
	// (and the instance's own lines), with the operator and subtask
	// attributes: a host publishes them (wire.LogPublisher).
	GuestLog slog.Handler

	// Outputs takes emit_watermark and emit_to and answers
	// input_watermark (hostfuncs_wm.go); nil: both emits are dropped and
	// input_watermark is abi.MinWatermark.
	Outputs Outputs
}

// Emitter receives the records of one guest emit call. The slices (the record
// slice and every key and value) are owned by the receiver: the host copied
// them out of guest memory and never touches them again, unless the instance
// was made with InstanceConfig.LendEmits.
type Emitter func(recs []abi.Record)

// Instance is one subtask's guest instance. It is driven by one goroutine at a
// time, in the call order of ABI.md. After any error it is discarded: the wasm
// instance is closed and every later call returns an *Error of kind
// ErrInstanceDiscarded without calling the guest.
type Instance struct {
	eng    *Engine
	module *Module
	mod    api.Module
	mem    api.Memory
	cfg    InstanceConfig
	maxP   int
	logger *slog.Logger
	stdout *lineWriter
	stderr *lineWriter

	fnInit, fnAlloc, fnOpen, fnProcess, fnWatermark, fnTimer api.Function
	fnEndInput, fnFinish, fnSnapshot, fnNotify, fnClose      api.Function
	fnProcTime                                               api.Function
	// headers: the guest exports streamd_record_headers, so its batches
	// carry the records' headers (without it they are left out).
	headers bool

	stack  [4]uint64 // reused for every guest call
	bufPtr uint32    // the guest's input buffer (streamd_alloc)
	bufCap uint32

	phase    abi.Phase // phase of the guest call in progress (or the last one)
	opened   bool
	finished bool   // finish returned OK: no more emits or state writes
	closed   bool   // Close was called
	dead     *Error // the error that discarded the instance
	failure  *hostCallPanic
	// rejectMsg is the reason the guest gave (reject) in the current call.
	rejectMsg string
	undo      []undoEntry // the state changes of the current process call (Isolate)

	emit      Emitter
	byteArena []byte       // emitted frames are copied here; handed out, never reused
	recArena  []abi.Record // decoded records; handed out, never reused

	state         stateBackend
	rng           abi.KeyGroupRange // this subtask's key groups
	restoredLists map[string]*ListState
	pendingLists  map[string]*ListState
	watermark     int64
	due           []timerID
	scratch       []byte
	records       int64     // records passed to process (a span attribute, trace.go)
	callStart     time.Time // the guest call's first yield (guard.go); zero before it
	ownsWatermark bool      // the guest called emit_watermark (hostfuncs_wm.go)

	// Structured state (mstate.go).
	clock      func() time.Time
	ttl        map[string]ttlConfig // state_ttl, by state name
	mst        mstateCall           // the mstate_* call in progress
	mkey, mbuf []byte               // scratch of mstate_* calls
}

// now is the host's processing time in ms.
func (i *Instance) now() int64 { return i.clock().UnixMilli() }

// clockAllowed: the guest may read the processing time (allow_clock).
func (i *Instance) clockAllowed() bool { return i.eng.cfg.allowClock || i.cfg.AllowClock }

// NewInstance instantiates the module for one subtask, with WASI sandboxed as
// ABI.md says, restores cfg.Restore and calls _initialize if exported. It does
// not call streamd_open.
func (m *Module) NewInstance(ctx context.Context, cfg InstanceConfig) (*Instance, error) {
	return m.newInstance(ctx, cfg, nil, nil)
}

// newInstance is NewInstance; with a non-nil state it takes over that
// backend (Replace) and lists as the restored list state instead of
// restoring cfg.Restore. It closes state if it fails.
func (m *Module) newInstance(ctx context.Context, cfg InstanceConfig, state stateBackend, lists map[string]*ListState) (*Instance, error) {
	e := m.eng
	if cfg.MaxParallelism == 0 {
		cfg.MaxParallelism = abi.DefaultMaxParallelism
	}
	switch {
	case cfg.Parallelism < 1:
		return nil, fmt.Errorf("host: operator %q: parallelism %d < 1", cfg.Operator, cfg.Parallelism)
	case cfg.Subtask < 0 || cfg.Subtask >= cfg.Parallelism:
		return nil, fmt.Errorf("host: operator %q: subtask %d outside [0, %d)", cfg.Operator, cfg.Subtask, cfg.Parallelism)
	case cfg.MaxParallelism < cfg.Parallelism:
		return nil, fmt.Errorf("host: operator %q: max parallelism %d < parallelism %d", cfg.Operator, cfg.MaxParallelism, cfg.Parallelism)
	case cfg.NumInputs < 0:
		return nil, fmt.Errorf("host: operator %q: negative number of inputs", cfg.Operator)
	}
	logger := e.cfg.logger.With("job", cfg.Job, "operator", cfg.Operator, "subtask", cfg.Subtask)
	guest := logger
	if cfg.GuestLog != nil {
		guest = slog.New(telemetry.TeeHandler(logger.Handler(),
			cfg.GuestLog.WithAttrs([]slog.Attr{slog.String("operator", cfg.Operator), slog.Int("subtask", cfg.Subtask)})))
	}
	i := &Instance{
		eng:       e,
		module:    m,
		cfg:       cfg,
		maxP:      cfg.MaxParallelism,
		logger:    guest,
		stdout:    &lineWriter{logger: guest, level: slog.LevelInfo, stream: "stdout"},
		stderr:    &lineWriter{logger: guest, level: slog.LevelWarn, stream: "stderr"},
		phase:     abi.PhaseLoad,
		watermark: abi.MinWatermark,
		rng:       abi.RangeForSubtask(cfg.Subtask, cfg.MaxParallelism, cfg.Parallelism),
		clock:     cfg.Clock,
	}
	if i.clock == nil {
		i.clock = e.cfg.clock
	}
	adopted := state != nil
	if adopted {
		i.state, i.restoredLists = state, lists
	} else {
		var err error
		state, err = newBackend(cfg, i.rng, i.now, pebbleOptions{logger: logger,
			name: fmt.Sprintf("%s-%s-%d-a%d", cfg.Job, cfg.Operator, cfg.Subtask, cfg.Attempt)})
		if err != nil {
			return nil, fmt.Errorf("host: job %q operator %q subtask %d/%d: %w", cfg.Job, cfg.Operator, cfg.Subtask, cfg.Parallelism, err)
		}
		i.state = state
	}
	if cfg.Restore != nil && !adopted {
		var err error
		if len(cfg.Restore.Sources) > 0 {
			err = i.state.restoreFrom(ctx, cfg.Restore.Sources)
		}
		if err == nil {
			err = cfg.Restore.loadCut() // a cut of another instance (tests); not Sources
		}
		if err == nil {
			err = i.state.restore(cfg.Restore.KeyGroups)
		}
		if err == nil && len(cfg.Restore.Files) > 0 {
			err = i.restoreFiles(ctx, cfg.Restore.Files)
		}
		if err != nil {
			i.state.close()
			return nil, fmt.Errorf("host: job %q operator %q subtask %d/%d: %w", cfg.Job, cfg.Operator, cfg.Subtask, cfg.Parallelism, err)
		}
		i.restoredLists = cfg.Restore.Lists
	}
	mc := wazero.NewModuleConfig().
		WithName(fmt.Sprintf("%s/%s/%d#%d", cfg.Job, cfg.Operator, cfg.Subtask, e.seq.Add(1))).
		WithStartFunctions().
		WithArgs(cfg.Operator).
		WithStdout(i.stdout).
		WithStderr(i.stderr)
	if i.clockAllowed() {
		mc = mc.WithSysWalltime().WithSysNanotime().WithSysNanosleep()
	}
	mod, err := e.runtime.InstantiateModule(ctx, m.compiled, mc)
	if err != nil {
		kind := ErrTrap
		if s := err.Error(); strings.Contains(s, "memory") && (strings.Contains(s, "limit") || strings.Contains(s, "exceed")) {
			kind = ErrMemoryLimit
		}
		i.state.close()
		return nil, i.newError(abi.PhaseLoad, kind, "instantiate: "+err.Error(), "", err)
	}
	i.mod = mod
	i.mem = mod.Memory()
	i.fnInit = mod.ExportedFunction("_initialize")
	i.fnAlloc = mod.ExportedFunction(abi.ExportAlloc)
	i.fnOpen = mod.ExportedFunction(abi.ExportOpen)
	i.fnProcess = mod.ExportedFunction(abi.ExportProcess)
	i.fnWatermark = mod.ExportedFunction(abi.ExportOnWatermark)
	i.fnTimer = mod.ExportedFunction(abi.ExportOnTimer)
	i.fnEndInput = mod.ExportedFunction(abi.ExportEndInput)
	i.fnFinish = mod.ExportedFunction(abi.ExportFinish)
	i.fnSnapshot = mod.ExportedFunction(abi.ExportSnapshotState)
	i.fnNotify = mod.ExportedFunction(abi.ExportNotifyCheckpoint)
	i.fnClose = mod.ExportedFunction(abi.ExportClose)
	i.fnProcTime = mod.ExportedFunction(abi.ExportOnProcessingTime)
	i.headers = mod.ExportedFunction(abi.ExportRecordHeaders) != nil
	e.instances.Store(mod, i)
	if m.hasInit && i.fnInit != nil {
		if err := i.invoke(ctx, abi.PhaseLoad, i.fnInit, 1); err != nil {
			i.closeState()
			return nil, err
		}
	}
	return i, nil
}

// Watermark is the subtask's current watermark (abi.MinWatermark before the first).
func (i *Instance) Watermark() int64 { return i.watermark }

// Open writes the open context and calls streamd_open.
func (i *Instance) Open(ctx context.Context) (err error) {
	if span := i.startSpan(ctx, telemetry.SpanGuestOpen, -1); span != nil {
		defer func() { i.endSpan(span, err) }()
	}
	if err := i.ready(abi.PhaseOpen); err != nil {
		return err
	}
	if i.opened {
		return fmt.Errorf("host: operator %q subtask %d: open called twice", i.cfg.Operator, i.cfg.Subtask)
	}
	i.opened = true
	i.scratch = abi.AppendOpenContext(i.scratch[:0], abi.OpenContext{
		Job:            i.cfg.Job,
		Operator:       i.cfg.Operator,
		Subtask:        i.cfg.Subtask,
		Parallelism:    i.cfg.Parallelism,
		MaxParallelism: i.maxP,
		Attempt:        i.cfg.Attempt,
		NumInputs:      i.cfg.NumInputs,
		Restored:       i.cfg.Restore != nil,
		Config:         i.cfg.Config,
	})
	ptr, buf, err := i.buffer(ctx, abi.PhaseOpen, len(i.scratch))
	if err != nil {
		return err
	}
	copy(buf, i.scratch)
	i.stack[0], i.stack[1] = uint64(ptr), uint64(len(i.scratch))
	return i.call(ctx, abi.PhaseOpen, i.fnOpen, 2)
}

// Process passes one batch of records of input (0-based) to streamd_process.
// The records are encoded straight into the guest's input buffer.
func (i *Instance) Process(ctx context.Context, input int, recs []abi.Record, emit Emitter) error {
	i.records += int64(len(recs))
	err := i.process(ctx, input, recs, emit)
	if err != nil {
		traceFailure(ctx, err)
	}
	return err
}

func (i *Instance) process(ctx context.Context, input int, recs []abi.Record, emit Emitter) error {
	if err := i.ready(abi.PhaseProcess); err != nil {
		return err
	}
	if input < 0 || (i.cfg.NumInputs > 0 && input >= i.cfg.NumInputs) {
		return fmt.Errorf("host: operator %q subtask %d: input %d outside [0, %d)", i.cfg.Operator, i.cfg.Subtask, input, i.cfg.NumInputs)
	}
	var size int
	if i.headers {
		size = abi.BatchSize(recs)
	} else {
		size = abi.BatchSizeNoHeaders(recs)
	}
	ptr, buf, err := i.buffer(ctx, abi.PhaseProcess, size)
	if err != nil {
		return err
	}
	if i.headers {
		abi.PutBatch(buf, recs)
	} else {
		abi.PutBatchNoHeaders(buf, recs)
	}
	i.stack[0], i.stack[1], i.stack[2] = uint64(input), uint64(ptr), uint64(size)
	i.undo = i.undo[:0]
	i.emit = emit
	err = i.call(ctx, abi.PhaseProcess, i.fnProcess, 3)
	i.emit = nil
	return err
}

// AdvanceWatermark: if ts > the current watermark, sets it, fires the due
// timers (streamd_on_timer) in (ts, key) order, then calls
// streamd_on_watermark(ts). A ts <= the current watermark is ignored.
func (i *Instance) AdvanceWatermark(ctx context.Context, ts int64, emit Emitter) error {
	err := i.advanceWatermark(ctx, ts, emit)
	if err != nil {
		traceFailure(ctx, err)
	}
	return err
}

func (i *Instance) advanceWatermark(ctx context.Context, ts int64, emit Emitter) error {
	if err := i.ready(abi.PhaseWatermark); err != nil {
		return err
	}
	if ts <= i.watermark {
		return nil
	}
	i.watermark = ts
	i.emit = emit
	defer func() { i.emit = nil }()
	// Timers registered while these fire (even at or below ts) wait for the next advance.
	if err := i.fireDue(ctx, eventTime, ts, abi.PhaseTimer, i.fnTimer); err != nil {
		return err
	}
	i.stack[0] = uint64(ts)
	return i.call(ctx, abi.PhaseWatermark, i.fnWatermark, 1)
}

// fireDue removes the timers of kind k with ts <= w and calls fn (if the
// guest exports it) for each, in (ts, key) order.
func (i *Instance) fireDue(ctx context.Context, k timerKind, w int64, phase abi.Phase, fn api.Function) error {
	var err error
	if i.due, err = i.state.popDue(k, w, i.due[:0]); err != nil {
		return i.stateError(phase, err)
	}
	for _, t := range i.due {
		if ok, err := i.state.removeTimer(k, t); err != nil {
			return i.stateError(phase, err)
		} else if !ok {
			continue // deleted by an earlier timer call
		}
		if fn == nil {
			continue
		}
		ptr, buf, err := i.buffer(ctx, phase, len(t.key))
		if err != nil {
			return err
		}
		copy(buf, t.key)
		i.stack[0], i.stack[1], i.stack[2] = uint64(t.ts), uint64(ptr), uint64(len(t.key))
		if err := i.call(ctx, phase, fn, 3); err != nil {
			return err
		}
	}
	return nil
}

// ProcessingTime is the host's processing time of this instance in ms
// (its clock: InstanceConfig.Clock, WithClock or time.Now).
func (i *Instance) ProcessingTime() int64 { return i.now() }

// NextProcessingTimer is the time (ms) of the earliest processing-time
// timer; false when there is none, or the instance finished (its pending
// timers are dropped) or was discarded.
func (i *Instance) NextProcessingTimer() (int64, bool) {
	if i.dead != nil || i.closed || i.finished || !i.opened {
		return 0, false
	}
	ts, ok, err := i.state.nextTimer(procTime)
	if err != nil {
		i.logger.Warn("reading the processing-time timers failed", "error", err)
		return 0, false
	}
	return ts, ok
}

// FireProcessingTimers fires every processing-time timer with ts <= now
// through streamd_on_processing_time, in (ts, key) order (without the
// export they are dropped). Timers registered meanwhile wait for the next
// call, even if due. After finish it does nothing: pending timers are
// dropped with the subtask, as in Flink.
func (i *Instance) FireProcessingTimers(ctx context.Context, now int64, emit Emitter) error {
	if err := i.ready(abi.PhaseProcessingTime); err != nil {
		return err
	}
	if i.finished {
		return nil
	}
	i.emit = emit
	defer func() { i.emit = nil }()
	err := i.fireDue(ctx, procTime, now, abi.PhaseProcessingTime, i.fnProcTime)
	if err != nil {
		traceFailure(ctx, err)
	}
	return err
}

// EndInput calls streamd_end_input(input).
func (i *Instance) EndInput(ctx context.Context, input int, emit Emitter) (err error) {
	if span := i.startSpan(ctx, telemetry.SpanGuestEndInput, -1); span != nil {
		span.SetAttributes(telemetry.AttrInput.Int(input))
		defer func() { i.endSpan(span, err) }()
	}
	if err := i.ready(abi.PhaseEndInput); err != nil {
		return err
	}
	if input < 0 || (i.cfg.NumInputs > 0 && input >= i.cfg.NumInputs) {
		return fmt.Errorf("host: operator %q subtask %d: end_input %d outside [0, %d)", i.cfg.Operator, i.cfg.Subtask, input, i.cfg.NumInputs)
	}
	i.stack[0] = uint64(input)
	i.emit = emit
	err = i.call(ctx, abi.PhaseEndInput, i.fnEndInput, 1)
	i.emit = nil
	return err
}

// Finish calls streamd_finish; afterwards the guest may not emit or write state.
func (i *Instance) Finish(ctx context.Context, emit Emitter) (err error) {
	if span := i.startSpan(ctx, telemetry.SpanGuestFinish, -1); span != nil {
		defer func() { i.endSpan(span, err) }()
	}
	if err := i.ready(abi.PhaseFinish); err != nil {
		return err
	}
	i.emit = emit
	err = i.call(ctx, abi.PhaseFinish, i.fnFinish, 1)
	i.emit = nil
	if err == nil {
		i.finished = true
	}
	return err
}

// SnapshotState calls streamd_snapshot_state and returns a deep copy of keyed
// state (by key group), timers and the list state the guest added.
func (i *Instance) SnapshotState(ctx context.Context, checkpointID int64) (snap *Snapshot, err error) {
	return i.snapshotState(ctx, checkpointID, false)
}

// SnapshotCheckpoint is SnapshotState for a checkpoint (not a savepoint):
// with the pebble backend and StateConfig.Incremental, the keyed state is
// cut as files (Snapshot.Files) that an incremental checkpoint shares with
// the checkpoints before and after it. Savepoints take SnapshotState: a
// full, backend-independent snapshot.
func (i *Instance) SnapshotCheckpoint(ctx context.Context, checkpointID int64) (*Snapshot, error) {
	_, files := i.state.(fileCutter)
	return i.snapshotState(ctx, checkpointID, files && i.cfg.State.Incremental)
}

// AdoptedFiles is the part of the restored state whose files the pebble
// backend was opened on (nil if none): their store keys may be reused by
// the next incremental checkpoint into the same store.
func (i *Instance) AdoptedFiles() *FileState {
	if p, ok := i.state.(*pebbleState); ok {
		return p.adopted
	}
	return nil
}

func (i *Instance) snapshotState(ctx context.Context, checkpointID int64, files bool) (snap *Snapshot, err error) {
	if span := i.startSpan(ctx, telemetry.SpanGuestSnapshotState, checkpointID); span != nil {
		defer func() {
			if snap != nil && snap.deferred == nil { // a deferred cut is not read here
				span.SetAttributes(telemetry.StateBytes(snap.Size()))
			}
			i.endSpan(span, err)
		}()
	}
	if err := i.ready(abi.PhaseSnapshot); err != nil {
		return nil, err
	}
	i.pendingLists = make(map[string]*ListState)
	i.stack[0] = uint64(checkpointID)
	err = i.call(ctx, abi.PhaseSnapshot, i.fnSnapshot, 1)
	lists := i.pendingLists
	i.pendingLists = nil
	if err != nil {
		return nil, err
	}
	if files {
		snap, err = i.state.(fileCutter).fileCut()
	} else {
		snap, err = i.state.cut()
	}
	if err != nil {
		return nil, i.stateError(abi.PhaseSnapshot, err)
	}
	snap.Lists = lists
	return snap, nil
}

// restoreFiles restores keyed state kept as files (an incremental
// checkpoint of the pebble backend) into whichever backend this instance
// has.
func (i *Instance) restoreFiles(ctx context.Context, parts []*FileState) error {
	if fi, ok := i.state.(fileImporter); ok {
		return fi.importFiles(ctx, parts)
	}
	return importParts(ctx, parts, i.cfg.State.DataDir, i.rng, i.maxP, i.state.put, i.state.registerTimer)
}

// stateError discards the instance after its state backend failed.
func (i *Instance) stateError(phase abi.Phase, err error) error {
	return i.discard(i.newError(phase, ErrState, err.Error(), "", err))
}

// NotifyCheckpointComplete calls streamd_notify_checkpoint_complete.
func (i *Instance) NotifyCheckpointComplete(ctx context.Context, checkpointID int64) (err error) {
	if span := i.startSpan(ctx, telemetry.SpanGuestNotifyCheckpoint, checkpointID); span != nil {
		defer func() { i.endSpan(span, err) }()
	}
	if err := i.ready(abi.PhaseNotify); err != nil {
		return err
	}
	i.stack[0] = uint64(checkpointID)
	return i.call(ctx, abi.PhaseNotify, i.fnNotify, 1)
}

// Close calls streamd_close (unless the instance was discarded or never
// opened), then releases the wasm instance. It is idempotent.
func (i *Instance) Close(ctx context.Context) (err error) {
	if i.closed {
		return nil
	}
	if span := i.startSpan(ctx, telemetry.SpanGuestClose, -1); span != nil {
		defer func() { i.endSpan(span, err) }()
	}
	i.closed = true
	if i.dead == nil && i.opened {
		err = i.call(ctx, abi.PhaseClose, i.fnClose, 1)
	}
	i.release()
	if cerr := i.closeState(); err == nil {
		err = cerr
	}
	if i.dead == nil {
		i.dead = i.newError(abi.PhaseClose, ErrInstanceDiscarded, "instance closed", "", nil)
	}
	return err
}

// closeState releases the state backend (a pebble instance's files).
func (i *Instance) closeState() error {
	if i.state == nil {
		return nil
	}
	err := i.state.close()
	if err != nil {
		i.logger.Warn("closing the keyed state failed", "error", err)
	}
	return err
}

// ready refuses calls on a discarded or closed instance, and lifecycle calls before open.
func (i *Instance) ready(phase abi.Phase) error {
	if i.dead != nil {
		return i.discarded(phase)
	}
	if i.closed {
		return i.newError(phase, ErrInstanceDiscarded, "instance closed", "", nil)
	}
	if !i.opened && phase != abi.PhaseOpen {
		return fmt.Errorf("host: operator %q subtask %d: %s before open", i.cfg.Operator, i.cfg.Subtask, phase)
	}
	return nil
}

func (i *Instance) discarded(phase abi.Phase) error {
	d := i.dead
	msg := fmt.Sprintf("discarded after %s in phase %s", kindLabel(d.Kind), d.Phase)
	if d.Kind == ErrInstanceDiscarded {
		msg = d.Message
	}
	return i.newError(phase, ErrInstanceDiscarded, msg, "", d)
}

// buffer returns the guest input buffer, at least size bytes, and a view of
// its first size bytes. It calls streamd_alloc when the buffer is too small.
func (i *Instance) buffer(ctx context.Context, phase abi.Phase, size int) (uint32, []byte, error) {
	if size > math.MaxInt32 {
		return 0, nil, i.discard(i.newError(phase, ErrHostCall, fmt.Sprintf("input frame of %d bytes exceeds the 2 GiB wasm32 limit", size), "", nil))
	}
	if uint32(size) > i.bufCap || i.bufPtr == 0 {
		want := max(uint32(size), 2*i.bufCap, 4096)
		if want > math.MaxInt32 {
			want = uint32(size)
		}
		i.stack[0] = uint64(want)
		if err := i.invoke(ctx, phase, i.fnAlloc, 1); err != nil {
			return 0, nil, err
		}
		ptr := uint32(i.stack[0])
		if ptr == 0 {
			return 0, nil, i.discard(i.newError(phase, ErrMemoryLimit, fmt.Sprintf("%s(%d) returned 0 (out of memory)", abi.ExportAlloc, want), i.stderr.text(), nil))
		}
		if uint64(ptr)+uint64(want) > uint64(i.mem.Size()) {
			return 0, nil, i.discard(i.newError(phase, ErrHostCall, fmt.Sprintf("%s(%d) returned %#x, past the end of memory (%d bytes)", abi.ExportAlloc, want, ptr, i.mem.Size()), "", nil))
		}
		i.bufPtr, i.bufCap = ptr, want
	}
	buf, _ := i.mem.Read(i.bufPtr, uint32(size)) // in range: checked at alloc, memory never shrinks
	return i.bufPtr, buf, nil
}

// call invokes a lifecycle export taking nparams parameters from i.stack and
// checks its status. An absent optional export is a successful no-op.
func (i *Instance) call(ctx context.Context, phase abi.Phase, fn api.Function, nparams int) error {
	if fn == nil {
		return nil
	}
	if err := i.invoke(ctx, phase, fn, max(nparams, 1)); err != nil {
		return err
	}
	if st := abi.Status(int32(uint32(i.stack[0]))); st == abi.StatusReject && phase == abi.PhaseProcess {
		msg := i.rejectMsg
		if msg == "" {
			msg = "rejected by the guest (no reason given)"
		}
		return i.discard(i.newError(phase, ErrRejected, msg, "", nil))
	} else if st != abi.StatusOK {
		msg := fmt.Sprintf("status %d (%s)", int32(st), st)
		if st == abi.StatusInvalidInput {
			msg += ": the guest could not decode the frame the host passed"
		}
		return i.discard(i.newError(phase, ErrGuestFailed, msg, "", nil))
	}
	return nil
}

// invoke calls fn with i.stack[:n] and turns any failure into a discarding *Error.
func (i *Instance) invoke(ctx context.Context, phase abi.Phase, fn api.Function, n int) error {
	i.phase = phase
	i.failure = nil
	i.rejectMsg = ""
	i.callStart = time.Time{}
	if i.stderr.crash != "" { // only this goroutine writes it (WASI fd_write runs inside our calls)
		i.stderr.crash = ""
	}
	var err error
	if d := i.eng.cfg.callDeadline; d > 0 && !i.eng.cfg.guard {
		cctx, cancel := context.WithTimeout(ctx, d)
		err = fn.CallWithStack(cctx, i.stack[:n])
		cancel()
	} else {
		err = fn.CallWithStack(ctx, i.stack[:n])
	}
	if err != nil {
		return i.discard(i.classify(phase, err))
	}
	return nil
}

// classify turns a wazero call error into an *Error.
func (i *Instance) classify(phase abi.Phase, err error) *Error {
	stderr := i.stderr.text()
	crash := i.stderr.crashLine()
	msg, stack := splitTrace(err.Error())
	var exit *sys.ExitError
	switch {
	case errors.As(err, &exit):
		switch exit.ExitCode() {
		case sys.ExitCodeDeadlineExceeded:
			return i.newError(phase, ErrDeadline, fmt.Sprintf("guest call exceeded the %v deadline", i.eng.cfg.callDeadline), stderr, err)
		case sys.ExitCodeContextCanceled:
			return i.newError(phase, ErrCanceled, "context canceled during the guest call", stderr, err)
		}
		m := fmt.Sprintf("proc_exit(%d)", exit.ExitCode())
		if crash != "" {
			m = crash + " (" + m + ")"
		}
		kind := ErrExit
		if oomText(crash) || oomText(stderr) {
			kind = ErrMemoryLimit
		}
		e := i.newError(phase, kind, m, stderr, err)
		e.Stack = stack
		return e
	case i.failure != nil:
		e := i.newError(phase, i.failure.kind, i.failure.msg, stderr, err)
		e.Stack = stack
		return e
	}
	msg = strings.TrimPrefix(msg, "wasm error: ")
	kind := ErrTrap
	if oomText(crash) || oomText(stderr) || i.atMemoryLimit() {
		kind = ErrMemoryLimit
	}
	if crash != "" {
		msg = crash + " (" + msg + ")"
	}
	e := i.newError(phase, kind, msg, stderr, err)
	e.Stack = stack
	return e
}

// atMemoryLimit: a trap with memory (nearly) at the limit is most likely an
// allocator giving up after memory.grow failed. Best effort.
func (i *Instance) atMemoryLimit() bool {
	if i.mem == nil {
		return false
	}
	limit := i.eng.memLimit
	if max, ok := i.mem.Definition().Max(); ok && uint64(max)*65536 < limit {
		limit = uint64(max) * 65536
	}
	slack := min(uint64(4<<20), limit/8)
	return uint64(i.mem.Size())+slack >= limit
}

func oomText(s string) bool {
	return strings.Contains(s, "out of memory") || strings.Contains(s, "memory allocation of")
}

func (i *Instance) newError(phase abi.Phase, kind error, msg, stderr string, cause error) *Error {
	return &Error{
		Job: i.cfg.Job, Operator: i.cfg.Operator, Subtask: i.cfg.Subtask, Parallelism: i.cfg.Parallelism,
		Phase: phase, Kind: kind, Message: msg, Stderr: stderr, cause: cause,
	}
}

// discard records err, closes the wasm instance and returns err.
func (i *Instance) discard(err *Error) error {
	if i.dead == nil {
		i.dead = err
	}
	i.release()
	i.logger.Debug("guest instance discarded", "phase", string(err.Phase), "error", kindLabel(err.Kind), "message", err.Message)
	return err
}

func (i *Instance) release() {
	if i.mod == nil {
		return
	}
	i.eng.instances.Delete(i.mod)
	_ = i.mod.Close(context.Background())
	i.mod = nil
	i.stdout.flush()
	i.stderr.flush()
}

// decodeEmit copies an emitted frame out of guest memory into the arena and
// decodes it; the result is handed to the emitter and never reused.
func (i *Instance) decodeEmit(frame []byte) ([]abi.Record, error) {
	if i.cfg.LendEmits {
		recs, err := abi.DecodeBatch(frame, i.recArena[:0])
		if cap(recs) > cap(i.recArena) {
			i.recArena = recs[:0]
		}
		return recs, err
	}
	if cap(i.byteArena)-len(i.byteArena) < len(frame) {
		i.byteArena = make([]byte, 0, max(64<<10, len(frame)))
	}
	start := len(i.byteArena)
	i.byteArena = append(i.byteArena, frame...)
	cp := i.byteArena[start:len(i.byteArena):len(i.byteArena)]
	if len(cp) >= 4 {
		n := int(binary.LittleEndian.Uint32(cp))
		if n <= len(cp)/16 && cap(i.recArena)-len(i.recArena) < n {
			i.recArena = make([]abi.Record, 0, max(1024, n))
		}
	}
	base := len(i.recArena)
	recs, err := abi.DecodeBatch(cp, i.recArena[base:base])
	if err != nil {
		return nil, err
	}
	if len(recs) > 0 && cap(recs) == cap(i.recArena)-base { // decoded in place
		i.recArena = i.recArena[:base+len(recs)]
	}
	return recs[:len(recs):len(recs)], nil
}
