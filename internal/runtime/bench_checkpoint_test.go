package runtime

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/internal/jobfile"
	"github.com/streamd/streamd/internal/testwasm"
)

// Checkpoint benchmarks. One b.N iteration of the throughput benchmarks is
// one record through generator -> keyed wasm counter (hash) -> discard at
// parallelism 2; give them at least a few seconds so several checkpoints
// happen:
//
//	go test -run '^$' -bench 'Checkpoint|Failover|FinalCheckpoint' -benchtime 3000000x ./internal/runtime/

func benchCheckpointThroughput(b *testing.B, interval time.Duration) {
	run := checkpointRunner(b, interval, control.AlignAligned)
	run(10000)
	b.ResetTimer()
	stats := run(b.N)
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "records/s")
	b.ReportMetric(float64(stats.Checkpoints), "checkpoints")
}

// checkpointRunner returns a function that runs generator -> keyed wasm
// counter (hash) -> discard at parallelism 2 with n records, checkpointing
// every interval (0: no checkpointing) with barriers aligned as mode says,
// and checks they all arrived. tweak, if given, changes the options and the
// generator of each run.
func checkpointRunner(b *testing.B, interval time.Duration, mode control.AlignmentMode, tweak ...func(*Options, *jobfile.SourceSpec)) func(n int) Stats {
	mod := testwasm.Path(b, "internal/testguests/failonce/failonce.wasm")
	eng := benchEngine(b)
	return func(n int) Stats {
		spec := &jobfile.SourceSpec{Type: "generator", Count: int64(n), KeyPattern: "key-{k}", ValuePattern: "value-{n}", Keys: 1000, TSStep: 1}
		g := graph(b,
			src("gen", 2, spec),
			op("count", 2, &jobfile.WasmSpec{Path: mod, Config: map[string]string{"mode": "count"}}, in("gen", control.Hash)),
			sink("out", 2, &jobfile.SinkSpec{Type: "discard"}, in("count", control.Forward)),
		)
		opts := Options{Engine: eng}
		if interval > 0 {
			opts.Checkpoint = &CheckpointOptions{Store: openStore(b, b.TempDir()), Interval: interval, Mode: mode}
		}
		for _, f := range tweak {
			f(&opts, spec)
		}
		stats, err := Run(context.Background(), g, opts)
		if err != nil {
			b.Fatal(err)
		}
		if got := stats.Operators[2].RecordsIn; got != int64(n) {
			b.Fatalf("discard got %d records, want %d", got, n)
		}
		return stats
	}
}

// BenchmarkCheckpointVsNone alternates the checkpointing pipeline with a
// checkpoint every second and the same pipeline without checkpoints (3M
// records each, three turns each per iteration, so a few checkpoints
// complete and one slow moment does not decide), so both see the
// same machine, and reports checkpointing's throughput as a percentage of
// none's (target >= 90).
func BenchmarkCheckpointVsNone(b *testing.B) {
	const n = 3_000_000
	none, every := checkpointRunner(b, 0, control.AlignAligned), checkpointRunner(b, time.Second, control.AlignAligned)
	none(10000)
	every(10000)
	var checkpoints int
	const rounds = 3
	alternateRounds(b, rounds, n, []string{"none", "1s"}, func(i int) {
		if i == 0 {
			none(n)
			return
		}
		checkpoints += every(n).Checkpoints
	})
	b.ReportMetric(float64(checkpoints)/float64(b.N*rounds), "checkpoints/run")
}

// alternate runs run(0), run(1), ... in turn b.N times, each over n records,
// and reports each one's records/s and every later one as a percentage of
// the first ("<name>-%-of-<first>").
func alternate(b *testing.B, n int, names []string, run func(i int)) {
	b.Helper()
	alternateRounds(b, 1, n, names, run)
}

