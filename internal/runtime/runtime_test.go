package runtime

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/dataplane"
	"github.com/streamd/streamd/host"
	"github.com/streamd/streamd/internal/jobfile"
	"github.com/streamd/streamd/internal/testwasm"
)

// TestPipelinePartitionings runs generator -[partitioning]-> upper -> collect
// at parallelism 1 and 4 and checks every record arrives exactly as often as
// the partitioning says, where it says, with the full lifecycle.
func TestPipelinePartitionings(t *testing.T) {
	const count = 3000
	for _, p := range []int{1, 4} {
		for _, part := range []control.Partitioning{control.Forward, control.Rebalance, control.Hash, control.Broadcast} {
			t.Run(fmt.Sprintf("%s/p%d", part, p), func(t *testing.T) {
				c := newCollector()
				g := graph(t,
					src("gen", p, genSpec(count)),
					op("upper", p, NativeFactory(newUpper), in("gen", part)),
					sink("collect", p, NativeFactory(c.factory), in("upper", control.Forward)),
				)
				stats, err := Run(context.Background(), g, Options{BatchSize: 64, ChannelCapacity: 4})
				if err != nil {
					t.Fatal(err)
				}
				copies := 1
				if part == control.Broadcast {
					copies = p
				}
				want := map[string]int{}
				for n := 0; n < count; n++ {
					want[fmt.Sprintf("key-%d|VALUE-%d|%d|0", n%13, n, n)] += copies
				}
				got := map[string]int{}
				for s := 0; s < p; s++ {
					sub := c.subs[s]
					for _, r := range sub.recs {
						got[r]++
					}
					checkLifecycle(t, s, sub.calls)
					switch part {
					case control.Forward:
						// Subtask s gets exactly the generator subtask s's records, in order.
						var exp []string
						for n := s; n < count; n += p {
							exp = append(exp, fmt.Sprintf("key-%d|VALUE-%d|%d|0", n%13, n, n))
						}
						if !slices.Equal(sub.recs, exp) {
							t.Fatalf("forward: subtask %d got %d records, not those of generator subtask %d in order", s, len(sub.recs), s)
						}
					case control.Hash:
						for _, r := range sub.recs {
							key := strings.SplitN(r, "|", 2)[0]
							kg := abi.KeyGroup([]byte(key), abi.DefaultMaxParallelism)
							if rg := abi.RangeForSubtask(s, abi.DefaultMaxParallelism, p); !rg.Contains(kg) {
								t.Fatalf("hash: subtask %d owning %s got key %s of key group %d", s, rg, key, kg)
							}
						}
					case control.Rebalance:
						if d := sub.records - count/p; d < -p || d > p {
							t.Fatalf("rebalance: subtask %d got %d records, want %d±%d", s, sub.records, count/p, p)
						}
					case control.Broadcast:
						if sub.records != count {
							t.Fatalf("broadcast: subtask %d got %d records, want %d", s, sub.records, count)
						}
					}
				}
				if len(got) != len(want) {
					t.Fatalf("got %d distinct records, want %d", len(got), len(want))
				}
				for r, n := range want {
					if got[r] != n {
						t.Fatalf("record %s arrived %d times, want %d", r, got[r], n)
					}
				}
				fin := slices.Repeat([]string{StateFinished}, p)
				wantStats := []OperatorStats{
					{"gen", p, 0, count, fin, 0, 0, 0, 0, 0, nil},
					{"upper", p, int64(count * copies), int64(count * copies), fin, 0, 0, 0, 0, 0, nil},
					{"collect", p, int64(count * copies), 0, fin, 0, 0, 0, 0, 0, nil},
				}
				for i := range stats.Operators {
					if len(stats.Operators[i].Live) != p {
						t.Fatalf("stats of %s: live counters of %d subtasks, want %d", stats.Operators[i].UID, len(stats.Operators[i].Live), p)
					}
					stats.Operators[i].Live = nil // times: not compared
				}
				if !reflect.DeepEqual(stats.Operators, wantStats) {
					t.Fatalf("stats %+v, want %+v", stats.Operators, wantStats)
				}
			})
		}
	}
}

