package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/streamd/streamd/internal/cluster/agent"
	"github.com/streamd/streamd/internal/cluster/wire"
	"github.com/streamd/streamd/internal/jobfile"
	"github.com/streamd/streamd/internal/testwasm"
)

// spreadJob writes a job file into a fresh directory: a generator of n
// records at rate per second (0: unlimited), hash-partitioned into the
// uppercase module, into a file sink, all at parallelism p, with extra
// appended (e.g. a checkpoint section). Hash partitioning makes every
// generator subtask send to every upper subtask, so a job spread over hosts
// has channels between them.
func spreadJob(t *testing.T, n, rate, p int, extra string) string {
	wasm := testwasm.Path(t, "examples/wasm/uppercase/uppercase.wasm")
	dir := t.TempDir()
	job := fmt.Sprintf(`name: spread
parallelism: %d
operators:
  - uid: gen
    source: {type: generator, count: %d, rate: %d, keys: 1000}
  - uid: upper
    wasm: %s
    inputs: [{from: gen, partition: hash}]
  - uid: out
    sink: {type: file, path: out/}
    inputs: [{from: upper}]
%s`, p, n, rate, wasm, extra)
	path := filepath.Join(dir, "spread.yaml")
	if err := os.WriteFile(path, []byte(job), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// outputLines reads every committed file of a file sink directory (names not
// starting with '.') and returns their lines, sorted.
func outputLines(t *testing.T, dir string) []string {
	t.Helper()
	return outputLinesOf(t, dir, "")
}

// outputLinesOf is outputLines of the committed files whose names start with
// prefix.
func outputLinesOf(t *testing.T, dir, prefix string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".") || e.IsDir() || !strings.HasPrefix(e.Name(), prefix) {
			continue
		}
		for _, l := range strings.Split(readFile(t, filepath.Join(dir, e.Name())), "\n") {
			if l != "" {
				lines = append(lines, l)
			}
		}
	}
	slices.Sort(lines)
	return lines
}

// runLocally runs the job file with `streamd run` in a copy of its directory,
// its generator not rate-limited (the output does not depend on the rate) and
// its checkpoints in a directory, and returns its output lines.
func runLocally(t *testing.T, path string) []string {
	t.Helper()
	dir := t.TempDir()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b = regexp.MustCompile(`rate: \d+`).ReplaceAll(b, []byte("rate: 0"))
	b = regexp.MustCompile(`storage: jetstream`).ReplaceAll(b, []byte("storage: dir"))
	local := filepath.Join(dir, filepath.Base(path))
	if err := os.WriteFile(local, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, errs, code := streamd(t, nil, "run", local); code != 0 {
		t.Fatalf("streamd run: exit %d\n%s\n%s", code, out, errs)
	}
	return outputLines(t, filepath.Join(dir, "out"))
}

func sameLines(t *testing.T, got, want []string) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%d output lines, want %d (as streamd run)", len(got), len(want))
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("output line %d: %q, want %q (as streamd run)", i, got[i], want[i])
		}
	}
}

func TestJobSpreadOverTwoHosts(t *testing.T) {
	for _, c := range []struct {
		name, extra, mode string
		rate              int
	}{
		{"no-checkpoints", "", "", 0},
		{"checkpoints", "checkpoint: {interval: 100ms, dir: chk}\n", "aligned", 0},
		// Unaligned barriers overtake what is queued on the NATS channels
		// between the hosts (rate-limited, so checkpoints run meanwhile).
		{"unaligned", "checkpoint: {interval: 50ms, dir: chk, mode: unaligned}\n", "unaligned", 10000},
	} {
		t.Run(c.name, func(t *testing.T) {
			tc := newCluster(t, 2, 2)
			path := spreadJob(t, 20000, c.rate, 4, c.extra)
			id := deploy(t, tc, path, jobfile.Options{})
			st := tc.waitJob(id, "finished", state(wire.JobFinished))
			if st.State != wire.JobFinished {
				t.Fatalf("job %s: %s", st.State, st.Reason)
			}
			if st.CheckpointMode != c.mode {
				t.Errorf("status: checkpoint mode %q, want %q", st.CheckpointMode, c.mode)
			}
			if c.mode == "unaligned" && len(st.Checkpoints) < 3 {
				t.Errorf("%d checkpoints completed, want several while the job ran", len(st.Checkpoints))
			}
			if !slices.Equal(st.Hosts, []string{"h1", "h2"}) {
				t.Errorf("hosts %v, want [h1 h2]", st.Hosts)
			}
			if st.Operators[1].RecordsIn != 20000 {
				t.Errorf("upper read %d records over both hosts, want 20000", st.Operators[1].RecordsIn)
			}
			sameLines(t, outputLines(t, filepath.Join(filepath.Dir(path), "out")), runLocally(t, path))
		})
	}
}