// alternateRounds is alternate with rounds turns per iteration: for a
// benchmark whose iteration takes long enough that make bench runs one,
// which a single slow moment of the shared machine would skew.
func alternateRounds(b *testing.B, rounds, n int, names []string, run func(i int)) {
	b.Helper()
	spent := make([]time.Duration, len(names))
	b.ResetTimer()
	for it := 0; it < b.N*rounds; it++ {
		for i := range names {
			start := time.Now()
			run(i)
			spent[i] += time.Since(start)
		}
	}
	b.StopTimer()
	rate := func(d time.Duration) float64 { return float64(b.N*rounds) * float64(n) / d.Seconds() }
	for i, name := range names {
		b.ReportMetric(rate(spent[i]), name+"-records/s")
		if i > 0 {
			b.ReportMetric(100*rate(spent[i])/rate(spent[0]), name+"-%-of-"+names[0])
		}
	}
}

// BenchmarkStateBackends alternates the keyed-counter pipeline with the
// memory and the pebble backend (1M records over 100k keys per iteration,
// a checkpoint every second) and reports pebble's throughput as a
// percentage of memory's:
//
//	go test -run '^$' -bench StateBackends -benchtime 2x ./internal/runtime/
func BenchmarkStateBackends(b *testing.B) {
	const n, keys = 1_000_000, 100_000
	backend := func(name string) func(*Options, *jobfile.SourceSpec) {
		return func(o *Options, s *jobfile.SourceSpec) {
			o.State, o.DataDir, s.Keys = jobfile.StateSettings{Backend: name, CacheMiB: 64}, b.TempDir(), keys
		}
	}
	mem := checkpointRunner(b, time.Second, control.AlignAligned, backend(jobfile.StateMemory))
	peb := checkpointRunner(b, time.Second, control.AlignAligned, backend(jobfile.StatePebble))
	mem(10000)
	peb(10000)
	alternate(b, n, []string{"memory", "pebble"}, func(i int) {
		if i == 0 {
			mem(n)
			return
		}
		peb(n)
	})
}

func BenchmarkNoCheckpoint(b *testing.B)         { benchCheckpointThroughput(b, 0) }
func BenchmarkCheckpointInterval1s(b *testing.B) { benchCheckpointThroughput(b, time.Second) }

// failover is a native sink that fails in attempt 0 once a checkpoint is
// complete, and records when it failed and when attempt 1 processed again.
type failover struct {
	mu               sync.Mutex
	failed, resumed  time.Time
	notified         bool
	errInjected      error
	attempt0Subtasks int
}

type failoverOp struct {
	f    *failover
	info SubtaskInfo
	noop
}

func (f *failover) factory(info SubtaskInfo) NativeOperator { return &failoverOp{f: f, info: info} }

func (o *failoverOp) Process(context.Context, int, []abi.Record, Emitter) error {
	f := o.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if o.info.Attempt == 0 && f.notified && o.info.Subtask == 0 {
		f.failed = time.Now()
		return f.errInjected
	}
	if o.info.Attempt > 0 && f.resumed.IsZero() {
		f.resumed = time.Now()
	}
	return nil
}

func (o *failoverOp) SnapshotState(context.Context, int64) error { return nil }
func (o *failoverOp) NotifyCheckpointComplete(context.Context, int64) error {
	o.f.mu.Lock()
	o.f.notified = true
	o.f.mu.Unlock()
	return nil
}

// BenchmarkFailoverRestart8: time from a subtask failure to records being
// processed again, for a job of 8 subtasks (4 generator, 4 sink), restarting
// from its latest checkpoint with no restart delay. Reported as ms/failover.
func BenchmarkFailoverRestart8(b *testing.B) {
	var total time.Duration
	for i := 0; i < b.N; i++ {
		f := &failover{errInjected: errors.New("injected failure")}
		spec := &jobfile.SourceSpec{Type: "generator", Rate: 200000, KeyPattern: "key-{k}", ValuePattern: "value-{n}", Keys: 100, TSStep: 1}
		g := graph(b,
			src("gen", 4, spec),
			sink("fail", 4, NativeFactory(f.factory), in("gen", control.Hash)),
		)
		ctx, cancel := context.WithCancel(context.Background())
		go func() {
			for {
				time.Sleep(5 * time.Millisecond)
				f.mu.Lock()
				done := !f.resumed.IsZero()
				f.mu.Unlock()
				if done {
					cancel()
					return
				}
			}
		}()
		_, err := Run(ctx, g, Options{Restart: jobfile.RestartSettings{Strategy: jobfile.RestartFixedDelay, Attempts: 1},
			Checkpoint: &CheckpointOptions{Store: openStore(b, b.TempDir()), Interval: 20 * time.Millisecond, Tick: 5 * time.Millisecond}})
		cancel()
		if !errors.Is(err, context.Canceled) {
			b.Fatalf("run: %v", err)
		}
		total += f.resumed.Sub(f.failed)
	}
	b.ReportMetric(float64(total.Microseconds())/1000/float64(b.N), "ms/failover")
}

