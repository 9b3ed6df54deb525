package runtime

import (
	"context"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	nooptrace "go.opentelemetry.io/otel/trace/noop"

	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/internal/jobfile"
	"github.com/streamd/streamd/internal/testwasm"
)

// BenchmarkTracingOff and BenchmarkTracingOn run the same checkpointing
// pipeline, generator -> Rust guest map (p=2, hash) -> discard with a
// checkpoint every 100 ms, once with the no-op tracer provider (tracing off,
// the default) and once with a real SDK provider sampling everything into a
// batcher with a discarding exporter. One b.N iteration is one record. make
// bench reports On / Off in records/s (target >= 0.95): tracing adds spans
// per lifecycle phase and per checkpoint, nothing per record.
func BenchmarkTracingOff(b *testing.B) {
	benchTracing(b, nooptrace.NewTracerProvider())
}

func BenchmarkTracingOn(b *testing.B) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(tracetest.NewNoopExporter()), sdktrace.WithSampler(sdktrace.AlwaysSample()))
	b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	benchTracing(b, tp)
}

func benchTracing(b *testing.B, tp trace.TracerProvider) {
	run := tracingRunner(b, tp)
	run(10000) // warm up: compile (and cache) the module, fill the pools
	b.ReportAllocs()
	b.ResetTimer()
	run(b.N)
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "records/s")
}

// BenchmarkTracingOnVsOff alternates the two (500k records each per
// iteration), so that both see the same machine, and reports each one's
// records/s and on as a percentage of off.
func BenchmarkTracingOnVsOff(b *testing.B) {
	const n = 500_000
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(tracetest.NewNoopExporter()), sdktrace.WithSampler(sdktrace.AlwaysSample()))
	b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	off, on := tracingRunner(b, nooptrace.NewTracerProvider()), tracingRunner(b, tp)
	off(10000)
	on(10000)
	var toff, ton time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		off(n)
		mid := time.Now()
		on(n)
		toff, ton = toff+mid.Sub(start), ton+time.Since(mid)
	}
	rate := func(d time.Duration) float64 { return float64(b.N) * n / d.Seconds() }
	b.ReportMetric(rate(toff), "off-records/s")
	b.ReportMetric(rate(ton), "on-records/s")
	b.ReportMetric(100*rate(ton)/rate(toff), "on-%-of-off")
}

// tracingRunner runs the benchmark pipeline with n records, its spans made by tp.
func tracingRunner(b *testing.B, tp trace.TracerProvider) func(n int) {
	wasm := testwasm.Path(b, "examples/wasm/uppercase-rust/uppercase_rust.wasm")
	eng := benchEngine(b)
	return func(n int) {
		spec := &jobfile.SourceSpec{Type: "generator", Count: int64(n), KeyPattern: "key-{k}", ValuePattern: "value-{n}",
			Keys: 1000, ValueSize: 100, TSStep: 1}
		g := graph(b,
			src("gen", 2, spec),
			op("map", 2, &jobfile.WasmSpec{Path: wasm}, in("gen", control.Hash)),
			sink("out", 2, &jobfile.SinkSpec{Type: "discard"}, in("map", control.Forward)),
		)
		stats, err := Run(context.Background(), g, Options{Engine: eng, TracerProvider: tp,
			Checkpoint: &CheckpointOptions{Store: openStore(b, b.TempDir()), Interval: 100 * time.Millisecond}})
		if err != nil {
			b.Fatal(err)
		}
		if got := stats.Operators[2].RecordsIn; got != int64(n) {
			b.Fatalf("discard got %d records, want %d", got, n)
		}
	}
}
