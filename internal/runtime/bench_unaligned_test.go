package runtime

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/host"
	"github.com/streamd/streamd/internal/checkpoint"
	"github.com/streamd/streamd/internal/jobfile"
	"github.com/streamd/streamd/internal/testwasm"
)

// Unaligned checkpoint benchmarks (issue 12), each side by side with
// aligned barriers in one benchmark:
//
//	go test -run '^$' -bench 'Unaligned' -benchtime 1x ./internal/runtime/

// The back-pressured pipeline: a generator at bpSourceRate records/s,
// rebalanced over four subtasks of a native map that takes bpPerRecord per
// record (the skewed subtask bpSkew times as long), then a discard sink.
// Round robin gives each subtask a quarter of the records, so the skewed
// subtask sets the pace: 4 / (bpPerRecord * bpSkew) = 4000 records/s, a
// tenth of the source's rate. With batches of bpBatch records and the
// default channel capacity of 16 messages, an aligned barrier queues behind
// about 16 * 100 records at 1 ms each on the skewed channel. The records
// all have timestamp 0: a source whose watermark advances broadcasts it
// after each batch it reads, a message of its own on every channel, which
// would leave room for only half as many record batches.
const (
	bpSourceRate = 40000
	bpPerRecord  = 250 * time.Microsecond
	bpSkew       = 4
	bpSkewed     = 3 // the skewed subtask
	bpBatch      = 100
	bpInterval   = 500 * time.Millisecond
	bpPerRun     = 3 // periodic checkpoints per run
)

// slowMap passes its records on after taking per for each one (a sleep, so
// the stage is slow without taking the machine's cores).
type slowMap struct {
	per time.Duration
	noop
}

func (o *slowMap) Process(_ context.Context, _ int, recs []abi.Record, emit Emitter) error {
	time.Sleep(time.Duration(len(recs)) * o.per)
	emit(recs)
	return nil
}

func newSlowMap(info SubtaskInfo) NativeOperator {
	per := bpPerRecord
	if info.Subtask == bpSkewed {
		per *= bpSkew
	}
	return &slowMap{per: per}
}

// bpCheckpoint is one completed periodic checkpoint of the back-pressured
// pipeline.
type bpCheckpoint struct {
	dur      time.Duration // trigger to durable metadata (Stats.Recent)
	inflight int64         // channel-state bytes (Metadata.InFlightBytes)
}

// backpressuredRun runs the back-pressured pipeline with barriers aligned as
// mode says until bpPerRun periodic checkpoints are complete, and returns
// them with the slow stage's records/s.
func backpressuredRun(b *testing.B, mode control.AlignmentMode) ([]bpCheckpoint, float64) {
	spec := &jobfile.SourceSpec{Type: "generator", Rate: bpSourceRate, KeyPattern: "key-{k}", ValuePattern: "value-{n}", Keys: 1000}
	g := graph(b,
		src("gen", 1, spec),
		op("slow", 4, NativeFactory(newSlowMap), in("gen", control.Rebalance)),
		sink("out", 4, &jobfile.SinkSpec{Type: "discard"}, in("slow", control.Forward)),
	)
	cps, stats := runCheckpoints(b, g, Options{BatchSize: bpBatch}, bpInterval, mode, bpPerRun)
	return cps, float64(stats.Operators[1].RecordsIn) / stats.Elapsed.Seconds()
}

// runCheckpoints runs g with opts, checkpointing every interval with
// barriers aligned as mode says, until n periodic checkpoints are complete,
// and returns them, oldest first, with the run's stats.
func runCheckpoints(b *testing.B, g *control.JobGraph, opts Options, interval time.Duration, mode control.AlignmentMode, n int) ([]bpCheckpoint, Stats) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var mu sync.Mutex
	inflight := map[int64]int64{}
	onComplete := func(md *checkpoint.Metadata) {
		mu.Lock()
		defer mu.Unlock()
		inflight[md.ID] = md.InFlightBytes()
		if len(inflight) == n {
			cancel()
		}
	}
	opts.Checkpoint = &CheckpointOptions{Store: openStore(b, b.TempDir()), Interval: interval, Mode: mode, OnComplete: onComplete}
	stats, err := Run(ctx, g, opts)
	if !errors.Is(err, context.Canceled) {
		b.Fatalf("%s run: %v", mode, err)
	}
	mu.Lock()
	defer mu.Unlock()
	var cps []bpCheckpoint
	for _, c := range stats.Recent {
		if bytes, ok := inflight[c.ID]; ok && len(cps) < n {
			cps = append(cps, bpCheckpoint{dur: c.Duration, inflight: bytes})
		}
	}
	if len(cps) != n {
		b.Fatalf("%s run: %d checkpoints in Stats.Recent, want %d", mode, len(cps), n)
	}
	return cps, stats
}

