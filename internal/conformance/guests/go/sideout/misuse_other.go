//go:build !wasip1

package main

import streamd "github.com/streamd/streamd/sdk/go"

// The raw imports need the Wasm host (see misuse_wasip1.go).
func emitToRaw(string, streamd.Record) { panic("sideout: needs GOOS=wasip1") }
func emitWatermarkRaw(int64)           { panic("sideout: needs GOOS=wasip1") }
