//go:build wasip1

package main

import "unsafe"

//go:wasmimport streamd_v1 state_ttl
func importStateTTL(name unsafe.Pointer, nameLen uint32, ttlMs int64, flags int32)

// stateTTL calls the state_ttl import itself, past the SDK's own check.
func stateTTL(name string, ttlMs int64) {
	importStateTTL(unsafe.Pointer(unsafe.StringData(name)), uint32(len(name)), ttlMs, 0)
}
