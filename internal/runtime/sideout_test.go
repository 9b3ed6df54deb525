package runtime

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/internal/jobfile"
	"github.com/streamd/streamd/internal/telemetry"
	"github.com/streamd/streamd/internal/testwasm"
)

const sideoutGuest = "internal/conformance/guests/wat/sideout.wasm"

// sideOf: the sideout guest sends a value ending in an odd digit to its
// side output "side", everything else to its main output.
func sideOf(v string) bool {
	return v != "" && v[len(v)-1] >= '0' && v[len(v)-1] <= '9' && (v[len(v)-1]-'0')%2 == 1
}

func fromSide(op string, p control.Partitioning) control.Edge {
	return control.Edge{From: op, Output: "side", Partition: p}
}

// TestSideOutputExactlyOnce: gen -> failonce (fails once) -> sideout, whose
// main output goes to one file sink and its side output "side" to another,
// with every partitioning of the side-output edge, aligned and unaligned.
// After the failover both sinks hold every record of their output exactly
// once.
func TestSideOutputExactlyOnce(t *testing.T) {
	failonce := testwasm.Path(t, "internal/testguests/failonce/failonce.wasm")
	sideout := testwasm.Path(t, sideoutGuest)
	eng := cachedEngine(t)
	const n, p = 3000, 2
	for _, c := range []struct {
		part  control.Partitioning
		align control.AlignmentMode
	}{
		{control.Forward, control.AlignAligned}, {control.Rebalance, control.AlignAligned},
		{control.Hash, control.AlignAligned}, {control.Broadcast, control.AlignAligned},
		{control.Hash, control.AlignUnaligned},
	} {
		name := string(c.part)
		if c.align == control.AlignUnaligned {
			name += "/unaligned"
		}
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			mainOut, sideOut := filepath.Join(dir, "main"), filepath.Join(dir, "side")
			gen := &jobfile.SourceSpec{Type: "generator", Count: n, Rate: 15000, KeyPattern: "key-{k}", ValuePattern: "value-{n}", Keys: 7, TSStep: 1}
			g := graph(t,
				src("src", p, gen),
				op("fail", p, &jobfile.WasmSpec{Path: failonce, Config: map[string]string{"fail_at": fmt.Sprint(n / p / 2)}}, in("src", control.Rebalance)),
				op("split", p, &jobfile.WasmSpec{Path: sideout}, in("fail", control.Hash)),
				sink("main", p, &jobfile.SinkSpec{Type: "file", Path: mainOut}, in("split", control.Forward)),
				sink("late", p, &jobfile.SinkSpec{Type: "file", Path: sideOut}, fromSide("split", c.part)),
			)
			stats, err := Run(context.Background(), g, Options{
				Engine: eng, BatchSize: 32,
				Checkpoint: &CheckpointOptions{Store: openStore(t, filepath.Join(dir, "chk")), Interval: 30 * time.Millisecond, Tick: 10 * time.Millisecond, Mode: c.align},
				Restart:    jobfile.RestartSettings{Strategy: jobfile.RestartFixedDelay, Attempts: 2},
			})
			if err != nil {
				t.Fatal(err)
			}
			if stats.Restarts != 1 {
				t.Fatalf("restarts %d, want 1", stats.Restarts)
			}
			var wantMain, wantSide []string
			for i := 0; i < n; i++ {
				v := fmt.Sprintf("value-%d", i)
				if !sideOf(v) {
					wantMain = append(wantMain, v)
					continue
				}
				copies := 1
				if c.part == control.Broadcast {
					copies = p
				}
				for range copies {
					wantSide = append(wantSide, v)
				}
			}
			checkExactlyOnce(t, committed(t, mainOut), wantMain)
			checkExactlyOnce(t, committed(t, sideOut), wantSide)
			t.Logf("%d checkpoints, elapsed %v", stats.Checkpoints, stats.Elapsed)
		})
	}
}

