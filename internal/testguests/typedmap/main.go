// Command typedmap is a benchmark guest: MapOf(Int64, Int64, v+1), the typed
// twin of rawmap (sdk/gotest BenchmarkTypedVsRawGuest).
package main

import streamd "github.com/streamd/streamd/sdk/go"

func init() {
	streamd.Register(streamd.MapOf(streamd.Int64, streamd.Int64, func(v int64) (int64, error) { return v + 1, nil }))
}

func main() {}
