//go:build !wasip1

package streamd

// In a native build there is no Wasm host: the host functions call
// nativeHost, which the SDK's own tests set to an in-memory fake, and panic
// with ErrNoHost otherwise.

type hostImports interface {
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
}

var nativeHost hostImports

func native() hostImports {
	if nativeHost == nil {
		panic(ErrNoHost)
	}
	return nativeHost
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
