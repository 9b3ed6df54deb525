package streamd

import (
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"strconv"
)

// Status codes of the lifecycle exports (abi/ABI.md).
const (
	statusOK           int32 = 0
	statusError        int32 = 1
	statusInvalidInput int32 = 2
	statusReject       int32 = 3 // streamd_process only: a record is rejected (reject import)
)

// phase is the lifecycle export being run; it decides what the SDK allows.
type phase uint8

const (
	phaseNone phase = iota
	phaseOpen
	phaseProcess
	phaseWatermark
	phaseTimer
	phaseEndInput
	phaseFinish
	phaseSnapshot
	phaseNotify
	phaseClose
	phaseProcessingTime
)

var phaseNames = [...]string{"(no call)", "Open", "ProcessElement", "OnWatermark", "OnTimer", "EndInput", "Finish", "SnapshotState", "NotifyCheckpointComplete", "Close", "OnProcessingTime"}

func (p phase) String() string { return phaseNames[p] }

// canEmit reports whether the ABI allows the emit import in p.
func (p phase) canEmit() bool {
	return p == phaseProcess || p == phaseWatermark || p == phaseTimer || p == phaseProcessingTime ||
		p == phaseEndInput || p == phaseFinish
}

// hasKey reports whether p has a current key: the record's or the timer's.
func (p phase) hasKey() bool {
	return p == phaseProcess || p == phaseTimer || p == phaseProcessingTime
}

// The guest's global state: one Wasm instance runs one subtask, driven by one
// thread, so plain globals are enough.
var (
	op      Operator
	cur     phase
	out     outFrame
	inbuf   []byte // the buffer lent to the host by streamd_alloc
	scratch []byte // reused buffer for state_get and list_state_get
	curKey  []byte // the current key while cur.hasKey()
	emitOK  bool   // cur.canEmit(), kept by run for the emit paths
)

// Register sets the operator this module runs. Call it from an init
// function: a Go reactor (-buildmode=c-shared) runs init functions when the
// host calls _initialize, but never runs main.
func Register(o Operator) {
	if o == nil {
		panic("streamd: Register(nil)")
	}
	if op != nil {
		panic("streamd: Register called twice")
	}
	op = o
}

// failed is the panic value Fail unwinds with after the fail import, in case
// a host lets it return (a native test host does).
type failed struct{}

// Fail fails the subtask with msg. It never returns.
func Fail(msg string) {
	out.reset()
	resetSides()
	hostFail(msg)
	panic(failed{})
}

// run executes one lifecycle call of the operator: it sets the phase, turns an
// error or a panic into a fail import call, and flushes the emitted records.
func run(p phase, f func() error) (status int32) {
	cur, emitOK = p, p.canEmit()
	defer func() {
		cur, emitOK, curKey = phaseNone, false, nil
		if r := recover(); r != nil {
			out.reset()
			resetSides()
			if _, ok := r.(failed); !ok {
				hostFail("panic in " + p.String() + ": " + panicText(r) + "\n\n" + stack())
			}
			status = statusError
		}
	}()
	if op == nil {
		Fail("streamd: no operator registered: call streamd.Register(op) in an init function of package main")
	}
	if err := f(); err != nil {
		var rj *rejection
		if p == phaseProcess && errors.As(err, &rj) {
			out.reset() // the host drops what the batch emitted and replays it
			resetSides()
			hostReject(rj.Error())
			return statusReject
		}
		Fail(p.String() + ": " + err.Error())
	}
	flush()
	return statusOK
}

// rejection is the error Reject returns.
type rejection struct{ reason error }

func (r *rejection) Error() string { return r.reason.Error() }
func (r *rejection) Unwrap() error { return r.reason }

// Reject returns an error that, returned from ProcessElement, rejects the
// record on purpose: the subtask does not fail and the instance is not
// trapped. The host then handles the record as the operator's on_error in
// the job file says: skip drops it, dead_letter writes it with reason's
// text to the dead-letter sink, and fail (the default) fails the job with
// that text. What the call emitted and wrote to keyed state for the record
// is undone (the host replays the batch without it). Returned from any
// other method, it fails the subtask like any error. A nil reason is
// "rejected".
func Reject(reason error) error {
	if reason == nil {
		reason = errors.New("rejected")
	}
	return &rejection{reason}
}