// checkLifecycle checks open, increasing watermarks ending with MAX,
// end_input:0, finish, close.
func checkLifecycle(t *testing.T, sub int, calls []string) {
	t.Helper()
	n := len(calls)
	if n < 5 || calls[0] != "open" || calls[n-4] != "wm:MAX" || calls[n-3] != "end_input:0" || calls[n-2] != "finish" || calls[n-1] != "close" {
		t.Fatalf("subtask %d lifecycle %v", sub, calls)
	}
	last := abi.MinWatermark
	for _, c := range calls[1 : n-4] {
		var ts int64
		if _, err := fmt.Sscanf(c, "wm:%d", &ts); err != nil || ts <= last {
			t.Fatalf("subtask %d: %s after watermark %d in %v", sub, c, last, calls)
		}
		last = ts
	}
}

// harness runs one operator subtask over hand-fed input channels and returns
// what it sends downstream.
type harness struct {
	t    *testing.T
	ups  []*dataplane.LocalChannel
	down *dataplane.InputGate
	errc chan error
	ctx  context.Context
	task *task
}

func newHarness(t *testing.T, inputs []int, o NativeOperator) *harness {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	h := &harness{t: t, errc: make(chan error, 1), ctx: ctx}
	var gcs []dataplane.GateChannel
	nIn := 0
	for i, input := range inputs {
		c := dataplane.NewLocalChannel(fmt.Sprintf("up%d", i), 16)
		h.ups = append(h.ups, c)
		gcs = append(gcs, dataplane.GateChannel{In: c.Input(), Input: input})
		nIn = max(nIn, input+1)
	}
	down := dataplane.NewLocalChannel("down", 64)
	h.down = dataplane.NewInputGate([]dataplane.GateChannel{{In: down.Input()}})
	w, _ := dataplane.NewRecordWriter([]dataplane.Output{down.Output()}, dataplane.Forward, dataplane.WriterOptions{BatchSize: 4})
	v := &control.Vertex{UID: "op", Parallelism: 1, Inputs: make([]control.Edge, nIn)}
	j := &job{g: &control.JobGraph{Name: "h"}, log: slog.New(slog.DiscardHandler), opts: Options{BatchSize: 4}}
	tk := &task{j: j, v: v, op: o, mb: &mailbox{}, outWM: abi.MinWatermark,
		stats: &opStats{}, info: SubtaskInfo{Job: "h", Operator: "op", Parallelism: 1, NumInputs: nIn}}
	tk.addWriter(control.Edge{}, w, []chanOrigin{{op: "down"}})
	tk.setGate(gcs)
	if err := tk.newMachine(); err != nil {
		t.Fatal(err)
	}
	h.task = tk
	go func() { h.errc <- tk.run(ctx) }()
	return h
}

func (h *harness) send(ch int, evs ...dataplane.Event) {
	for _, ev := range evs {
		if err := h.ups[ch].Output().Send(h.ctx, ev); err != nil {
			h.t.Fatal(err)
		}
	}
}

func batchOf(values ...string) dataplane.Event {
	b := dataplane.GetBatch()
	for _, v := range values {
		b.Append(abi.Record{Value: []byte(v), Timestamp: 1})
	}
	return dataplane.RecordsEvent(b)
}

// expect reads the next downstream events, rendering records as their
// values. Like a downstream subtask, it acknowledges EndOfData when it
// takes it (the finishing handshake).
func (h *harness) expect(want ...string) {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(h.ctx, 2*time.Second)
	defer cancel()
	var got []string
	for len(got) < len(want) {
		ch, ev, err := h.down.Next(ctx)
		if err != nil {
			h.t.Fatalf("after %v: %v (want %v)", got, err, want)
		}
		if ev.Kind == dataplane.KindEndOfData {
			if err := dataplane.AckEndOfData(h.down.In(ch)); err != nil {
				h.t.Fatal(err)
			}
		}
		if ev.Kind == dataplane.KindRecords {
			var vs []string
			for _, r := range ev.Batch.Records {
				vs = append(vs, string(r.Value))
			}
			got = append(got, "["+strings.Join(vs, " ")+"]")
			continue
		}
		got = append(got, ev.String())
	}
	if !slices.Equal(got, want) {
		h.t.Fatalf("downstream got %v\nwant %v", got, want)
	}
}

