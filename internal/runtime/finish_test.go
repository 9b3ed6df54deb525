package runtime

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/internal/checkpoint"
	"github.com/streamd/streamd/internal/jobfile"
	"github.com/streamd/streamd/internal/testwasm"
)

// TestFinalCheckpointImmediately: a bounded job with a checkpoint interval of
// one hour finishes at once, every record committed exactly once by the file
// sink on the final checkpoint.
func TestFinalCheckpointImmediately(t *testing.T) {
	const n = 5000
	for _, p := range []int{1, 3} {
		t.Run(fmt.Sprint("p", p), func(t *testing.T) {
			dir := t.TempDir()
			out := filepath.Join(dir, "out")
			g := graph(t,
				src("src", p, genSpec(n)),
				op("up", p, NativeFactory(newUpper), in("src", control.Rebalance)),
				sink("out", p, &jobfile.SinkSpec{Type: "file", Path: out}, in("up", control.Forward)),
			)
			var kinds []string
			stats, err := Run(context.Background(), g, Options{BatchSize: 100,
				Checkpoint: &CheckpointOptions{Store: openStore(t, filepath.Join(dir, "chk")), Interval: time.Hour, Tick: 10 * time.Millisecond,
					OnComplete: func(md *checkpoint.Metadata) {
						kinds = append(kinds, md.Operators[len(md.Operators)-1].Finished.String())
					}}})
			if err != nil {
				t.Fatal(err)
			}
			if stats.Elapsed > 5*time.Second {
				t.Fatalf("took %v: the final checkpoint waited for the interval", stats.Elapsed)
			}
			if len(kinds) != 1 || kinds[0] != control.OperatorFullyFinished.String() {
				t.Fatalf("checkpoints: sink finished states %v, want one final checkpoint with the sink fully finished", kinds)
			}
			var want []string
			for i := 0; i < n; i++ {
				want = append(want, fmt.Sprintf("VALUE-%d", i))
			}
			checkExactlyOnce(t, committed(t, out), want)
		})
	}
}

// lifecycle is a native operator that records its lifecycle calls,
// including checkpoints, per subtask.
type lifecycle struct {
	mu    sync.Mutex
	calls map[int][]string
}

func (l *lifecycle) factory(info SubtaskInfo) NativeOperator {
	return &lifecycleOp{l: l, sub: info.Subtask}
}

func (l *lifecycle) get(sub int) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.calls[sub])
}

type lifecycleOp struct {
	l   *lifecycle
	sub int
}

func (o *lifecycleOp) add(s string) {
	o.l.mu.Lock()
	o.l.calls[o.sub] = append(o.l.calls[o.sub], s)
	o.l.mu.Unlock()
}

func (o *lifecycleOp) Open(context.Context, SubtaskInfo) error { o.add("open"); return nil }
func (o *lifecycleOp) Process(_ context.Context, _ int, recs []abi.Record, emit Emitter) error {
	emit(recs)
	return nil
}
func (o *lifecycleOp) AdvanceWatermark(_ context.Context, ts int64, _ Emitter) error {
	if ts == abi.MaxWatermark {
		o.add("wm:MAX")
	}
	return nil
}
func (o *lifecycleOp) EndInput(_ context.Context, i int, _ Emitter) error {
	o.add(fmt.Sprint("end_input:", i))
	return nil
}
func (o *lifecycleOp) Finish(context.Context, Emitter) error { o.add("finish"); return nil }
func (o *lifecycleOp) Close(context.Context) error           { o.add("close"); return nil }
func (o *lifecycleOp) SnapshotState(_ context.Context, id int64) error {
	o.add(fmt.Sprint("snapshot:", id))
	return nil
}
func (o *lifecycleOp) NotifyCheckpointComplete(_ context.Context, id int64) error {
	o.add(fmt.Sprint("notify:", id))
	return nil
}

