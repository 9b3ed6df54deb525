//go:build wasip1

package streamd

import "unsafe"

// The guest exports of ABI v1. Pointers the host passes always point into the
// buffer streamd_alloc lent it; input maps them back to a slice of that buffer
// (and rejects anything else) instead of trusting a raw address.

//go:wasmexport streamd_abi_version
func exportABIVersion() int32 { return abiVersion }

//go:wasmexport streamd_alloc
func exportAlloc(size int32) int32 {
	if size < 0 {
		return 0
	}
	b := alloc(int(size))
	return int32(uintptr(unsafe.Pointer(unsafe.SliceData(b))))
}

//go:wasmexport streamd_open
func exportOpen(ptr, n int32) int32 {
	b, ok := input(ptr, n)
	if !ok {
		return badPointer(phaseOpen, ptr, n)
	}
	return doOpen(b)
}

//go:wasmexport streamd_process
func exportProcess(in, ptr, n int32) int32 {
	b, ok := input(ptr, n)
	if !ok {
		return badPointer(phaseProcess, ptr, n)
	}
	return doProcess(int(in), b)
}

//go:wasmexport streamd_on_watermark
func exportOnWatermark(ts int64) int32 { return doWatermark(ts) }

//go:wasmexport streamd_on_timer
func exportOnTimer(ts int64, ptr, n int32) int32 {
	b, ok := input(ptr, n)
	if !ok {
		return badPointer(phaseTimer, ptr, n)
	}
	return doTimer(ts, b)
}

//go:wasmexport streamd_on_processing_time
func exportOnProcessingTime(ts int64, ptr, n int32) int32 {
	b, ok := input(ptr, n)
	if !ok {
		return badPointer(phaseProcessingTime, ptr, n)
	}
	return doProcessingTime(ts, b)
}

//go:wasmexport streamd_end_input
func exportEndInput(in int32) int32 { return doEndInput(int(in)) }

//go:wasmexport streamd_finish
func exportFinish() int32 { return doFinish() }

//go:wasmexport streamd_snapshot_state
func exportSnapshotState(id int64) int32 { return doSnapshot(id) }

//go:wasmexport streamd_notify_checkpoint_complete
func exportNotifyCheckpointComplete(id int64) int32 { return doNotify(id) }

//go:wasmexport streamd_close
func exportClose() int32 { return doClose() }

// The host passes record headers to a guest that exports this (ABI.md,
// "Record headers"); it is never called.
//
//go:wasmexport streamd_record_headers
func exportRecordHeaders() {}

// input returns the n bytes at ptr, which must lie in the alloc buffer.
func input(ptr, n int32) ([]byte, bool) {
	if n == 0 {
		return nil, true
	}
	if n < 0 || len(inbuf) == 0 {
		return nil, false
	}
	base := uint64(uintptr(unsafe.Pointer(unsafe.SliceData(inbuf))))
	p := uint64(uint32(ptr))
	if p < base || p-base+uint64(n) > uint64(len(inbuf)) {
		return nil, false
	}
	off := int(p - base)
	return inbuf[off : off+int(n) : off+int(n)], true
}

func badPointer(p phase, ptr, n int32) int32 {
	hostLog(int32(LevelError), "streamd: "+p.String()+": the host passed "+itoa(int(n))+" bytes at "+itoa(int(uint32(ptr)))+
		", outside the buffer streamd_alloc returned")
	return statusInvalidInput
}
