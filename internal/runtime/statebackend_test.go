package runtime

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/internal/checkpoint"
	"github.com/streamd/streamd/internal/jobfile"
	"github.com/streamd/streamd/internal/testwasm"
)

// TestSavepointAcrossStateBackends: a keyed counter (failonce, mode count)
// runs with one state backend, fails once (restarting from its latest
// checkpoint), and stops with a savepoint mid-run; the savepoint restores
// into the other backend (or the same one) at another parallelism and the
// job runs to the end. The file sink holds every count of every key exactly
// once: the savepoint is canonical, whatever backend wrote or reads it.
//
// The first run's generator is unbounded, so the stop at the 8th checkpoint
// cannot lose a race with the end of its input on a slow machine; the
// second run's generator ends at n or, for a subtask whose savepoint
// position is already past n, at once. The expected output follows from
// the positions the savepoint recorded.
func TestSavepointAcrossStateBackends(t *testing.T) {
	mod := testwasm.Path(t, "internal/testguests/failonce/failonce.wasm")
	eng := cachedEngine(t)
	const n, keys = 6000, 13
	for _, c := range []struct {
		from, to string
		p1, p2   int
	}{
		{jobfile.StateMemory, jobfile.StatePebble, 2, 3},
		{jobfile.StatePebble, jobfile.StateMemory, 3, 2},
		{jobfile.StatePebble, jobfile.StatePebble, 2, 1},
	} {
		t.Run(fmt.Sprintf("%s-p%d-to-%s-p%d", c.from, c.p1, c.to, c.p2), func(t *testing.T) {
			dir := t.TempDir()
			out, data := filepath.Join(dir, "out"), filepath.Join(dir, "data")
			job := func(p int, failAt int, count int64) *control.JobGraph {
				gen := &jobfile.SourceSpec{Type: "generator", Count: count, Rate: 4000, KeyPattern: "key-{k}", ValuePattern: "value-{n}", Keys: keys, TSStep: 1}
				return graph(t,
					src("src", 2, gen),
					op("op", p, &jobfile.WasmSpec{Path: mod, Config: map[string]string{"fail_at": fmt.Sprint(failAt), "mode": "count"}}, in("src", control.Hash)),
					sink("out", 1, &jobfile.SinkSpec{Type: "file", Path: out}, in("op", control.Rebalance)),
				)
			}
			stop := make(chan StopRequest, 1)
			var cps atomic.Int32
			stats, err := Run(context.Background(), job(c.p1, 300, 0), Options{Engine: eng, BatchSize: 64, Stop: stop,
				State: jobfile.StateSettings{Backend: c.from, CacheMiB: 8, Incremental: c.from == jobfile.StatePebble}, DataDir: data,
				Restart: jobfile.RestartSettings{Strategy: jobfile.RestartFixedDelay, Attempts: 2},
				Checkpoint: &CheckpointOptions{Store: openStore(t, filepath.Join(dir, "chk")), Interval: 30 * time.Millisecond, Tick: 5 * time.Millisecond,
					OnComplete: func(*checkpoint.Metadata) {
						if cps.Add(1) == 8 {
							stop <- StopRequest{}
						}
					}}})
			if err != nil {
				t.Fatal(err)
			}
			if stats.Restarts != 1 {
				t.Fatalf("restarts %d, want 1", stats.Restarts)
			}
			// (Records read count both attempts: the restored one reads again
			// what came after the checkpoint it restored.)
			if stats.Savepoint == "" {
				t.Fatalf("not stopped with a savepoint: %d records read over both attempts", stats.Operators[0].RecordsOut)
			}
			checkDataDirEmpty(t, data, c.from == jobfile.StatePebble)
			os.RemoveAll(data)
			g := job(c.p2, 0, n)
			rs, err := checkpoint.LoadRestore(context.Background(), stats.Savepoint, g)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := Run(context.Background(), g, Options{Engine: eng, BatchSize: 64, Restore: rs,
				State: jobfile.StateSettings{Backend: c.to, CacheMiB: 8}, DataDir: data,
				Checkpoint: &CheckpointOptions{Store: openStore(t, filepath.Join(dir, "chk2")), Interval: 30 * time.Millisecond, Tick: 5 * time.Millisecond}}); err != nil {
				t.Fatal(err)
			}
			checkDataDirEmpty(t, data, c.to == jobfile.StatePebble)
			// Source subtask s generates s, s+2, ... up to n or up to where
			// the savepoint stopped it, whichever is later.
			var want []string
			per := map[int]int{}
			for s := 0; s < 2; s++ {
				end := int64(n)
				sr := rs.Subtasks[control.SubtaskID{Operator: "src", Index: s}]
				if sr == nil || len(sr.SourcePosition) != 9 {
					t.Fatalf("savepoint holds no generator position for src/%d", s)
				}
				if pos := int64(binary.BigEndian.Uint64(sr.SourcePosition[1:])); pos > end {
					end = pos
				}
				for i := int64(s); i < end; i += 2 {
					k := int(i % keys)
					per[k]++
					want = append(want, fmt.Sprintf("key-%d=%d", k, per[k]))
				}
			}
			checkExactlyOnce(t, committed(t, out), want)
			t.Logf("stopped after %d records (n %d) with savepoint %s", stats.Operators[0].RecordsOut, n, filepath.Base(stats.Savepoint))
		})
	}
}