func TestWatermarkIsMinOverInputsAndEndedChannelsDoNotHoldIt(t *testing.T) {
	c := newCollector()
	h := newHarness(t, []int{0, 1}, c.factory(SubtaskInfo{}))
	h.send(0, dataplane.WatermarkEvent(10))
	h.send(1, dataplane.WatermarkEvent(5))
	h.expect("watermark(5)")
	h.send(1, dataplane.WatermarkEvent(20))
	h.expect("watermark(10)")
	h.send(0, dataplane.WatermarkEvent(8)) // a regression on one channel changes nothing
	h.send(0, dataplane.EndOfDataEvent(true), dataplane.EndOfPartitionEvent())
	h.expect("watermark(20)") // channel 0 ended: only channel 1 counts
	h.send(1, batchOf("a"), dataplane.WatermarkEvent(abi.MaxWatermark), dataplane.EndOfDataEvent(true))
	h.expect("watermark(MAX)", "end-of-data(drain=true)")
	h.send(1, dataplane.EndOfPartitionEvent())
	h.expect("end-of-partition")
	if err := <-h.errc; err != nil {
		t.Fatal(err)
	}
	want := "open wm:5 wm:10 end_input:0 wm:20 wm:MAX end_input:1 finish close"
	if got := strings.Join(c.subs[0].calls, " "); got != want {
		t.Fatalf("calls %s\nwant  %s", got, want)
	}
}

func TestEndOfDataWithoutDrainSkipsEndInputAndFinish(t *testing.T) {
	c := newCollector()
	h := newHarness(t, []int{0, 0}, c.factory(SubtaskInfo{}))
	h.send(0, dataplane.EndOfDataEvent(false), dataplane.EndOfPartitionEvent())
	h.send(1, dataplane.EndOfDataEvent(false))
	h.expect("end-of-data(drain=false)")
	h.send(1, dataplane.EndOfPartitionEvent())
	h.expect("end-of-partition")
	if err := <-h.errc; err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(c.subs[0].calls, " "); got != "open close" {
		t.Fatalf("calls %s, want open close", got)
	}
}

func TestBarrierAlignment(t *testing.T) {
	h := newHarness(t, []int{0, 0}, &upper{})
	// Records behind a channel's barrier wait until the other channel's barrier.
	h.send(0, dataplane.BarrierEvent(dataplane.Barrier{ID: 1}), batchOf("a"))
	h.send(1, batchOf("b"), dataplane.BarrierEvent(dataplane.Barrier{ID: 1}))
	h.expect("[B]", "barrier(1, checkpoint, sync=false)", "[A]")
	// A cancelled alignment releases the blocked channel and is forwarded once.
	h.send(0, dataplane.BarrierEvent(dataplane.Barrier{ID: 2}), batchOf("c"), dataplane.CancelCheckpointEvent(2))
	h.send(1, dataplane.CancelCheckpointEvent(2))
	h.expect("cancel-checkpoint(2)", "[C]")
	h.send(1, dataplane.BarrierEvent(dataplane.Barrier{ID: 2})) // late barrier of the cancelled checkpoint: dropped
	// A channel that ended counts as aligned.
	h.send(0, dataplane.BarrierEvent(dataplane.Barrier{ID: 3, Kind: dataplane.Savepoint, IsSync: true}), batchOf("d"))
	h.send(1, dataplane.EndOfDataEvent(true), dataplane.EndOfPartitionEvent())
	h.expect("barrier(3, savepoint, sync=true)", "[D]")
	h.send(0, dataplane.EndOfDataEvent(true), dataplane.EndOfPartitionEvent())
	h.expect("end-of-data(drain=true)", "end-of-partition")
	if err := <-h.errc; err != nil {
		t.Fatal(err)
	}
}

func TestProtocolViolationsFail(t *testing.T) {
	h := newHarness(t, []int{0}, &upper{})
	h.send(0, dataplane.EndOfDataEvent(true), batchOf("late"))
	err := <-h.errc
	var te *TaskError
	if !errors.As(err, &te) || te.Phase != phaseInput || !strings.Contains(err.Error(), "records after end-of-data") {
		t.Fatalf("records after end-of-data: %v", err)
	}
}

// failing fails in Process of its third batch.
type failing struct {
	noop
	batches int
	closed  *atomic.Int32
}

func (f *failing) Process(context.Context, int, []abi.Record, Emitter) error {
	if f.batches++; f.batches == 3 {
		return errors.New("boom")
	}
	return nil
}

func (f *failing) Close(context.Context) error { f.closed.Add(1); return nil }

func unbounded() *jobfile.SourceSpec {
	s := genSpec(0)
	s.Rate = 1e12
	return s
}

