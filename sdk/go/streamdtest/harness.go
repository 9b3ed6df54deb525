// Package streamdtest runs a streamd Go operator natively, without Wasm or a
// host: a Harness plays the host of one subtask. It keeps keyed state (with
// TTL against the harness's processing time), event-time and processing-time
// timers, watermarks, operator list state, side outputs and the output, and
// takes snapshots that restore at the same or another parallelism (key
// groups as the host computes them). It follows the ABI (abi/ABI.md) and
// SPEC14 as the host does, and fails the operator on the misuse the host
// fails it on.
//
//	h := streamdtest.New(&MyOp{}, streamdtest.Options{})
//	if err := h.Open(); err != nil { ... }
//	h.ProcessElement(streamd.Record{Key: []byte("a"), Value: v, Timestamp: 5}, 0)
//	h.ProcessWatermark(10) // fires the event-time timers <= 10, then OnWatermark
//	got := h.Output()
//
// The SDK has one operator and one host per process (a Wasm instance runs one
// subtask): a Harness installs itself for each call, so several harnesses can
// be used one after another in a test, but not from parallel goroutines (no
// t.Parallel with harnesses).
package streamdtest

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"

	streamd "github.com/streamd/streamd/sdk/go"
	"github.com/streamd/streamd/sdk/go/internal/hook"
)

// Options describe the subtask a Harness plays and its start.
type Options struct {
	Subtask        int // 0-based
	Parallelism    int // default 1
	MaxParallelism int // number of key groups, default 128
	NumInputs      int // default 1
	Job, Operator  string
	Attempt        int
	Config         streamd.Config
	// AllowClock lets the operator read the processing time
	// (CurrentProcessingTime), as allow_clock: true in the job file.
	AllowClock bool
	// ProcessingTime is the harness clock at the start, in ms (after a
	// restore at least the snapshot's clock).
	ProcessingTime int64
	// Restore starts the subtask from a snapshot (Harness.Snapshot, or Merge
	// of the snapshots of every subtask to change the parallelism): it gets
	// the keyed state and timers of its key groups and its share of the
	// operator list state, and Context.Restored is true.
	Restore *Snapshot
}

// Failure is the error of a call that failed the subtask: the operator
// returned an error, panicked, called Fail, or misused a host function. The
// harness never calls the operator again (nor Close, as the host).
type Failure struct {
	Phase string // the lifecycle call: "ProcessElement", "OnTimer", ...
	Msg   string // the host's error message
}

func (f *Failure) Error() string { return "streamdtest: " + f.Phase + " failed: " + f.Msg }

// ErrRejected is wrapped by the error ProcessElement returns when the
// operator rejected the record (streamd.Reject); the record's output and
// state changes are undone, as the host does.
var ErrRejected = errors.New("streamdtest: record rejected")

type rejected struct{ reason string }

func (r *rejected) Error() string { return ErrRejected.Error() + ": " + r.reason }
func (r *rejected) Unwrap() error { return ErrRejected }

// Timer is a pending timer.
type Timer struct {
	Key []byte
	TS  int64
}

type timerKey struct {
	key string
	ts  int64
}

// entry is a structured state entry (SPEC14 section 1): a value or a list.
type entry struct {
	list   bool
	val    []byte
	expiry int64 // 0: none
	elems  []elem
}

type elem struct {
	val    []byte
	expiry int64
}

func (e *entry) clone() *entry {
	c := *e
	c.elems = slices.Clone(e.elems)
	return &c
}

type ttlConf struct {
	ms    int64
	flags int32
}

type listState struct {
	mode    int32
	entries [][]byte
}

// Harness is the host of one operator subtask. Its methods run the
// operator's lifecycle calls and return a *Failure when the call failed the
// subtask; after that every call returns that failure.
type Harness struct {
	op   streamd.Operator
	opts Options
	kg0  int
	kg1  int

	phase    string
	opened   bool
	finished bool // Finish returned
	closed   bool
	failure  *Failure
	reject   string

	plain    map[string][]byte            // old keyed state: name "\x00" key
	mstate   map[string]map[string]*entry // prefix (name, key, ns) -> ukey -> entry
	ttl      map[string]ttlConf
	timers   map[timerKey]bool
	ptimers  map[timerKey]bool
	lists    map[string]*listState // written by SnapshotState
	restored map[string]*listState // read by ListState(...).Get

	watermark int64
	inputWM   []int64
	now       int64

	out      []streamd.Record
	sides    map[string][]streamd.Record
	wms      []int64
	lastWM   int64
	logs     []string
	undo     []func() // while a ProcessElement call may be rejected
	undoing  bool
	loggedKG bool
}

