package telemetry_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"github.com/spf13/viper"
	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	collectorpb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/streamd/streamd/internal/telemetry"
)

// otlpSink collects the spans of OTLP export requests: service name -> span names.
type otlpSink struct {
	collectorpb.UnimplementedTraceServiceServer
	mu    sync.Mutex
	spans map[string][]string
	got   chan struct{}
}

func newSink() *otlpSink {
	return &otlpSink{spans: map[string][]string{}, got: make(chan struct{}, 100)}
}

func (s *otlpSink) add(req *collectorpb.ExportTraceServiceRequest) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, rs := range req.ResourceSpans {
		service := ""
		for _, kv := range rs.Resource.GetAttributes() {
			if kv.Key == "service.name" {
				service = kv.Value.GetStringValue()
			}
		}
		for _, ss := range rs.ScopeSpans {
			for _, sp := range ss.Spans {
				s.spans[service] = append(s.spans[service], sp.Name)
			}
		}
	}
	s.got <- struct{}{}
}

func (s *otlpSink) Export(_ context.Context, req *collectorpb.ExportTraceServiceRequest) (*collectorpb.ExportTraceServiceResponse, error) {
	s.add(req)
	return &collectorpb.ExportTraceServiceResponse{}, nil
}

func (s *otlpSink) wait(t *testing.T) map[string][]string {
	t.Helper()
	select {
	case <-s.got:
	case <-time.After(10 * time.Second):
		t.Fatal("no OTLP export arrived")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.spans
}

func grpcSink(t *testing.T) (*otlpSink, string) {
	sink := newSink()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	collectorpb.RegisterTraceServiceServer(srv, sink)
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	return sink, ln.Addr().String()
}

func httpSink(t *testing.T) (*otlpSink, string) {
	sink := newSink()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/traces" {
			http.Error(w, "not found", 404)
			return
		}
		body, _ := io.ReadAll(r.Body)
		var req collectorpb.ExportTraceServiceRequest
		if err := proto.Unmarshal(body, &req); err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		sink.add(&req)
		w.Header().Set("Content-Type", "application/x-protobuf")
		b, _ := proto.Marshal(&collectorpb.ExportTraceServiceResponse{})
		w.Write(b)
	}))
	t.Cleanup(srv.Close)
	return sink, srv.URL
}