// TestStopWithSavepoint stops an unbounded job with a savepoint, with and
// without drain, and checks each subtask's lifecycle: with drain, MAX
// watermark, end_input and finish come before the savepoint's snapshot;
// without, none of them; both end with the savepoint's notify and close.
func TestStopWithSavepoint(t *testing.T) {
	for _, drain := range []bool{true, false} {
		t.Run(fmt.Sprint("drain=", drain), func(t *testing.T) {
			dir := t.TempDir()
			out := filepath.Join(dir, "out")
			spec := genSpec(0)
			spec.Rate = 20000
			lc := &lifecycle{calls: map[int][]string{}}
			g := graph(t,
				src("src", 2, spec),
				op("rec", 2, NativeFactory(lc.factory), in("src", control.Hash)),
				sink("out", 2, &jobfile.SinkSpec{Type: "file", Path: out}, in("rec", control.Forward)),
			)
			stop := make(chan StopRequest, 1)
			var completed atomic.Int32
			var lastKind control.CheckpointKind
			stats, err := Run(context.Background(), g, Options{BatchSize: 64, Stop: stop,
				Checkpoint: &CheckpointOptions{Store: openStore(t, filepath.Join(dir, "chk")), Interval: 20 * time.Millisecond, Tick: 5 * time.Millisecond,
					OnComplete: func(md *checkpoint.Metadata) {
						lastKind = md.Kind
						if completed.Add(1) == 3 {
							stop <- StopRequest{Drain: drain}
						}
					}}})
			if err != nil {
				t.Fatal(err)
			}
			if stats.Savepoint == "" || lastKind != control.KindSavepoint {
				t.Fatalf("no savepoint: %+v, last kind %s", stats, lastKind)
			}
			md, err := checkpoint.Resolve(stats.Savepoint)
			if err != nil {
				t.Fatal(err)
			}
			sp := fmt.Sprint(md.ID)
			for sub := 0; sub < 2; sub++ {
				calls := lc.get(sub)
				n := len(calls)
				if n < 4 || calls[0] != "open" || calls[n-1] != "close" || calls[n-2] != "notify:"+sp || calls[n-3] != "snapshot:"+sp {
					t.Fatalf("subtask %d: lifecycle %v", sub, calls)
				}
				got := strings.Join(calls, " ")
				fin := strings.Contains(got, "finish") || strings.Contains(got, "end_input") || strings.Contains(got, "wm:MAX")
				if !drain && fin {
					t.Fatalf("subtask %d without drain: %v", sub, calls)
				}
				if drain && (n < 7 || calls[n-6] != "wm:MAX" || calls[n-5] != "end_input:0" || calls[n-4] != "finish") {
					t.Fatalf("subtask %d with drain: want wm:MAX end_input:0 finish before the savepoint's snapshot: %v", sub, calls)
				}
			}
			// Everything the sources produced is committed exactly once.
			lines := committed(t, out)
			seen := map[string]bool{}
			for _, l := range lines {
				if seen[l] {
					t.Fatalf("duplicate %q", l)
				}
				seen[l] = true
			}
			if int64(len(lines)) != stats.Operators[0].RecordsOut {
				t.Fatalf("committed %d lines, the sources produced %d", len(lines), stats.Operators[0].RecordsOut)
			}
		})
	}
}