// New returns a harness of op for the subtask opts describe; call Open next.
func New(op streamd.Operator, opts Options) *Harness {
	if opts.Parallelism <= 0 {
		opts.Parallelism = 1
	}
	if opts.MaxParallelism <= 0 {
		opts.MaxParallelism = 128
	}
	if opts.NumInputs <= 0 {
		opts.NumInputs = 1
	}
	if opts.Job == "" {
		opts.Job = "test"
	}
	if opts.Operator == "" {
		opts.Operator = "op"
	}
	h := &Harness{
		op: op, opts: opts,
		plain: map[string][]byte{}, mstate: map[string]map[string]*entry{}, ttl: map[string]ttlConf{},
		timers: map[timerKey]bool{}, ptimers: map[timerKey]bool{}, lists: map[string]*listState{},
		restored: map[string]*listState{}, sides: map[string][]streamd.Record{},
		watermark: streamd.MinWatermark, lastWM: streamd.MinWatermark, now: opts.ProcessingTime,
	}
	h.kg0, h.kg1 = keyGroupRange(opts.Subtask, opts.MaxParallelism, opts.Parallelism)
	h.inputWM = make([]int64, opts.NumInputs)
	for i := range h.inputWM {
		h.inputWM[i] = streamd.MinWatermark
	}
	if opts.Restore != nil {
		h.restore(opts.Restore)
	}
	return h
}

// --- lifecycle ----------------------------------------------------------------

// call runs one lifecycle export and turns its status into an error.
func (h *Harness) call(phase string, f func() int32) error {
	if h.failure != nil {
		return h.failure
	}
	if h.closed {
		return errors.New("streamdtest: " + phase + " after Close")
	}
	hook.Guest.Install((*host)(h), h.op)
	h.phase = phase
	st := f()
	h.phase = ""
	switch {
	case h.failure != nil:
		return h.failure
	case st == 0:
		return nil
	case st == 3 && phase == "ProcessElement":
		return &rejected{h.reject}
	case st == 2:
		h.failure = &Failure{phase, "the guest reports an invalid input frame"}
	default:
		h.failure = &Failure{phase, fmt.Sprintf("status %d without a fail call", st)}
	}
	return h.failure
}

// Open calls the operator's Open with the subtask's context.
func (h *Harness) Open() error {
	if h.opened {
		return errors.New("streamdtest: Open called twice")
	}
	h.opened = true
	c := &streamd.Context{
		Job: h.opts.Job, Operator: h.opts.Operator, Subtask: h.opts.Subtask, Parallelism: h.opts.Parallelism,
		MaxParallelism: h.opts.MaxParallelism, Attempt: h.opts.Attempt, NumInputs: h.opts.NumInputs,
		Restored: h.opts.Restore != nil, Config: h.opts.Config,
	}
	if c.Config == nil {
		c.Config = streamd.Config{}
	}
	return h.call("Open", func() int32 { return hook.Guest.Open(c) })
}

func (h *Harness) checkOpen(what string) error {
	if !h.opened {
		return errors.New("streamdtest: " + what + " before Open")
	}
	return nil
}

// ProcessElement hands rec to the operator as a record of input. A record
// whose key belongs to another subtask makes the operator's first keyed
// call fail, as the host would (route records with SubtaskOf). A rejected
// record (streamd.Reject) returns an error wrapping ErrRejected, and what the
// call emitted and changed in keyed state is undone.
func (h *Harness) ProcessElement(rec streamd.Record, input int) error {
	if err := h.checkOpen("ProcessElement"); err != nil {
		return err
	}
	if input < 0 || input >= h.opts.NumInputs {
		return fmt.Errorf("streamdtest: ProcessElement: input %d outside [0, %d) (Options.NumInputs)", input, h.opts.NumInputs)
	}
	if h.finished {
		return errors.New("streamdtest: ProcessElement after Finish")
	}
	nOut, nWM := len(h.out), len(h.wms)
	nSides := map[string]int{}
	for k, v := range h.sides {
		nSides[k] = len(v)
	}
	h.undoing, h.undo = true, h.undo[:0]
	err := h.call("ProcessElement", func() int32 { return hook.Guest.Process(input, []streamd.Record{rec}) })
	h.undoing = false
	if errors.Is(err, ErrRejected) {
		for i := len(h.undo) - 1; i >= 0; i-- {
			h.undo[i]()
		}
		h.out, h.wms = h.out[:nOut], h.wms[:nWM]
		for k := range h.sides {
			h.sides[k] = h.sides[k][:nSides[k]]
		}
	}
	h.undo = h.undo[:0]
	return err
}

