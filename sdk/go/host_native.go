//go:build !wasip1

package streamd

import "github.com/streamd/streamd/sdk/go/internal/hook"

// In a native build there is no Wasm host: the host functions call
// nativeHost, which a Go host sets through the hook package (the SDK's own
// tests and the streamdtest harness), and panic with ErrNoHost otherwise.

type hostImports = hook.Host

var nativeHost hostImports

func native() hostImports {
	if nativeHost == nil {
		panic(ErrNoHost)
	}
	return nativeHost
}

func init() {
	hook.Guest = hook.Lifecycle{
		Install: func(h hook.Host, o any) {
			nativeHost = h
			op, _ = o.(Operator)
			out.reset()
			resetSides()
		},
		Open:           func(c any) int32 { return runOpen(c.(*Context)) },
		Process:        func(input int, recs any) int32 { return processRecords(input, recs.([]Record)) },
		Watermark:      doWatermark,
		Timer:          doTimer,
		ProcessingTime: doProcessingTime,
		EndInput:       doEndInput,
		Finish:         doFinish,
		Snapshot:       doSnapshot,
		Notify:         doNotify,
		Close:          doClose,
		DecodeBatch:    func(frame []byte) (any, error) { return decodeRecords(frame) },
	}
}

func hostEmit(frame []byte)                           { native().Emit(frame) }
func hostStateGet(name string, key, buf []byte) int32 { return native().StateGet(name, key, buf) }
func hostStatePut(name string, key, val []byte)       { native().StatePut(name, key, val) }
func hostStateDelete(name string, key []byte)         { native().StateDelete(name, key) }
func hostListAdd(name string, mode int32, val []byte) { native().ListAdd(name, mode, val) }
func hostListGet(name string, index int32, buf []byte) int32 {
	return native().ListGet(name, index, buf)
}
func hostTimerRegister(key []byte, ts int64) { native().TimerRegister(key, ts) }
func hostTimerDelete(key []byte, ts int64)   { native().TimerDelete(key, ts) }
func hostCurrentWatermark() int64            { return native().CurrentWatermark() }
func hostLog(level int32, msg string)        { native().Log(level, msg) }
func hostFail(msg string)                    { native().Fail(msg) }
func hostReject(msg string)                  { native().Reject(msg) }

func hostMStateGet(name string, key, ns, ukey, buf []byte) int32 {
	return native().MStateGet(name, key, ns, ukey, buf)
}
func hostMStatePut(name string, key, ns, ukey, val []byte) {
	native().MStatePut(name, key, ns, ukey, val)
}
func hostMStateAppend(name string, key, ns, ukey, val []byte) {
	native().MStateAppend(name, key, ns, ukey, val)
}
func hostMStateRemove(name string, key, ns, ukey []byte) { native().MStateRemove(name, key, ns, ukey) }
func hostMStateEntries(name string, key, ns, buf []byte) int32 {
	return native().MStateEntries(name, key, ns, buf)
}
func hostMStateClear(name string, key, ns []byte)        { native().MStateClear(name, key, ns) }
func hostStateTTL(name string, ttlMs int64, flags int32) { native().StateTTL(name, ttlMs, flags) }
func hostPTimerRegister(key []byte, ts int64)            { native().PTimerRegister(key, ts) }
func hostPTimerDelete(key []byte, ts int64)              { native().PTimerDelete(key, ts) }
func hostProcessingTime() int64                          { return native().ProcessingTime() }
func hostEmitWatermark(ts int64)                         { native().EmitWatermark(ts) }
func hostInputWatermark(input int32) int64               { return native().InputWatermark(input) }
func hostEmitTo(name string, frame []byte)               { native().EmitTo(name, frame) }
