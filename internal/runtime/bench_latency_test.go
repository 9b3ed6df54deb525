package runtime

import (
	"context"
	"runtime/debug"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/internal/jobfile"
	"github.com/streamd/streamd/internal/testwasm"
)

// latencySink is a native sink that notes, for every record, when it
// arrived and the record's index n (the generator's value "{n}...").
type latencySink struct {
	noop
	mu   *sync.Mutex
	seen *[]latencySample
}

type latencySample struct {
	n  int64
	at int64 // arrival, ns since the benchmark's start
}

func (s *latencySink) Process(_ context.Context, _ int, recs []abi.Record, _ Emitter) error {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range recs {
		v := r.Value
		i := 0
		for i < len(v) && v[i] >= '0' && v[i] <= '9' {
			i++
		}
		n, err := strconv.ParseInt(string(v[:i]), 10, 64)
		if err != nil {
			return err
		}
		*s.seen = append(*s.seen, latencySample{n: n, at: now.UnixNano()})
	}
	return nil
}

// latencies turns the samples of a generator paced at rate records/s into
// per-record latencies: arrival minus the time the generator had the
// record due (its start plus (n+1)/rate). The generator's start is not
// seen from outside, so it is taken from the record that arrived soonest
// after it was due: the latencies are relative to that best record, which
// in one process is tens of microseconds behind its due time.
func latencies(s []latencySample, rate float64) []time.Duration {
	due := func(x latencySample) int64 { return int64(float64(x.n+1) / rate * 1e9) }
	off := int64(1<<63 - 1)
	for _, x := range s {
		off = min(off, x.at-due(x))
	}
	out := make([]time.Duration, len(s))
	for i, x := range s {
		out[i] = time.Duration(x.at - due(x) - off)
	}
	slices.Sort(out)
	return out
}

// BenchmarkLatency100k runs generator (100k records/s, 100-byte values) ->
// Rust uppercase wasm map -> native sink in one process, with a memory
// checkpoint every second, for 5 s per iteration, and reports the
// percentiles of the records' latency from when the generator had them due
// to the sink (target: p99 <= 3 ms, max <= 25 ms), and what makes a long
// tail: the GC cycles and the longest GC pause of the run, the
// checkpoints' longest synchronous pause, and how late a goroutine that
// sleeps 1 ms at a time woke up at worst (sched-max-late-ms: the machine
// did not run this process; on a shared, loaded machine the max latency
// follows it).
//
//	go test -run '^$' -bench Latency100k -benchtime 1x ./internal/runtime/
func BenchmarkLatency100k(b *testing.B) {
	const rate, secs = 100_000, 5
	eng := benchEngine(b)
	wasm := &jobfile.WasmSpec{Path: testwasm.Path(b, "examples/wasm/uppercase-rust/uppercase_rust.wasm")}
	var all []time.Duration
	var gcs uint32
	var gcMax time.Duration
	var pauseMax, lateMax time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		var mu sync.Mutex
		var seen []latencySample
		spec := &jobfile.SourceSpec{Type: "generator", Count: rate * secs, Rate: rate, ValuePattern: "{n}", ValueSize: 100, TSStep: 1}
		g := graph(b,
			src("gen", 1, spec),
			op("map", 1, wasm, in("gen", control.Forward)),
			sink("out", 1, NativeFactory(func(SubtaskInfo) NativeOperator { return &latencySink{mu: &mu, seen: &seen} }), in("map", control.Forward)),
		)
		opts := Options{Engine: eng, Checkpoint: &CheckpointOptions{Store: openStore(b, b.TempDir()), Interval: time.Second}}
		var before debug.GCStats
		debug.ReadGCStats(&before)
		stopProbe := make(chan struct{})
		probed := make(chan time.Duration)
		go schedProbe(stopProbe, probed)
		stats, err := Run(context.Background(), g, opts)
		close(stopProbe)
		lateMax = max(lateMax, <-probed)
		if err != nil {
			b.Fatal(err)
		}
		var after debug.GCStats
		debug.ReadGCStats(&after)
		gcs += uint32(after.NumGC - before.NumGC)
		for _, p := range after.Pause[:min(len(after.Pause), int(after.NumGC-before.NumGC))] {
			gcMax = max(gcMax, p)
		}
		for _, op := range stats.Operators {
			pauseMax = max(pauseMax, op.MaxSnapshotPause)
		}
		if len(seen) != rate*secs {
			b.Fatalf("sink got %d records, want %d", len(seen), rate*secs)
		}
		all = append(all, latencies(seen, rate)...)
	}
	b.StopTimer()
	slices.Sort(all)
	ms := func(d time.Duration) float64 { return float64(d) / 1e6 }
	pct := func(p float64) time.Duration { return all[min(len(all)-1, int(p*float64(len(all))))] }
	b.ReportMetric(ms(pct(0.5)), "p50-ms")
	b.ReportMetric(ms(pct(0.99)), "p99-ms")
	b.ReportMetric(ms(pct(0.999)), "p999-ms")
	b.ReportMetric(ms(all[len(all)-1]), "max-ms")
	b.ReportMetric(float64(gcs)/float64(b.N), "gc/op")
	b.ReportMetric(ms(gcMax), "gc-max-pause-ms")
	b.ReportMetric(ms(pauseMax), "checkpoint-max-sync-pause-ms")
	b.ReportMetric(ms(lateMax), "sched-max-late-ms")
}

// schedProbe sleeps 1 ms at a time until stop closes, then sends the
// longest it overslept.
func schedProbe(stop <-chan struct{}, out chan<- time.Duration) {
	var late time.Duration
	for {
		select {
		case <-stop:
			out <- late
			return
		default:
		}
		t := time.Now()
		time.Sleep(time.Millisecond)
		late = max(late, time.Since(t)-time.Millisecond)
	}
}
