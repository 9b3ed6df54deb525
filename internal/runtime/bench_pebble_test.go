package runtime

import (
	"context"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/internal/checkpoint"
	"github.com/streamd/streamd/internal/jobfile"
	"github.com/streamd/streamd/internal/testwasm"
)

// BenchmarkPebbleStateCheckpointVsNone: generator -> keyed wasm counter on
// the pebble backend (STREAMD_BENCH_PEBBLE_KEYS distinct keys, default 16M,
// 100-byte state per key; a 256 MiB block cache) -> discard, each key
// written once per run, with incremental checkpoints every second and
// without, alternating. Reported: the checkpointing run's throughput as %
// of none's (target >= 50), the process's peak RSS (target <= 1 GB), then,
// restored from the last checkpoint of the checkpointing run into the same
// store, a run at a rate that changes 1% of the keys per second: the bytes
// each of its checkpoints wrote as % of the full state's (target <= 5;
// the median), and the time from the restore's start to its first
// completed checkpoint (the restore and one interval).
func BenchmarkPebbleStateCheckpointVsNone(b *testing.B) {
	bigState(b)
	keys := 16_000_000
	if s := os.Getenv("STREAMD_BENCH_PEBBLE_KEYS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1000 {
			b.Fatalf("STREAMD_BENCH_PEBBLE_KEYS=%q: want a count >= 1000", s)
		}
		keys = n
	}
	mod := testwasm.Path(b, "internal/testguests/failonce/failonce.wasm")
	eng := benchEngine(b)
	state := jobfile.StateSettings{Backend: jobfile.StatePebble, CacheMiB: 256, Incremental: true}
	job := func(count, rate int) *control.JobGraph {
		spec := &jobfile.SourceSpec{Type: "generator", Count: int64(count), Rate: float64(rate), KeyPattern: "key-{k}", ValuePattern: "v", Keys: int64(keys), TSStep: 1}
		return graph(b,
			src("gen", 1, spec),
			op("count", 1, &jobfile.WasmSpec{Path: mod, Config: map[string]string{"mode": "count", "state_bytes": "100"}}, in("gen", control.Hash)),
			sink("out", 1, &jobfile.SinkSpec{Type: "discard"}, in("count", control.Forward)),
		)
	}
	var last *checkpoint.Metadata
	var store *checkpoint.Dir
	var lastMu sync.Mutex
	run := func(interval time.Duration) {
		opts := Options{Engine: eng, State: state, DataDir: b.TempDir()}
		if interval > 0 {
			store = openStoreRetain(b, b.TempDir(), 4)
			opts.Checkpoint = &CheckpointOptions{Store: store, Interval: interval, OnComplete: func(md *checkpoint.Metadata) {
				if md.Kind == control.KindCheckpoint && md.Operator("gen").Finished == control.OperatorRunning {
					lastMu.Lock()
					last = md
					lastMu.Unlock()
				}
			}}
		}
		if _, err := Run(context.Background(), job(keys, 0), opts); err != nil {
			b.Fatal(err)
		}
	}
	alternate(b, keys, []string{"none", "1s"}, func(i int) { run(time.Duration(i) * time.Second) })
	b.ReportMetric(peakRSSMiB(), "MiB-peak-rss")
	if last == nil {
		b.Fatal("the checkpointing run completed no checkpoint")
	}

	// 1% of the keys per second, from the last checkpoint.
	g := job(keys+keys/10, keys/100)
	start := time.Now()
	rs, err := checkpoint.LoadRestoreFrom(context.Background(), store, last, g)
	if err != nil {
		b.Fatal(err)
	}
	var ratios []float64
	var restored time.Duration
	opts := Options{Engine: eng, State: state, DataDir: b.TempDir(), Restore: rs,
		Checkpoint: &CheckpointOptions{Store: store, Interval: time.Second, OnComplete: func(md *checkpoint.Metadata) {
			if restored == 0 {
				restored = time.Since(start)
			}
			if md.Kind == control.KindCheckpoint && md.ID > last.ID+1 { // the first one includes the catch-up
				lastMu.Lock()
				ratios = append(ratios, 100*float64(md.IncrementalSize())/float64(md.FullSize()))
				lastMu.Unlock()
			}
		}}}
	if _, err := Run(context.Background(), g, opts); err != nil {
		b.Fatal(err)
	}
	if len(ratios) == 0 {
		b.Fatal("no checkpoint at 1% of the keys per second")
	}
	mean := 0.0
	for _, r := range ratios {
		mean += r / float64(len(ratios))
	}
	slices.Sort(ratios)
	b.ReportMetric(ratios[len(ratios)/2], "1pct-written-%-of-full")
	b.ReportMetric(mean, "1pct-written-%-of-full-mean")
	b.ReportMetric(float64(len(ratios)), "1pct-checkpoints")
	b.ReportMetric(float64(last.FullSize())/(1<<20), "MiB-full-state")
	b.ReportMetric(restored.Seconds(), "s-restore-to-first-checkpoint")
}

// resetPeakRSS starts a new peak of the process's resident set (Linux:
// VmHWM becomes the current RSS); false if it cannot.
// It first returns the Go heap's free memory to the OS, so that the peak
// that follows is not that of what ran before.
func resetPeakRSS() bool {
	debug.FreeOSMemory()
	return os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) == nil
}

// peakRSSMiB is the process's peak resident set (VmHWM), 0 if unknown.
func peakRSSMiB() float64 {
	data, err := os.ReadFile(filepath.Join("/proc", "self", "status"))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			return kb / 1024
		}
	}
	return 0
}

