// Package streamd is the Go guest SDK of streamd: it turns a Go type that
// implements Operator into a WebAssembly module that speaks the streamd guest
// ABI v1 (abi/ABI.md).
//
// A guest is a main package built as a WASI reactor:
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o op.wasm .
//
// It registers its operator in an init function (a reactor never runs main):
//
//	type Upper struct{ streamd.Base }
//
//	func (Upper) ProcessElement(r streamd.Record, input int) error {
//		streamd.Emit(r.Key, bytes.ToUpper(r.Value), r.Timestamp)
//		return nil
//	}
//
//	func init() { streamd.Register(&Upper{}) }
//	func main() {}
//
// The SDK exports every streamd_* function, decodes the host's record batches
// without allocating per record, buffers emitted records into one output frame
// per call, and turns a Go panic into a subtask failure whose message holds the
// panic text and the Go stack.
//
// Everything that reaches the host (Emit, state, timers, Log, Fail) works only
// in a GOOS=wasip1 build, or natively under the test harness of package
// streamdtest, which plays the host; the frame codecs are plain Go and run
// anywhere.
package streamd

import "math"

// NoTimestamp is the Timestamp of a record that has no event time.
const NoTimestamp int64 = math.MinInt64

// MinWatermark is CurrentWatermark before the first watermark arrived.
const MinWatermark int64 = math.MinInt64

// MaxWatermark is the watermark that ends event time: the end of a bounded
// input produces it, and every timer fires before OnWatermark(MaxWatermark).
const MaxWatermark int64 = math.MaxInt64

// Record is one stream element. An empty Key means the record has no key;
// Timestamp is event time in milliseconds since the Unix epoch, or
// NoTimestamp; Headers are its headers (none: empty).
//
// The Key, Value and Headers of a record passed to ProcessElement point
// into the SDK's input buffer: they are valid only until ProcessElement
// returns. Copy what must outlive the call.
type Record struct {
	Key       []byte
	Value     []byte
	Timestamp int64
	Headers   Headers
}

// HasTimestamp reports whether r carries an event time.
func (r Record) HasTimestamp() bool { return r.Timestamp != NoTimestamp }

// Operator is a user function run by streamd, one instance per subtask. The
// host calls its methods in this order, never concurrently:
//
//	Open                                   once, first
//	( ProcessElement                       for each record of each input, in order
//	| OnTimer* OnWatermark                 when the watermark advances
//	| OnProcessingTime                     for each due processing-time timer, between batches
//	| SnapshotState | NotifyCheckpointComplete )*
//	EndInput                               once per input, when it ended with drain
//	Finish                                 once, after every EndInput
//	( SnapshotState | NotifyCheckpointComplete )*   the final checkpoint
//	Close                                  last, but not after a failure
//
// OnProcessingTime belongs to ProcessingTimeHandler, which Base implements.
//
// A method that returns a non-nil error, or panics, fails the subtask: the
// error text (or the panic text and Go stack) becomes the host's error
// message, and the job fails over according to its restart strategy. The
// host discards a failed instance without calling it again: Close is not
// called after a failure (a trap, an error, Fail or a panic).
//
// Embed Base to get no-op defaults for every method but ProcessElement.
type Operator interface {
	// Open is called once before anything else. ctx describes the subtask and
	// carries the operator's config from the job file. When ctx.Restored is
	// true, Open reads back the operator list state it wrote in SnapshotState
	// (ListState(...).Entries()). Open has no current key: typed state
	// (NewValueState, ...) and timers fail there; it may create state
	// descriptors (those WithTTL must be created here or at package level),
	// EmitWatermark, but not Emit.
	Open(ctx *Context) error

	// ProcessElement is called for every record of input input (0-based, the
	// order of the operator's inputs in the job file). The record's key is
	// the current key: keyed state and timers work on it. It may Emit,
	// EmitTo and EmitWatermark, and must not keep r.Key or r.Value after it
	// returns.
	ProcessElement(r Record, input int) error

	// OnWatermark is called when the subtask's event-time watermark advances
	// to ts, after the timers it fired. ts == MaxWatermark at the end of
	// event time (bounded inputs end with it). The host forwards watermarks
	// downstream itself: OnWatermark only reacts to them. It may Emit.
	OnWatermark(ts int64) error

	// OnTimer is called for every event-time timer at or below the new
	// watermark, in increasing ts order (ties in key order), before
	// OnWatermark. key is the timer's key, valid only during the call; keyed
	// state calls use it as the current key. The timer is removed before the
	// call. It may Emit.
	OnTimer(ts int64, key []byte) error

	// EndInput is called once per input when that input has delivered all its
	// records (end of data with drain). It may Emit.
	EndInput(input int) error

	// Finish is called once after EndInput of every input: flush what is
	// buffered with Emit. No record may be emitted after it returns. A job
	// stopped with a savepoint without drain calls neither EndInput nor Finish.
	Finish() error

	// SnapshotState is called at each checkpoint barrier. The operator writes
	// the operator list state it wants to keep with ListState(...).Add; each
	// snapshot starts from empty lists. Keyed state and timers are
	// snapshotted by the host without help. It must not Emit.
	SnapshotState(checkpointID int64) error

	// NotifyCheckpointComplete is called when checkpoint checkpointID is
	// durable: commit side effects that belong to it here. It must not Emit.
	NotifyCheckpointComplete(checkpointID int64) error

	// Close is called last, not after a failure (trap, error, fail): release
	// resources only. It must not Emit, use state or register timers.
	Close() error
}

// Base gives an Operator no-op defaults for every method but
// ProcessElement. Embed it and override what the operator needs.
type Base struct{}

func (Base) Open(*Context) error                  { return nil }
func (Base) OnWatermark(int64) error              { return nil }
func (Base) OnTimer(int64, []byte) error          { return nil }
func (Base) EndInput(int) error                   { return nil }
func (Base) Finish() error                        { return nil }
func (Base) SnapshotState(int64) error            { return nil }
func (Base) NotifyCheckpointComplete(int64) error { return nil }
func (Base) Close() error                         { return nil }

// Map returns an operator that emits f(r) for every record r, its headers
// included (so a function that changes r's value and returns r keeps r's
// headers). The returned record is copied into the output before the next
// call, so it may alias r or a buffer that f reuses.
func Map(f func(r Record) Record) Operator { return &mapOp{f: f} }

type mapOp struct {
	Base
	f func(Record) Record
}

func (m *mapOp) ProcessElement(r Record, _ int) error {
	EmitRecord(m.f(r))
	return nil
}

// Filter returns an operator that emits the records for which keep returns
// true, unchanged (headers included).
func Filter(keep func(r Record) bool) Operator { return &filterOp{keep: keep} }

type filterOp struct {
	Base
	keep func(Record) bool
}

func (f *filterOp) ProcessElement(r Record, _ int) error {
	if f.keep(r) {
		EmitRecord(r)
	}
	return nil
}

// FlatMap returns an operator that calls f for every record; f emits any
// number of records through emit, which copies them into the output at once.
func FlatMap(f func(r Record, emit func(Record))) Operator {
	return &flatMapOp{f: f, emit: EmitRecord}
}

type flatMapOp struct {
	Base
	f    func(Record, func(Record))
	emit func(Record)
}

func (m *flatMapOp) ProcessElement(r Record, _ int) error {
	m.f(r, m.emit)
	return nil
}
