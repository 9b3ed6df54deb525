package runtime

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/internal/checkpoint"
	"github.com/streamd/streamd/internal/jobfile"
	"github.com/streamd/streamd/internal/testwasm"
)

// TestGeneratorRestoresRescaled: generator -hash-> a keyed wasm counter ->
// file sink, checkpointed at p=2, restored (as streamd run --from does) at
// p=3 and from a checkpoint of that run at p=1, which runs to the end: the
// generator's positions are rescaled each time (roundrobin) and the
// committed output is every count of every key exactly once.
func TestGeneratorRestoresRescaled(t *testing.T) {
	mod := testwasm.Path(t, "internal/testguests/failonce/failonce.wasm")
	eng := cachedEngine(t)
	const n, keys = 16000, 40
	dir := t.TempDir()
	out, store := filepath.Join(dir, "out"), openStore(t, filepath.Join(dir, "chk"))
	build := func(p int) *control.JobGraph {
		gen := &jobfile.SourceSpec{Type: "generator", Count: n, Rate: 4000, KeyPattern: "key-{k}", ValuePattern: "v-{n}", Keys: keys, TSStep: 1}
		return graph(t,
			src("gen", p, gen),
			op("count", p, &jobfile.WasmSpec{Path: mod, Config: map[string]string{"fail_at": strconv.Itoa(10 * n), "mode": "count"}}, in("gen", control.Hash)),
			sink("out", p, &jobfile.SinkSpec{Type: "file", Path: out}, in("count", control.Rebalance)))
	}
	// run runs the job at p, restored from md unless nil; stopAfter > 0
	// stops it at its stopAfter-th completed checkpoint taken while the
	// generator still runs, which it returns.
	run := func(p int, md *checkpoint.Metadata, stopAfter int) *checkpoint.Metadata {
		g := build(p)
		opts := Options{Engine: eng, BatchSize: 32, ChannelCapacity: 4}
		if md != nil {
			rs, err := checkpoint.LoadRestoreFrom(context.Background(), store, md, g)
			if err != nil {
				t.Fatalf("restore checkpoint %d at p=%d: %v", md.ID, p, err)
			}
			opts.Restore = rs
		}
		ctx, cancel := context.WithCancelCause(context.Background())
		defer cancel(nil)
		stop := fmt.Errorf("test: stop at p=%d", p)
		var taken *checkpoint.Metadata
		seen := 0
		opts.Checkpoint = &CheckpointOptions{Store: store, Interval: 40 * time.Millisecond, Tick: 5 * time.Millisecond,
			OnComplete: func(c *checkpoint.Metadata) {
				om := c.Operator("gen")
				if stopAfter == 0 || taken != nil || om == nil || om.Finished != control.OperatorRunning {
					return
				}
				if seen++; seen == stopAfter {
					taken = c
					cancel(stop)
				}
			}}
		_, err := Run(ctx, g, opts)
		if stopAfter == 0 {
			if err != nil {
				t.Fatalf("p=%d: %v", p, err)
			}
			return nil
		}
		if taken == nil {
			t.Fatalf("p=%d: no checkpoint %d while the generator ran (%v)", p, stopAfter, err)
		}
		if !errors.Is(err, stop) && !errors.Is(context.Cause(ctx), stop) {
			t.Fatalf("p=%d: %v", p, err)
		}
		if om := taken.Operator("gen"); om.Parallelism != p {
			t.Fatalf("checkpoint %d: the generator at %d, want %d", taken.ID, om.Parallelism, p)
		}
		t.Logf("p=%d: stopped at checkpoint %d", p, taken.ID)
		return taken
	}
	md := run(2, nil, 3)
	md = run(3, md, 3)
	run(1, md, 0)
	want := map[string]int{}
	var lines []string
	for i := range n {
		k := fmt.Sprintf("key-%d", i%keys)
		want[k]++
		lines = append(lines, fmt.Sprintf("%s=%d", k, want[k]))
	}
	checkExactlyOnce(t, committed(t, out), lines)
}