// ProcessWatermark advances the watermark of every input to ts. When the
// subtask's watermark rises, the event-time timers at or below ts fire in
// (ts, key) order (timers they register wait for the next advance), then
// OnWatermark(ts) is called. A ts not above the current watermark does
// nothing.
func (h *Harness) ProcessWatermark(ts int64) error {
	for i := range h.inputWM {
		h.inputWM[i] = max(h.inputWM[i], ts)
	}
	return h.advance(ts)
}

// ProcessInputWatermark advances the watermark of one input; the subtask's
// watermark is the minimum over its inputs.
func (h *Harness) ProcessInputWatermark(input int, ts int64) error {
	if input < 0 || input >= h.opts.NumInputs {
		return fmt.Errorf("streamdtest: ProcessInputWatermark: input %d outside [0, %d)", input, h.opts.NumInputs)
	}
	h.inputWM[input] = max(h.inputWM[input], ts)
	return h.advance(slices.Min(h.inputWM))
}

func (h *Harness) advance(ts int64) error {
	if err := h.checkOpen("ProcessWatermark"); err != nil {
		return err
	}
	if h.failure != nil {
		return h.failure
	}
	if ts <= h.watermark {
		return nil
	}
	h.watermark = ts
	for _, t := range due(h.timers, ts) {
		if !h.timers[t] {
			continue // deleted by an earlier timer
		}
		delete(h.timers, t)
		key := []byte(t.key)
		if err := h.call("OnTimer", func() int32 { return hook.Guest.Timer(t.ts, key) }); err != nil {
			return err
		}
	}
	return h.call("OnWatermark", func() int32 { return hook.Guest.Watermark(ts) })
}

// due returns the timers at or below ts in (ts, key) order.
func due(timers map[timerKey]bool, ts int64) []timerKey {
	var d []timerKey
	for t := range timers {
		if t.ts <= ts {
			d = append(d, t)
		}
	}
	sortTimers(d)
	return d
}

func sortTimers(d []timerKey) {
	sort.Slice(d, func(i, j int) bool {
		if d[i].ts != d[j].ts {
			return d[i].ts < d[j].ts
		}
		return d[i].key < d[j].key
	})
}

// SetProcessingTime sets the harness clock to ts (it never goes back) and
// fires the processing-time timers at or below it in (ts, key) order
// through OnProcessingTime; timers they register wait for the next call.
// After Finish timers no longer fire. The clock also drives state TTL.
func (h *Harness) SetProcessingTime(ts int64) error {
	if err := h.checkOpen("SetProcessingTime"); err != nil {
		return err
	}
	if h.failure != nil {
		return h.failure
	}
	h.now = max(h.now, ts)
	if h.finished {
		return nil
	}
	for _, t := range due(h.ptimers, h.now) {
		if !h.ptimers[t] {
			continue
		}
		delete(h.ptimers, t)
		key := []byte(t.key)
		if err := h.call("OnProcessingTime", func() int32 { return hook.Guest.ProcessingTime(t.ts, key) }); err != nil {
			return err
		}
	}
	return nil
}

// ProcessingTime returns the harness clock.
func (h *Harness) ProcessingTime() int64 { return h.now }

// Watermark returns the subtask's current watermark.
func (h *Harness) Watermark() int64 { return h.watermark }

// EndInput calls EndInput(input).
func (h *Harness) EndInput(input int) error {
	if err := h.checkOpen("EndInput"); err != nil {
		return err
	}
	return h.call("EndInput", func() int32 { return hook.Guest.EndInput(input) })
}