func TestFailureCancelsTheRunAndNamesTheSubtask(t *testing.T) {
	var closed atomic.Int32
	g := graph(t,
		src("gen", 2, unbounded()),
		op("boom", 2, NativeFactory(func(SubtaskInfo) NativeOperator { return &failing{closed: &closed} }), in("gen", control.Rebalance)),
		sink("out", 1, &jobfile.SinkSpec{Type: "discard"}, in("boom", control.Rebalance)),
	)
	done := make(chan error)
	go func() {
		_, err := Run(context.Background(), g, Options{BatchSize: 16})
		done <- err
	}()
	var err error
	select {
	case err = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after a subtask failed")
	}
	var te *TaskError
	if !errors.As(err, &te) || te.Operator != "boom" || te.Phase != "process" || te.Job != "test" || te.Parallelism != 2 {
		t.Fatalf("got %v", err)
	}
	if !strings.HasPrefix(err.Error(), `runtime: job "test" operator "boom" subtask `) || !strings.HasSuffix(err.Error(), "/2 phase process: boom") {
		t.Fatalf("error text %q", err)
	}
	if closed.Load() != 2 {
		t.Fatalf("close called %d times, want 2 (always, also after a failure)", closed.Load())
	}
}

func TestCancelReturnsContextError(t *testing.T) {
	c := newCollector()
	g := graph(t,
		src("gen", 1, unbounded()),
		sink("out", 2, NativeFactory(c.factory), in("gen", control.Hash)),
	)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	var calls atomic.Int32
	_, err := Run(ctx, g, Options{Progress: func(Stats) { calls.Add(1) }})
	if !errors.Is(err, context.DeadlineExceeded) || err != ctx.Err() {
		t.Fatalf("got %v, want ctx.Err()", err)
	}
	if calls.Load() != 1 {
		t.Fatalf("progress called %d times in 100ms, want once at the end", calls.Load())
	}
	for s, sub := range c.subs {
		if sub.calls[len(sub.calls)-1] != "close" {
			t.Fatalf("subtask %d not closed: %v", s, sub.calls)
		}
	}
}

// counting passes records through and counts them.
type counting struct {
	noop
	n *atomic.Int64
}

func (c *counting) Process(_ context.Context, _ int, recs []abi.Record, emit Emitter) error {
	c.n.Add(int64(len(recs)))
	emit(recs)
	return nil
}

// slow is a sink that takes its time and checks how far ahead its producer got.
type slow struct {
	noop
	produced, consumed *atomic.Int64
	bound              int64
	violation          atomic.Value
	batches            atomic.Int64
}

func (s *slow) Process(_ context.Context, _ int, recs []abi.Record, _ Emitter) error {
	time.Sleep(time.Millisecond)
	c := s.consumed.Add(int64(len(recs)))
	if ahead := s.produced.Load() - c; ahead > s.bound {
		s.violation.Store(fmt.Sprintf("producer %d records ahead, bound %d", ahead, s.bound))
	}
	s.batches.Add(1)
	return nil
}

func TestBackPressureBoundsRecordsInFlight(t *testing.T) {
	const batch, capacity = 32, 4
	var produced, consumed atomic.Int64
	// Between the counting map's emit and the sink: one pending batch in the
	// writer, capacity batches in the channel, one batch being processed.
	sl := &slow{produced: &produced, consumed: &consumed, bound: (capacity + 2) * batch}
	g := graph(t,
		src("gen", 1, unbounded()),
		op("count", 1, &counting{n: &produced}, in("gen", control.Forward)),
		sink("slow", 1, sl, in("count", control.Forward)),
	)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if _, err := Run(ctx, g, Options{BatchSize: batch, ChannelCapacity: capacity}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatal(err)
	}
	if v := sl.violation.Load(); v != nil {
		t.Fatal(v)
	}
	if sl.batches.Load() < 20 {
		t.Fatalf("the slow sink processed only %d batches", sl.batches.Load())
	}
}