// BenchmarkUnalignedBackpressure alternates the back-pressured pipeline with
// aligned and with unaligned checkpoints (bpPerRun periodic checkpoints
// each per iteration) and reports each mode's mean checkpoint duration
// (trigger to durable metadata), the slowest unaligned one (target under
// 1 s), unaligned as a percentage of aligned (target <= 20), the in-flight
// bytes an unaligned checkpoint stores, and the slow stage's records/s
// (about a tenth of the source's bpSourceRate when it is back-pressured).
func BenchmarkUnalignedBackpressure(b *testing.B) {
	var al, ua []bpCheckpoint
	var alRate, uaRate float64
	for i := 0; i < b.N; i++ {
		cps, rate := backpressuredRun(b, control.AlignAligned)
		al, alRate = append(al, cps...), alRate+rate
		cps, rate = backpressuredRun(b, control.AlignUnaligned)
		ua, uaRate = append(ua, cps...), uaRate+rate
	}
	b.StopTimer()
	mean := func(cps []bpCheckpoint) (ms float64, bytes float64) {
		for _, c := range cps {
			ms += float64(c.dur.Microseconds()) / 1000
			bytes += float64(c.inflight)
		}
		return ms / float64(len(cps)), bytes / float64(len(cps))
	}
	alMS, _ := mean(al)
	uaMS, uaBytes := mean(ua)
	uaMax := slices.MaxFunc(ua, func(x, y bpCheckpoint) int { return int(x.dur - y.dur) })
	b.ReportMetric(alMS, "aligned-ms/checkpoint")
	b.ReportMetric(uaMS, "unaligned-ms/checkpoint")
	b.ReportMetric(float64(uaMax.dur.Microseconds())/1000, "unaligned-max-ms")
	b.ReportMetric(100*uaMS/alMS, "unaligned-%-of-aligned")
	b.ReportMetric(uaBytes, "unaligned-inflight-B/checkpoint")
	b.ReportMetric(alRate/float64(b.N), "aligned-slow-records/s")
	b.ReportMetric(uaRate/float64(b.N), "unaligned-slow-records/s")
}

// BenchmarkUnalignedVsAligned alternates the checkpoint throughput pipeline
// (generator -> keyed wasm counter -> discard, p=2, no slow stage) with a
// checkpoint every 500 ms aligned and unaligned (3M records each per
// iteration) and reports unaligned's throughput as a percentage of
// aligned's (target >= 90).
func BenchmarkUnalignedVsAligned(b *testing.B) {
	const n = 3_000_000
	const interval = 500 * time.Millisecond
	aligned, unaligned := checkpointRunner(b, interval, control.AlignAligned), checkpointRunner(b, interval, control.AlignUnaligned)
	aligned(10000)
	unaligned(10000)
	var checkpoints [2]int
	alternate(b, n, []string{"aligned", "unaligned"}, func(i int) {
		if i == 0 {
			checkpoints[0] += aligned(n).Checkpoints
			return
		}
		checkpoints[1] += unaligned(n).Checkpoints
	})
	b.ReportMetric(float64(checkpoints[0])/float64(b.N), "aligned-checkpoints/run")
	b.ReportMetric(float64(checkpoints[1])/float64(b.N), "unaligned-checkpoints/run")
}

func BenchmarkFinalCheckpointUnalignedDepth1(b *testing.B) {
	benchFinalCheckpoint(b, 1, control.AlignUnaligned)
}
func BenchmarkFinalCheckpointUnalignedDepth4(b *testing.B) {
	benchFinalCheckpoint(b, 4, control.AlignUnaligned)
}
func BenchmarkFinalCheckpointUnalignedDepth8(b *testing.B) {
	benchFinalCheckpoint(b, 8, control.AlignUnaligned)
}

// The pipeline without back-pressure of issue 24: a generator of 20 KB
// records -hash-> the Rust uppercase guest -> discard, p=2, a checkpoint
// every nbpInterval. The source rate is 100000 records/s (2 GB/s),
// more than a loaded machine's pipeline keeps up with; the benchmark first
// measures what this pipeline does unthrottled, in the same run, and paces
// the source at a third of that (at most nbpMaxRate), so that no stage is
// back-pressured: an unaligned checkpoint should then cost an aligned one's
// time plus the time to write the little its barriers overtake.
const (
	nbpMaxRate   = 100000
	nbpValueSize = 20000
	nbpInterval  = 300 * time.Millisecond
	nbpPerRun    = 6 // completed periodic checkpoints per run; the first is not counted
	nbpRounds    = 2 // runs of each mode per iteration, alternating
)