// TestSameJobFileDeployedTwice deploys one job file twice at once, spread
// over two hosts with checkpoints (retain 1) and one file sink directory:
// each deployment keeps its checkpoints under chk/JOB_ID and its own part
// files, and both write every record exactly once.
func TestSameJobFileDeployedTwice(t *testing.T) {
	tc := newCluster(t, 4, 4)
	path := spreadJob(t, 6000, 20000, 2, "checkpoint: {interval: 50ms, dir: chk, retain: 1}\n")
	job, err := jobfile.LoadJob(path, jobfile.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ids, errs := make([]string, 2), make([]error, 2)
	var wg sync.WaitGroup
	for i := range ids {
		wg.Go(func() { ids[i], errs[i] = tc.client.Deploy(context.Background(), job, path) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	want := runLocally(t, path)
	for _, id := range ids {
		st := tc.waitJob(id, "finished", state(wire.JobFinished))
		if st.State != wire.JobFinished || st.Attempt != 0 {
			t.Fatalf("job %s: %s in attempt %d: %s", id, st.State, st.Attempt, st.Reason)
		}
		if len(st.Checkpoints) == 0 {
			t.Fatalf("job %s completed no checkpoint", id)
		}
		if last := st.Checkpoints[len(st.Checkpoints)-1].Location; !strings.HasPrefix(last, filepath.Join(filepath.Dir(path), "chk", id)+"/") {
			t.Errorf("job %s: last checkpoint at %s, want it under chk/%s", id, last, id)
		}
		sameLines(t, outputLinesOf(t, filepath.Join(filepath.Dir(path), "out"), "part-"+id+"-"), want)
	}
}

// TestSavepointAndStopAcrossHosts takes a savepoint of a job spread over two
// hosts into another directory, stops it with a savepoint and resumes it
// with streamd run --from: the output is that of an uninterrupted run.
func TestSavepointAndStopAcrossHosts(t *testing.T) {
	tc := newCluster(t, 2, 2)
	const n = 12000
	path := spreadJob(t, n, 3000, 4, "checkpoint: {interval: 300ms, dir: chk}\n")
	id := deploy(t, tc, path, jobfile.Options{})
	tc.waitJob(id, "running", func(st *wire.JobStatus) bool {
		return wire.TerminalJobState(st.State) || (st.State == wire.JobRunning && st.Operators[2].RecordsIn > 0)
	})
	spDir := t.TempDir()
	sp, err := tc.client.Savepoint(context.Background(), id, spDir)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(sp, spDir) {
		t.Errorf("savepoint %q: want it in %s", sp, spDir)
	}
	if _, err := os.Stat(filepath.Join(sp, "_metadata")); err != nil {
		t.Errorf("savepoint: %v", err)
	}
	stopped, err := tc.client.Stop(context.Background(), id, "", false)
	if err != nil {
		t.Fatal(err)
	}
	st := tc.waitJob(id, "stopped", state(wire.JobStopped))
	if st.State != wire.JobStopped || st.Savepoint != stopped {
		t.Fatalf("after stop: %s savepoint %q (%s), want stopped with %s", st.State, st.Savepoint, st.Reason, stopped)
	}
	if st.Operators[0].RecordsOut >= n {
		t.Fatalf("the generator had already ended (%d records) before the stop: make the job longer", st.Operators[0].RecordsOut)
	}
	// Resume in one process from the savepoint the hosts wrote.
	if out, errs, code := streamd(t, nil, "run", path, "--from", stopped); code != 0 {
		t.Fatalf("streamd run --from: exit %d\n%s\n%s", code, out, errs)
	}
	sameLines(t, outputLines(t, filepath.Join(filepath.Dir(path), "out")), runLocally(t, path))
}

// TestDrainCheckpointsOverNATS: a job spread over two hosts whose slow stage
// (2 ms a record) reads hash-partitioned channels, so half of them cross
// NATS. The generator has no rate: its records are all queued in the
// channels (the NATS credit windows) at once and it ends, so nearly the
// whole run is the drain. Unaligned checkpoints keep completing meanwhile
// (a barrier waits only for the slow stage's current batch of 10 records),
// with the queued records as channel state (received over NATS on the
// crossing channels), and the output is what streamd run writes.
func TestDrainCheckpointsOverNATS(t *testing.T) {
	mod := testwasm.Path(t, "internal/testguests/failonce/failonce.wasm")
	dir := t.TempDir()
	const n = 2000 // 1000 a slow subtask: at least 2 s of drain
	job := fmt.Sprintf(`name: drain
parallelism: 2
checkpoint: {interval: 100ms, dir: chk, mode: unaligned}
operators:
  - uid: gen
    source: {type: generator, count: %d, keys: 100, value: "v-{n}"}
  - uid: slow
    wasm: %s
    allow_clock: true
    config: {sleep_us: 2000}
    inputs: [{from: gen, partition: hash}]
  - uid: out
    sink: {type: file, path: out/}
    inputs: [slow]
`, n, mod)
	path := filepath.Join(dir, "drain.yaml")
	if err := os.WriteFile(path, []byte(job), 0o644); err != nil {
		t.Fatal(err)
	}
	// One slot each: the two subtasks go to different hosts. Batches of 10
	// records: the slow stage takes a barrier between two process calls.
	// In-process channels of 200 batches hold all the records, as the NATS
	// credit windows do: the generator ends at once.
	tc := newCluster(t)
	for _, h := range []string{"h1", "h2"} {
		tc.addHostWith(h, 1, &agent.LocalExecutor{Engine: tc.engine, BatchSize: 10, ChannelCapacity: 200})
	}
	tc.waitHosts(2)
	id := deploy(t, tc, path, jobfile.Options{})
	st := tc.waitJob(id, "finished", state(wire.JobFinished))
	if st.State != wire.JobFinished {
		t.Fatalf("job %s: %s", st.State, st.Reason)
	}
	if !slices.Equal(st.Hosts, []string{"h1", "h2"}) {
		t.Fatalf("hosts %v, want [h1 h2]", st.Hosts)
	}
	withInFlight := 0
	for _, c := range st.Checkpoints {
		if c.InFlight > 0 {
			withInFlight++
		}
	}
	if withInFlight < 3 {
		t.Errorf("%d of the %d recent checkpoints carry in-flight records, want >= 3 completed during the drain: %+v", withInFlight, len(st.Checkpoints), st.Checkpoints)
	}
	sameLines(t, outputLines(t, filepath.Join(dir, "out")), runLocally(t, path))
}
