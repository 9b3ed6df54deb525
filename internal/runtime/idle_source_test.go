package runtime

import (
	"context"
	"io"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/internal/checkpoint"
	"github.com/streamd/streamd/internal/jobfile"
)

// countOp counts the records it receives.
type countOp struct {
	noop
	n *atomic.Int64
}

func (o countOp) Process(_ context.Context, _ int, recs []abi.Record, _ Emitter) error {
	o.n.Add(int64(len(recs)))
	return nil
}

// idleRun runs src -> count with checkpoints every 20 ms. It waits until
// three checkpoints in a row completed with no record arriving between them
// (so the source was waiting for input while they were taken), then stops
// the job with a savepoint and returns the savepoint's location.
// want, if not negative, is the number of records that must have arrived.
func idleRun(t *testing.T, spec *jobfile.SourceSpec, stdin io.Reader, want int64) string {
	t.Helper()
	var got atomic.Int64
	quiet := make(chan struct{})
	last, same := int64(-1), 0
	onComplete := func(md *checkpoint.Metadata) {
		// Called by the driver goroutine, one at a time.
		if n := got.Load(); n == last {
			same++
		} else {
			last, same = n, 1
		}
		if same == 3 && (want < 0 || last == want) {
			close(quiet)
		}
	}
	g := graph(t,
		src("src", 1, spec),
		sink("count", 1, NativeFactory(func(SubtaskInfo) NativeOperator { return countOp{n: &got} }), in("src", control.Forward)),
	)
	stop := make(chan StopRequest, 1)
	type result struct {
		stats Stats
		err   error
	}
	done := make(chan result, 1)
	go func() {
		st, err := Run(context.Background(), g, Options{Stdin: stdin, Stop: stop,
			Checkpoint: &CheckpointOptions{Store: openStore(t, filepath.Join(t.TempDir(), "chk")), Interval: 20 * time.Millisecond, Tick: 5 * time.Millisecond,
				OnComplete: onComplete}})
		done <- result{st, err}
	}()
	select {
	case <-quiet:
	case r := <-done:
		t.Fatalf("the job ended before three checkpoints completed while its source waited: %+v %v", r.stats, r.err)
	}
	stop <- StopRequest{}
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.stats.Savepoint == "" {
		t.Fatalf("stopped without a savepoint: %+v", r.stats)
	}
	return r.stats.Savepoint
}

// TestCheckpointsWhileGeneratorThrottled: a generator emitting one record
// every 4 s takes barriers between its records, and a stop does not wait
// for its next record.
func TestCheckpointsWhileGeneratorThrottled(t *testing.T) {
	idleRun(t, &jobfile.SourceSpec{Type: "generator", Rate: 0.25, KeyPattern: "k", ValuePattern: "v{n}", Keys: 1, TSStep: 1}, nil, -1)
}

// TestCheckpointsWhileStdinWaits: a file source on standard input that
// waits for its next line (the writer keeps the pipe open) takes barriers
// and stops with a savepoint; the savepoint holds the position after the
// lines it read.
func TestCheckpointsWhileStdinWaits(t *testing.T) {
	pr, pw := io.Pipe()
	t.Cleanup(func() { pw.Close() })
	go func() { _, _ = io.WriteString(pw, "one\ntwo\n") }()
	sp := idleRun(t, &jobfile.SourceSpec{Type: "file", Path: "-"}, pr, 2)
	md, err := checkpoint.Resolve(sp)
	if err != nil {
		t.Fatal(err)
	}
	if md.Kind != control.KindSavepoint {
		t.Fatalf("%s is a %s", sp, md.Kind)
	}
}
