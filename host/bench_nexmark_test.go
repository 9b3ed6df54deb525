package host_test

import (
	"context"
	"runtime"
	"testing"

	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/host"
	"github.com/streamd/streamd/internal/nexmark"
)

// BenchmarkNexmarkGuest: the guest's part of the stateless Nexmark queries
// (examples/nexmark, config query and stage map), with the Go and the Rust
// module, in calls of 1000 generated events (920 bids), reporting ns/event
// and, on Linux, cpu-ns/event: the CPU time of the benchmark's thread, which
// runs the guest, so a loaded machine's waits do not count.
// It is what `streamd bench nexmark q0-go` pays in the guest, apart from the
// source, the sink and the framing between tasks.
func BenchmarkNexmarkGuest(b *testing.B) {
	const batch = 1000
	g := nexmark.NewGenerator(nexmark.Config{})
	recs := make([]abi.Record, batch)
	for i := range recs {
		v, ts := g.Append(nil, int64(i))
		recs[i] = abi.Record{Value: v, Timestamp: ts}
	}
	for _, m := range []struct{ name, target string }{
		{"go", "examples/nexmark/nexmark_go.wasm"},
		{"rust", "examples/nexmark/nexmark_rust.wasm"},
	} {
		for _, q := range []string{"q0", "q1", "q2"} {
			b.Run(m.name+"/"+q, func(b *testing.B) {
				inst := benchInstanceConfig(b, m.target, host.InstanceConfig{NumInputs: 1, Config: map[string]string{"query": q, "stage": "map"}})
				ctx := context.Background()
				out := 0
				emit := func(r []abi.Record) { out += len(r) }
				runtime.LockOSThread()
				defer runtime.UnlockOSThread()
				cpu0, cpuOK := threadCPU()
				b.ResetTimer()
				for n := 0; n < b.N; n++ {
					if err := inst.Process(ctx, 0, recs, emit); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*batch), "ns/event")
				if cpu1, ok := threadCPU(); ok && cpuOK {
					b.ReportMetric(float64((cpu1-cpu0).Nanoseconds())/float64(b.N*batch), "cpu-ns/event")
				}
				if q != "q2" && out != b.N*batch*46/50 { // q0 and q1 emit every bid
					b.Fatalf("the query emitted %d records for %d calls", out, b.N)
				}
			})
		}
	}
}