// Finish calls Finish. Afterwards processing-time timers no longer fire and
// keyed state and timers are read-only, as on the host.
func (h *Harness) Finish() error {
	if err := h.checkOpen("Finish"); err != nil {
		return err
	}
	err := h.call("Finish", hook.Guest.Finish)
	if err == nil {
		h.finished = true
	}
	return err
}

// EndOfInput is what the host does at the end of bounded inputs: EndInput
// of every input, the watermark MaxWatermark (every event-time timer fires),
// then Finish.
func (h *Harness) EndOfInput() error {
	for i := 0; i < h.opts.NumInputs; i++ {
		if err := h.EndInput(i); err != nil {
			return err
		}
	}
	if err := h.ProcessWatermark(streamd.MaxWatermark); err != nil {
		return err
	}
	return h.Finish()
}

// NotifyCheckpointComplete calls NotifyCheckpointComplete(id).
func (h *Harness) NotifyCheckpointComplete(id int64) error {
	if err := h.checkOpen("NotifyCheckpointComplete"); err != nil {
		return err
	}
	return h.call("NotifyCheckpointComplete", func() int32 { return hook.Guest.Notify(id) })
}

// Close calls Close, unless the subtask failed: the host never calls a
// failed instance again.
func (h *Harness) Close() error {
	if h.failure != nil || h.closed || !h.opened {
		return nil
	}
	err := h.call("Close", hook.Guest.Close)
	h.closed = true
	return err
}

// Err returns the failure that ended the subtask, or nil.
func (h *Harness) Err() error {
	if h.failure == nil {
		return nil
	}
	return h.failure
}

// --- output -----------------------------------------------------------------------

// Output returns the records emitted so far (Emit), in order.
func (h *Harness) Output() []streamd.Record { return slices.Clone(h.out) }

// SideOutput returns the records emitted to side output name (EmitTo).
func (h *Harness) SideOutput(name string) []streamd.Record { return slices.Clone(h.sides[name]) }

// EmittedWatermarks returns the watermarks the operator emitted itself
// (EmitWatermark), those not above the previous one left out as the host
// ignores them.
func (h *Harness) EmittedWatermarks() []int64 { return slices.Clone(h.wms) }

// Logs returns the lines the operator logged, as "LEVEL msg".
func (h *Harness) Logs() []string { return slices.Clone(h.logs) }

// ClearOutput forgets the output, side outputs, emitted watermarks and logs
// captured so far.
func (h *Harness) ClearOutput() {
	h.out, h.wms, h.logs = nil, nil, nil
	h.sides = map[string][]streamd.Record{}
}

// EventTimeTimers returns the pending event-time timers in (ts, key) order.
func (h *Harness) EventTimeTimers() []Timer { return listTimers(h.timers) }

// ProcessingTimeTimers returns the pending processing-time timers.
func (h *Harness) ProcessingTimeTimers() []Timer { return listTimers(h.ptimers) }

func listTimers(m map[timerKey]bool) []Timer {
	d := make([]timerKey, 0, len(m))
	for t := range m {
		d = append(d, t)
	}
	sortTimers(d)
	ts := make([]Timer, len(d))
	for i, t := range d {
		ts[i] = Timer{Key: []byte(t.key), TS: t.ts}
	}
	return ts
}

// StateEntries returns the number of live keyed-state entries (old
// key-value state and structured entries), for checks that state is cleaned
// up.
func (h *Harness) StateEntries() int {
	n := len(h.plain)
	for _, m := range h.mstate {
		for _, e := range m {
			if (*host)(h).live(e) {
				n++
			}
		}
	}
	return n
}

// --- host imports (hook.Host) --------------------------------------------------

// host is the Harness as the SDK sees it: the host imports, kept off the
// Harness's own method set.
type host Harness

// misuse fails the subtask with msg, as a host import the guest misused.
func (h *host) misuse(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	if h.failure == nil {
		h.failure = &Failure{h.phase, msg}
	}
	panic(errors.New("host: " + msg))
}

func (h *host) Emit(frame []byte) {
	h.out = append(h.out, h.decode("emit", frame)...)
}

func (h *host) EmitTo(name string, frame []byte) {
	if !canEmit(h.phase) {
		h.misuse("emit_to: not allowed in %s", h.phase)
	}
	h.sides[name] = append(h.sides[name], h.decode("emit_to", frame)...)
}

func canEmit(phase string) bool {
	switch phase {
	case "ProcessElement", "OnWatermark", "OnTimer", "OnProcessingTime", "EndInput", "Finish":
		return true
	}
	return false
}

