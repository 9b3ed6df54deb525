//go:build wasip1

package streamd

import "unsafe"

// The host imports of ABI v1 (module streamd_v1), and wrappers that pass Go
// slices and strings as pointer and length. The host reads (or, for state_get
// and list_state_get, writes) the memory only during the call.

//go:wasmimport streamd_v1 emit
func importEmit(ptr unsafe.Pointer, n uint32)

//go:wasmimport streamd_v1 state_get
func importStateGet(name unsafe.Pointer, nameLen uint32, key unsafe.Pointer, keyLen uint32, buf unsafe.Pointer, bufCap uint32) int32

//go:wasmimport streamd_v1 state_put
func importStatePut(name unsafe.Pointer, nameLen uint32, key unsafe.Pointer, keyLen uint32, val unsafe.Pointer, valLen uint32)

//go:wasmimport streamd_v1 state_delete
func importStateDelete(name unsafe.Pointer, nameLen uint32, key unsafe.Pointer, keyLen uint32)

//go:wasmimport streamd_v1 list_state_add
func importListAdd(name unsafe.Pointer, nameLen uint32, mode int32, val unsafe.Pointer, valLen uint32)

//go:wasmimport streamd_v1 list_state_get
func importListGet(name unsafe.Pointer, nameLen uint32, index int32, buf unsafe.Pointer, bufCap uint32) int32

//go:wasmimport streamd_v1 timer_register
func importTimerRegister(key unsafe.Pointer, keyLen uint32, ts int64)

//go:wasmimport streamd_v1 timer_delete
func importTimerDelete(key unsafe.Pointer, keyLen uint32, ts int64)

//go:wasmimport streamd_v1 current_watermark
func importCurrentWatermark() int64

//go:wasmimport streamd_v1 log
func importLog(level int32, msg unsafe.Pointer, msgLen uint32)

//go:wasmimport streamd_v1 fail
func importFail(msg unsafe.Pointer, msgLen uint32)

//go:wasmimport streamd_v1 reject
func importReject(msg unsafe.Pointer, msgLen uint32)

func bptr(b []byte) unsafe.Pointer { return unsafe.Pointer(unsafe.SliceData(b)) }
func sptr(s string) unsafe.Pointer { return unsafe.Pointer(unsafe.StringData(s)) }

func hostEmit(frame []byte) { importEmit(bptr(frame), uint32(len(frame))) }

func hostStateGet(name string, key, buf []byte) int32 {
	return importStateGet(sptr(name), uint32(len(name)), bptr(key), uint32(len(key)), bptr(buf), uint32(len(buf)))
}

func hostStatePut(name string, key, val []byte) {
	importStatePut(sptr(name), uint32(len(name)), bptr(key), uint32(len(key)), bptr(val), uint32(len(val)))
}

func hostStateDelete(name string, key []byte) {
	importStateDelete(sptr(name), uint32(len(name)), bptr(key), uint32(len(key)))
}

func hostListAdd(name string, mode int32, val []byte) {
	importListAdd(sptr(name), uint32(len(name)), mode, bptr(val), uint32(len(val)))
}

func hostListGet(name string, index int32, buf []byte) int32 {
	return importListGet(sptr(name), uint32(len(name)), index, bptr(buf), uint32(len(buf)))
}

func hostTimerRegister(key []byte, ts int64) { importTimerRegister(bptr(key), uint32(len(key)), ts) }
func hostTimerDelete(key []byte, ts int64)   { importTimerDelete(bptr(key), uint32(len(key)), ts) }
func hostCurrentWatermark() int64            { return importCurrentWatermark() }
func hostLog(level int32, msg string)        { importLog(level, sptr(msg), uint32(len(msg))) }
func hostFail(msg string)                    { importFail(sptr(msg), uint32(len(msg))) }
func hostReject(msg string)                  { importReject(sptr(msg), uint32(len(msg))) }

// The imports of SPEC14 (structured state, TTL, processing time, own
// watermarks, side outputs). A module imports only those it calls: the Go
// linker drops the rest, so a module that uses none still loads on a host
// that predates them.

//go:wasmimport streamd_v1 mstate_get
func importMStateGet(name unsafe.Pointer, nameLen uint32, key unsafe.Pointer, keyLen uint32, ns unsafe.Pointer, nsLen uint32, ukey unsafe.Pointer, ukeyLen uint32, buf unsafe.Pointer, bufCap uint32) int32

//go:wasmimport streamd_v1 mstate_put
func importMStatePut(name unsafe.Pointer, nameLen uint32, key unsafe.Pointer, keyLen uint32, ns unsafe.Pointer, nsLen uint32, ukey unsafe.Pointer, ukeyLen uint32, val unsafe.Pointer, valLen uint32)

