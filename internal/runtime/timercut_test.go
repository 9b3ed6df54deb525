package runtime

import (
	"context"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/internal/checkpoint"
	"github.com/streamd/streamd/internal/jobfile"
	"github.com/streamd/streamd/internal/testwasm"
)

// TestTimersAcrossCutsAndRestore: wordcount's counter (a timer per key,
// registered at the key's first record, all firing at the end of input)
// on the memory backend, checkpointed every 10 ms while it registers its
// timers, so many cuts take timers registered since the one before; a
// stage in front fails once, and the job restores from the latest
// checkpoint. Every key's timer fires exactly once after the restore, with
// the exact count: no timer lost or doubled by a cut or by the restore.
func TestTimersAcrossCutsAndRestore(t *testing.T) {
	fail := testwasm.Path(t, "internal/testguests/failonce/failonce.wasm")
	count := testwasm.Path(t, "examples/wasm/wordcount/count.wasm")
	const n, keys, p = 6000, 2000, 2
	dir := t.TempDir()
	out := filepath.Join(dir, "out")
	gen := &jobfile.SourceSpec{Type: "generator", Count: n, Rate: 16000, KeyPattern: "key-{k}", ValuePattern: "v", Keys: keys, TSStep: 1}
	g := graph(t,
		src("src", p, gen),
		op("fail", p, &jobfile.WasmSpec{Path: fail, Config: map[string]string{"fail_at": fmt.Sprint(n / p / 2)}}, in("src", control.Forward)),
		op("count", p, &jobfile.WasmSpec{Path: count}, in("fail", control.Hash)),
		sink("out", p, &jobfile.SinkSpec{Type: "file", Path: out}, in("count", control.Forward)),
	)
	var completed atomic.Int32
	stats, err := Run(context.Background(), g, Options{
		Engine: cachedEngine(t), BatchSize: 64,
		Checkpoint: &CheckpointOptions{Store: openStore(t, filepath.Join(dir, "chk")), Interval: 10 * time.Millisecond, Tick: 5 * time.Millisecond,
			OnComplete: func(*checkpoint.Metadata) { completed.Add(1) }},
		Restart: jobfile.RestartSettings{Strategy: jobfile.RestartFixedDelay, Attempts: 2},
	})
	if err != nil {
		t.Fatal(err)
	}
	if stats.Restarts != 1 {
		t.Fatalf("restarts %d, want 1", stats.Restarts)
	}
	if c := completed.Load(); c < 2 {
		t.Fatalf("%d checkpoints completed, want several", c)
	}
	var want []string
	for k := range keys {
		want = append(want, fmt.Sprintf("key-%d %d", k, n/keys))
	}
	checkExactlyOnce(t, committed(t, out), want)
}
