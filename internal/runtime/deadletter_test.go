package runtime

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/host"
	"github.com/streamd/streamd/internal/checkpoint"
	"github.com/streamd/streamd/internal/jobfile"
	"github.com/streamd/streamd/internal/natsutil"
	"github.com/streamd/streamd/internal/testwasm"
)

// deadLetterJob is generator -> failonce (count mode, poison values) ->
// file sink, with the operator's on_error oe.
func deadLetterJob(t *testing.T, mod string, n int64, p int, cfg map[string]string, oe *jobfile.OnError, out string) *control.JobGraph {
	t.Helper()
	cfg["mode"] = "count"
	gen := &jobfile.SourceSpec{Type: "generator", Count: n, Rate: 60000, KeyPattern: "key-{k}", ValuePattern: "value-{n}", Keys: 13, TSStep: 1}
	return graph(t,
		src("src", p, gen),
		op("op", p, &jobfile.WasmSpec{Path: mod, Config: cfg, OnError: oe}, in("src", control.Hash)),
		sink("out", p, &jobfile.SinkSpec{Type: "file", Path: out}, in("op", control.Forward)),
	)
}

// countsWithout are the committed lines of failonce's count mode over
// value-0..value-(n-1) when the poison records are taken out (their count
// writes undone).
func countsWithout(n int, poison map[int]bool) []string {
	var want []string
	per := map[int]int{}
	for i := 0; i < n; i++ {
		if poison[i] {
			continue
		}
		per[i%13]++
		want = append(want, fmt.Sprintf("key-%d=%d", i%13, per[i%13]))
	}
	return want
}

// deadLetters reads the committed dead letters of dir.
func readDeadLetters(t *testing.T, dir string) []DeadLetter {
	t.Helper()
	var dls []DeadLetter
	for _, l := range committed(t, dir) {
		var d DeadLetter
		if err := json.Unmarshal([]byte(l), &d); err != nil {
			t.Fatalf("dead letter %q is not JSON: %v", l, err)
		}
		dls = append(dls, d)
	}
	return dls
}

// TestDeadLetterPoisonRecord: poison records among 100 000 land in the
// dead-letter sink with their error, once each, and every other record is
// committed exactly once with the poison records' state writes undone,
// across a failover in the middle of the run (the operator fails in its
// third notify_checkpoint_complete of attempt 0).
func TestDeadLetterPoisonRecord(t *testing.T) {
	mod := testwasm.Path(t, "internal/testguests/failonce/failonce.wasm")
	eng := cachedEngine(t)
	const n = 100000
	poison := map[int]bool{777: true, 54321: true, 99998: true}
	for _, how := range []string{"fail", "reject"} {
		t.Run(how, func(t *testing.T) {
			dir := t.TempDir()
			out, dead := filepath.Join(dir, "out"), filepath.Join(dir, "dead")
			cfg := map[string]string{"poison": "value-777,value-54321,value-99998", "poison_how": how, "fail_notify": "3"}
			g := deadLetterJob(t, mod, n, 2, cfg, &jobfile.OnError{Mode: jobfile.OnErrorDeadLetter,
				DeadLetter: &jobfile.SinkSpec{Type: "file", Path: dead, Format: "value"}}, out)
			var ids []int64
			stats, err := Run(context.Background(), g, Options{
				Engine: eng, BatchSize: 256,
				Checkpoint: &CheckpointOptions{Store: openStore(t, filepath.Join(dir, "chk")), Interval: 40 * time.Millisecond, Tick: 10 * time.Millisecond,
					OnComplete: func(md *checkpoint.Metadata) { ids = append(ids, md.ID) }},
				Restart: jobfile.RestartSettings{Strategy: jobfile.RestartFixedDelay, Attempts: 2},
			})
			if err != nil {
				t.Fatal(err)
			}
			if stats.Restarts != 1 {
				t.Fatalf("restarts %d, want 1 (the failover in notify of attempt 0)", stats.Restarts)
			}
			checkExactlyOnce(t, committed(t, out), countsWithout(n, poison))
			dls := readDeadLetters(t, dead)
			var got []string
			for _, d := range dls {
				got = append(got, d.Value)
				msg := "guest failed: ProcessElement: failonce: poison record " + d.Value
				if how == "reject" {
					msg = "record rejected: failonce: poison record " + d.Value
				}
				if d.Error != msg || d.Operator != "op" || d.Job != "test" || d.Input != 0 || d.Rejected != (how == "reject") ||
					d.Timestamp == nil || !strings.HasPrefix(d.Key, "key-") || d.Subtask < 0 || d.Subtask > 1 || d.Attempt > 1 {
					t.Errorf("dead letter %+v: want error %q from operator op", d, msg)
				}
			}
			sort.Strings(got)
			checkExactlyOnce(t, got, []string{"value-777", "value-54321", "value-99998"})
			var op OperatorStats
			for _, o := range stats.Operators {
				if o.UID == "op" {
					op = o
				}
			}
			if op.DeadLetters < 3 {
				t.Errorf("stats count %d dead letters, want at least 3", op.DeadLetters)
			}
			t.Logf("%d checkpoints %v; dead letters %+v; elapsed %v", stats.Checkpoints, ids, dls, stats.Elapsed)
		})
	}
}

