package runtime

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/dataplane"
)

// TestFinishingHandshakeWaitsForTheReceiver: a subtask that sent EndOfData
// does not close before its receiver acknowledged it, and still answers a
// checkpoint trigger meanwhile. The test is the receiver: it takes
// EndOfData (the subtask has processed its two records), triggers a checkpoint (the barrier comes before any
// EndOfPartition: the subtask is still running), then acknowledges, and
// only then comes EndOfPartition.
func TestFinishingHandshakeWaitsForTheReceiver(t *testing.T) {
	c := newCollector()
	h := newHarness(t, []int{0}, c.factory(SubtaskInfo{}))
	h.send(0, batchOf("a", "b"), dataplane.EndOfDataEvent(true), dataplane.EndOfPartitionEvent())
	ctx, cancel := context.WithTimeout(h.ctx, 5*time.Second)
	defer cancel()
	next := func() (int, dataplane.Event) {
		t.Helper()
		ch, ev, err := h.down.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return ch, ev
	}
	ch, ev := next()
	for ev.Kind == dataplane.KindWatermark { // the collector emits no records
		ch, ev = next()
	}
	if ev.Kind != dataplane.KindEndOfData {
		t.Fatalf("got %s, want end-of-data", ev)
	}
	if !h.task.mb.send(command{kind: cmdTrigger, barrier: dataplane.Barrier{ID: 7}}) {
		t.Fatal("the subtask exited before its receiver acknowledged end-of-data")
	}
	if _, ev := next(); ev.Kind != dataplane.KindBarrier || ev.Barrier.ID != 7 {
		t.Fatalf("got %s while waiting for the acknowledgement, want barrier 7", ev)
	}
	if calls := c.subs[0].calls; slices.Contains(calls, "close") {
		t.Fatalf("closed before the acknowledgement: %v", calls)
	}
	if err := dataplane.AckEndOfData(h.down.In(ch)); err != nil {
		t.Fatal(err)
	}
	if _, ev := next(); ev.Kind != dataplane.KindEndOfPartition {
		t.Fatalf("got %s after the acknowledgement, want end-of-partition", ev)
	}
	if err := <-h.errc; err != nil {
		t.Fatal(err)
	}
	if calls := strings.Join(c.subs[0].calls, " "); !strings.HasSuffix(calls, "finish close") {
		t.Fatalf("calls %s", calls)
	}
}

// orderLog records the calls of several operators in one order.
type orderLog struct {
	mu    sync.Mutex
	calls []string
}

func (l *orderLog) add(s string) {
	l.mu.Lock()
	l.calls = append(l.calls, s)
	l.mu.Unlock()
}

// closeLogger logs its Close.
type closeLogger struct {
	noop
	l    *orderLog
	name string
}

func (o *closeLogger) Process(_ context.Context, _ int, recs []abi.Record, emit Emitter) error {
	emit(recs)
	return nil
}
func (o *closeLogger) Close(context.Context) error { o.l.add(o.name + ":close"); return nil }

// slowLast processes its input only once its upstream has finished (so all
// of it is still queued then) and logs the last record it processed.
type slowLast struct {
	noop
	l        *orderLog
	upFinish <-chan struct{}
	last     string
}

func (o *slowLast) Process(ctx context.Context, _ int, recs []abi.Record, _ Emitter) error {
	select {
	case <-o.upFinish:
	case <-ctx.Done():
		return ctx.Err()
	}
	for _, r := range recs {
		if string(r.Value) == o.last {
			o.l.add("slow:processed-last")
		}
	}
	return nil
}

// finishSignal closes a channel in Finish.
type finishSignal struct {
	closeLogger
	done chan struct{}
}

func (o *finishSignal) Finish(context.Context, Emitter) error { close(o.done); return nil }

// TestUpstreamClosesAfterDownstreamProcessed: in a whole job, with and
// without checkpointing, an operator closes only after the slow operator
// behind it has processed the last record it sent. (Without the handshake
// the order here is a race the upstream usually loses; the deterministic
// check is TestFinishingHandshakeWaitsForTheReceiver. With checkpoints the
// final checkpoint's aligned barrier orders it too.)
func TestUpstreamClosesAfterDownstreamProcessed(t *testing.T) {
	for _, ckpt := range []bool{false, true} {
		name := "no-checkpoints"
		if ckpt {
			name = "checkpoints"
		}
		t.Run(name, func(t *testing.T) {
			const n = 20
			l := &orderLog{}
			upFinish := make(chan struct{})
			g := graph(t,
				src("src", 1, genSpec(n)),
				op("up", 1, NativeFactory(func(SubtaskInfo) NativeOperator {
					return &finishSignal{closeLogger: closeLogger{l: l, name: "up"}, done: upFinish}
				}), in("src", control.Forward)),
				op("slow", 1, NativeFactory(func(SubtaskInfo) NativeOperator {
					return &slowLast{l: l, upFinish: upFinish, last: "value-19"}
				}), in("up", control.Forward)),
			)
			opts := Options{BatchSize: 4}
			if ckpt {
				opts.Checkpoint = &CheckpointOptions{Store: openStore(t, t.TempDir()), Interval: time.Hour, Tick: 5 * time.Millisecond}
			}
			if _, err := Run(context.Background(), g, opts); err != nil {
				t.Fatal(err)
			}
			l.mu.Lock()
			defer l.mu.Unlock()
			if !slices.Equal(l.calls, []string{"slow:processed-last", "up:close"}) {
				t.Fatalf("order %v: want the last record processed downstream before the upstream closes", l.calls)
			}
		})
	}
}