func TestFileSourceToFileSinkAndStdout(t *testing.T) {
	dir := t.TempDir()
	var lines []string
	for i := 0; i < 500; i++ {
		lines = append(lines, fmt.Sprintf("line %d", i))
	}
	input := filepath.Join(dir, "in.txt")
	if err := os.WriteFile(input, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "out")
	var stdout bytes.Buffer
	g := graph(t,
		src("read", 2, &jobfile.SourceSpec{Type: "file", Path: input}),
		op("upper", 3, NativeFactory(newUpper), in("read", control.Rebalance)),
		sink("files", 3, &jobfile.SinkSpec{Type: "file", Path: out, Format: "value"}, in("upper", control.Forward)),
		sink("print", 1, &jobfile.SinkSpec{Type: "stdout"}, in("read", control.Rebalance)),
	)
	var last Stats
	if _, err := Run(context.Background(), g, Options{BatchSize: 50, Stdout: &stdout, Progress: func(s Stats) { last = s }}); err != nil {
		t.Fatal(err)
	}
	var got []string
	for s := 0; s < 3; s++ {
		b, err := os.ReadFile(filepath.Join(out, fmt.Sprintf("part-%d", s)))
		if err != nil {
			t.Fatal(err)
		}
		if len(b) == 0 {
			t.Fatalf("part-%d is empty", s)
		}
		got = append(got, strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")...)
	}
	var want []string
	for _, l := range lines {
		want = append(want, upperASCII(l))
	}
	sort.Strings(got)
	sort.Strings(want)
	if !slices.Equal(got, want) {
		t.Fatalf("file sink wrote %d lines, want the %d upper-cased input lines", len(got), len(want))
	}
	printed := strings.Split(strings.TrimSuffix(stdout.String(), "\n"), "\n")
	sort.Strings(printed)
	sorted := slices.Clone(lines)
	sort.Strings(sorted)
	if !slices.Equal(printed, sorted) {
		t.Fatalf("stdout sink printed %d lines, want %d", len(printed), len(lines))
	}
	if last.Operators[0].RecordsOut != 500 || last.Operators[2].RecordsIn != 500 || last.Operators[3].RecordsIn != 500 {
		t.Fatalf("final stats %+v", last.Operators)
	}
}

func newEngine(t testing.TB) *host.Engine {
	t.Helper()
	e, err := host.NewEngine(context.Background(), host.WithCacheDir(""))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close(context.Background()) })
	return e
}

func TestBadModuleFailsBeforeAnythingRuns(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "bad.wasm")
	os.WriteFile(bad, []byte("not wasm"), 0o644)
	c := newCollector()
	g := graph(t,
		src("gen", 1, genSpec(10)),
		sink("early", 1, NativeFactory(c.factory), in("gen", control.Forward)),
		op("bad", 1, &jobfile.WasmSpec{Path: bad}, in("gen", control.Forward)),
		sink("out", 1, &jobfile.SinkSpec{Type: "discard"}, in("bad", control.Forward)),
	)
	_, err := Run(context.Background(), g, Options{Engine: newEngine(t)})
	if !errors.Is(err, host.ErrBadModule) || !strings.Contains(err.Error(), `operator "bad"`) {
		t.Fatalf("got %v", err)
	}
	if len(c.subs) != 0 && len(c.subs[0].calls) != 0 {
		t.Fatalf("a subtask ran before the bad module was refused: %v", c.subs[0].calls)
	}
	if _, err := Run(context.Background(), g, Options{}); err == nil || !strings.Contains(err.Error(), "Options.Engine") {
		t.Fatalf("wasm without engine: %v", err)
	}
}

func TestWasmPipeline(t *testing.T) {
	wasm := testwasm.Path(t, "examples/wasm/uppercase/uppercase.wasm")
	out := filepath.Join(t.TempDir(), "out")
	spec := genSpec(5000)
	spec.ValuePattern = "value-{n}-ünïcode"
	g := graph(t,
		src("gen", 2, spec),
		op("upper", 2, &jobfile.WasmSpec{Path: wasm}, in("gen", control.Hash)),
		sink("files", 2, &jobfile.SinkSpec{Type: "file", Path: out, Format: "kv"}, in("upper", control.Forward)),
	)
	stats, err := Run(context.Background(), g, Options{Engine: newEngine(t), BatchSize: 256})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for s := 0; s < 2; s++ {
		b, err := os.ReadFile(filepath.Join(out, fmt.Sprintf("part-%d", s)))
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range strings.Split(strings.TrimSuffix(string(b), "\n"), "\n") {
			key := strings.SplitN(l, "\t", 2)[0]
			if dataplane.HashTarget(abi.Record{Key: []byte(key)}, abi.DefaultMaxParallelism, 2) != s {
				t.Fatalf("part-%d has key %s of another subtask", s, key)
			}
			got = append(got, l)
		}
	}
	var want []string
	for n := 0; n < 5000; n++ {
		want = append(want, fmt.Sprintf("key-%d\tVALUE-%d-ÜNÏCODE", n%13, n))
	}
	sort.Strings(got)
	sort.Strings(want)
	if !slices.Equal(got, want) {
		t.Fatalf("got %d lines, want %d; first %q vs %q", len(got), len(want), got[0], want[0])
	}
	if stats.Operators[1].RecordsIn != 5000 || stats.Operators[1].RecordsOut != 5000 {
		t.Fatalf("stats %+v", stats.Operators)
	}
}
