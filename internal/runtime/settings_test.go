package runtime

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/internal/checkpoint"
	"github.com/streamd/streamd/internal/jobfile"
)

// flakyStore is a checkpoint directory whose first WriteState of checkpoint
// failID fails, as a full disk would: that subtask declines the checkpoint.
type flakyStore struct {
	*checkpoint.Dir
	failID int64
	failed atomic.Bool
}

func (s *flakyStore) WriteState(ctx context.Context, kind control.CheckpointKind, id int64, sub control.SubtaskID, data []byte) (checkpoint.BlobRef, error) {
	if id == s.failID && s.failed.CompareAndSwap(false, true) {
		return checkpoint.BlobRef{}, fmt.Errorf("flaky store: write state of %v for checkpoint %d: no space left on device", sub, id)
	}
	return s.Dir.WriteState(ctx, kind, id, sub, data)
}

// TestNewCheckpointOptions: every checkpoint field of the job file reaches
// the runtime's options.
func TestNewCheckpointOptions(t *testing.T) {
	dir := t.TempDir()
	job, err := jobfile.ParseJob([]byte(`name: s
checkpoint: {interval: 250ms, timeout: 30s, min_pause: 100ms, tolerable_failures: 0, max_concurrent: 2, final_immediately: false}
operators:
  - {uid: gen, source: {type: generator, count: 5}}
  - {uid: out, sink: {type: discard}, inputs: [gen]}
`), dir, jobfile.Options{})
	if err != nil {
		t.Fatal(err)
	}
	store := openStore(t, filepath.Join(dir, "chk"))
	co := NewCheckpointOptions(job.Checkpoint, store)
	if co.Store != store || co.Interval != 250*time.Millisecond || co.Timeout != 30*time.Second || co.MinPause != 100*time.Millisecond ||
		co.TolerableFailures == nil || *co.TolerableFailures != 0 || co.MaxConcurrent != 2 || !co.DelayFinalCheckpoint {
		t.Fatalf("options %+v (tolerable %v)", co, co.TolerableFailures)
	}
	job.Checkpoint.FinalImmediately = true
	job.Checkpoint.TolerableFailures = -1
	if co := NewCheckpointOptions(job.Checkpoint, store); co.DelayFinalCheckpoint || *co.TolerableFailures != -1 {
		t.Fatalf("final_immediately true, unlimited failures: %+v", co)
	}
}

// TestTolerableFailures: one subtask declines the first checkpoint (its
// state cannot be written). With checkpoint.tolerable_failures 0 that fails
// the job at once; with the default (3) the job goes on and finishes with
// every record committed exactly once.
func TestTolerableFailures(t *testing.T) {
	const n = 3000
	for _, tolerable := range []string{"0", "default"} {
		t.Run(tolerable, func(t *testing.T) {
			dir := t.TempDir()
			section := "checkpoint: {interval: 50ms, dir: chk}"
			if tolerable != "default" {
				section = "checkpoint: {interval: 50ms, dir: chk, tolerable_failures: " + tolerable + "}"
			}
			job, err := jobfile.ParseJob([]byte(`name: tolerable
`+section+`
restart: {strategy: none}
operators:
  - {uid: gen, parallelism: 2, source: {type: generator, count: `+fmt.Sprint(n)+`, rate: 6000}}
  - {uid: out, parallelism: 2, sink: {type: file, path: out}, inputs: [gen]}
`), dir, jobfile.Options{})
			if err != nil {
				t.Fatal(err)
			}
			d, err := checkpoint.OpenDir(job.Checkpoint.Dir)
			if err != nil {
				t.Fatal(err)
			}
			first, _ := d.NextID(context.Background())
			store := &flakyStore{Dir: d, failID: first}
			co := NewCheckpointOptions(job.Checkpoint, store)
			co.Tick = 10 * time.Millisecond
			var completed atomic.Int32
			co.OnComplete = func(*checkpoint.Metadata) { completed.Add(1) }
			stats, err := Run(context.Background(), job.Graph, Options{BatchSize: 50, Checkpoint: co})
			if !store.failed.Load() {
				t.Fatalf("checkpoint %d never wrote state (err %v)", first, err)
			}
			if tolerable == "0" {
				if !errors.Is(err, control.ErrTooManyCheckpointFailures) {
					t.Fatalf("err %v, want %v", err, control.ErrTooManyCheckpointFailures)
				}
				if completed.Load() != 0 {
					t.Fatalf("%d checkpoints completed before the job failed, want 0", completed.Load())
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if stats.Restarts != 0 || stats.Checkpoints < 2 {
				t.Fatalf("restarts %d, checkpoints %d: want no restart, a periodic and the final checkpoint", stats.Restarts, stats.Checkpoints)
			}
			var want []string
			for i := 0; i < n; i++ {
				want = append(want, fmt.Sprintf("value-%d", i))
			}
			checkExactlyOnce(t, committed(t, filepath.Join(dir, "out")), want)
		})
	}
}

// TestStopLogNamesJobOnce: the runtime logs with the caller's logger, which
// names the job; "stopping with a savepoint" carries job= once.
func TestStopLogNamesJobOnce(t *testing.T) {
	dir := t.TempDir()
	spec := genSpec(0)
	spec.Rate = 5000
	g := graph(t,
		src("src", 1, spec),
		sink("out", 1, &jobfile.SinkSpec{Type: "discard"}, in("src", control.Forward)),
	)
	var logs syncBuffer
	log := slog.New(slog.NewTextHandler(&logs, nil)).With("job", g.Name)
	stop := make(chan StopRequest, 1)
	var once atomic.Bool
	stats, err := Run(context.Background(), g, Options{Logger: log, Stop: stop,
		Checkpoint: &CheckpointOptions{Store: openStore(t, filepath.Join(dir, "chk")), Interval: 20 * time.Millisecond, Tick: 5 * time.Millisecond,
			OnComplete: func(*checkpoint.Metadata) {
				if once.CompareAndSwap(false, true) {
					stop <- StopRequest{}
				}
			}}})
	if err != nil || stats.Savepoint == "" {
		t.Fatalf("stop with savepoint: %v, savepoint %q", err, stats.Savepoint)
	}
	var line string
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, "stopping with a savepoint") {
			line = l
		}
	}
	if line == "" {
		t.Fatalf("no stopping line in the log:\n%s", logs.String())
	}
	if n := strings.Count(line, "job="); n != 1 {
		t.Fatalf("%d job= in %q, want 1", n, line)
	}
}