// TestDeadLetterSkip: on_error skip drops the poison records (a panic and a
// proc_exit of the Go runtime), with their state writes undone, and counts
// them; nothing else changes.
func TestDeadLetterSkip(t *testing.T) {
	mod := testwasm.Path(t, "internal/testguests/failonce/failonce.wasm")
	eng := cachedEngine(t)
	const n = 5000
	for _, how := range []string{"panic", "exit"} {
		t.Run(how, func(t *testing.T) {
			dir := t.TempDir()
			out := filepath.Join(dir, "out")
			cfg := map[string]string{"poison": "value-0,value-2500,value-4999", "poison_how": how}
			g := deadLetterJob(t, mod, n, 1, cfg, &jobfile.OnError{Mode: jobfile.OnErrorSkip}, out)
			stats, err := Run(context.Background(), g, Options{Engine: eng, BatchSize: 512})
			if err != nil {
				t.Fatal(err)
			}
			checkExactlyOnce(t, committed(t, out), countsWithout(n, map[int]bool{0: true, 2500: true, 4999: true}))
			if d := stats.Operators[1].DeadLetters; d != 3 {
				t.Errorf("%d dead letters counted, want 3", d)
			}
		})
	}
}

// TestDeadLetterLimit: past max_dead_letters (a count, or a rate) the job
// fails with an error that names the limit and the last failure.
func TestDeadLetterLimit(t *testing.T) {
	mod := testwasm.Path(t, "internal/testguests/failonce/failonce.wasm")
	eng := cachedEngine(t)
	for _, c := range []struct {
		limit jobfile.DeadLetterLimit
		want  string
	}{
		{jobfile.DeadLetterLimit{Count: 2}, "max_dead_letters 2 exceeded: 3 records made the guest fail (on_error dead_letter)"},
		{jobfile.DeadLetterLimit{Count: 2, Per: time.Hour}, "max_dead_letters 2/1h0m0s exceeded: 3 records made the guest fail within 1h0m0s"},
	} {
		t.Run(c.limit.String(), func(t *testing.T) {
			dir := t.TempDir()
			cfg := map[string]string{"poison": "value-10,value-20,value-30,value-40"}
			g := deadLetterJob(t, mod, 1000, 1, cfg, &jobfile.OnError{Mode: jobfile.OnErrorDeadLetter, Max: c.limit,
				DeadLetter: &jobfile.SinkSpec{Type: "file", Path: filepath.Join(dir, "dead"), Format: "value"}}, filepath.Join(dir, "out"))
			_, err := Run(context.Background(), g, Options{Engine: eng, BatchSize: 64})
			if err == nil {
				t.Fatal("the job succeeded past max_dead_letters")
			}
			for _, want := range []string{c.want, `operator "op"`, "the last: guest failed: ProcessElement: failonce: poison record value-30"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q lacks %q", err, want)
				}
			}
		})
	}
}

// TestDeadLetterRejectFails: with on_error fail (the default) a record the
// guest rejects fails the job with the guest's reason.
func TestDeadLetterRejectFails(t *testing.T) {
	mod := testwasm.Path(t, "internal/testguests/failonce/failonce.wasm")
	dir := t.TempDir()
	g := deadLetterJob(t, mod, 100, 1, map[string]string{"poison": "value-50", "poison_how": "reject"}, nil, filepath.Join(dir, "out"))
	_, err := Run(context.Background(), g, Options{Engine: cachedEngine(t)})
	if !errors.Is(err, host.ErrRejected) || !strings.Contains(err.Error(), "record rejected: failonce: poison record value-50") {
		t.Fatalf("got %v, want the job to fail with the guest's rejection", err)
	}
}

