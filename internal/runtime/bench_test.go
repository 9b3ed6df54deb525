package runtime

import (
	"context"
	goruntime "runtime"
	"slices"
	"testing"
	"time"

	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/host"
	"github.com/streamd/streamd/internal/jobfile"
	"github.com/streamd/streamd/internal/testwasm"
)

// The pipeline benchmarks run generator -> map -> discard with 100-byte
// values; one b.N iteration is one record, so ns/op is ns per record and
// records/s is the pipeline's throughput. Compare the map implementations:
//
//	go test -run '^$' -bench Pipeline -benchtime 3000000x ./internal/runtime/

func benchPipeline(b *testing.B, mapSpec any, p int, part control.Partitioning, eng *host.Engine) {
	b.Helper()
	run := pipelineRunner(b, mapSpec, p, part, eng)
	run(10000) // warm up: compile (and cache) the module, fill the pools
	b.ReportAllocs()
	b.ResetTimer()
	run(b.N)
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "records/s")
}

// pipelineRunner returns a function that runs generator -> map -> discard
// with n records and checks they all arrived.
func pipelineRunner(b *testing.B, mapSpec any, p int, part control.Partitioning, eng *host.Engine) func(n int) Stats {
	return func(n int) Stats {
		spec := &jobfile.SourceSpec{Type: "generator", Count: int64(n), KeyPattern: "key-{k}", ValuePattern: "value-{n}",
			Keys: 1000, ValueSize: 100, TSStep: 1}
		g := graph(b,
			src("gen", p, spec),
			op("map", p, mapSpec, in("gen", part)),
			sink("out", p, &jobfile.SinkSpec{Type: "discard"}, in("map", control.Forward)),
		)
		stats, err := Run(context.Background(), g, Options{Engine: eng})
		if err != nil {
			b.Fatal(err)
		}
		if got := stats.Operators[2].RecordsIn; got != int64(n) {
			b.Fatalf("discard got %d records, want %d", got, n)
		}
		return stats
	}
}

func benchEngine(b *testing.B) *host.Engine {
	e, err := host.NewEngine(context.Background(), host.WithCacheDir(b.TempDir()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { e.Close(context.Background()) })
	return e
}

func BenchmarkPipelineNativeMap(b *testing.B) {
	benchPipeline(b, NativeFactory(newUpper), 1, control.Forward, nil)
}

func BenchmarkPipelineGoGuest(b *testing.B) {
	wasm := testwasm.Path(b, "examples/wasm/uppercase/uppercase.wasm")
	benchPipeline(b, &jobfile.WasmSpec{Path: wasm}, 1, control.Forward, benchEngine(b))
}

func BenchmarkPipelineRustGuest(b *testing.B) {
	wasm := testwasm.Path(b, "examples/wasm/uppercase-rust/uppercase_rust.wasm")
	benchPipeline(b, &jobfile.WasmSpec{Path: wasm}, 1, control.Forward, benchEngine(b))
}

func BenchmarkPipelineForwardP2(b *testing.B) {
	benchPipeline(b, NativeFactory(newUpper), 2, control.Forward, nil)
}

func BenchmarkPipelineHashP2(b *testing.B) {
	benchPipeline(b, NativeFactory(newUpper), 2, control.Hash, nil)
}

// BenchmarkHashVsForwardP2 alternates the native pipeline at parallelism 2
// with forward and with hash partitioning (2M records each per iteration) and
// reports hash's throughput as a percentage of forward's (target >= 70: hash
// partitioning costs no more than 30%).
func BenchmarkHashVsForwardP2(b *testing.B) {
	const n = 2_000_000
	runs := []func(int) Stats{
		pipelineRunner(b, NativeFactory(newUpper), 2, control.Forward, nil),
		pipelineRunner(b, NativeFactory(newUpper), 2, control.Hash, nil),
	}
	alternate(b, n, []string{"forward", "hash"}, func(i int) { runs[i](n) })
}

// BenchmarkGuestVsNative runs the native and the Rust and Go guest pipelines
// back to back (1M records each per iteration, so they share the machine's
// conditions) and reports each one's records/s and the guests' share of the
// native throughput (target: Rust >= 40%).
func BenchmarkGuestVsNative(b *testing.B) {
	const n = 1_000_000
	eng := benchEngine(b)
	rust := pipelineRunner(b, &jobfile.WasmSpec{Path: testwasm.Path(b, "examples/wasm/uppercase-rust/uppercase_rust.wasm")}, 1, control.Forward, eng)
	goGuest := pipelineRunner(b, &jobfile.WasmSpec{Path: testwasm.Path(b, "examples/wasm/uppercase/uppercase.wasm")}, 1, control.Forward, eng)
	native := pipelineRunner(b, NativeFactory(newUpper), 1, control.Forward, nil)
	rust(10000)
	goGuest(10000)
	var tn, tr, tg time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		tn += native(n).Elapsed
		tr += rust(n).Elapsed
		tg += goGuest(n).Elapsed
	}
	rate := func(d time.Duration) float64 { return float64(b.N) * n / d.Seconds() }
	b.ReportMetric(rate(tn), "native-records/s")
	b.ReportMetric(rate(tr), "rust-records/s")
	b.ReportMetric(rate(tg), "go-records/s")
	b.ReportMetric(100*rate(tr)/rate(tn), "rust-%-of-native")
	b.ReportMetric(100*rate(tg)/rate(tn), "go-%-of-native")
}

