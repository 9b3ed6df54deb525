package runtime

import (
	"context"
	"testing"
	"time"

	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/internal/jobfile"
	"github.com/streamd/streamd/internal/testwasm"
)

// BenchmarkState1MKeysCheckpointVsNone: generator -> keyed wasm counter
// (1M distinct keys, 100-byte state per key: about 120 MB of state) ->
// discard, with a checkpoint every second and without, alternating in one
// benchmark (3M records each, so the state is at its full size for most of
// the run and several checkpoints complete). Reported: the checkpointing
// run's throughput as % of none's (target >= 80), the longest synchronous
// snapshot pause of the keyed subtask (target <= 10 ms: the cut, not a
// copy) and the state size per checkpoint. Three turns per iteration, as
// make bench runs one: single turns on the shared machine gave 70% to 94%
// on the same code.
func BenchmarkState1MKeysCheckpointVsNone(b *testing.B) {
	const n, keys = 3_000_000, 1_000_000
	mod := testwasm.Path(b, "internal/testguests/failonce/failonce.wasm")
	eng := benchEngine(b)
	run := func(n int, interval time.Duration) Stats {
		spec := &jobfile.SourceSpec{Type: "generator", Count: int64(n), KeyPattern: "key-{k}", ValuePattern: "v", Keys: keys, TSStep: 1}
		g := graph(b,
			src("gen", 1, spec),
			op("count", 1, &jobfile.WasmSpec{Path: mod, Config: map[string]string{"mode": "count", "state_bytes": "100"}}, in("gen", control.Hash)),
			sink("out", 1, &jobfile.SinkSpec{Type: "discard"}, in("count", control.Forward)),
		)
		opts := Options{Engine: eng}
		if interval > 0 {
			opts.Checkpoint = &CheckpointOptions{Store: openStore(b, b.TempDir()), Interval: interval}
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
	run(10000, 0)
	var checkpoints int
	var pause time.Duration
	var size int64
	const rounds = 3
	alternateRounds(b, rounds, n, []string{"none", "1s"}, func(i int) {
		if i == 0 {
			run(n, 0)
			return
		}
		st := run(n, time.Second)
		checkpoints += st.Checkpoints
		pause = max(pause, st.Operators[1].MaxSnapshotPause)
		for _, c := range st.Recent {
			size = max(size, c.Size)
		}
	})
	b.ReportMetric(float64(checkpoints)/float64(b.N*rounds), "checkpoints/run")
	b.ReportMetric(float64(pause.Microseconds())/1000, "ms-max-sync-pause")
	b.ReportMetric(float64(size)/(1<<20), "MiB-state")
}