func exportOne(t *testing.T, cfg telemetry.Config) {
	t.Helper()
	ctx := context.Background()
	tel, err := telemetry.New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	_, span := tel.TracerProvider().Tracer(telemetry.ScopeName).Start(ctx, telemetry.SpanCheckpoint)
	span.End()
	if err := tel.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestExportOTLP(t *testing.T) {
	t.Run("grpc", func(t *testing.T) {
		sink, addr := grpcSink(t)
		exportOne(t, telemetry.Config{Enabled: true, Protocol: "grpc", Endpoint: addr, Insecure: true, ServiceName: "streamd-test"})
		if got := sink.wait(t)["streamd-test"]; len(got) != 1 || got[0] != telemetry.SpanCheckpoint {
			t.Fatalf("received %v", got)
		}
	})
	t.Run("http", func(t *testing.T) {
		sink, url := httpSink(t)
		exportOne(t, telemetry.Config{Enabled: true, Protocol: "http", Endpoint: url}) // http:// URL: no TLS
		if got := sink.wait(t)["streamd"]; len(got) != 1 || got[0] != telemetry.SpanCheckpoint {
			t.Fatalf("received %v", sink.spans)
		}
	})
	t.Run("standard variables", func(t *testing.T) {
		sink, url := httpSink(t)
		t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
		t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", url)
		exportOne(t, telemetry.Config{Enabled: true, ServiceName: "streamd-env"})
		if got := sink.wait(t)["streamd-env"]; len(got) != 1 {
			t.Fatalf("received %v", sink.spans)
		}
	})
	t.Run("grpc standard variables", func(t *testing.T) {
		sink, addr := grpcSink(t)
		t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://"+addr)
		exportOne(t, telemetry.Config{Enabled: true})
		if got := sink.wait(t)["streamd"]; len(got) != 1 {
			t.Fatalf("received %v", sink.spans)
		}
	})
}

func TestSampler(t *testing.T) {
	sampled := func(t *testing.T, cfg telemetry.Config) int {
		t.Helper()
		cfg.Enabled, cfg.Endpoint = true, "127.0.0.1:1" // nothing is exported: never ended
		tel, err := telemetry.New(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer tel.Shutdown(context.Background())
		n := 0
		for range 1000 {
			_, s := tel.TracerProvider().Tracer("t").Start(context.Background(), "x")
			if s.SpanContext().IsSampled() {
				n++
			}
		}
		return n
	}
	zero, half := 0.0, 0.5
	if n := sampled(t, telemetry.Config{}); n != 1000 {
		t.Errorf("default: %d of 1000 sampled", n)
	}
	if n := sampled(t, telemetry.Config{SampleRatio: &zero}); n != 0 {
		t.Errorf("ratio 0: %d of 1000 sampled", n)
	}
	if n := sampled(t, telemetry.Config{SampleRatio: &half}); n < 400 || n > 600 {
		t.Errorf("ratio 0.5: %d of 1000 sampled", n)
	}
	t.Setenv("OTEL_TRACES_SAMPLER", "always_off")
	if n := sampled(t, telemetry.Config{}); n != 0 {
		t.Errorf("OTEL_TRACES_SAMPLER=always_off: %d of 1000 sampled", n)
	}
	if n := sampled(t, telemetry.Config{SampleRatio: &half}); n < 400 || n > 600 {
		t.Errorf("tracing.sample_ratio must win over OTEL_TRACES_SAMPLER: %d of 1000 sampled", n)
	}
	t.Setenv("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
	t.Setenv("OTEL_TRACES_SAMPLER_ARG", "0.25")
	if n := sampled(t, telemetry.Config{}); n < 150 || n > 350 {
		t.Errorf("parentbased_traceidratio 0.25: %d of 1000 sampled", n)
	}
	t.Setenv("OTEL_TRACES_SAMPLER_ARG", "2")
	if _, err := telemetry.New(context.Background(), telemetry.Config{Enabled: true}); err == nil || !strings.Contains(err.Error(), "OTEL_TRACES_SAMPLER_ARG") {
		t.Errorf("bad OTEL_TRACES_SAMPLER_ARG: %v", err)
	}
	t.Setenv("OTEL_TRACES_SAMPLER", "sometimes")
	if _, err := telemetry.New(context.Background(), telemetry.Config{Enabled: true}); err == nil || !strings.Contains(err.Error(), "OTEL_TRACES_SAMPLER") {
		t.Errorf("bad OTEL_TRACES_SAMPLER: %v", err)
	}
}

func TestFromViper(t *testing.T) {
	v := viper.New()
	fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
	if err := telemetry.AddFlags(fs, v); err != nil {
		t.Fatal(err)
	}
	cfg, err := telemetry.FromViper(v)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Enabled || cfg.SampleRatio != nil || cfg.ServiceName != "streamd" || cfg.PrometheusAddr != "" || cfg.Protocol != "" {
		t.Errorf("defaults: %+v", cfg)
	}
	if err := fs.Parse([]string{"--tracing", "--tracing-protocol=http", "--tracing-sample-ratio=0.1"}); err != nil {
		t.Fatal(err)
	}
	t.Setenv("STREAMD_TRACING_ENDPOINT", "collector:4318")
	t.Setenv("STREAMD_METRICS_LISTEN", "127.0.0.1:9464")
	t.Setenv("STREAMD_TRACING_SERVICE_NAME", "streamd-host-a")
	cfg, err = telemetry.FromViper(v)
	if err != nil {
		t.Fatal(err)
	}
	if !cfg.Enabled || cfg.Protocol != "http" || cfg.Endpoint != "collector:4318" || cfg.SampleRatio == nil || *cfg.SampleRatio != 0.1 ||
		cfg.PrometheusAddr != "127.0.0.1:9464" || cfg.ServiceName != "streamd-host-a" {
		t.Errorf("from flags and variables: %+v", cfg)
	}
	for _, bad := range []struct{ key, val, want string }{
		{telemetry.KeyTracingProtocol, "udp", "not a protocol"},
		{telemetry.KeyTracingSampleRatio, "1.5", "outside [0, 1]"},
		{telemetry.KeyTracingSampleRatio, "lots", "want a number"},
		{telemetry.KeyTracingService, "flink", `must start with "streamd"`},
	} {
		v := viper.New()
		v.Set(bad.key, bad.val)
		if _, err := telemetry.FromViper(v); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%s=%s: %v, want an error with %q", bad.key, bad.val, err, bad.want)
		}
	}
}

// Trace context crosses a NATS message and a control message: spans of two
// providers (two hosts) are one trace.
func TestPropagation(t *testing.T) {
	recA, recB := tracetest.NewSpanRecorder(), tracetest.NewSpanRecorder()
	tpA := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(recA))
	tpB := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(recB))
	ctx, cp := tpA.Tracer("a").Start(context.Background(), telemetry.SpanCheckpoint)

	header := map[string][]string{"Streamd-Seq": {"7"}} // a nats.Header
	telemetry.InjectHeaders(ctx, header)
	if len(header["traceparent"]) != 1 {
		t.Fatalf("headers %v: no traceparent", header)
	}
	control := telemetry.InjectMap(ctx)
	if control["traceparent"] == "" {
		t.Fatalf("control map %v: no traceparent", control)
	}
	if telemetry.InjectMap(context.Background()) != nil {
		t.Error("InjectMap without a span should return nil")
	}
	empty := map[string][]string{}
	telemetry.InjectHeaders(context.Background(), empty)
	if len(empty) != 0 {
		t.Errorf("InjectHeaders without a span wrote %v", empty)
	}

	// canonicalized header keys are found too
	canon := map[string][]string{"Traceparent": header["traceparent"]}
	for _, rctx := range []context.Context{
		telemetry.ExtractHeaders(context.Background(), header),
		telemetry.ExtractHeaders(context.Background(), canon),
		telemetry.ExtractMap(context.Background(), control),
	} {
		_, child := tpB.Tracer("b").Start(rctx, telemetry.SpanTaskSnapshot)
		child.End()
	}
	cp.End()
	for _, s := range recB.Ended() {
		if s.Parent().SpanID() != cp.SpanContext().SpanID() || s.SpanContext().TraceID() != cp.SpanContext().TraceID() || !s.Parent().IsRemote() {
			t.Errorf("%s on host b: parent %v, want the remote checkpoint span %v", s.Name(), s.Parent(), cp.SpanContext())
		}
	}
	if len(recB.Ended()) != 3 || len(recA.Ended()) != 1 {
		t.Errorf("%d spans on b, %d on a", len(recB.Ended()), len(recA.Ended()))
	}
}