// TestSideOutputUnread: records emitted to a side output no edge reads are
// dropped and counted.
func TestSideOutputUnread(t *testing.T) {
	sideout := testwasm.Path(t, sideoutGuest)
	const n = 500
	dir := t.TempDir()
	g := graph(t,
		src("src", 1, genSpec(n)),
		op("split", 2, &jobfile.WasmSpec{Path: sideout}, in("src", control.Rebalance)),
		sink("main", 1, &jobfile.SinkSpec{Type: "file", Path: dir}, in("split", control.Rebalance)),
	)
	m := telemetry.NewMetrics()
	reader := sdkmetric.NewManualReader(sdkmetric.WithProducer(m))
	_ = sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	stats, err := Run(context.Background(), g, Options{Engine: cachedEngine(t), Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	var dropped int64
	for _, sm := range rm.ScopeMetrics {
		for _, x := range sm.Metrics {
			if x.Name != telemetry.MetricSideOutputDropped {
				continue
			}
			for _, dp := range x.Data.(metricdata.Sum[int64]).DataPoints {
				if o, _ := dp.Attributes.Value("output"); o.AsString() != "side" {
					t.Errorf("dropped records of output %q", o.AsString())
				}
				dropped += dp.Value
			}
		}
	}
	if dropped != n/2 {
		t.Errorf("metric %s: %d, want %d", telemetry.MetricSideOutputDropped, dropped, n/2)
	}
	if got := len(committed(t, dir)); got != n/2 {
		t.Errorf("main output: %d records, want %d", got, n/2)
	}
	for _, o := range stats.Operators {
		if o.UID == "split" && o.SideOutputDropped != n/2 {
			t.Errorf("split: %d side-output records dropped, want %d", o.SideOutputDropped, n/2)
		}
	}
}

// watchOp is a sink that hands every record and watermark to callbacks
// (from the subtask's goroutine).
type watchOp struct {
	noop
	rec func(input int, r abi.Record)
	wm  func(ts int64)
}

func (o watchOp) Process(_ context.Context, input int, recs []abi.Record, _ Emitter) error {
	if o.rec != nil {
		for _, r := range recs {
			o.rec(input, r)
		}
	}
	return nil
}

func (o watchOp) AdvanceWatermark(_ context.Context, ts int64, _ Emitter) error {
	if o.wm != nil {
		o.wm(ts)
	}
	return nil
}

// TestEmitWatermarkOwnsOutput: an operator that calls emit_watermark (the
// sideout guest: input watermark - 1000 in on_watermark) sends its own
// watermarks, never the combined input watermark, and MAX at the end.
func TestEmitWatermarkOwnsOutput(t *testing.T) {
	sideout := testwasm.Path(t, sideoutGuest)
	const n = 4000
	var mu sync.Mutex
	var wms []int64
	gen := &jobfile.SourceSpec{Type: "generator", Count: n, Rate: 20000, KeyPattern: "k", ValuePattern: "v{n}", Keys: 1, StartTS: 10_000, TSStep: 1,
		WatermarkInterval: time.Millisecond}
	g := graph(t,
		src("src", 1, gen),
		op("own", 1, &jobfile.WasmSpec{Path: sideout}, in("src", control.Forward)),
		sink("watch", 1, NativeFactory(func(SubtaskInfo) NativeOperator {
			return watchOp{wm: func(ts int64) { mu.Lock(); wms = append(wms, ts); mu.Unlock() }}
		}), in("own", control.Forward)),
	)
	if _, err := Run(context.Background(), g, Options{Engine: cachedEngine(t), BatchSize: 16}); err != nil {
		t.Fatal(err)
	}
	if len(wms) < 3 || wms[len(wms)-1] != abi.MaxWatermark {
		t.Fatalf("watermarks %v: want several, MAX last", wms)
	}
	for _, ts := range wms[:len(wms)-1] {
		// The source's watermarks are in [10000, 10000+n); the operator's
		// own are 1000 below.
		if ts < 9000 || ts >= 10_000+n-1000 {
			t.Fatalf("watermark %d is not one of the operator's own (source watermark - 1000): %v", ts, wms)
		}
	}
}

// TestInputWatermarkTwoInputs: input_watermark(i) of a two-input operator
// is the watermark of input i alone: input 1 (a short bounded generator)
// ends at MAX while input 0 (unbounded) is still far below.
func TestInputWatermarkTwoInputs(t *testing.T) {
	sideout := testwasm.Path(t, sideoutGuest)
	done := make(chan struct{})
	var once sync.Once
	var bad error
	last := [2]int64{abi.MinWatermark, abi.MinWatermark}
	g := graph(t,
		src("a", 1, &jobfile.SourceSpec{Type: "generator", Rate: 2000, KeyPattern: "k", ValuePattern: "iw", Keys: 1, StartTS: 1000, TSStep: 1, WatermarkInterval: time.Millisecond}),
		src("b", 1, &jobfile.SourceSpec{Type: "generator", Count: 5, KeyPattern: "k", ValuePattern: "x{n}", Keys: 1, StartTS: 1000, TSStep: 1}),
		op("two", 1, &jobfile.WasmSpec{Path: sideout}, in("a", control.Forward), in("b", control.Forward)),
		sink("watch", 1, NativeFactory(func(SubtaskInfo) NativeOperator {
			return watchOp{rec: func(_ int, r abi.Record) {
				v := string(r.Value)
				if !strings.HasPrefix(v, "iw") || len(v) != 18 {
					return // b's records, passed on
				}
				w0, w1 := int64(binary.LittleEndian.Uint64(r.Value[2:])), int64(binary.LittleEndian.Uint64(r.Value[10:]))
				if w0 < last[0] || w1 < last[1] || (w0 != abi.MinWatermark && w0 >= r.Timestamp) {
					bad = fmt.Errorf("record ts %d: input watermarks (%d, %d) after (%d, %d)", r.Timestamp, w0, w1, last[0], last[1])
				}
				last = [2]int64{w0, w1}
				if w1 == abi.MaxWatermark && w0 > abi.MinWatermark && w0 < abi.MaxWatermark {
					once.Do(func() { close(done) })
				}
			}}
		}), in("two", control.Forward)),
	)
	runUntil(t, g, Options{Engine: cachedEngine(t), BatchSize: 8}, done, "a record saw input 1 at MAX and input 0 advancing")
	if bad != nil {
		t.Fatal(bad)
	}
}

// TestFileSourceTimestampWatermarks: a file source with timestamp: {field}
// sends watermarks while it reads, before its input ends: the test writes
// lines into standard input, waits for the watermark they make, and only
// then ends the input. An RFC 3339 string works as a number of ms does.
func TestFileSourceTimestampWatermarks(t *testing.T) {
	pr, pw := io.Pipe()
	defer pw.Close()
	wms := make(chan int64, 1024)
	recs := make(chan abi.Record, 1024)
	spec := &jobfile.SourceSpec{Type: "file", Path: "-", TimestampField: "ts", WatermarkLag: 5 * time.Millisecond, WatermarkInterval: time.Millisecond}
	g := graph(t,
		src("src", 1, spec),
		sink("watch", 1, NativeFactory(func(SubtaskInfo) NativeOperator {
			return watchOp{wm: func(ts int64) { wms <- ts }, rec: func(_ int, r abi.Record) { recs <- abi.Record{Timestamp: r.Timestamp} }}
		}), in("src", control.Forward)),
	)
	errc := make(chan error, 1)
	go func() {
		_, err := Run(context.Background(), g, Options{Stdin: pr})
		errc <- err
	}()
	waitWM := func(want int64) {
		t.Helper()
		for {
			select {
			case ts := <-wms:
				if ts == abi.MaxWatermark {
					t.Fatalf("MAX before watermark %d", want)
				}
				if ts >= want {
					return
				}
			case err := <-errc:
				t.Fatalf("run ended waiting for watermark %d: %v", want, err)
			}
		}
	}
	fmt.Fprintln(pw, `{"ts": 1000, "v": "a"}`)
	fmt.Fprintln(pw, `{"v": "b", "ts": 1010}`)
	waitWM(1005)
	fmt.Fprintln(pw, `{"ts": "1970-01-01T00:00:02Z"}`)
	waitWM(1995)
	pw.Close()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	close(recs)
	var got []int64
	for r := range recs {
		got = append(got, r.Timestamp)
	}
	if fmt.Sprint(got) != "[1000 1010 2000]" {
		t.Errorf("record timestamps %v, want [1000 1010 2000]", got)
	}
}

// TestFileSourceBadTimestamp: a line without a valid timestamp field fails
// the job, naming the file and the line.
func TestFileSourceBadTimestamp(t *testing.T) {
	for _, c := range []struct{ line, want string }{
		{`{"v": 1}`, `line 2: bad event timestamp: field "ts" is missing`},
		{`{"ts": "yesterday"}`, `line 2: bad event timestamp: field "ts": "yesterday" is not an RFC 3339 time`},
		{`{"ts": 1.5}`, `line 2: bad event timestamp: field "ts": 1.5 is neither`},
		{`not json`, `line 2: bad event timestamp: the value is not a JSON object`},
	} {
		path := filepath.Join(t.TempDir(), "events.jsonl")
		if err := os.WriteFile(path, []byte("{\"ts\": 1}\n"+c.line+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		g := graph(t,
			src("src", 1, &jobfile.SourceSpec{Type: "file", Path: path, TimestampField: "ts"}),
			sink("out", 1, &jobfile.SinkSpec{Type: "discard"}, in("src", control.Forward)),
		)
		_, err := Run(context.Background(), g, Options{})
		if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want an error naming %s and %q", c.line, err, path, c.want)
		}
	}
}

// TestIdleSourceUnion: a two-source union where one source (standard input,
// nothing ever written) goes idle after idle_timeout: it no longer holds
// back the watermark, so the other source's event-time timers fire (the
// conformance guest registers one per "timer" record).
func TestIdleSourceUnion(t *testing.T) {
	conf := testwasm.Path(t, "internal/conformance/guests/wat/conformance.wasm")
	pr, pw := io.Pipe()
	defer pw.Close()
	fired := make(chan struct{})
	var once sync.Once
	g := graph(t,
		src("quiet", 1, &jobfile.SourceSpec{Type: "file", Path: "-", IdleTimeout: 50 * time.Millisecond}),
		src("busy", 1, &jobfile.SourceSpec{Type: "generator", Rate: 1000, KeyPattern: "k{k}", ValuePattern: "timer", Keys: 3, TSStep: 1, WatermarkInterval: 5 * time.Millisecond}),
		op("timers", 1, &jobfile.WasmSpec{Path: conf}, in("quiet", control.Forward), in("busy", control.Forward)),
		sink("watch", 1, NativeFactory(func(SubtaskInfo) NativeOperator {
			return watchOp{rec: func(_ int, r abi.Record) {
				if string(r.Value) == "timer" {
					once.Do(func() { close(fired) })
				}
			}}
		}), in("timers", control.Forward)),
	)
	runUntil(t, g, Options{Engine: cachedEngine(t), Stdin: pr}, fired, "a timer fired")
}

// runUntil runs the unbounded job g until done is closed, then cancels it.
func runUntil(t *testing.T, g *control.JobGraph, opts Options, done <-chan struct{}, what string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		_, err := Run(ctx, g, opts)
		errc <- err
	}()
	select {
	case <-done:
	case err := <-errc:
		t.Fatalf("run ended before %s: %v", what, err)
	}
	cancel()
	if err := <-errc; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
}

// TestSideOutputOnErrorSkip: with on_error skip, a batch whose call fails
// is replayed record by record; what the failed call sent to the side
// output is dropped with its main-output records, so each record reaches
// its output once and the failing one ("badin") none.
func TestSideOutputOnErrorSkip(t *testing.T) {
	sideout := testwasm.Path(t, sideoutGuest)
	dir := t.TempDir()
	input := filepath.Join(dir, "in.txt")
	if err := os.WriteFile(input, []byte("v1\nv2\nbadin\nv3\nv4\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	mainOut, sideOut := filepath.Join(dir, "main"), filepath.Join(dir, "side")
	g := graph(t,
		src("src", 1, &jobfile.SourceSpec{Type: "file", Path: input}),
		op("split", 1, &jobfile.WasmSpec{Path: sideout, OnError: &jobfile.OnError{Mode: jobfile.OnErrorSkip}}, in("src", control.Forward)),
		sink("main", 1, &jobfile.SinkSpec{Type: "file", Path: mainOut}, in("split", control.Forward)),
		sink("side", 1, &jobfile.SinkSpec{Type: "file", Path: sideOut}, fromSide("split", control.Forward)),
	)
	stats, err := Run(context.Background(), g, Options{Engine: cachedEngine(t)})
	if err != nil {
		t.Fatal(err)
	}
	checkExactlyOnce(t, committed(t, mainOut), []string{"v2", "v4"})
	checkExactlyOnce(t, committed(t, sideOut), []string{"v1", "v3"})
	for _, o := range stats.Operators {
		if o.UID == "split" && o.DeadLetters != 1 {
			t.Errorf("split: %d records skipped, want 1", o.DeadLetters)
		}
	}
}
