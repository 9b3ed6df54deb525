package runtime

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/host"
	"github.com/streamd/streamd/internal/checkpoint"
	"github.com/streamd/streamd/internal/jobfile"
	"github.com/streamd/streamd/internal/testout"
	"github.com/streamd/streamd/internal/testwasm"
)

// committed returns the lines of every visible (committed) file of dir, sorted.
func committed(t testing.TB, dir string) []string { return testout.Committed(t, dir) }

// checkExactlyOnce compares sorted lines with the sorted expected lines and
// reports duplicates and losses.
func checkExactlyOnce(t testing.TB, got, want []string) {
	t.Helper()
	sort.Strings(want)
	if slices.Equal(got, want) {
		return
	}
	count := map[string]int{}
	for _, l := range got {
		count[l]++
	}
	var dup, lost []string
	for _, w := range want {
		switch count[w] {
		case 0:
			lost = append(lost, w)
		case 1:
		default:
			dup = append(dup, w)
		}
		delete(count, w)
	}
	var extra []string
	for l := range count {
		extra = append(extra, l)
	}
	t.Fatalf("got %d lines, want %d: %d lost (e.g. %.5q), %d duplicated (e.g. %.5q), %d unexpected (e.g. %.5q)",
		len(got), len(want), len(lost), lost, len(dup), dup, len(extra), extra)
}

func openStore(t testing.TB, dir string) *checkpoint.Dir {
	t.Helper()
	st, err := checkpoint.OpenDir(dir, checkpoint.WithRetain(2))
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// TestExactlyOnceUnderFailure: an operator fails once (attempt 0) at a chosen
// record; the job restarts from the latest completed checkpoint and the file
// sink still commits every expected record exactly once.
func TestExactlyOnceUnderFailure(t *testing.T) {
	mod := testwasm.Path(t, "internal/testguests/failonce/failonce.wasm")
	eng := cachedEngine(t)
	const n, keys = 4000, 13
	for _, c := range []struct {
		mode    string
		p       int
		align   control.AlignmentMode
		timeout time.Duration
		backend string // state.backend; "" memory
		full    bool   // pebble: full checkpoints (state.incremental: false)
	}{
		{"map", 1, control.AlignAligned, 0, "", false}, {"map", 4, control.AlignAligned, 0, "", false},
		{"count", 1, control.AlignAligned, 0, "", false}, {"count", 4, control.AlignAligned, 0, "", false},
		{"map", 4, control.AlignUnaligned, 0, "", false}, {"count", 4, control.AlignUnaligned, 0, "", false},
		{"count", 4, control.AlignAligned, time.Microsecond, "", false},
		{"count", 1, control.AlignAligned, 0, jobfile.StatePebble, false}, {"count", 4, control.AlignAligned, 0, jobfile.StatePebble, false},
		{"count", 4, control.AlignUnaligned, 0, jobfile.StatePebble, false}, {"count", 4, control.AlignAligned, 0, jobfile.StatePebble, true},
	} {
		mode, p := c.mode, c.p
		name := fmt.Sprintf("%s/p%d", mode, p)
		if c.align == control.AlignUnaligned {
			name += "/unaligned"
		} else if c.timeout > 0 {
			name += "/aligned_timeout"
		}
		if c.backend != "" {
			name += "/" + c.backend
		}
		if c.full {
			name += "/full"
		}
		{
			t.Run(name, func(t *testing.T) {
				dir := t.TempDir()
				out := filepath.Join(dir, "out")
				part := control.Rebalance
				if mode == "count" {
					part = control.Hash
				}
				gen := &jobfile.SourceSpec{Type: "generator", Count: n, Rate: 16000, KeyPattern: "key-{k}", ValuePattern: "value-{n}", Keys: keys, TSStep: 1}
				g := graph(t,
					src("src", p, gen),
					op("op", p, &jobfile.WasmSpec{Path: mod, Config: map[string]string{"fail_at": fmt.Sprint(n / p / 2), "mode": mode}}, in("src", part)),
					sink("out", p, &jobfile.SinkSpec{Type: "file", Path: out}, in("op", control.Forward)),
				)
				var before int
				var inflight int64
				data := filepath.Join(dir, "data")
				stats, err := Run(context.Background(), g, Options{
					Engine: eng, BatchSize: 64,
					State: jobfile.StateSettings{Backend: c.backend, CacheMiB: 8, Incremental: c.backend == jobfile.StatePebble && !c.full}, DataDir: data,
					Checkpoint: &CheckpointOptions{Store: openStore(t, filepath.Join(dir, "chk")), Interval: 30 * time.Millisecond, Tick: 10 * time.Millisecond,
						Mode: c.align, AlignedTimeout: c.timeout,
						OnComplete: func(md *checkpoint.Metadata) {
							before++
							inflight += md.InFlightBytes()
							if shared := len(md.SharedFiles()); (shared > 0) != (c.backend == jobfile.StatePebble && !c.full) {
								t.Errorf("checkpoint %d refers to %d shared files (backend %q, full %v)", md.ID, shared, c.backend, c.full)
							}
						}},
					Restart: jobfile.RestartSettings{Strategy: jobfile.RestartFixedDelay, Attempts: 2},
				})
				if err != nil {
					t.Fatal(err)
				}
				if stats.Restarts != 1 {
					t.Fatalf("restarts %d, want 1", stats.Restarts)
				}
				// The failed attempt and its cause (the REST API's exceptions).
				if f := stats.Failures; len(f) != 1 || f[0].Attempt != 0 || !strings.Contains(f[0].Error, `operator "op"`) || f[0].Time.IsZero() {
					t.Errorf("failures %+v: want attempt 0 with the failure of op", f)
				}
				var want []string
				if mode == "map" {
					for i := 0; i < n; i++ {
						want = append(want, fmt.Sprintf("value-%d", i))
					}
				} else {
					per := map[int]int{}
					for i := 0; i < n; i++ {
						per[i%keys]++
						want = append(want, fmt.Sprintf("key-%d=%d", i%keys, per[i%keys]))
					}
				}
				checkExactlyOnce(t, committed(t, out), want)
				checkDataDirEmpty(t, data, c.backend == jobfile.StatePebble)
				t.Logf("%d checkpoints (%d bytes in flight), elapsed %v", stats.Checkpoints, inflight, stats.Elapsed)
			})
		}
	}
}

// checkDataDirEmpty: every pebble subtask removed its directory below dir,
// which exists after a pebble run (the subtasks made it) and not after a
// memory run.
func checkDataDirEmpty(t testing.TB, dir string, pebble bool) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if os.IsNotExist(err) && !pebble {
		return
	}
	if err != nil {
		t.Fatalf("data directory after a pebble run: %v", err)
	}
	if !pebble {
		t.Fatalf("a memory run made the data directory %s", dir)
	}
	for _, e := range ents {
		t.Errorf("%s left behind in the data directory", e.Name())
	}
}

// cachedEngine is an engine with an on-disk compiled-module cache shared by
// the tests of this package: Go guests take seconds to compile, and several
// tests run the same modules many times.
func cachedEngine(t testing.TB) *host.Engine {
	t.Helper()
	e, err := host.NewEngine(context.Background(), host.WithCacheDir(filepath.Join(os.TempDir(), "streamd-runtime-test-cache")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close(context.Background()) })
	return e
}