// panicText renders a panic value without fmt, which would add 700 KiB to
// every guest; Logf is the only user of fmt and is linked only when used.
func panicText(r any) string {
	switch v := r.(type) {
	case string:
		return v
	case error:
		return v.Error()
	case interface{ String() string }:
		return v.String()
	case int:
		return strconv.Itoa(v)
	case int64:
		return strconv.FormatInt(v, 10)
	case int32:
		return strconv.FormatInt(int64(v), 10)
	case uint64:
		return strconv.FormatUint(v, 10)
	case uint32:
		return strconv.FormatUint(uint64(v), 10)
	case bool:
		return strconv.FormatBool(v)
	case float64:
		return strconv.FormatFloat(v, 'g', -1, 64)
	}
	return "(panic value that is not a string, error or number)"
}

// stack returns the calling goroutine's stack, like runtime/debug.Stack.
func stack() string {
	buf := make([]byte, 4096)
	for {
		n := runtime.Stack(buf, false)
		if n < len(buf) {
			return string(buf[:n])
		}
		buf = make([]byte, 2*len(buf))
	}
}

// invalidInput reports a frame the SDK could not decode.
func invalidInput(p phase, err error) int32 {
	hostLog(int32(LevelError), "streamd: "+p.String()+": "+err.Error())
	return statusInvalidInput
}

// The functions below implement the lifecycle exports on byte slices; the
// wasip1 exports map pointers to slices and call them.

func doOpen(frame []byte) int32 {
	c, err := decodeContext(frame)
	if err != nil {
		return invalidInput(phaseOpen, err)
	}
	return runOpen(c)
}

func runOpen(c *Context) int32 {
	return run(phaseOpen, func() error {
		if applyTTLs != nil {
			applyTTLs()
		}
		return op.Open(c)
	})
}

func doProcess(input int, frame []byte) int32 {
	n, err := checkBatch(frame)
	if err != nil {
		return invalidInput(phaseProcess, err)
	}
	return run(phaseProcess, func() error {
		// nextRecord, written out: Go does not inline it, and a call per
		// record is dear in Go's wasm code.
		off := 4
		for i := 0; i < n; i++ {
			ts := int64(binary.LittleEndian.Uint64(frame[off:]))
			klf := binary.LittleEndian.Uint32(frame[off+8:])
			kl := int(klf &^ headersFlag)
			off += 12
			var key []byte
			if kl > 0 {
				key = frame[off : off+kl : off+kl]
				off += kl
			}
			vl := int(binary.LittleEndian.Uint32(frame[off:]))
			off += 4
			val := frame[off : off+vl : off+vl]
			off += vl
			var h Headers
			if klf&headersFlag != 0 {
				h, off = headersAt(frame, off)
			}
			curKey = key
			if err := op.ProcessElement(Record{Key: key, Value: val, Timestamp: ts, Headers: h}, input); err != nil {
				return err
			}
		}
		return nil
	})
}

func doWatermark(ts int64) int32 {
	return run(phaseWatermark, func() error { return op.OnWatermark(ts) })
}

// processRecords is doProcess on decoded records (a native host's path).
func processRecords(input int, recs []Record) int32 {
	return run(phaseProcess, func() error {
		for _, r := range recs {
			curKey = r.Key
			if err := op.ProcessElement(r, input); err != nil {
				return err
			}
		}
		return nil
	})
}

func doTimer(ts int64, key []byte) int32 {
	return run(phaseTimer, func() error {
		curKey = key
		return op.OnTimer(ts, key)
	})
}

func doProcessingTime(ts int64, key []byte) int32 {
	return run(phaseProcessingTime, func() error {
		curKey = key
		if h, ok := op.(ProcessingTimeHandler); ok {
			return h.OnProcessingTime(ts, key)
		}
		return nil
	})
}

func doEndInput(input int) int32 {
	return run(phaseEndInput, func() error { return op.EndInput(input) })
}

func doFinish() int32 { return run(phaseFinish, op.Finish) }

func doSnapshot(id int64) int32 {
	return run(phaseSnapshot, func() error { return op.SnapshotState(id) })
}