func (h *host) decode(what string, frame []byte) []streamd.Record {
	recs, err := hook.Guest.DecodeBatch(frame)
	if err != nil {
		h.misuse("%s: %v", what, err)
	}
	return recs.([]streamd.Record)
}

func (h *host) EmitWatermark(ts int64) {
	switch h.phase {
	case "Open", "ProcessElement", "OnWatermark", "OnTimer", "OnProcessingTime", "EndInput":
	default:
		h.misuse("emit_watermark: not allowed in %s", h.phase)
	}
	if ts > h.lastWM {
		h.lastWM = ts
		h.wms = append(h.wms, ts)
	}
}

func (h *host) InputWatermark(input int32) int64 {
	if input < 0 || int(input) >= len(h.inputWM) {
		h.misuse("input_watermark: input %d outside [0, %d)", input, len(h.inputWM))
	}
	return h.inputWM[input]
}

func (h *host) CurrentWatermark() int64 { return h.watermark }

func (h *host) Log(level int32, msg string) {
	names := []string{"DEBUG", "INFO", "WARN", "ERROR"}
	h.logs = append(h.logs, names[min(max(level, 0), 3)]+" "+msg)
}

func (h *host) Fail(msg string) {
	if h.failure == nil {
		h.failure = &Failure{h.phase, msg}
	}
}

func (h *host) Reject(msg string) { h.reject = msg }

// canRead and canWrite are the ABI's "reads" and "writes" phases.
func (h *host) canRead() bool { return h.phase != "Close" && h.phase != "" }

func (h *host) canWrite() bool { return h.canRead() && !h.finished }

func (h *host) checkWrite(imp string) {
	if !h.canWrite() {
		if h.finished {
			h.misuse("%s: keyed state and timers are read-only after Finish", imp)
		}
		h.misuse("%s: not allowed in %s", imp, h.phase)
	}
}

func (h *host) checkRead(imp string) {
	if !h.canRead() {
		h.misuse("%s: not allowed in %s", imp, h.phase)
	}
}

// checkKey fails the guest on an empty key or one of another subtask.
func (h *host) checkKey(imp string, key []byte) {
	if len(key) == 0 {
		h.misuse("%s: empty key (keyed state and timers need the record's key)", imp)
	}
	if kg := KeyGroup(key, h.opts.MaxParallelism); kg < h.kg0 || kg > h.kg1 {
		h.misuse("%s: key %q is in key group %d, outside this subtask's key groups [%d,%d]", imp, key, kg, h.kg0, h.kg1)
	}
}

func (h *host) checkPlainName(imp, name string) {
	if strings.HasPrefix(name, "\x00") {
		h.misuse("%s: state name %q starts with a NUL byte (reserved for structured state)", imp, name)
	}
}

// copyOut implements the ABI's buffer convention.
func copyOut(v, buf []byte) int32 {
	if len(v) <= len(buf) {
		copy(buf, v)
	}
	return int32(len(v))
}

func plainKey(name string, key []byte) string { return name + "\x00" + string(key) }

func (h *host) StateGet(name string, key, buf []byte) int32 {
	h.checkRead("state_get")
	h.checkPlainName("state_get", name)
	h.checkKey("state_get", key)
	v, ok := h.plain[plainKey(name, key)]
	if !ok {
		return -1
	}
	return copyOut(v, buf)
}

func (h *host) StatePut(name string, key, val []byte) {
	h.checkWrite("state_put")
	h.checkPlainName("state_put", name)
	h.checkKey("state_put", key)
	h.setPlain(plainKey(name, key), bytes.Clone(val), true)
}

func (h *host) StateDelete(name string, key []byte) {
	h.checkWrite("state_delete")
	h.checkPlainName("state_delete", name)
	h.checkKey("state_delete", key)
	h.setPlain(plainKey(name, key), nil, false)
}

func (h *host) setPlain(k string, v []byte, put bool) {
	if h.undoing {
		old, had := h.plain[k]
		h.undo = append(h.undo, func() {
			if had {
				h.plain[k] = old
			} else {
				delete(h.plain, k)
			}
		})
	}
	if put {
		h.plain[k] = v
	} else {
		delete(h.plain, k)
	}
}