//go:wasmimport streamd_v1 mstate_append
func importMStateAppend(name unsafe.Pointer, nameLen uint32, key unsafe.Pointer, keyLen uint32, ns unsafe.Pointer, nsLen uint32, ukey unsafe.Pointer, ukeyLen uint32, val unsafe.Pointer, valLen uint32)

//go:wasmimport streamd_v1 mstate_remove
func importMStateRemove(name unsafe.Pointer, nameLen uint32, key unsafe.Pointer, keyLen uint32, ns unsafe.Pointer, nsLen uint32, ukey unsafe.Pointer, ukeyLen uint32)

//go:wasmimport streamd_v1 mstate_entries
func importMStateEntries(name unsafe.Pointer, nameLen uint32, key unsafe.Pointer, keyLen uint32, ns unsafe.Pointer, nsLen uint32, buf unsafe.Pointer, bufCap uint32) int32

//go:wasmimport streamd_v1 mstate_clear
func importMStateClear(name unsafe.Pointer, nameLen uint32, key unsafe.Pointer, keyLen uint32, ns unsafe.Pointer, nsLen uint32)

//go:wasmimport streamd_v1 state_ttl
func importStateTTL(name unsafe.Pointer, nameLen uint32, ttlMs int64, flags int32)

//go:wasmimport streamd_v1 ptimer_register
func importPTimerRegister(key unsafe.Pointer, keyLen uint32, ts int64)

//go:wasmimport streamd_v1 ptimer_delete
func importPTimerDelete(key unsafe.Pointer, keyLen uint32, ts int64)

//go:wasmimport streamd_v1 processing_time
func importProcessingTime() int64

//go:wasmimport streamd_v1 emit_watermark
func importEmitWatermark(ts int64)

//go:wasmimport streamd_v1 input_watermark
func importInputWatermark(input int32) int64

//go:wasmimport streamd_v1 emit_to
func importEmitTo(name unsafe.Pointer, nameLen uint32, batch unsafe.Pointer, batchLen uint32)

func hostMStateGet(name string, key, ns, ukey, buf []byte) int32 {
	return importMStateGet(sptr(name), uint32(len(name)), bptr(key), uint32(len(key)), bptr(ns), uint32(len(ns)),
		bptr(ukey), uint32(len(ukey)), bptr(buf), uint32(len(buf)))
}

func hostMStatePut(name string, key, ns, ukey, val []byte) {
	importMStatePut(sptr(name), uint32(len(name)), bptr(key), uint32(len(key)), bptr(ns), uint32(len(ns)),
		bptr(ukey), uint32(len(ukey)), bptr(val), uint32(len(val)))
}

func hostMStateAppend(name string, key, ns, ukey, val []byte) {
	importMStateAppend(sptr(name), uint32(len(name)), bptr(key), uint32(len(key)), bptr(ns), uint32(len(ns)),
		bptr(ukey), uint32(len(ukey)), bptr(val), uint32(len(val)))
}

func hostMStateRemove(name string, key, ns, ukey []byte) {
	importMStateRemove(sptr(name), uint32(len(name)), bptr(key), uint32(len(key)), bptr(ns), uint32(len(ns)),
		bptr(ukey), uint32(len(ukey)))
}

func hostMStateEntries(name string, key, ns, buf []byte) int32 {
	return importMStateEntries(sptr(name), uint32(len(name)), bptr(key), uint32(len(key)), bptr(ns), uint32(len(ns)),
		bptr(buf), uint32(len(buf)))
}

func hostMStateClear(name string, key, ns []byte) {
	importMStateClear(sptr(name), uint32(len(name)), bptr(key), uint32(len(key)), bptr(ns), uint32(len(ns)))
}

func hostStateTTL(name string, ttlMs int64, flags int32) {
	importStateTTL(sptr(name), uint32(len(name)), ttlMs, flags)
}

func hostPTimerRegister(key []byte, ts int64) { importPTimerRegister(bptr(key), uint32(len(key)), ts) }
func hostPTimerDelete(key []byte, ts int64)   { importPTimerDelete(bptr(key), uint32(len(key)), ts) }
func hostProcessingTime() int64               { return importProcessingTime() }
func hostEmitWatermark(ts int64)              { importEmitWatermark(ts) }
func hostInputWatermark(input int32) int64    { return importInputWatermark(input) }
func hostEmitTo(name string, frame []byte) {
	importEmitTo(sptr(name), uint32(len(name)), bptr(frame), uint32(len(frame)))
}
