package host_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/host"
	"github.com/streamd/streamd/internal/telemetry"
	"github.com/streamd/streamd/internal/testwasm"
)

// newRecorder is a tracer provider that keeps every ended span in memory.
func newRecorder(t *testing.T, opts ...sdktrace.TracerProviderOption) (*sdktrace.TracerProvider, *tracetest.SpanRecorder) {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(append([]sdktrace.TracerProviderOption{sdktrace.WithSpanProcessor(rec)}, opts...)...)
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	return tp, rec
}

func attrsOf(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value // later values win (records is updated at the end)
	}
	return m
}

func TestLifecycleSpans(t *testing.T) {
	tp, rec := newRecorder(t)
	e := newEngine(t)
	m := load(t, e, testwasmPath(t))
	inst, err := m.NewInstance(context.Background(), host.InstanceConfig{
		Job: "wc", Operator: "count", Subtask: 1, Parallelism: 2, Attempt: 3, NumInputs: 1,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, task := tp.Tracer("test").Start(context.Background(), telemetry.SpanTask)
	emit := func([]abi.Record) {}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(inst.Open(ctx))
	for range 2 {
		must(inst.Process(ctx, 0, []abi.Record{{Key: []byte("k1"), Value: []byte("a")}, {Key: []byte("k2"), Value: []byte("b")}}, emit))
	}
	must(inst.AdvanceWatermark(ctx, 100, emit))
	snap, err := inst.SnapshotState(ctx, 7)
	must(err)
	must(inst.NotifyCheckpointComplete(ctx, 7))
	must(inst.EndInput(ctx, 0, emit))
	must(inst.Finish(ctx, emit))
	must(inst.Close(ctx))
	task.End()

	spans := rec.Ended()
	want := []string{telemetry.SpanGuestOpen, telemetry.SpanGuestSnapshotState, telemetry.SpanGuestNotifyCheckpoint,
		telemetry.SpanGuestEndInput, telemetry.SpanGuestFinish, telemetry.SpanGuestClose, telemetry.SpanTask}
	var got []string
	for _, s := range spans {
		got = append(got, s.Name())
	}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("spans %v, want %v (process and watermark have none)", got, want)
	}
	encoded, err := snap.MarshalBinary()
	must(err)
	if snap.Size() != int64(len(encoded)) {
		t.Errorf("Snapshot.Size() = %d, MarshalBinary gives %d bytes", snap.Size(), len(encoded))
	}
	for _, s := range spans[:len(spans)-1] {
		if s.Parent().SpanID() != task.SpanContext().SpanID() || s.SpanContext().TraceID() != task.SpanContext().TraceID() {
			t.Errorf("%s: parent %v, want the task span %v", s.Name(), s.Parent().SpanID(), task.SpanContext().SpanID())
		}
		if s.Status().Code == codes.Error {
			t.Errorf("%s: status %v", s.Name(), s.Status())
		}
		a := attrsOf(s)
		for k, v := range map[attribute.Key]attribute.Value{
			telemetry.AttrJob: attribute.StringValue("wc"), telemetry.AttrOperator: attribute.StringValue("count"),
			telemetry.AttrSubtask: attribute.IntValue(1), telemetry.AttrAttempt: attribute.IntValue(3),
		} {
			if a[k] != v {
				t.Errorf("%s: %s = %v, want %v", s.Name(), k, a[k].Emit(), v.Emit())
			}
		}
		wantRecords := int64(4)
		if s.Name() == telemetry.SpanGuestOpen {
			wantRecords = 0
		}
		if r := a[telemetry.AttrRecords]; r.AsInt64() != wantRecords {
			t.Errorf("%s: %s = %v, want %d", s.Name(), telemetry.AttrRecords, r.Emit(), wantRecords)
		}
		switch s.Name() {
		case telemetry.SpanGuestSnapshotState:
			if a[telemetry.AttrCheckpointID].AsInt64() != 7 || a[telemetry.AttrStateBytes].AsInt64() != int64(len(encoded)) {
				t.Errorf("snapshot span: checkpoint %v state bytes %v, want 7 and %d",
					a[telemetry.AttrCheckpointID].Emit(), a[telemetry.AttrStateBytes].Emit(), len(encoded))
			}
		case telemetry.SpanGuestNotifyCheckpoint:
			if a[telemetry.AttrCheckpointID].AsInt64() != 7 {
				t.Errorf("notify span: checkpoint %v, want 7", a[telemetry.AttrCheckpointID].Emit())
			}
		}
	}
}

func TestNoSpansWithoutRecordingParent(t *testing.T) {
	tp, rec := newRecorder(t, sdktrace.WithSampler(sdktrace.NeverSample()))
	e := newEngine(t)
	m := load(t, e, testwasmPath(t))
	// No span at all, and an unsampled span: neither gives guest spans.
	unsampled, span := tp.Tracer("test").Start(context.Background(), "unsampled")
	for _, ctx := range []context.Context{context.Background(), unsampled} {
		inst := instance(t, m, host.InstanceConfig{NumInputs: 1})
		if _, err := inst.SnapshotState(ctx, 1); err != nil {
			t.Fatal(err)
		}
		if err := inst.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
	span.End()
	if n := len(rec.Ended()); n != 0 {
		t.Fatalf("%d spans recorded without a sampled parent", n)
	}
}

// Records are never traced: process under a recording span allocates nothing.
func TestProcessUnderSpanDoesNotAllocate(t *testing.T) {
	tp, rec := newRecorder(t)
	inst := instance(t, load(t, newEngine(t), fixture(t, "noop")), host.InstanceConfig{NumInputs: 1})
	ctx, span := tp.Tracer("test").Start(context.Background(), telemetry.SpanTask)
	recs := makeRecords(100, 50)
	emit := func([]abi.Record) {}
	allocs := testing.AllocsPerRun(100, func() {
		if err := inst.Process(ctx, 0, recs, emit); err != nil {
			t.Fatal(err)
		}
	})
	span.End()
	if allocs != 0 {
		t.Errorf("Process under a recording span: %v allocations per call, want 0", allocs)
	}
	if n := len(rec.Ended()); n != 1 {
		t.Errorf("%d spans, want only the task span", n)
	}
}

func exceptionEvent(t *testing.T, s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	t.Helper()
	var found []map[attribute.Key]attribute.Value
	for _, ev := range s.Events() {
		if ev.Name == "exception" {
			m := map[attribute.Key]attribute.Value{}
			for _, kv := range ev.Attributes {
				m[kv.Key] = kv.Value
			}
			found = append(found, m)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%s: %d exception events, want 1", s.Name(), len(found))
	}
	return found[0]
}

func TestGuestFailureBecomesSpanError(t *testing.T) {
	tp, rec := newRecorder(t)
	m := load(t, newEngine(t), testwasmPath(t))

	// A failing lifecycle call: the error is on its own span.
	inst, err := m.NewInstance(context.Background(), host.InstanceConfig{
		Job: "j", Operator: "op", Parallelism: 1, NumInputs: 1, Config: map[string]string{"fail_in": "open"},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, task := tp.Tracer("test").Start(context.Background(), telemetry.SpanTask)
	err = inst.Open(ctx)
	var he *host.Error
	if !errors.As(err, &he) || !errors.Is(err, host.ErrGuestFailed) {
		t.Fatalf("open: %v, want a guest failure", err)
	}
	task.End()
	spans := rec.Ended()
	if len(spans) != 2 || spans[0].Name() != telemetry.SpanGuestOpen {
		t.Fatalf("spans %v, want guest.open and task", spans)
	}
	open := spans[0]
	if open.Status().Code != codes.Error || !strings.Contains(open.Status().Description, "conformance: fail in open") {
		t.Errorf("guest.open status %v, want Error with the guest's message", open.Status())
	}
	ev := exceptionEvent(t, open)
	if got := ev[telemetry.AttrGuestMessage].AsString(); got != "conformance: fail in open" {
		t.Errorf("guest message %q", got)
	}
	if ev[telemetry.AttrPhase].AsString() != "open" || ev[telemetry.AttrErrorKind].AsString() != "guest failed" {
		t.Errorf("phase %v kind %v", ev[telemetry.AttrPhase].Emit(), ev[telemetry.AttrErrorKind].Emit())
	}
	// The WAT guest has no name section: frames are ".$<index>(<signature>)".
	if st := ev[telemetry.AttrWasmStack].AsString(); !strings.Contains(st, "streamd_v1.fail(i32,i32)") || st != he.Stack {
		t.Errorf("wasm stack %q, want the error's stack %q with the fail import", st, he.Stack)
	}
	if ev["exception.stacktrace"].AsString() != he.Stack {
		t.Errorf("exception.stacktrace %q", ev["exception.stacktrace"].AsString())
	}

	// A trap in process (no span of its own): the event is on the ctx span,
	// once, even when the caller records the same error again.
	rec.Reset()
	inst2 := instance(t, m, host.InstanceConfig{Job: "j", Operator: "op", NumInputs: 1})
	ctx, task = tp.Tracer("test").Start(context.Background(), telemetry.SpanTask)
	err = inst2.Process(ctx, 0, []abi.Record{{Key: []byte("k"), Value: []byte("oob")}}, func([]abi.Record) {})
	if !errors.As(err, &he) || !errors.Is(err, host.ErrTrap) {
		t.Fatalf("process: %v, want a trap", err)
	}
	telemetry.EndSpan(task, err)
	var got sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Name() == telemetry.SpanTask {
			got = s
		}
	}
	if got == nil {
		t.Fatal("no task span")
	}
	ev = exceptionEvent(t, got)
	if msg := ev[telemetry.AttrGuestMessage].AsString(); !strings.Contains(msg, "out of bounds") {
		t.Errorf("guest message %q, want the trap text", msg)
	}
	if st := ev[telemetry.AttrWasmStack].AsString(); st != he.Stack || !strings.Contains(st, "(i32,i32,i32) i32") {
		t.Errorf("wasm stack %q, want the error's stack %q with streamd_process's frame", st, he.Stack)
	}
	if got.Status().Code != codes.Error || !strings.HasPrefix(got.Status().Description, "guest trap: ") {
		t.Errorf("task status %v", got.Status())
	}
	if !trace.SpanContextFromContext(ctx).Equal(task.SpanContext()) {
		t.Error("context lost its span")
	}
}

func testwasmPath(t *testing.T) string { return testwasm.Path(t, watConformance) }
