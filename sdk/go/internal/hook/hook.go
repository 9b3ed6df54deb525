// Package hook connects the SDK's native build (no Wasm host) to a host
// written in Go: the SDK's own tests and the streamdtest harness. The SDK
// sets Guest in its native build; a host calls Guest.Install and then the
// lifecycle functions, which run the SDK's export code.
package hook

// Host is the set of ABI imports (abi/ABI.md and SPEC14) as Go calls; buf
// arguments are the guest's buffers that the host fills as the ABI says.
type Host interface {
	Emit(frame []byte)
	StateGet(name string, key, buf []byte) int32
	StatePut(name string, key, val []byte)
	StateDelete(name string, key []byte)
	ListAdd(name string, mode int32, val []byte)
	ListGet(name string, index int32, buf []byte) int32
	TimerRegister(key []byte, ts int64)
	TimerDelete(key []byte, ts int64)
	CurrentWatermark() int64
	Log(level int32, msg string)
	Fail(msg string)
	Reject(msg string)

	MStateGet(name string, key, ns, ukey, buf []byte) int32
	MStatePut(name string, key, ns, ukey, val []byte)
	MStateAppend(name string, key, ns, ukey, val []byte)
	MStateRemove(name string, key, ns, ukey []byte)
	MStateEntries(name string, key, ns, buf []byte) int32
	MStateClear(name string, key, ns []byte)
	StateTTL(name string, ttlMs int64, flags int32)
	PTimerRegister(key []byte, ts int64)
	PTimerDelete(key []byte, ts int64)
	ProcessingTime() int64
	EmitWatermark(ts int64)
	InputWatermark(input int32) int64
	EmitTo(name string, frame []byte)
}

// Lifecycle is what the SDK gives a native host: each function runs the
// matching export and returns its ABI status (0 ok, 1 error, 2 invalid
// input, 3 reject). Values typed any are the SDK's own types (op a
// streamd.Operator, ctx a *streamd.Context, recs a []streamd.Record).
type Lifecycle struct {
	// Install makes h the host and op the operator of the next calls.
	Install        func(h Host, op any)
	Open           func(ctx any) int32
	Process        func(input int, recs any) int32
	Watermark      func(ts int64) int32
	Timer          func(ts int64, key []byte) int32
	ProcessingTime func(ts int64, key []byte) int32
	EndInput       func(input int) int32
	Finish         func() int32
	Snapshot       func(id int64) int32
	Notify         func(id int64) int32
	Close          func() int32
	// DecodeBatch decodes a frame the guest emitted into a []streamd.Record
	// that owns its bytes.
	DecodeBatch func(frame []byte) (any, error)
}

// Guest is set by the SDK's native build.
var Guest Lifecycle