func doNotify(id int64) int32 {
	return run(phaseNotify, func() error { return op.NotifyCheckpointComplete(id) })
}

func doClose() int32 { return run(phaseClose, op.Close) }

// alloc returns the input buffer grown to at least size bytes.
func alloc(size int) []byte {
	if size < 1 {
		size = 1
	}
	if cap(inbuf) < size {
		n := 2 * cap(inbuf)
		if n < size {
			n = size
		}
		if n < 4096 {
			n = 4096
		}
		inbuf = nil // let the old buffer go before the new one is allocated
		inbuf = make([]byte, n)
	}
	inbuf = inbuf[:cap(inbuf)]
	return inbuf
}

// --- emitting -----------------------------------------------------------------

// Emit sends a record downstream: key (empty for none), value and event time
// ts (NoTimestamp for none). The SDK copies key and value into its output
// frame, so the caller may reuse them at once. Records reach the host in
// order, at the latest when the current call returns.
//
// Emit is allowed in ProcessElement, OnTimer, OnProcessingTime, OnWatermark,
// EndInput and Finish; elsewhere it fails the subtask.
func Emit(key, value []byte, ts int64) {
	if !emitOK {
		emitOutside("Emit")
	}
	if out.add(key, value, ts) {
		flush()
	}
}

// emitOutside fails the subtask for an emit (what) outside the phases that
// may emit; out of line, to keep the emit paths short.
//
//go:noinline
func emitOutside(what string) {
	Fail("streamd: " + what + " called in " + cur.String() +
		": records may be emitted only in ProcessElement, OnTimer, OnProcessingTime, OnWatermark, EndInput and Finish")
}

// EmitRecord is Emit(r.Key, r.Value, r.Timestamp) that also sends r's
// headers: EmitRecord of an input record, changed or not, keeps its headers.
func EmitRecord(r Record) {
	if len(r.Headers) == 0 {
		Emit(r.Key, r.Value, r.Timestamp)
		return
	}
	if !emitOK {
		emitOutside("EmitRecord")
	}
	if out.addWithHeaders(r.Key, r.Value, r.Timestamp, r.Headers) {
		flush()
	}
}

// flush sends the pending output frames: the main output's, then the side
// outputs'.
func flush() {
	if f := out.frame(); f != nil {
		hostEmit(f)
		out.reset()
	}
	if flushSides != nil {
		flushSides()
	}
}

// --- keyed state --------------------------------------------------------------

// Value is a handle on keyed value state: a map key -> value of byte strings
// under one name, held and checkpointed by the host. The key must be the key
// of the record or timer being handled (the "current key"): the host owns
// only the keys of this subtask's key groups, and a call with another key or
// an empty one fails the subtask. Handles are cheap: create them once.
type Value struct{ name string }

// ValueState returns the handle of the keyed value state called name.
//
// Deprecated: use NewValueState, which takes the current key itself and
// encodes values with a Codec (Bytes keeps them as they are). ValueState keeps
// working: its values live apart from NewValueState's, even under one name.
func ValueState(name string) Value { return Value{name: name} }

// Name returns the state's name.
func (s Value) Name() string { return s.name }

// Get returns a copy of the value stored for key, and whether there is one.
func (s Value) Get(key []byte) ([]byte, bool) {
	v, ok := s.get(key)
	if !ok {
		return nil, false
	}
	return append(make([]byte, 0, len(v)), v...), true
}

// AppendGet appends the value stored for key to dst and reports whether there
// is one; with a reused dst it does not allocate.
func (s Value) AppendGet(dst, key []byte) ([]byte, bool) {
	v, ok := s.get(key)
	if !ok {
		return dst, false
	}
	return append(dst, v...), true
}

// get returns the value in the scratch buffer, valid until the next state call.
func (s Value) get(key []byte) ([]byte, bool) {
	for {
		buf := scratch[:cap(scratch)]
		n := hostStateGet(s.name, key, buf)
		if n < 0 {
			return nil, false
		}
		if int(n) <= len(buf) {
			return buf[:n], true
		}
		scratch = make([]byte, n)
	}
}

