package runtime

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/internal/jobfile"
)

// grow forwards its input and, at record at (0-based, counted over the
// subtask), emits one of size bytes (key and value) instead.
type grow struct {
	noop
	at, size, seen int
	out            []abi.Record
}

func (g *grow) Process(_ context.Context, _ int, recs []abi.Record, emit Emitter) error {
	g.out = g.out[:0]
	for _, r := range recs {
		if g.seen == g.at {
			r = abi.Record{Key: r.Key, Value: make([]byte, g.size-len(r.Key)), Timestamp: r.Timestamp}
		}
		g.seen++
		g.out = append(g.out, r)
	}
	emit(g.out)
	return nil
}

// TestRecordOverMaxRecordBytes: an operator emits one record of
// max_record_bytes+1 bytes after 9000 ordinary ones; the job fails with an
// error naming the operator, the subtask and the size, and the two-phase
// file sink, which got thousands of records of the failing epoch (here the
// only one: the checkpoint interval is long; bounded channels hold at most
// 17 batches between the operator and the sink), commits none of them.
func TestRecordOverMaxRecordBytes(t *testing.T) {
	const limit = 1 << 20
	dir := t.TempDir()
	out := filepath.Join(dir, "out")
	g := graph(t,
		src("gen", 1, genSpec(10000)),
		op("grow", 1, NativeFactory(func(SubtaskInfo) NativeOperator { return &grow{at: 9000, size: limit + 1} }), in("gen", control.Forward)),
		sink("out", 1, &jobfile.SinkSpec{Type: "file", Path: out}, in("grow", control.Forward)),
	)
	stats, err := Run(context.Background(), g, Options{
		BatchSize: 100, ChannelCapacity: 16, MaxRecordBytes: limit,
		Checkpoint: &CheckpointOptions{Store: openStore(t, filepath.Join(dir, "chk")), Interval: time.Hour, Tick: 10 * time.Millisecond},
	})
	var te *TaskError
	if !errors.As(err, &te) || !errors.Is(err, abi.ErrRecordTooLarge) {
		t.Fatalf("error %v: want a *TaskError wrapping abi.ErrRecordTooLarge", err)
	}
	for _, want := range []string{`operator "grow" subtask 0/1`, "a record of 1048577 bytes (key 5, value 1048572) is over max_record_bytes 1048576"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if got := committed(t, out); len(got) != 0 {
		t.Errorf("%d lines committed of the failing epoch, want none", len(got))
	}
	if in := stats.Operators[2].RecordsIn; in < 9000-17*100 {
		t.Errorf("the sink got %d records of the failing epoch, want at least %d", in, 9000-17*100)
	}
}

// TestFileSourceOnDevZero: a job reading /dev/zero fails at once with the
// line error (file, line, limit) instead of reading without end.
func TestFileSourceOnDevZero(t *testing.T) {
	if _, err := os.Stat("/dev/zero"); err != nil {
		t.Skip("no /dev/zero")
	}
	g := graph(t,
		src("zero", 1, &jobfile.SourceSpec{Type: "file", Path: "/dev/zero"}),
		sink("out", 1, &jobfile.SinkSpec{Type: "discard"}, in("zero", control.Forward)),
	)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	_, err := Run(ctx, g, Options{MaxRecordBytes: 4 << 20})
	if err == nil || !errors.Is(err, abi.ErrRecordTooLarge) || !strings.Contains(err.Error(), `operator "zero" subtask 0/1 phase read: connector: file source /dev/zero: line 1 (byte 0): record too large: longer than max_record_bytes 4194304`) {
		t.Fatalf("error %v: want the line error", err)
	}
	t.Logf("failed after %v", time.Since(start))
}
