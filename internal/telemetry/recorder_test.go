package telemetry

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// The recorder keeps each job's latest checkpoint traces with their child
// spans, counts checkpoints completed, failed and in progress, keeps why
// they failed, and drops older traces past its bound; with tracing off its
// sampler samples the checkpoint traces only.
func TestRecorder(t *testing.T) {
	rec := NewRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec), sdktrace.WithSampler(RecorderSampler()))
	defer tp.Shutdown(context.Background())
	tr := tp.Tracer(ScopeName)
	ckpt := func(job string, id int64) (context.Context, trace.Span) {
		return tr.Start(context.Background(), SpanCheckpoint, trace.WithNewRoot(),
			trace.WithAttributes(append(JobAttrs(job+"-id", job), CheckpointID(id))...))
	}

	// Not sampled: a job span and its children.
	jctx, job := tr.Start(context.Background(), SpanJob)
	_, child := tr.Start(jctx, SpanTaskOpen)
	if job.IsRecording() || child.IsRecording() {
		t.Error("the recorder's sampler sampled a job trace")
	}
	child.End()
	job.End()

	ctx, c1 := ckpt("j", 1)
	_, sub := tr.Start(ctx, SpanCheckpointSubtask, trace.WithAttributes(Operator("op"), Subtask(0)))
	sub.End()
	counts, _, _ := rec.Checkpoints("j-id", "")
	if counts != (CheckpointCounts{InProgress: 1}) {
		t.Errorf("during checkpoint 1: %+v", counts)
	}
	c1.End()
	_, c2 := ckpt("j", 2)
	c2.SetStatus(codes.Error, "aborted: expired")
	c2.End()

	counts, failed, traced := rec.Checkpoints("", "j") // by name, as streamd run asks
	if counts != (CheckpointCounts{Completed: 1, Failed: 1}) || len(failed) != 1 || failed[0].ID != 2 ||
		failed[0].Reason != "aborted: expired" || len(traced) != 2 || traced[0] != 2 {
		t.Errorf("counts %+v, failed %+v, traced %v", counts, failed, traced)
	}
	spans, ok := rec.Trace("j-id", "j", 1)
	if !ok || len(spans) != 2 || spans[0].Name != SpanCheckpoint || spans[1].Name != SpanCheckpointSubtask ||
		spans[1].ParentID != spans[0].SpanID || spans[1].Attrs[string(AttrOperator)] != "op" {
		t.Errorf("trace of checkpoint 1: %+v", spans)
	}
	if _, ok := rec.Trace("other", "other", 1); ok {
		t.Error("a trace of a job never seen")
	}

	// Bounded: the oldest traces go.
	for id := int64(3); id < 3+RecorderTraces; id++ {
		_, c := ckpt("j", id)
		c.End()
	}
	if _, ok := rec.Trace("j-id", "", 1); ok {
		t.Errorf("checkpoint 1's trace kept past %d newer ones", RecorderTraces)
	}
	if _, ok := rec.Trace("j-id", "", 2+RecorderTraces); !ok {
		t.Error("the latest trace not kept")
	}
	if _, _, traced := rec.Checkpoints("j-id", ""); len(traced) != RecorderTraces {
		t.Errorf("%d traces kept, want %d", len(traced), RecorderTraces)
	}
}

// With tracing on (here to a file), the recorder gets the same spans as the
// exporter.
func TestRecorderBesideExporter(t *testing.T) {
	path := filepath.Join(t.TempDir(), "traces.json")
	rec := NewRecorder()
	tel, err := New(context.Background(), Config{Enabled: true, Protocol: ProtocolFile, Endpoint: path, ServiceName: "streamd-test", Recorder: rec})
	if err != nil {
		t.Fatal(err)
	}
	_, span := tel.TracerProvider().Tracer(ScopeName).Start(context.Background(), SpanCheckpoint,
		trace.WithAttributes(append(JobAttrs("", "j"), CheckpointID(7))...))
	span.End()
	if err := tel.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil || !strings.Contains(string(b), `"Name":"checkpoint"`) {
		t.Errorf("trace file: %v %.200s", err, b)
	}
	if spans, ok := rec.Trace("j", "j", 7); !ok || len(spans) != 1 || spans[0].Service != "streamd-test" {
		t.Errorf("recorder: %+v %v", spans, ok)
	}
}

// BenchmarkRecorderSpans: what a span costs once the recorder's provider is
// installed (tracing off): a span it does not sample (a task's lifecycle)
// against the no-op provider's, and one of a sampled checkpoint trace.
func BenchmarkRecorderSpans(b *testing.B) {
	rec := NewRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec), sdktrace.WithSampler(RecorderSampler()))
	defer tp.Shutdown(context.Background())
	tr := tp.Tracer(ScopeName)
	attrs := trace.WithAttributes(SubtaskAttrs("j", "j", "op", 0, 0)...)
	b.Run("noop", func(b *testing.B) {
		nt := noop.NewTracerProvider().Tracer(ScopeName)
		for i := 0; i < b.N; i++ {
			_, s := nt.Start(context.Background(), SpanTaskOpen, attrs)
			s.End()
		}
	})
	b.Run("not-sampled", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			_, s := tr.Start(context.Background(), SpanTaskOpen, attrs)
			s.End()
		}
	})
	b.Run("checkpoint-span", func(b *testing.B) {
		ctx, root := tr.Start(context.Background(), SpanCheckpoint, trace.WithAttributes(append(JobAttrs("j", "j"), CheckpointID(1))...))
		for i := 0; i < b.N; i++ {
			if i%RecorderSpans == RecorderSpans-1 { // a new trace: one keeps at most RecorderSpans
				root.End()
				ctx, root = tr.Start(context.Background(), SpanCheckpoint, trace.WithAttributes(append(JobAttrs("j", "j"), CheckpointID(int64(i)))...))
			}
			_, s := tr.Start(ctx, SpanCheckpointSubtask, attrs)
			s.End()
		}
		root.End()
	})
}

// Past RecorderTotalSpans the oldest trace goes, whatever its job.
func TestRecorderTotalBound(t *testing.T) {
	rec := NewRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec), sdktrace.WithSampler(RecorderSampler()))
	defer tp.Shutdown(context.Background())
	tr := tp.Tracer(ScopeName)
	jobs := RecorderTotalSpans/RecorderSpans + 1
	for j := 0; j < jobs; j++ {
		name := fmt.Sprintf("j%d", j)
		ctx, root := tr.Start(context.Background(), SpanCheckpoint, trace.WithAttributes(append(JobAttrs(name, name), CheckpointID(1))...))
		for i := 0; i < RecorderSpans-1; i++ {
			_, s := tr.Start(ctx, SpanCheckpointSubtask)
			s.End()
		}
		root.End()
	}
	if _, ok := rec.Trace("j0", "", 1); ok {
		t.Errorf("the oldest trace kept past %d spans in all", RecorderTotalSpans)
	}
	if spans, ok := rec.Trace(fmt.Sprintf("j%d", jobs-1), "", 1); !ok || len(spans) != RecorderSpans {
		t.Errorf("the latest trace: %d spans, %v", len(spans), ok)
	}
	if counts, _, _ := rec.Checkpoints("j0", ""); counts.Completed != 1 {
		t.Errorf("j0's counts %+v: a dropped trace still counts", counts)
	}
}
