//go:build wasip1

package main

import (
	"encoding/binary"
	"unsafe"

	streamd "github.com/streamd/streamd/sdk/go"
)

//go:wasmimport streamd_v1 emit_to
func importEmitTo(name unsafe.Pointer, nameLen uint32, batch unsafe.Pointer, batchLen uint32)

//go:wasmimport streamd_v1 emit_watermark
func importEmitWatermark(ts int64)

// emitToRaw sends r to side output name through the import, unchecked.
func emitToRaw(name string, r streamd.Record) {
	b := binary.LittleEndian.AppendUint32(nil, 1)
	b = binary.LittleEndian.AppendUint64(b, uint64(r.Timestamp))
	b = binary.LittleEndian.AppendUint32(b, uint32(len(r.Key)))
	b = append(b, r.Key...)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(r.Value)))
	b = append(b, r.Value...)
	importEmitTo(unsafe.Pointer(unsafe.StringData(name)), uint32(len(name)), unsafe.Pointer(unsafe.SliceData(b)), uint32(len(b)))
}

// emitWatermarkRaw calls the import, unchecked.
func emitWatermarkRaw(ts int64) { importEmitWatermark(ts) }
