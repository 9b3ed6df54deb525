package cluster_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/streamd/streamd/internal/cluster"
	"github.com/streamd/streamd/internal/cluster/wire"
	"github.com/streamd/streamd/internal/jobfile"
	"github.com/streamd/streamd/internal/testwasm"
)

// Adaptive scheduling (internal/cluster/adaptive.go): the controller waits
// slotWait for slots before it runs a job on fewer, and rescales a job at
// most once per rescaleInterval.
const (
	slotWait        = time.Second
	rescaleInterval = time.Second
)

// newAdaptiveCluster is newCluster with the adaptive scheduler's waits
// short enough for a test.
func newAdaptiveCluster(t *testing.T, slots ...int) *testCluster {
	t.Helper()
	return newClusterOpts(t, cluster.ControllerOptions{SlotWait: slotWait, RescaleInterval: rescaleInterval}, slots...)
}

// adaptiveJob writes a job file declared at parallelism 4: a generator
// (its positions rescale: a scale-down runs it at fewer subtasks too), keys
// hash-partitioned into wordcount's count module (keyed state: its key
// groups are redistributed on a rescale) and a file sink, checkpointing
// every 200ms. extra is added to the job's fields.
func adaptiveJob(t *testing.T, n, rate int, extra string) string {
	wasm := testwasm.Path(t, "examples/wasm/wordcount/count.wasm")
	job := fmt.Sprintf(`name: adaptive
parallelism: 4
%scheckpoint: {interval: 200ms, dir: chk}
operators:
  - uid: gen
    source: {type: generator, count: %d, rate: %d, keys: 500}
  - uid: count
    wasm: %s
    inputs: [{from: gen, partition: hash}]
  - uid: out
    sink: {type: file, path: out/}
    inputs: [{from: count}]
`, extra, n, rate, wasm)
	path := filepath.Join(t.TempDir(), "adaptive.yaml")
	if err := os.WriteFile(path, []byte(job), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// subtasksRunning is how many of the job's subtasks its status shows
// running, and whether each of those has a host.
func subtasksRunning(st *wire.JobStatus) (n int, placed bool) {
	placed = true
	for _, op := range st.Operators {
		for _, s := range op.Subtasks {
			if s.State == "running" {
				n++
				placed = placed && s.Host != ""
			}
		}
	}
	return n, placed
}

// TestAdaptiveScalesDownAndUp: a job declared at parallelism 4 runs on two
// hosts of 2 slots; one host is lost for good: the job runs at parallelism
// 2 on the other (the claim: within 10s of the loss; asserted with
// a margin for a loaded machine, the real figure logged), restored from its
// latest checkpoint with its key groups redistributed, and while it waits
// no subtask is shown running. A new host joins: the job is stopped with a
// savepoint and runs at 4 again. Its output is that of streamd run:
// exactly once throughout.
func TestAdaptiveScalesDownAndUp(t *testing.T) {
	tc := newAdaptiveCluster(t, 2, 2)
	const n, rate = 60000, 1500 // 40s: it still runs when the new host joins
	path := adaptiveJob(t, n, rate, "")
	id := deploy(t, tc, path, jobfile.Options{})
	st := tc.waitJob(id, "running with a checkpoint", func(st *wire.JobStatus) bool {
		return wire.TerminalJobState(st.State) || (st.State == wire.JobRunning && len(st.Checkpoints) > 0)
	})
	if st.State != wire.JobRunning || len(st.Hosts) != 2 || st.Parallelism != 4 || st.DeclaredParallelism != 4 {
		t.Fatalf("job %s on %v at parallelism %d (declared %d): %s; want running on 2 hosts at 4", st.State, st.Hosts, st.Parallelism, st.DeclaredParallelism, st.Reason)
	}
	attempt := st.Attempt
	tc.hosts["h2"].Close() // a crash; h2 does not come back
	lost := time.Now()
	sawWaiting := false
	st = tc.waitJob(id, "running at parallelism 2", func(st *wire.JobStatus) bool {
		if st.Attempt > attempt && st.State != wire.JobRunning && !wire.TerminalJobState(st.State) {
			sawWaiting = true
			if n, placed := subtasksRunning(st); n > 0 && !placed {
				t.Errorf("while the job is %s (%s), %d subtask(s) are shown running without a host", st.State, st.Reason, n)
			}
		}
		return wire.TerminalJobState(st.State) || (st.State == wire.JobRunning && st.Parallelism == 2)
	})
	took := time.Since(lost)
	if st.State != wire.JobRunning {
		t.Fatalf("after h2 was lost: job %s: %s", st.State, st.Reason)
	}
	t.Logf("host lost -> running at parallelism 2 in %s (loss detected after %s, slot wait %s)", took.Round(time.Millisecond), time.Duration(lostAfter)*hbInterval, slotWait)
	if took > 30*time.Second {
		t.Errorf("running at parallelism 2 after %s, want within 10s (30s on a loaded machine)", took.Round(time.Millisecond))
	}
	if !sawWaiting {
		t.Log("the job's wait between the loss and the rescale was not seen by a status poll")
	}
	if len(st.Hosts) != 1 || st.Hosts[0] != "h1" || st.DeclaredParallelism != 4 {
		t.Fatalf("at parallelism 2: on %v, declared %d; want on h1, declared 4", st.Hosts, st.DeclaredParallelism)
	}
	for _, op := range st.Operators {
		if want := map[string]int{"gen": 2, "count": 2, "out": 2}[op.UID]; op.Parallelism != want || len(op.Subtasks) != want {
			t.Errorf("operator %s: parallelism %d with %d subtasks, want %d", op.UID, op.Parallelism, len(op.Subtasks), want)
		}
		if want := map[string]int{"gen": 4, "count": 4, "out": 4}[op.UID]; op.DeclaredParallelism != want {
			t.Errorf("operator %s: declared %d, want %d", op.UID, op.DeclaredParallelism, want)
		}
	}
	if len(st.Rescales) != 1 || st.Rescales[0].From != 4 || st.Rescales[0].To != 2 {
		t.Fatalf("rescales %+v, want one from 4 to 2", st.Rescales)
	}
	t.Logf("rescale: %+v", st.Rescales[0])

	attempt = st.Attempt
	tc.addHost("h3", 2)
	joined := time.Now()
	st = tc.waitJob(id, "running at parallelism 4 again", func(st *wire.JobStatus) bool {
		return wire.TerminalJobState(st.State) || (st.State == wire.JobRunning && st.Parallelism == 4)
	})
	if st.State != wire.JobRunning {
		if st.State == wire.JobFinished {
			t.Fatalf("the job finished before it scaled up: make it longer")
		}
		t.Fatalf("after h3 joined: job %s: %s", st.State, st.Reason)
	}
	t.Logf("host joined -> running at parallelism 4 in %s, on %v", time.Since(joined).Round(time.Millisecond), st.Hosts)
	if len(st.Rescales) != 2 || st.Rescales[1].From != 2 || st.Rescales[1].To != 4 || !strings.Contains(st.Rescales[1].Restore, "savepoint") || st.Attempt <= attempt {
		t.Fatalf("rescales %+v (attempt %d, was %d), want a second from 2 to 4 from a savepoint", st.Rescales, st.Attempt, attempt)
	}
	st = tc.waitJobLoose(id, "finished", 5*time.Minute, state(wire.JobFinished)) // its records come at rate/s, slower on a loaded machine
	if st.State != wire.JobFinished {
		t.Fatalf("job %s: %s", st.State, st.Reason)
	}
	for _, a := range st.Attempts {
		t.Logf("attempt %d at parallelism %d on %v: %s %s", a.Attempt, a.Parallelism, a.Hosts, a.State, a.Reason)
	}
	got := outputLines(t, filepath.Join(filepath.Dir(path), "out"))
	sameLines(t, got, runLocally(t, adaptiveJob(t, n, rate, "")))
	t.Logf("%d output lines, exactly once", len(got))
}

// TestAdaptiveWaitsBelowMin: a job that may run at no less than
// parallelism 3 waits on a cluster of 2 slots and says why in its status;
// with 2 more slots it runs at its declared 4.
func TestAdaptiveWaitsBelowMin(t *testing.T) {
	tc := newAdaptiveCluster(t, 2)
	path := adaptiveJob(t, 3000, 0, "min_parallelism: 3\n")
	id := deploy(t, tc, path, jobfile.Options{})
	st := tc.waitJob(id, "waiting below its min", func(st *wire.JobStatus) bool {
		return strings.Contains(st.Reason, "no fewer than 3 slot(s)")
	})
	t.Logf("status: %s: %s", st.State, st.Reason)
	if st.State != wire.JobCreated || st.Parallelism != 4 || st.DeclaredParallelism != 4 || st.MinParallelism != 3 || len(st.Rescales) != 0 {
		t.Fatalf("job %s at %d (declared %d, min %d, rescales %v): want created, waiting at 4 (declared 4, min 3)", st.State, st.Parallelism, st.DeclaredParallelism, st.MinParallelism, st.Rescales)
	}
	if !strings.Contains(st.Reason, "2 free") || !strings.Contains(st.Reason, "declared 4") {
		t.Errorf("reason %q: want it to say 2 free, declared 4", st.Reason)
	}
	if n, _ := subtasksRunning(st); n > 0 {
		t.Errorf("%d subtasks shown running while the job waits", n)
	}
	tc.addHost("h2", 2)
	st = tc.waitJob(id, "finished", state(wire.JobFinished))
	if st.State != wire.JobFinished || len(st.Rescales) != 0 || len(st.Hosts) != 2 {
		t.Fatalf("job %s on %v (rescales %v): %s; want finished at 4 on 2 hosts, never rescaled", st.State, st.Hosts, st.Rescales, st.Reason)
	}
}