// TestFinishedBranchSkippedOnRestore: a bounded and an unbounded branch.
// After the bounded branch finished, checkpoints still complete (with its
// operators fully finished); then the unbounded branch fails once and the
// job restores: the bounded branch runs no user code again and its output is
// not duplicated, the unbounded branch resumes where it was. Finally the job
// stops with a drained savepoint.
//
// The unbounded branch fails once a checkpoint with the bounded branch fully
// finished completed (armed by OnComplete), however slow the machine.
func TestFinishedBranchSkippedOnRestore(t *testing.T) {
	mod := testwasm.Path(t, "internal/testguests/failonce/failonce.wasm")
	eng := cachedEngine(t)
	dir := t.TempDir()
	outA, outB := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	const nA = 3000
	unb := &jobfile.SourceSpec{Type: "generator", Rate: 4000, ValuePattern: "u-{n}"}
	var arm atomic.Bool
	g := graph(t,
		src("bsrc", 2, genSpec(nA)),
		op("bop", 2, &jobfile.WasmSpec{Path: mod, Config: map[string]string{"mode": "count"}}, in("bsrc", control.Hash)),
		sink("bout", 2, &jobfile.SinkSpec{Type: "file", Path: outA}, in("bop", control.Forward)),
		src("usrc", 1, unb),
		op("uop", 1, &failArmed{arm: &arm}, in("usrc", control.Forward)),
		sink("uout", 1, &jobfile.SinkSpec{Type: "file", Path: outB}, in("uop", control.Forward)),
	)
	stop := make(chan StopRequest, 1)
	var finishedCps, afterRestart atomic.Int32
	var restarted atomic.Bool
	store := openStore(t, filepath.Join(dir, "chk"))
	stats, err := Run(context.Background(), g, Options{Engine: eng, BatchSize: 64, Stop: stop,
		Restart: jobfile.RestartSettings{Strategy: jobfile.RestartFixedDelay, Attempts: 1},
		Checkpoint: &CheckpointOptions{Store: store, Interval: 30 * time.Millisecond, Tick: 5 * time.Millisecond,
			OnComplete: func(md *checkpoint.Metadata) {
				if md.Operator("bop").Finished == control.OperatorFullyFinished && md.Operator("bout").Finished == control.OperatorFullyFinished {
					finishedCps.Add(1)
					arm.Store(true)
				}
				if md.Kind == control.KindCheckpoint && md.Operator("uop").Finished != control.OperatorRunning {
					t.Errorf("checkpoint %d: the unbounded operator is %s", md.ID, md.Operator("uop").Finished)
				}
				if restarted.Load() && afterRestart.Add(1) == 3 {
					stop <- StopRequest{Drain: true}
				}
			}},
		Progress: func(s Stats) {
			if s.Restarts > 0 {
				restarted.Store(true)
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if stats.Restarts != 1 {
		t.Fatalf("restarts %d", stats.Restarts)
	}
	if finishedCps.Load() == 0 {
		t.Fatal("no checkpoint completed with the bounded branch fully finished")
	}
	// The checkpoint history (REST, console) says which had finished.
	found := false
	for _, c := range stats.Recent {
		if c.Kind == string(control.KindCheckpoint) && fmt.Sprint(c.FinishedOperators) == "[bsrc bop bout]" {
			if c.FinishedSubtasks != 6 {
				t.Errorf("checkpoint %d: bounded branch finished, %d finished subtasks, want 6", c.ID, c.FinishedSubtasks)
			}
			found = true
		}
	}
	if !found {
		t.Errorf("no checkpoint of the history says the bounded branch finished: %+v", stats.Recent)
	}
	// The bounded operator processed each record once over both attempts:
	// it was deployed as finished after the restore.
	if in := stats.Operators[1].RecordsIn; in != nA {
		t.Fatalf("bounded operator processed %d records over both attempts, want %d", in, nA)
	}
	per := map[int]int{}
	var wantA []string
	for i := 0; i < nA; i++ {
		per[i%13]++
		wantA = append(wantA, fmt.Sprintf("key-%d=%d", i%13, per[i%13]))
	}
	checkExactlyOnce(t, committed(t, outA), wantA)
	linesB := committed(t, outB)
	var wantB []string
	for i := 0; i < len(linesB); i++ {
		wantB = append(wantB, fmt.Sprintf("u-%d", i))
	}
	if len(linesB) == 0 {
		t.Fatalf("unbounded branch committed no record")
	}
	checkExactlyOnce(t, linesB, wantB)

	// A job changed to put a new operator in front of the fully finished
	// one cannot restore the latest checkpoint.
	md, err := store.Latest(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	g2 := graph(t,
		src("bsrc", 2, genSpec(nA)),
		op("new", 2, NativeFactory(newUpper), in("bsrc", control.Hash)),
		op("bop", 2, &jobfile.WasmSpec{Path: mod}, in("new", control.Forward)),
		sink("bout", 2, &jobfile.SinkSpec{Type: "file", Path: outA}, in("bop", control.Forward)),
		src("usrc", 1, unb),
		op("uop", 1, &jobfile.WasmSpec{Path: mod}, in("usrc", control.Forward)),
		sink("uout", 1, &jobfile.SinkSpec{Type: "file", Path: outB}, in("uop", control.Forward)),
	)
	_, err = checkpoint.LoadRestoreFrom(context.Background(), store, md, g2)
	if err == nil || !strings.Contains(err.Error(), `"bop"`) || !strings.Contains(err.Error(), `"new"`) {
		t.Fatalf("restore with a new operator in front of a finished one: %v", err)
	}
}

// TestWindowCountResumeFromSavepoint: the window-count example stopped with a
// savepoint without drain (timers stay in state) and resumed from it gives
// the same windows as a run that was never stopped, also at another
// parallelism of the windows.
func TestWindowCountResumeFromSavepoint(t *testing.T) {
	keyby := testwasm.Path(t, "examples/wasm/window-count/keyby.wasm")
	windows := testwasm.Path(t, "examples/wasm/window-count/window-count.wasm")
	eng := cachedEngine(t)
	dir := t.TempDir()
	const n = 6000
	job := func(out string, p int) *control.JobGraph {
		// Slow enough that the stop lands mid-run on a loaded machine.
		gen := &jobfile.SourceSpec{Type: "generator", Count: n, Rate: 3000, ValuePattern: "k{k},{n}", Keys: 7, TSStep: 1, WatermarkLag: 50 * time.Millisecond}
		return graph(t,
			src("lines", 1, gen),
			op("keyby", 1, &jobfile.WasmSpec{Path: keyby}, in("lines", control.Forward)),
			op("windows", p, &jobfile.WasmSpec{Path: windows, Config: map[string]string{"size_ms": "500"}}, in("keyby", control.Hash)),
			sink("out", p, &jobfile.SinkSpec{Type: "file", Path: out}, in("windows", control.Forward)),
		)
	}
	ref := filepath.Join(dir, "ref")
	start := time.Now()
	if _, err := Run(context.Background(), job(ref, 2), Options{Engine: eng, BatchSize: 50}); err != nil {
		t.Fatal(err)
	}
	t.Logf("reference run: %v", time.Since(start))
	want := committed(t, ref)
	if len(want) < 50 {
		t.Fatalf("reference run: %d windows", len(want))
	}

	out := filepath.Join(dir, "out")
	stop := make(chan StopRequest, 1)
	var cps atomic.Int32
	stats, err := Run(context.Background(), job(out, 2), Options{Engine: eng, BatchSize: 50, Stop: stop,
		Checkpoint: &CheckpointOptions{Store: openStore(t, filepath.Join(dir, "chk")), Interval: 20 * time.Millisecond, Tick: 5 * time.Millisecond,
			OnComplete: func(*checkpoint.Metadata) {
				if cps.Add(1) == 1 {
					stop <- StopRequest{}
				}
			}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("stopped run: %v", stats.Elapsed)
	if stats.Savepoint == "" || stats.Operators[0].RecordsOut >= n {
		t.Fatalf("not stopped mid-run: savepoint %q, %d of %d records read", stats.Savepoint, stats.Operators[0].RecordsOut, n)
	}
	backup := filepath.Join(dir, "backup")
	copyDir(t, out, backup) // committed and pending files at the savepoint
	for _, p := range []int{2, 3} {
		os.RemoveAll(out)
		copyDir(t, backup, out)
		g := job(out, p)
		rs, err := checkpoint.LoadRestore(context.Background(), stats.Savepoint, g)
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		if _, err := Run(context.Background(), g, Options{Engine: eng, BatchSize: 50, Restore: rs,
			Checkpoint: &CheckpointOptions{Store: openStore(t, filepath.Join(dir, fmt.Sprint("chk", p))), Interval: 20 * time.Millisecond, Tick: 5 * time.Millisecond}}); err != nil {
			t.Fatal(err)
		}
		t.Logf("resumed at p=%d in %v", p, time.Since(start))
		got := committed(t, out)
		checkExactlyOnce(t, got, slices.Clone(want))
	}
}

// copyDir copies the regular files of from into a new directory to.
func copyDir(t testing.TB, from, to string) {
	t.Helper()
	if err := os.MkdirAll(to, 0o755); err != nil {
		t.Fatal(err)
	}
	ents, err := os.ReadDir(from)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(from, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(to, e.Name()), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// TestRestoreCommitsFinalPending: the job failed after its final checkpoint
// was durable but before the file sink committed it (simulated by putting the
// committed files back to pending). Restoring that checkpoint deploys every
// operator as finished and commits the pending files; nothing runs again.
func TestRestoreCommitsFinalPending(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "out")
	const n = 1000
	lc := &lifecycle{calls: map[int][]string{}}
	g := graph(t,
		src("src", 2, genSpec(n)),
		op("rec", 2, NativeFactory(lc.factory), in("src", control.Rebalance)),
		sink("out", 2, &jobfile.SinkSpec{Type: "file", Path: out}, in("rec", control.Forward)),
	)
	store := openStore(t, filepath.Join(dir, "chk"))
	opts := Options{BatchSize: 100, Checkpoint: &CheckpointOptions{Store: store, Interval: time.Hour, Tick: 5 * time.Millisecond}}
	if _, err := Run(context.Background(), g, opts); err != nil {
		t.Fatal(err)
	}
	want := committed(t, out)
	if len(want) != n {
		t.Fatalf("%d lines committed", len(want))
	}
	ents, _ := os.ReadDir(out)
	for _, e := range ents {
		if err := os.Rename(filepath.Join(out, e.Name()), filepath.Join(out, "."+e.Name()+".pending")); err != nil {
			t.Fatal(err)
		}
	}
	md, err := store.Latest(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if f := md.Operator("out").Finished; f != control.OperatorFullyFinished {
		t.Fatalf("sink is %s in the final checkpoint", f)
	}
	rs, err := checkpoint.LoadRestoreFrom(context.Background(), store, md, g)
	if err != nil {
		t.Fatal(err)
	}
	lc.calls = map[int][]string{}
	opts.Restore = rs
	stats, err := Run(context.Background(), g, opts)
	if err != nil {
		t.Fatal(err)
	}
	if len(lc.get(0)) != 0 || stats.Operators[0].RecordsOut != 0 {
		t.Fatalf("finished operators ran again: %v, %d records", lc.get(0), stats.Operators[0].RecordsOut)
	}
	checkExactlyOnce(t, committed(t, out), want)
}

// noSavepoints is a store that cannot write savepoint state.
type noSavepoints struct{ *checkpoint.Dir }

func (s noSavepoints) WriteState(ctx context.Context, kind control.CheckpointKind, id int64, sub control.SubtaskID, data []byte) (checkpoint.BlobRef, error) {
	if kind == control.KindSavepoint {
		return checkpoint.BlobRef{}, fmt.Errorf("disk full")
	}
	return s.Dir.WriteState(ctx, kind, id, sub, data)
}

// TestStopWithSavepointFails: when the savepoint fails, the job fails over
// and the error says so.
func TestStopWithSavepointFails(t *testing.T) {
	dir := t.TempDir()
	spec := genSpec(0)
	spec.Rate = 10000
	g := graph(t,
		src("src", 1, spec),
		sink("out", 1, &jobfile.SinkSpec{Type: "file", Path: filepath.Join(dir, "out")}, in("src", control.Forward)),
	)
	stop := make(chan StopRequest, 1)
	stop <- StopRequest{}
	_, err := Run(context.Background(), g, Options{Stop: stop,
		Checkpoint: &CheckpointOptions{Store: noSavepoints{openStore(t, filepath.Join(dir, "chk"))}, Interval: time.Hour, Tick: 5 * time.Millisecond}})
	if err == nil || !errors.Is(err, control.ErrStopWithSavepointFailed) || !strings.Contains(err.Error(), "disk full") {
		t.Fatalf("err = %v, want a stop-with-savepoint failure naming the cause", err)
	}
}

// wmLifecycleOp is a lifecycleOp that records every watermark it is given.
type wmLifecycleOp struct{ *lifecycleOp }

func (o wmLifecycleOp) AdvanceWatermark(_ context.Context, ts int64, _ Emitter) error {
	o.add(fmt.Sprint("wm:", ts))
	return nil
}

// TestStopWithoutDrainMultiInput: a two-input operator whose inputs have
// different watermarks is stopped with a savepoint without drain. Between
// the savepoint's snapshot_state and close it gets only
// notify_checkpoint_complete: no on_watermark when one input's channel
// ends before the other's (ABI.md).
func TestStopWithoutDrainMultiInput(t *testing.T) {
	for round := 0; round < 3; round++ {
		dir := t.TempDir()
		slow, fast := genSpec(0), genSpec(0)
		slow.Rate, fast.Rate = 5000, 5000
		fast.StartTS = 1_000_000_000
		lc := &lifecycle{calls: map[int][]string{}}
		g := graph(t,
			src("slow", 1, slow),
			src("fast", 1, fast),
			op("rec", 1, NativeFactory(func(info SubtaskInfo) NativeOperator {
				return wmLifecycleOp{&lifecycleOp{l: lc, sub: info.Subtask}}
			}), in("slow", control.Forward), in("fast", control.Forward)),
			sink("out", 1, &jobfile.SinkSpec{Type: "discard"}, in("rec", control.Forward)),
		)
		stop := make(chan StopRequest, 1)
		var completed atomic.Int32
		stats, err := Run(context.Background(), g, Options{BatchSize: 16, Stop: stop,
			Checkpoint: &CheckpointOptions{Store: openStore(t, filepath.Join(dir, "chk")), Interval: 20 * time.Millisecond, Tick: 5 * time.Millisecond,
				OnComplete: func(md *checkpoint.Metadata) {
					if completed.Add(1) == 3 {
						stop <- StopRequest{}
					}
				}}})
		if err != nil {
			t.Fatal(err)
		}
		md, err := checkpoint.Resolve(stats.Savepoint)
		if err != nil {
			t.Fatal(err)
		}
		calls := lc.get(0)
		i := slices.Index(calls, fmt.Sprint("snapshot:", md.ID))
		if i < 0 || !slices.Equal(calls[i:], []string{fmt.Sprint("snapshot:", md.ID), fmt.Sprint("notify:", md.ID), "close"}) {
			t.Fatalf("after the savepoint's snapshot: %v, want only its notify and close (all: %d calls)", calls[max(i, 0):], len(calls))
		}
		if !slices.ContainsFunc(calls[:i], func(c string) bool { return strings.HasPrefix(c, "wm:") }) {
			t.Fatalf("no watermark before the savepoint: %v", calls)
		}
	}
}

// failArmed passes records on and fails its first batch after arm is set,
// once per test (a native operator shared by the attempts).
type failArmed struct {
	noop
	arm    *atomic.Bool
	failed atomic.Bool
}

func (f *failArmed) Process(_ context.Context, _ int, recs []abi.Record, emit Emitter) error {
	if f.arm.Load() && !f.failed.Swap(true) {
		return errors.New("failArmed: failing once, as armed")
	}
	emit(recs)
	return nil
}