func (h *host) ListAdd(name string, mode int32, val []byte) {
	if h.phase != "SnapshotState" {
		h.misuse("list_state_add: not allowed in %s", h.phase)
	}
	l := h.lists[name]
	if l == nil {
		l = &listState{mode: mode}
		h.lists[name] = l
	}
	if l.mode != mode {
		h.misuse("list_state_add: list state %q used with modes %d and %d", name, l.mode, mode)
	}
	l.entries = append(l.entries, bytes.Clone(val))
}

func (h *host) ListGet(name string, index int32, buf []byte) int32 {
	l := h.restored[name]
	if l == nil || index < 0 || int(index) >= len(l.entries) {
		return -1
	}
	return copyOut(l.entries[index], buf)
}

func (h *host) setTimer(m map[timerKey]bool, t timerKey, on bool) {
	if h.undoing {
		had := m[t]
		h.undo = append(h.undo, func() {
			if had {
				m[t] = true
			} else {
				delete(m, t)
			}
		})
	}
	if on {
		m[t] = true
	} else {
		delete(m, t)
	}
}

func (h *host) TimerRegister(key []byte, ts int64) {
	h.checkWrite("timer_register")
	h.checkKey("timer_register", key)
	h.setTimer(h.timers, timerKey{string(key), ts}, true)
}

func (h *host) TimerDelete(key []byte, ts int64) {
	h.checkWrite("timer_delete")
	h.checkKey("timer_delete", key)
	h.setTimer(h.timers, timerKey{string(key), ts}, false)
}

func (h *host) PTimerRegister(key []byte, ts int64) {
	h.checkWrite("ptimer_register")
	h.checkKey("ptimer_register", key)
	h.setTimer(h.ptimers, timerKey{string(key), ts}, true)
}

func (h *host) PTimerDelete(key []byte, ts int64) {
	h.checkWrite("ptimer_delete")
	h.checkKey("ptimer_delete", key)
	h.setTimer(h.ptimers, timerKey{string(key), ts}, false)
}

func (h *host) ProcessingTime() int64 {
	if !h.opts.AllowClock {
		h.misuse("processing_time needs allow_clock: true (job file)")
	}
	return h.now
}

// --- structured state ------------------------------------------------------------

// prefix is the stored prefix of (name, key, ns), as the host stores it.
func prefix(name string, key, ns []byte) string {
	var b []byte
	b = append(b, 0)
	b = append(b, name...)
	b = append(b, 0)
	b = appendU32(b, len(key))
	b = append(b, key...)
	b = appendU32(b, len(ns))
	b = append(b, ns...)
	return string(b)
}

func appendU32(b []byte, n int) []byte {
	return append(b, byte(n>>24), byte(n>>16), byte(n>>8), byte(n))
}

func (h *host) expiryFor(name string) int64 {
	t, ok := h.ttl[name]
	if !ok || t.ms <= 0 {
		return 0
	}
	if h.now > math.MaxInt64-t.ms {
		return math.MaxInt64
	}
	return h.now + t.ms
}

func (h *host) alive(expiry int64) bool { return expiry == 0 || h.now < expiry }

func (h *host) live(e *entry) bool {
	if !e.list {
		return h.alive(e.expiry)
	}
	for _, x := range e.elems {
		if h.alive(x.expiry) {
			return true
		}
	}
	return false
}

// setEntry stores e (nil: removes) under (p, ukey), undoably.
func (h *host) setEntry(p, ukey string, e *entry) {
	m := h.mstate[p]
	if h.undoing {
		var old *entry
		if m != nil {
			if o := m[ukey]; o != nil {
				old = o.clone()
			}
		}
		h.undo = append(h.undo, func() { h.putEntry(p, ukey, old) })
	}
	h.putEntry(p, ukey, e)
}

func (h *host) putEntry(p, ukey string, e *entry) {
	m := h.mstate[p]
	if e == nil {
		if m != nil {
			delete(m, ukey)
			if len(m) == 0 {
				delete(h.mstate, p)
			}
		}
		return
	}
	if m == nil {
		m = map[string]*entry{}
		h.mstate[p] = m
	}
	m[ukey] = e
}