// Put stores value for key.
func (s Value) Put(key, value []byte) { hostStatePut(s.name, key, value) }

// Delete removes the value of key, if any.
func (s Value) Delete(key []byte) { hostStateDelete(s.name, key) }

// GetUint64 returns the value of key decoded as 8 bytes little-endian (the
// encoding PutUint64 writes), and whether there is one. A value of another
// length fails the subtask.
func (s Value) GetUint64(key []byte) (uint64, bool) {
	v, ok := s.get(key)
	if !ok {
		return 0, false
	}
	if len(v) != 8 {
		Fail("streamd: state " + strconv.Quote(s.name) + " holds " + strconv.Itoa(len(v)) + " bytes, not an 8-byte integer")
	}
	return binary.LittleEndian.Uint64(v), true
}

// PutUint64 stores v for key as 8 bytes little-endian.
func (s Value) PutUint64(key []byte, v uint64) {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], v)
	hostStatePut(s.name, key, b[:])
}

// GetInt64 is GetUint64 for a signed integer.
func (s Value) GetInt64(key []byte) (int64, bool) {
	v, ok := s.GetUint64(key)
	return int64(v), ok
}

// PutInt64 is PutUint64 for a signed integer.
func (s Value) PutInt64(key []byte, v int64) { s.PutUint64(key, uint64(v)) }

// --- operator list state --------------------------------------------------------

// ListMode says how list state entries are redistributed on restore.
type ListMode int32

const (
	// Split divides the entries of all subtasks among the new subtasks, round robin.
	Split ListMode = 0
	// Union gives every new subtask the entries of every old subtask.
	Union ListMode = 1
	// Broadcast: every subtask wrote the same entries; each new subtask gets one copy.
	Broadcast ListMode = 2
)

// List is a handle on operator list state: the operator's own non-keyed
// state, written in SnapshotState and read back after a restore.
type List struct {
	name string
	mode ListMode
}

// ListState returns the handle of the operator list state called name,
// redistributed with mode. One name must always be used with one mode.
func ListState(name string, mode ListMode) List { return List{name: name, mode: mode} }

// Add appends an entry to the list for the current checkpoint. Call it only
// in SnapshotState; each snapshot starts from an empty list.
func (l List) Add(v []byte) { hostListAdd(l.name, int32(l.mode), v) }

// AddUint64 adds v as 8 bytes little-endian.
func (l List) AddUint64(v uint64) {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], v)
	hostListAdd(l.name, int32(l.mode), b[:])
}

// Get returns a copy of entry i of the restored list, and whether it exists.
func (l List) Get(i int) ([]byte, bool) {
	for {
		buf := scratch[:cap(scratch)]
		n := hostListGet(l.name, int32(i), buf)
		if n < 0 {
			return nil, false
		}
		if int(n) <= len(buf) {
			return append(make([]byte, 0, n), buf[:n]...), true
		}
		scratch = make([]byte, n)
	}
}

// Entries returns copies of all entries of the restored list (nil when
// nothing was restored). Read it in Open.
func (l List) Entries() [][]byte {
	var all [][]byte
	for i := 0; ; i++ {
		v, ok := l.Get(i)
		if !ok {
			return all
		}
		all = append(all, v)
	}
}

// --- timers, watermark, logging -----------------------------------------------

// CurrentWatermark returns the subtask's current watermark (MinWatermark
// before the first one).
func CurrentWatermark() int64 { return hostCurrentWatermark() }

// Level is the level of a log line.
type Level int32

const (
	LevelDebug Level = 0
	LevelInfo  Level = 1
	LevelWarn  Level = 2
	LevelError Level = 3
)

// Log writes msg to the host log at level.
func Log(level Level, msg string) { hostLog(int32(level), msg) }

// Logf formats a line with fmt.Sprintf and writes it to the host log.
func Logf(level Level, format string, args ...any) {
	hostLog(int32(level), fmt.Sprintf(format, args...))
}

// ErrNoHost is what the host functions panic with outside a GOOS=wasip1
// build, unless a test installed a host.
var ErrNoHost = errors.New("streamd: no host: the SDK's host functions work only in a GOOS=wasip1 build run by streamd")

func itoa(i int) string { return strconv.Itoa(i) }