// endStamp is a native map that records when its input ended.
type endStamp struct {
	mu  sync.Mutex
	end time.Time
	noop
}

type endStampOp struct {
	s *endStamp
	noop
}

func (o *endStampOp) Process(_ context.Context, _ int, recs []abi.Record, emit Emitter) error {
	emit(recs)
	return nil
}

func (o *endStampOp) EndInput(context.Context, int, Emitter) error {
	o.s.mu.Lock()
	if o.s.end.IsZero() {
		o.s.end = time.Now()
	}
	o.s.mu.Unlock()
	return nil
}

// benchFinalCheckpoint: time from the sources' end of input (the first
// operator's end_input) to the job finished, with a chain of depth native
// operators before a file sink, parallelism 2 and a checkpoint interval of
// one hour: the final checkpoint is triggered at once, with barriers aligned
// as mode says.
func benchFinalCheckpoint(b *testing.B, depth int, mode control.AlignmentMode) {
	var total time.Duration
	for i := 0; i < b.N; i++ {
		es := &endStamp{}
		vs := []*control.Vertex{src("src", 2, genSpec(1000))}
		prev := "src"
		for d := 0; d < depth; d++ {
			uid := fmt.Sprint("op", d)
			var spec any = NativeFactory(newUpper)
			if d == 0 {
				spec = NativeFactory(func(SubtaskInfo) NativeOperator { return &endStampOp{s: es} })
			}
			part := control.Forward
			if d == 0 {
				part = control.Rebalance
			}
			vs = append(vs, op(uid, 2, spec, in(prev, part)))
			prev = uid
		}
		vs = append(vs, sink("out", 2, &jobfile.SinkSpec{Type: "file", Path: filepath.Join(b.TempDir(), "out")}, in(prev, control.Forward)))
		g := graph(b, vs...)
		_, err := Run(context.Background(), g, Options{BatchSize: 100,
			Checkpoint: &CheckpointOptions{Store: openStore(b, b.TempDir()), Interval: time.Hour, Mode: mode}})
		if err != nil {
			b.Fatal(err)
		}
		total += time.Since(es.end)
	}
	b.ReportMetric(float64(total.Microseconds())/1000/float64(b.N), "ms/finish")
}

func BenchmarkFinalCheckpointDepth1(b *testing.B) { benchFinalCheckpoint(b, 1, control.AlignAligned) }
func BenchmarkFinalCheckpointDepth4(b *testing.B) { benchFinalCheckpoint(b, 4, control.AlignAligned) }
func BenchmarkFinalCheckpointDepth8(b *testing.B) { benchFinalCheckpoint(b, 8, control.AlignAligned) }

// BenchmarkStateBackendsNoCheckpoint is BenchmarkStateBackends without
// checkpoints: the backends' hot path alone, pebble's throughput as a
// percentage of memory's (target >= 60):
//
//	go test -run '^$' -bench StateBackendsNoCheckpoint -benchtime 2x ./internal/runtime/
func BenchmarkStateBackendsNoCheckpoint(b *testing.B) {
	const n, keys = 1_000_000, 100_000
	backend := func(name string) func(*Options, *jobfile.SourceSpec) {
		return func(o *Options, s *jobfile.SourceSpec) {
			o.State, o.DataDir, s.Keys = jobfile.StateSettings{Backend: name, CacheMiB: 64}, b.TempDir(), keys
		}
	}
	mem := checkpointRunner(b, 0, control.AlignAligned, backend(jobfile.StateMemory))
	peb := checkpointRunner(b, 0, control.AlignAligned, backend(jobfile.StatePebble))
	mem(10000)
	peb(10000)
	alternate(b, n, []string{"memory", "pebble"}, func(i int) {
		if i == 0 {
			mem(n)
			return
		}
		peb(n)
	})
}