// read returns the live entry (name, p, ukey), dropping it or its expired
// elements when touched, and refreshing expiries on read if the TTL says so.
func (h *host) read(name, p, ukey string) *entry {
	e := h.mstate[p][ukey]
	if e == nil {
		return nil
	}
	if !h.live(e) {
		h.setEntry(p, ukey, nil)
		return nil
	}
	refresh := h.ttl[name].flags&1 != 0 && h.ttl[name].ms > 0
	if e.list {
		keep := e.elems[:0:0]
		for _, x := range e.elems {
			if h.alive(x.expiry) {
				if refresh {
					x.expiry = h.expiryFor(name)
				}
				keep = append(keep, x)
			}
		}
		if len(keep) != len(e.elems) || refresh {
			e = &entry{list: true, elems: keep}
			h.setEntry(p, ukey, e)
		}
	} else if refresh {
		e = &entry{val: e.val, expiry: h.expiryFor(name)}
		h.setEntry(p, ukey, e)
	}
	return e
}

func (e *entry) bytes() []byte {
	if !e.list {
		return e.val
	}
	b := appendLE32(nil, len(e.elems))
	for _, x := range e.elems {
		b = appendLE32(b, len(x.val))
		b = append(b, x.val...)
	}
	return b
}

func appendLE32(b []byte, n int) []byte {
	return append(b, byte(n), byte(n>>8), byte(n>>16), byte(n>>24))
}

func (h *host) mcheck(imp string, write bool, name string, key []byte) {
	if write {
		h.checkWrite(imp)
	} else {
		h.checkRead(imp)
	}
	h.checkKey(imp, key)
}

func (h *host) MStateGet(name string, key, ns, ukey, buf []byte) int32 {
	h.mcheck("mstate_get", false, name, key)
	e := h.read(name, prefix(name, key, ns), string(ukey))
	if e == nil {
		return -1
	}
	return copyOut(e.bytes(), buf)
}

func (h *host) MStatePut(name string, key, ns, ukey, val []byte) {
	h.mcheck("mstate_put", true, name, key)
	h.setEntry(prefix(name, key, ns), string(ukey), &entry{val: bytes.Clone(val), expiry: h.expiryFor(name)})
}

func (h *host) MStateAppend(name string, key, ns, ukey, val []byte) {
	h.mcheck("mstate_append", true, name, key)
	p := prefix(name, key, ns)
	e := h.read(name, p, string(ukey))
	if e != nil && !e.list {
		h.misuse("state %s: entry is a value, not a list", name)
	}
	n := &entry{list: true}
	if e != nil {
		n.elems = slices.Clip(e.elems)
	}
	n.elems = append(n.elems, elem{val: bytes.Clone(val), expiry: h.expiryFor(name)})
	h.setEntry(p, string(ukey), n)
}

func (h *host) MStateRemove(name string, key, ns, ukey []byte) {
	h.mcheck("mstate_remove", true, name, key)
	h.setEntry(prefix(name, key, ns), string(ukey), nil)
}

func (h *host) MStateEntries(name string, key, ns, buf []byte) int32 {
	h.mcheck("mstate_entries", false, name, key)
	p := prefix(name, key, ns)
	ukeys := make([]string, 0, len(h.mstate[p]))
	for uk := range h.mstate[p] {
		ukeys = append(ukeys, uk)
	}
	sort.Strings(ukeys)
	var b []byte
	n := 0
	for _, uk := range ukeys {
		e := h.read(name, p, uk)
		if e == nil {
			continue
		}
		n++
		b = appendLE32(b, len(uk))
		b = append(b, uk...)
		v := e.bytes()
		b = appendLE32(b, len(v))
		b = append(b, v...)
	}
	if n == 0 {
		return -1
	}
	return copyOut(append(appendLE32(nil, n), b...), buf)
}

func (h *host) MStateClear(name string, key, ns []byte) {
	h.mcheck("mstate_clear", true, name, key)
	p := prefix(name, key, ns)
	for uk := range h.mstate[p] {
		h.setEntry(p, uk, nil)
	}
}

func (h *host) StateTTL(name string, ttlMs int64, flags int32) {
	if h.phase != "Open" {
		h.misuse("state_ttl: allowed in Open only, not in %s", h.phase)
	}
	if ttlMs < 0 {
		h.misuse("state_ttl: state %q: negative ttl_ms %d", name, ttlMs)
	}
	if ttlMs == 0 {
		delete(h.ttl, name)
		return
	}
	h.ttl[name] = ttlConf{ms: ttlMs, flags: flags}
}
