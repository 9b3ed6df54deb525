//go:build long

package telemetry_test

import (
	"context"
	"testing"
	"time"

	"github.com/streamd/streamd/host"
	"github.com/streamd/streamd/internal/telemetry"
	"github.com/streamd/streamd/internal/telemetry/jaegertest"
	"github.com/streamd/streamd/internal/testwasm"
	"go.opentelemetry.io/otel/trace"
)

// Two hosts (two tracer providers, one exporting over OTLP gRPC, the other
// over OTLP HTTP) take part in one checkpoint: the coordinator's span on
// host a, barrier alignment, snapshot and the guest's snapshot_state on host
// b, the trace context carried in NATS headers and a control message. Jaeger
// shows one trace with the spans of both services.
func TestCheckpointTraceAcrossHostsInJaeger(t *testing.T) {
	j := jaegertest.Start(t)
	ctx := context.Background()
	telA, err := telemetry.New(ctx, telemetry.Config{Enabled: true, Protocol: "grpc", Endpoint: j.OTLPGRPC, Insecure: true, ServiceName: "streamd-host-a"})
	if err != nil {
		t.Fatal(err)
	}
	defer telA.Shutdown(ctx)
	telB, err := telemetry.New(ctx, telemetry.Config{Enabled: true, Protocol: "http", Endpoint: j.OTLPHTTP, ServiceName: "streamd-host-b"})
	if err != nil {
		t.Fatal(err)
	}
	defer telB.Shutdown(ctx)

	// host b's subtask: a real guest
	eng, err := host.NewEngine(ctx, host.WithCacheDir(""))
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close(ctx)
	mod, err := eng.LoadFile(ctx, testwasm.Path(t, "internal/conformance/guests/wat/conformance.wasm"))
	if err != nil {
		t.Fatal(err)
	}
	inst, err := mod.NewInstance(ctx, host.InstanceConfig{Job: "wc", Operator: "count", Subtask: 1, Parallelism: 2, NumInputs: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer inst.Close(ctx)
	if err := inst.Open(ctx); err != nil {
		t.Fatal(err)
	}

	// host a: the coordinator triggers checkpoint 42
	cpCtx, cp := telA.TracerProvider().Tracer(telemetry.ScopeName).Start(ctx, telemetry.SpanCheckpoint,
		trace.WithNewRoot(), trace.WithAttributes(telemetry.Job("wc"), telemetry.CheckpointID(42)))
	barrierHeaders := map[string][]string{"Streamd-Kind": {"barrier"}} // a nats.Header
	telemetry.InjectHeaders(cpCtx, barrierHeaders)
	control := telemetry.InjectMap(cpCtx) // the "checkpoint complete" control message

	// host b: alignment and snapshot under the barrier's context
	tracerB := telB.TracerProvider().Tracer(telemetry.ScopeName)
	attrs := append(telemetry.SubtaskAttrs("wc-1", "wc", "count", 1, 0), telemetry.CheckpointID(42))
	bctx := telemetry.ExtractHeaders(ctx, barrierHeaders)
	_, align := tracerB.Start(bctx, telemetry.SpanBarrierAlignment, trace.WithAttributes(attrs...))
	time.Sleep(time.Millisecond)
	align.End()
	sctx, snap := tracerB.Start(bctx, telemetry.SpanTaskSnapshot, trace.WithAttributes(attrs...))
	if _, err := inst.SnapshotState(sctx, 42); err != nil {
		t.Fatal(err)
	}
	snap.End()
	// host b: the completion arrives as a control message
	nctx, notify := tracerB.Start(telemetry.ExtractMap(ctx, control), telemetry.SpanTaskNotifyComplete, trace.WithAttributes(attrs...))
	if err := inst.NotifyCheckpointComplete(nctx, 42); err != nil {
		t.Fatal(err)
	}
	notify.End()
	cp.End()
	if err := telB.Shutdown(ctx); err != nil { // flush
		t.Fatal(err)
	}
	if err := telA.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}

	traceID := cp.SpanContext().TraceID().String()
	want := map[string]string{ // span -> service
		telemetry.SpanCheckpoint:            "streamd-host-a",
		telemetry.SpanBarrierAlignment:      "streamd-host-b",
		telemetry.SpanTaskSnapshot:          "streamd-host-b",
		telemetry.SpanGuestSnapshotState:    "streamd-host-b",
		telemetry.SpanTaskNotifyComplete:    "streamd-host-b",
		telemetry.SpanGuestNotifyCheckpoint: "streamd-host-b",
	}
	tr := j.WaitTrace(t, "streamd-host-a", 30*time.Second, func(tr *jaegertest.Trace) bool {
		return tr.TraceID == traceID && len(tr.Spans) == len(want)
	})
	byName := map[string]jaegertest.Span{}
	for _, s := range tr.Spans {
		byName[s.OperationName] = s
		if svc := tr.Service(s); svc != want[s.OperationName] {
			t.Errorf("span %s from service %q, want %q", s.OperationName, svc, want[s.OperationName])
		}
	}
	cpID := byName[telemetry.SpanCheckpoint].SpanID
	for child, parent := range map[string]string{
		telemetry.SpanCheckpoint:            "",
		telemetry.SpanBarrierAlignment:      cpID,
		telemetry.SpanTaskSnapshot:          cpID,
		telemetry.SpanGuestSnapshotState:    byName[telemetry.SpanTaskSnapshot].SpanID,
		telemetry.SpanTaskNotifyComplete:    cpID,
		telemetry.SpanGuestNotifyCheckpoint: byName[telemetry.SpanTaskNotifyComplete].SpanID,
	} {
		if got := byName[child].Parent(); got != parent {
			t.Errorf("%s: parent %q, want %q", child, got, parent)
		}
	}
	g := byName[telemetry.SpanGuestSnapshotState]
	for key, want := range map[string]any{"streamd.checkpoint_id": float64(42), "streamd.job": "wc", "streamd.operator": "count", "streamd.subtask": float64(1)} {
		if v, ok := g.Tag(key); !ok || v != want {
			t.Errorf("guest.snapshot_state tag %s = %v (%T), want %v", key, v, v, want)
		}
	}
	if v, ok := g.Tag("streamd.state_bytes"); !ok || v.(float64) <= 0 {
		t.Errorf("guest.snapshot_state state bytes %v", v)
	}
	// The same trace is found from host b's service.
	j.WaitTrace(t, "streamd-host-b", 10*time.Second, func(tr *jaegertest.Trace) bool { return tr.TraceID == traceID })
}
