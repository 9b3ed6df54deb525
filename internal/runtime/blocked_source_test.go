package runtime

import (
	"context"
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
	const (
		blkBatch     = 400
		blkPerRecord = 8 * time.Millisecond
		count        = 1200
		keys         = 10
	)
	mod := testwasm.Path(t, "internal/testguests/failonce/failonce.wasm")
	dir := t.TempDir()
	out := filepath.Join(dir, "out")
	slow := NativeFactory(func(SubtaskInfo) NativeOperator { return &slowMap{per: blkPerRecord} })
	g := graph(t,
		src("gen", 1, &jobfile.SourceSpec{Type: "generator", Count: count, Rate: 250, KeyPattern: "key-{k}", ValuePattern: "value-{n}", Keys: keys, TSStep: 1}),
		op("slow", 1, slow, in("gen", control.Rebalance)),
		op("count", 2, &jobfile.WasmSpec{Path: mod, Config: map[string]string{"fail_at": strconv.Itoa(count / 4), "mode": "count"}}, in("slow", control.Hash)),
		sink("out", 2, &jobfile.SinkSpec{Type: "file", Path: out}, in("count", control.Forward)),
	)
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	var withOutputs atomic.Int64 // source snapshots with output buffers (a source has no input channels)
	stats, err := Run(context.Background(), g, Options{Engine: cachedEngine(t), BatchSize: blkBatch, ChannelCapacity: 1, TracerProvider: tp,
		Checkpoint: &CheckpointOptions{Store: openStore(t, filepath.Join(dir, "chk")), Interval: 100 * time.Millisecond, Tick: 5 * time.Millisecond,
			Mode: control.AlignUnaligned,
			OnComplete: func(md *checkpoint.Metadata) {
				if om := md.Operator("gen"); om != nil {
					for _, s := range om.Subtasks {
						if s.InFlightBytes > 0 {
							withOutputs.Add(1)
						}
					}
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
	per := map[string]int{}
	var want []string
	for n := 0; n < count; n++ {
		k := fmt.Sprintf("key-%d", n%keys)
		per[k]++
		want = append(want, fmt.Sprintf("%s=%d", k, per[k]))
	}
	checkExactlyOnce(t, committed(t, out), want)

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