// BenchmarkGuardOnVsOff alternates the Rust guest pipeline (generator ->
// Rust uppercase map -> discard, 1M records each per iteration) on an engine
// with the guest guard (the default: instrumented loops that yield to Go,
// host/guard.go, and the 1m call deadline) and on one without it (no
// instrumentation, no deadline), and reports the guarded throughput as a
// percentage of the unguarded one (target >= 90).
func BenchmarkGuardOnVsOff(b *testing.B) {
	const n = 1_000_000
	wasm := &jobfile.WasmSpec{Path: testwasm.Path(b, "examples/wasm/uppercase-rust/uppercase_rust.wasm")}
	off, err := host.NewEngine(context.Background(), host.WithCacheDir(b.TempDir()), host.WithGuard(false), host.WithCallDeadline(0))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { off.Close(context.Background()) })
	runs := []func(int) Stats{
		pipelineRunner(b, wasm, 1, control.Forward, off),
		pipelineRunner(b, wasm, 1, control.Forward, benchEngine(b)),
	}
	for _, r := range runs {
		r(10000) // compile, fill the pools
	}
	alternate(b, n, []string{"off", "on"}, func(i int) { runs[i](n) })
}

// BenchmarkTypedVsRaw alternates the map pipeline (generator -> uppercase map
// -> discard, 100-byte values) written with the raw byte API and with the
// SDKs' typed helpers over the string codecs, Go and Rust side by side: ten
// turns per iteration, each side 200k (Go) or 600k (Rust) records a turn. It
// reports each side's median records/s and each typed side as a percentage
// of its raw twin (SPEC14: target >= 90): the median over the turns of the
// two's throughput in that turn, so that a busy moment of the shared machine
// weighs on one turn only. Go: MapOf(String, String) against the uppercase
// example's Map; Rust: map_view::<Str, Str> (a borrowed &str in, the result
// written straight into the output frame) and map_typed::<Str, Str> (an
// owned String, upper-cased in place) against uppercase-rust's hand-written
// emit_with.
//
//	go test -run '^$' -bench TypedVsRaw -benchtime 3x ./internal/runtime/
func BenchmarkTypedVsRaw(b *testing.B) {
	const turns = 10
	eng := benchEngine(b)
	sides := []struct {
		name, raw, wasm string
		n               int // records a turn: about 0.1 to 0.2 s
	}{
		{"go-raw", "", "examples/wasm/uppercase/uppercase.wasm", 200_000},
		{"go-typed", "go-raw", "examples/wasm/uppercase/typed.wasm", 200_000},
		{"rust-raw", "", "examples/wasm/uppercase-rust/uppercase_rust.wasm", 600_000},
		{"rust-typed", "rust-raw", "internal/testguests/typedupper-rust/typedupper_rust.wasm", 600_000},
		{"rust-owned-typed", "rust-raw", "internal/testguests/typedupper-rust-owned/typedupper_rust_owned.wasm", 600_000},
	}
	runs := make([]func(int) Stats, len(sides))
	for i, s := range sides {
		runs[i] = pipelineRunner(b, &jobfile.WasmSpec{Path: testwasm.Path(b, s.wasm)}, 1, control.Forward, eng)
		runs[i](10000) // compile, fill the pools
	}
	spent := make([][]time.Duration, len(sides)) // per side, per turn
	b.ResetTimer()
	for it := 0; it < b.N*turns; it++ {
		for i, run := range runs {
			// Collect what the previous side left (a Go guest's instance
			// memory is large) so that no side pays for another's garbage.
			goruntime.GC()
			spent[i] = append(spent[i], run(sides[i].n).Elapsed)
		}
	}
	b.StopTimer()
	index := map[string]int{}
	for i, s := range sides {
		index[s.name] = i
		b.ReportMetric(float64(s.n)/median(spent[i]).Seconds(), s.name+"-records/s")
		if s.raw == "" {
			continue
		}
		// The median over the turns of typed/raw throughput in that turn:
		// the raw twin ran just before, in the same conditions.
		raw := spent[index[s.raw]]
		pct := make([]float64, len(raw))
		for t := range raw {
			pct[t] = 100 * float64(raw[t]) / float64(sides[index[s.raw]].n) * float64(s.n) / float64(spent[i][t])
		}
		b.ReportMetric(median(pct), s.name+"-%-of-raw")
	}
}

// median returns the middle value of v (the mean of the middle two for an
// even count).
func median[T int64 | float64 | time.Duration](v []T) T {
	v = slices.Sorted(slices.Values(v))
	if n := len(v); n%2 == 0 {
		return (v[n/2-1] + v[n/2]) / 2
	}
	return v[len(v)/2]
}

// BenchmarkRustVsNative1Core alternates the native and the Rust guest
// pipelines (generator -> uppercase map -> discard, 1M records each per
// turn) with GOMAXPROCS 1, so that the host's framing and copies weigh as
// they do on a busy machine, and reports the guest's throughput as a
// percentage of the native loop's (issue 28: >= 65).
func BenchmarkRustVsNative1Core(b *testing.B) {
	const n = 1_000_000
	defer goruntime.GOMAXPROCS(goruntime.GOMAXPROCS(1))
	runs := []func(int) Stats{
		pipelineRunner(b, NativeFactory(newUpper), 1, control.Forward, nil),
		pipelineRunner(b, &jobfile.WasmSpec{Path: testwasm.Path(b, "examples/wasm/uppercase-rust/uppercase_rust.wasm")}, 1, control.Forward, benchEngine(b)),
	}
	for _, r := range runs {
		r(10000) // compile, fill the pools
	}
	b.ReportAllocs()
	alternate(b, n, []string{"native", "rust"}, func(i int) { runs[i](n) })
}