// TestDeadLetterRustReject: the Rust SDK's reject (the conformance guest's
// value "reject") goes to the dead-letter sink with the guest's reason. The
// file source's lines have no key, so the guest's keyed-state calls on the
// other lines fail too (a host import misused): dead letters of their own.
func TestDeadLetterRustReject(t *testing.T) {
	mod := testwasm.Path(t, "internal/conformance/guests/rust/conformance.wasm")
	dir := t.TempDir()
	input := filepath.Join(dir, "in.txt")
	if err := os.WriteFile(input, []byte("a\nreject\nb\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, dead := filepath.Join(dir, "out"), filepath.Join(dir, "dead")
	g := graph(t,
		src("src", 1, &jobfile.SourceSpec{Type: "file", Path: input}),
		op("conf", 1, &jobfile.WasmSpec{Path: mod, OnError: &jobfile.OnError{Mode: jobfile.OnErrorDeadLetter,
			DeadLetter: &jobfile.SinkSpec{Type: "file", Path: dead, Format: "value"}}}, in("src", control.Forward)),
		sink("out", 1, &jobfile.SinkSpec{Type: "file", Path: out}, in("conf", control.Forward)),
	)
	if _, err := Run(context.Background(), g, Options{Engine: cachedEngine(t)}); err != nil {
		t.Fatal(err)
	}
	dls := readDeadLetters(t, dead)
	byValue := map[string]DeadLetter{}
	for _, d := range dls {
		byValue[d.Value] = d
	}
	if r := byValue["reject"]; len(dls) != 3 || r.Error != "record rejected: conformance reject" || !r.Rejected || r.CheckpointID != 0 {
		t.Fatalf("dead letters %+v, want the rejected line with the guest's reason and the other two", dls)
	}
	for _, v := range []string{"a", "b"} {
		if d := byValue[v]; d.Rejected || !strings.HasPrefix(d.Error, "host import misused: state_get: empty key") {
			t.Errorf("dead letter of %q: %+v, want the misused import", v, d)
		}
	}
}

// TestDeadLetterNATS: a nats dead-letter sink publishes each poison record
// once, with the record's key in the Streamd-Key header, across a failover
// (the operator fails in its third notify of attempt 0).
func TestDeadLetterNATS(t *testing.T) {
	mod := testwasm.Path(t, "internal/testguests/failonce/failonce.wasm")
	srv, js := jetStreamServer(t)
	ctx := context.Background()
	dead, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "DEAD", Subjects: []string{"dead.>"}, AllowAtomicPublish: true})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	job, err := jobfile.ParseJob([]byte(fmt.Sprintf(`
name: dlnats
parallelism: 2
checkpoint: {interval: 30ms, dir: chk}
operators:
  - uid: gen
    source: {type: generator, count: 20000, rate: 40000, keys: 13}
  - uid: count
    wasm: %s
    config: {mode: count, poison: "value-100,value-15000", fail_notify: 3}
    on_error: dead_letter
    dead_letter: {type: nats, subject: dead.count}
    inputs: [{from: gen, partition: hash}]
  - uid: out
    sink: {type: file, path: out/}
    inputs: [count]
`, mod)), dir, jobfile.Options{Filename: "dlnats.yaml"})
	if err != nil {
		t.Fatal(err)
	}
	stats, err := Run(ctx, job.Graph, Options{
		Engine: cachedEngine(t), BatchSize: 128,
		NATS:       natsutil.ConnectOptions{URLs: []string{srv.URL()}},
		Checkpoint: &CheckpointOptions{Store: openStore(t, job.Checkpoint.Dir), Interval: job.Checkpoint.Interval, Tick: 10 * time.Millisecond},
		Restart:    jobfile.RestartSettings{Strategy: jobfile.RestartFixedDelay, Attempts: 2},
	})
	if err != nil {
		t.Fatal(err)
	}
	if stats.Restarts != 1 {
		t.Fatalf("restarts %d, want 1", stats.Restarts)
	}
	checkExactlyOnce(t, committed(t, filepath.Join(dir, "out")), countsWithout(20000, map[int]bool{100: true, 15000: true}))
	var got []string
	for _, v := range streamValues(t, dead, "dead.count", func(m *jetstream.RawStreamMsg) {
		if k := m.Header.Get("Streamd-Key"); !strings.HasPrefix(k, "key-") {
			t.Errorf("dead letter with key %q, want the record's", k)
		}
	}) {
		var d DeadLetter
		if err := json.Unmarshal([]byte(v), &d); err != nil || d.Operator != "count" || !strings.Contains(d.Error, "poison record "+d.Value) {
			t.Errorf("dead letter %s (%v): want the poison record and its error", v, err)
		}
		got = append(got, d.Value)
	}
	sort.Strings(got)
	checkExactlyOnce(t, got, []string{"value-100", "value-15000"})
}