func TestSpanHelpers(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	// StartChild: nothing without a recording parent.
	ctx, span := telemetry.StartChild(context.Background(), "x")
	if span != nil || ctx != context.Background() {
		t.Fatal("StartChild without a parent made a span")
	}
	telemetry.EndSpan(span, io.EOF) // nil span: no-op
	ctx, job := tp.Tracer("t").Start(context.Background(), "job")
	cctx, child := telemetry.StartChild(ctx, telemetry.SpanTaskOpen, telemetry.SubtaskAttrs("j-1", "j", "op", 2, 1)...)
	if child == nil || !trace.SpanContextFromContext(cctx).Equal(child.SpanContext()) {
		t.Fatal("StartChild under a recording parent made no span")
	}
	telemetry.EndSpan(child, io.EOF)
	// StartRoot (global provider): a new trace linked to the job span.
	otel.SetTracerProvider(tp)
	defer otel.SetTracerProvider(noop.NewTracerProvider())
	_, root := telemetry.StartRoot(ctx, telemetry.SpanCheckpoint, telemetry.CheckpointID(3))
	root.End()
	job.End()
	ended := rec.Ended()
	if len(ended) != 3 || ended[0].Status().Description != "EOF" || len(ended[0].Events()) != 1 {
		t.Fatalf("spans %v", ended)
	}
	r := ended[1]
	if r.Name() != telemetry.SpanCheckpoint || r.SpanContext().TraceID() == job.SpanContext().TraceID() || r.Parent().IsValid() ||
		len(r.Links()) != 1 || !r.Links()[0].SpanContext.Equal(job.SpanContext()) {
		t.Errorf("StartRoot: trace %v parent %v links %v; want a new trace linked to the job span", r.SpanContext().TraceID(), r.Parent(), r.Links())
	}
}