// noBackpressurePipeline is the job graph of that pipeline, its source
// paced at rate records/s, or bounded at count records when rate is 0.
func noBackpressurePipeline(b *testing.B, wasm string, rate float64, count int64) *control.JobGraph {
	spec := &jobfile.SourceSpec{Type: "generator", Rate: rate, Count: count, KeyPattern: "key-{k}", ValuePattern: "value-{n}",
		Keys: 1000, ValueSize: nbpValueSize, TSStep: 1}
	return graph(b,
		src("gen", 2, spec),
		op("upper", 2, &jobfile.WasmSpec{Path: wasm}, in("gen", control.Hash)),
		sink("out", 2, &jobfile.SinkSpec{Type: "discard"}, in("upper", control.Forward)),
	)
}

// noBackpressureRun runs that pipeline at rate records/s with barriers
// aligned as mode says until nbpPerRun periodic checkpoints are complete and
// returns the durations and in-flight bytes of all but the first.
func noBackpressureRun(b *testing.B, eng *host.Engine, wasm string, rate float64, mode control.AlignmentMode) []bpCheckpoint {
	cps, _ := runCheckpoints(b, noBackpressurePipeline(b, wasm, rate, 0), Options{Engine: eng}, nbpInterval, mode, nbpPerRun)
	return cps[1:]
}

// BenchmarkUnalignedNoBackpressure measures the pipeline's unthrottled
// records/s, then alternates it, paced at a third of that, with aligned and
// with unaligned checkpoints, and reports each mode's median and 90th
// percentile checkpoint duration (trigger to durable metadata), the
// in-flight bytes an unaligned checkpoint stores (median), and the target for
// unaligned's median: 2x aligned's + 20 ms + the time to write its in-flight
// bytes at the disk speed measured in the same run (unaligned-target-ms;
// unaligned-over-target-ms is the median minus the target, <= 0 when met).
func BenchmarkUnalignedNoBackpressure(b *testing.B) {
	eng := benchEngine(b)
	wasm := testwasm.Path(b, "examples/wasm/uppercase-rust/uppercase_rust.wasm")
	const probe = 20000
	stats, err := Run(context.Background(), noBackpressurePipeline(b, wasm, 0, probe), Options{Engine: eng})
	if err != nil {
		b.Fatal(err)
	}
	capacity := probe / stats.Elapsed.Seconds()
	rate := min(nbpMaxRate, capacity/3)
	var al, ua []bpCheckpoint
	b.ResetTimer()
	for i := 0; i < b.N*nbpRounds; i++ {
		al = append(al, noBackpressureRun(b, eng, wasm, rate, control.AlignAligned)...)
		ua = append(ua, noBackpressureRun(b, eng, wasm, rate, control.AlignUnaligned)...)
	}
	b.StopTimer()
	ms := func(cps []bpCheckpoint, q float64) float64 {
		d := make([]float64, len(cps))
		for i, c := range cps {
			d[i] = float64(c.dur.Microseconds()) / 1000
		}
		slices.Sort(d)
		return d[min(len(d)-1, int(q*float64(len(d))))]
	}
	var bytes []float64
	for _, c := range ua {
		bytes = append(bytes, float64(c.inflight))
	}
	uaBytes := median(bytes)
	diskMS := 1000 * uaBytes / diskWriteSpeed(b, int(uaBytes))
	alMed, uaMed := ms(al, 0.5), ms(ua, 0.5)
	target := 2*alMed + 20 + diskMS
	b.ReportMetric(capacity, "unthrottled-records/s")
	b.ReportMetric(rate, "paced-records/s")
	b.ReportMetric(alMed, "aligned-ms-median")
	b.ReportMetric(ms(al, 0.9), "aligned-ms-p90")
	b.ReportMetric(uaMed, "unaligned-ms-median")
	b.ReportMetric(ms(ua, 0.9), "unaligned-ms-p90")
	b.ReportMetric(uaBytes, "unaligned-inflight-B-median")
	b.ReportMetric(diskMS, "inflight-write-ms")
	b.ReportMetric(target, "unaligned-target-ms")
	b.ReportMetric(uaMed-target, "unaligned-over-target-ms")
}

// diskWriteSpeed writes n bytes (at least 1 MiB) to a new file in a temporary
// directory, syncs it, and returns the bytes/s.
func diskWriteSpeed(b *testing.B, n int) float64 {
	n = max(n, 1<<20)
	buf := make([]byte, n)
	path := filepath.Join(b.TempDir(), "speed")
	start := time.Now()
	f, err := os.Create(path)
	if err == nil {
		_, err = f.Write(buf)
		if err == nil {
			err = f.Sync()
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		b.Fatal(err)
	}
	return float64(n) / time.Since(start).Seconds()
}
