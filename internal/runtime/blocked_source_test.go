package runtime

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/internal/checkpoint"
	"github.com/streamd/streamd/internal/jobfile"
	"github.com/streamd/streamd/internal/telemetry"
	"github.com/streamd/streamd/internal/testwasm"
)

const (
	blkBatch     = 400
	blkPerRecord = 8 * time.Millisecond
	blkCount     = 1200
	blkKeys      = 10
)

// blockedGraph is gen (p=1, twice as fast as the slow stage) -rebalance->
// slow (native, blkPerRecord a record, parallelism slowP) -hash-> count
// (wasm keyed running count, failing once at failAt records; 0: never)
// -> file sink out.
func blockedGraph(t *testing.T, slowP, failAt int, out string) *control.JobGraph {
	mod := testwasm.Path(t, "internal/testguests/failonce/failonce.wasm")
	slow := NativeFactory(func(SubtaskInfo) NativeOperator { return &slowMap{per: blkPerRecord} })
	return graph(t,
		src("gen", 1, &jobfile.SourceSpec{Type: "generator", Count: blkCount, Rate: 250, KeyPattern: "key-{k}", ValuePattern: "value-{n}", Keys: blkKeys, TSStep: 1}),
		op("slow", slowP, slow, in("gen", control.Rebalance)),
		op("count", 2, &jobfile.WasmSpec{Path: mod, Config: map[string]string{"fail_at": strconv.Itoa(failAt), "mode": "count"}}, in("slow", control.Hash)),
		sink("out", 2, &jobfile.SinkSpec{Type: "file", Path: out}, in("count", control.Forward)),
	)
}

// blockedCounts is the committed output of an exactly-once run of
// blockedGraph: every count 1..N of every key.
func blockedCounts() []string {
	per := map[string]int{}
	var want []string
	for n := 0; n < blkCount; n++ {
		k := fmt.Sprintf("key-%d", n%blkKeys)
		per[k]++
		want = append(want, fmt.Sprintf("%s=%d", k, per[k]))
	}
	return want
}

// genOutputs reports whether the source's part of md stores output
// buffers (a source has no input channels: all its channel state is).
func genOutputs(md *checkpoint.Metadata) bool {
	if om := md.Operator("gen"); om != nil {
		for _, s := range om.Subtasks {
			if s.InFlightBytes > 0 {
				return true
			}
		}
	}
	return false
}

// TestBlockedSourceTakesTrigger (issue 24): a source back-pressured by a
// slow stage takes an unaligned checkpoint's trigger at once, not when its
// blocked send gets room. The slow stage takes blkBatch * blkPerRecord
// (3.2 s) for each batch and its channel holds one, so the source, which
// reads twice as fast, finds it full most of the time; a trigger that
// waited for the send waited up to 3.2 s. Measured from the checkpoint span
// (the trigger) to the source's task.snapshot span (its position taken):
// under 1 s for every checkpoint, and most far less. A failure injected
// behind the slow stage restores the last checkpoint, whose output buffers
// and channel state are replayed: the keyed running count is exactly once
// in the committed output.
func TestBlockedSourceTakesTrigger(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "out")
	g := blockedGraph(t, 1, blkCount/4, out)
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	var withOutputs atomic.Int64 // source snapshots with output buffers (a source has no input channels)
	stats, err := Run(context.Background(), g, Options{Engine: cachedEngine(t), BatchSize: blkBatch, ChannelCapacity: 1, TracerProvider: tp,
		Checkpoint: &CheckpointOptions{Store: openStore(t, filepath.Join(dir, "chk")), Interval: 100 * time.Millisecond, Tick: 5 * time.Millisecond,
			Mode: control.AlignUnaligned,
			OnComplete: func(md *checkpoint.Metadata) {
				if genOutputs(md) {
					withOutputs.Add(1)
				}
			}},
		Restart: jobfile.RestartSettings{Strategy: jobfile.RestartFixedDelay, Attempts: 2},
	})
	if err != nil {
		t.Fatal(err)
	}
	if stats.Restarts != 1 {
		t.Fatalf("restarts %d, want 1 (the injected failure)", stats.Restarts)
	}
	checkExactlyOnce(t, committed(t, out), blockedCounts())

	ss := spans(exp.GetSpans())
	var delays []time.Duration
	for _, c := range ss.named(telemetry.SpanCheckpoint) {
		for _, k := range ss.childrenOf(c).named(telemetry.SpanTaskSnapshot) {
			if v, _ := attr(k, telemetry.AttrOperator); v.AsString() == "gen" {
				delays = append(delays, k.StartTime.Sub(c.StartTime))
			}
		}
	}
	if len(delays) < 3 {
		t.Fatalf("%d source snapshots, want at least 3", len(delays))
	}
	for i, d := range delays {
		if d >= time.Second {
			t.Fatalf("source snapshot %d of %d: %v after its trigger, want under 1s (the slow stage frees room every %v): %v",
				i+1, len(delays), d, blkBatch*blkPerRecord, delays)
		}
	}
	t.Logf("%d checkpoints, trigger to source snapshot: %v; %d with the source's output buffers", stats.Checkpoints, delays, withOutputs.Load())
}

// TestBlockedSourceRestoreRescaled: a checkpoint whose source part stores
// output buffers (taken while the source was blocked on the slow stage)
// restores with the slow stage at parallelism 2: the buffers go to the
// new subtasks by the rebalance edge's rule, after their channel state,
// and the output is exactly once.
func TestBlockedSourceRestoreRescaled(t *testing.T) {
	dir := t.TempDir()
	out, chk := filepath.Join(dir, "out"), filepath.Join(dir, "chk")
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	stop := errors.New("test: a checkpoint with the source's output buffers")
	var taken *checkpoint.Metadata
	_, err := Run(ctx, blockedGraph(t, 1, 0, out), Options{Engine: cachedEngine(t), BatchSize: blkBatch, ChannelCapacity: 1,
		Checkpoint: &CheckpointOptions{Store: openStore(t, chk), Interval: 100 * time.Millisecond, Tick: 5 * time.Millisecond,
			Mode: control.AlignUnaligned,
			OnComplete: func(md *checkpoint.Metadata) {
				if taken == nil && genOutputs(md) {
					taken = md
					cancel(stop)
				}
			}},
	})
	if taken == nil {
		t.Fatalf("no checkpoint with the source's output buffers: %v", err)
	}
	g := blockedGraph(t, 2, 0, out)
	rs, err := checkpoint.LoadRestore(context.Background(), taken.Location, g)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for id, sr := range rs.Subtasks {
		if id.Operator == "slow" {
			for _, cd := range sr.InFlight {
				n += len(cd.Elements)
			}
		}
	}
	if n == 0 {
		t.Fatalf("checkpoint %d: nothing in flight to the slow stage", taken.ID)
	}
	if _, err := Run(context.Background(), g, Options{Engine: cachedEngine(t), BatchSize: blkBatch, ChannelCapacity: 1, Restore: rs,
		Checkpoint: &CheckpointOptions{Store: openStore(t, chk), Interval: 100 * time.Millisecond, Tick: 5 * time.Millisecond, Mode: control.AlignUnaligned},
	}); err != nil {
		t.Fatal(err)
	}
	checkExactlyOnce(t, committed(t, out), blockedCounts())
	t.Logf("restored checkpoint %d (%d bytes in flight, %d elements to slow) at slow p=2", taken.ID, taken.InFlightBytes(), n)
}
