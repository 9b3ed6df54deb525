// Tests of the Nexmark queries: each job file of examples/nexmark runs with
// the streamd binary as a user runs it, on a small stream, and its output
// equals the query's definition computed in plain Go over the same events
// (reference_test.go), exactly. The stateful queries are killed (SIGKILL)
// in the middle of the stream and resumed from their checkpoints at another
// parallelism; their output is still exactly the reference, once.
package nexmark_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/streamd/streamd/internal/nexmark"
	"github.com/streamd/streamd/internal/testout"
	"github.com/streamd/streamd/internal/testwasm"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testwasm.RemoveBuilt()
	os.Exit(code)
}

// The test stream: 100k events with event time at 1000 events/s, so the
// 10 s windows of q4, q5, q7 and q8 close a few times (100 s of event time).
const (
	events       = 100_000
	sourceInFile = "source: {type: nexmark, events: 1000000}"
	testSource   = "source: {type: nexmark, events: 100000, event_rate: 1000}"
	pacedSource  = "source: {type: nexmark, events: 100000, event_rate: 1000, rate: 5000}"
	checkpointIn = "checkpoint: {interval: 10s, dir: checkpoints, mode: aligned}"
	fastCheckpts = "checkpoint: {interval: 100ms, dir: checkpoints, mode: aligned}"
)

var testConfig = nexmark.Config{Events: events, EventRate: 1000}

// setup copies job file name.yaml, with its source and checkpoint interval
// replaced, and the module it runs into a new directory.
func setup(t *testing.T, name, source, checkpoint string) string {
	t.Helper()
	root, err := testwasm.Root()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	writeJob(t, root, dir, name, source, checkpoint)
	for _, m := range []string{"nexmark_rust.wasm", "nexmark_go.wasm"} {
		b, err := os.ReadFile(testwasm.Path(t, "examples/nexmark/"+m))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, m), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func writeJob(t *testing.T, root, dir, name, source, checkpoint string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "examples", "nexmark", name+".yaml"))
	if err != nil {
		t.Fatal(err)
	}
	job := string(b)
	for from, to := range map[string]string{sourceInFile: source, checkpointIn: checkpoint} {
		if !strings.Contains(job, from) {
			t.Fatalf("%s.yaml has no %q to replace", name, from)
		}
		job = strings.Replace(job, from, to, 1)
	}
	if err := os.WriteFile(filepath.Join(dir, "job.yaml"), []byte(job), 0o644); err != nil {
		t.Fatal(err)
	}
}

// run runs streamd in dir and fails the test unless it exits 0.
func run(t *testing.T, dir string, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, testwasm.Streamd(t), append([]string{"run", "--progress", "off"}, args...)...)
	cmd.Dir = dir
	var errb bytes.Buffer
	cmd.Stderr = &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("streamd run %v: %v\nstderr:\n%s", args, err, errb.String())
	}
}

// committed is the sorted lines of the committed files in dir.
func committed(t *testing.T, dir string) []string { return testout.Committed(t, dir) }

var evsCache []nexmark.Event

func testEvents() []nexmark.Event {
	if evsCache == nil {
		evsCache = generate(testConfig, events)
	}
	return evsCache
}

// same fails the test unless got (sorted) is want (sorted), line for line.
func same(t *testing.T, what string, got, want []string) {
	t.Helper()
	if len(want) == 0 {
		t.Fatalf("%s: the reference has no output: the test stream is too small", what)
	}
	if strings.Join(got, "\n") == strings.Join(want, "\n") {
		t.Logf("%s: %d lines, as the reference", what, len(got))
		return
	}
	gs, ws := map[string]int{}, map[string]int{}
	for _, l := range got {
		gs[l]++
	}
	for _, l := range want {
		ws[l]++
	}
	var extra, missing []string
	for l, n := range gs {
		if n > ws[l] {
			extra = append(extra, l)
		}
	}
	for l, n := range ws {
		if n > gs[l] {
			missing = append(missing, l)
		}
	}
	sort.Strings(extra)
	sort.Strings(missing)
	t.Fatalf("%s: %d lines, the reference %d; %d not in it (first: %q), %d missing (first: %q)",
		what, len(got), len(want), len(extra), extra[:min(3, len(extra))], len(missing), missing[:min(3, len(missing))])
}