// BenchmarkStateScaling: how checkpoint and restore cost grow with the
// state, on both backends. For each backend and key count (the sizes in
// STREAMD_BENCH_STATE_SIZES, default 100k,1M,4M,16M; 100-byte state per
// key) a keyed counter writes every key once, and 1.5M records more, with a
// checkpoint every second (pebble: incremental); reported are the duration
// and full size of its last checkpoint while it ran, then the time to restore that checkpoint: reading and
// redistributing it plus the slowest subtask's load of its keyed state, and
// the peak RSS from the restore to the end of the restored run (which
// processes the records again). The memory rows restore full checkpoints,
// read as streams; the pebble rows incremental ones (files). The streamed
// restore of a full snapshot into pebble is measured by
// TestRestoreLargeSavepointIntoPebble (internal/checkpoint).
func BenchmarkStateScaling(b *testing.B) {
	bigState(b)
	sizes := []int{100_000, 1_000_000, 4_000_000, 16_000_000}
	if s := os.Getenv("STREAMD_BENCH_STATE_SIZES"); s != "" {
		sizes = sizes[:0]
		for _, f := range strings.Split(s, ",") {
			f = strings.TrimSpace(f)
			mul := 1
			if n, ok := strings.CutSuffix(f, "M"); ok {
				f, mul = n, 1_000_000
			} else if n, ok := strings.CutSuffix(f, "k"); ok {
				f, mul = n, 1_000
			}
			n, err := strconv.Atoi(f)
			if err != nil || n < 1 {
				b.Fatalf("STREAMD_BENCH_STATE_SIZES=%q: want counts like 100k,1M", s)
			}
			sizes = append(sizes, n*mul)
		}
	}
	mod := testwasm.Path(b, "internal/testguests/failonce/failonce.wasm")
	eng := benchEngine(b)
	label := func(n int) string {
		if n%1_000_000 == 0 {
			return strconv.Itoa(n/1_000_000) + "M"
		}
		return strconv.Itoa(n/1_000) + "k"
	}
	for range b.N {
		for _, backend := range []string{jobfile.StateMemory, jobfile.StatePebble} {
			state := jobfile.StateSettings{Backend: backend}
			if backend == jobfile.StatePebble {
				state = jobfile.StateSettings{Backend: backend, CacheMiB: 256, Incremental: true}
			}
			for _, keys := range sizes {
				g := graph(b,
					src("gen", 1, &jobfile.SourceSpec{Type: "generator", Count: int64(keys) + 1_500_000, KeyPattern: "key-{k}", ValuePattern: "v", Keys: int64(keys), TSStep: 1}),
					op("count", 1, &jobfile.WasmSpec{Path: mod, Config: map[string]string{"mode": "count", "state_bytes": "100"}}, in("gen", control.Hash)),
					sink("out", 1, &jobfile.SinkSpec{Type: "discard"}, in("count", control.Forward)),
				)
				store := openStoreRetain(b, b.TempDir(), 4)
				var last *checkpoint.Metadata
				var mu sync.Mutex
				stats, err := Run(context.Background(), g, Options{Engine: eng, State: state, DataDir: b.TempDir(),
					Checkpoint: &CheckpointOptions{Store: store, Interval: time.Second, OnComplete: func(md *checkpoint.Metadata) {
						if md.Kind == control.KindCheckpoint && md.Operator("count").Finished == control.OperatorRunning {
							mu.Lock()
							last = md
							mu.Unlock()
						}
					}}})
				if err != nil {
					b.Fatal(err)
				}
				if last == nil {
					b.Logf("%s %s: no checkpoint with state completed", backend, label(keys))
					continue
				}
				var dur time.Duration
				for _, c := range stats.Recent {
					if c.ID == last.ID {
						dur = c.Duration
					}
				}
				rss := resetPeakRSS()
				start := time.Now()
				rs, err := checkpoint.LoadRestoreFrom(context.Background(), store, last, g)
				if err != nil {
					b.Fatal(err)
				}
				load := time.Since(start)
				rstats, err := Run(context.Background(), g, Options{Engine: eng, State: state, DataDir: b.TempDir(), Restore: rs,
					Checkpoint: &CheckpointOptions{Store: openStore(b, b.TempDir()), Interval: time.Hour}})
				if err != nil {
					b.Fatal(err)
				}
				name := backend + "-" + label(keys)
				b.ReportMetric(dur.Seconds(), name+"-s-checkpoint")
				b.ReportMetric(float64(last.FullSize())/(1<<20), name+"-MiB")
				b.ReportMetric((load + rstats.Operators[1].MaxRestore).Seconds(), name+"-s-restore")
				if rss {
					b.ReportMetric(peakRSSMiB(), name+"-MiB-restore-peak-rss")
				}
				b.Logf("%s: checkpoint %d, load %v, subtask restore %v", name, last.ID, load, rstats.Operators[1].MaxRestore)
			}
		}
	}
}

func openStoreRetain(b *testing.B, dir string, n int) *checkpoint.Dir {
	st, err := checkpoint.OpenDir(dir, checkpoint.WithRetain(n))
	if err != nil {
		b.Fatal(err)
	}
	return st
}

// bigState skips a large-state benchmark unless STREAMD_BENCH_BIG_STATE is
// set (make bench runs them in a suite of their own: minutes each).
func bigState(b *testing.B) {
	if os.Getenv("STREAMD_BENCH_BIG_STATE") == "" {
		b.Skip("set STREAMD_BENCH_BIG_STATE=1 (make bench does)")
	}
}