// TestStatelessQueries runs q0, q1 and q2, with the Rust and the Go SDK.
func TestStatelessQueries(t *testing.T) {
	for _, job := range []string{"q0", "q0-go", "q1", "q1-go", "q2", "q2-go"} {
		t.Run(job, func(t *testing.T) {
			dir := setup(t, job, testSource, checkpointIn)
			run(t, dir, "job.yaml")
			same(t, job, committed(t, filepath.Join(dir, "out")), reference(strings.TrimSuffix(job, "-go"), testEvents()))
		})
	}
}

// TestStatefulQueriesKillResume runs q3, q4, q5, q7 and q8 at parallelism
// 2 with checkpoints every 100 ms, kills the process once a checkpoint
// completed, and resumes from the checkpoint directory at parallelism 3 or
// 1: keyed state and timers (joins, open windows, pending auctions) move to
// the subtasks that own their keys now, and what the killed run committed
// plus what the resumed run adds is the reference exactly once.
func TestStatefulQueriesKillResume(t *testing.T) {
	for i, q := range []string{"q3", "q4", "q5", "q7", "q8"} {
		t.Run(q, func(t *testing.T) {
			root, err := testwasm.Root()
			if err != nil {
				t.Fatal(err)
			}
			dir := setup(t, q, pacedSource, fastCheckpts)
			want := reference(q, testEvents())
			cmd := exec.Command(testwasm.Streamd(t), "run", "--progress", "off", "job.yaml")
			cmd.Dir = dir
			var errb bytes.Buffer
			cmd.Stderr = &errb
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			exited := make(chan error, 1)
			go func() { exited <- cmd.Wait() }()
			deadline := time.After(60 * time.Second)
			for done := false; !done; {
				select {
				case err := <-exited:
					t.Fatalf("the job ended (%v) before it was killed: make the test source slower\nstderr:\n%s", err, errb.String())
				case <-deadline:
					cmd.Process.Kill()
					t.Fatalf("no two completed checkpoints within 60s\nstderr:\n%s", errb.String())
				case <-time.After(20 * time.Millisecond):
					m, _ := filepath.Glob(filepath.Join(dir, "checkpoints", "chk-*", "_metadata"))
					done = len(m) >= 1
				}
			}
			if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			<-exited
			before := committed(t, filepath.Join(dir, "out"))
			// Resume unpaced (the rate is not part of the checkpoint).
			writeJob(t, root, dir, q, testSource, fastCheckpts)
			p := []string{"3", "1"}[i%2]
			run(t, dir, "-p", p, "job.yaml", "--from", "checkpoints")
			t.Logf("killed run committed %d lines, resumed at p=%s", len(before), p)
			same(t, q+" killed and resumed", committed(t, filepath.Join(dir, "out")), want)
		})
	}
}

// TestOutOfOrderEvents runs the windowed queries on a stream whose events
// are permuted within groups of 500 (half a second of event time): the
// source's watermark stays below every event still to come, so no event is
// late and the output is still the reference's.
func TestOutOfOrderEvents(t *testing.T) {
	cfg := testConfig
	cfg.OutOfOrderGroupSize = 500
	evs := generate(cfg, events)
	for _, q := range []string{"q4", "q5", "q7", "q8"} {
		t.Run(q, func(t *testing.T) {
			dir := setup(t, q, "source: {type: nexmark, events: 100000, event_rate: 1000, out_of_order_group_size: 500}", checkpointIn)
			run(t, dir, "job.yaml")
			same(t, q+" out of order", committed(t, filepath.Join(dir, "out")), reference(q, evs))
		})
	}
}
