// Package telemetry is streamd's OpenTelemetry setup: OTLP trace export (gRPC
// or HTTP), W3C trace-context propagation through NATS headers and control
// messages, span names and attribute keys shared by the host, the runtime and
// the coordinator, and metrics served on a Prometheus endpoint.
//
// Everything is off by default. Off, the global providers stay OpenTelemetry's
// no-ops, so starting a span costs a few nanoseconds and no exporter, batcher
// or goroutine exists; the metric handles (*OperatorMetrics, *Metrics) are nil
// and their methods return at once. Records are never traced one by one. A
// Recorder (Config.Recorder: the web console's checkpoint traces) is the one
// exception: with tracing off it gets a provider that samples only the
// checkpoint and stop-with-savepoint traces, for itself, and exports nothing.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	neturl "net/url"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	promexporter "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// Telemetry is one process's (or, in tests, one simulated host's) tracer and
// meter providers and metrics endpoint. Make it with New; Shutdown flushes the
// spans not yet exported and stops the endpoint.
type Telemetry struct {
	cfg     Config
	tp      *sdktrace.TracerProvider // nil: tracing off
	mp      *sdkmetric.MeterProvider // nil: metrics off
	metrics *Metrics                 // nil: metrics off
	ln      net.Listener
	srv     *http.Server
	served  chan error
}

// New builds the providers cfg asks for without installing them globally
// (Setup does). Tracing on: an OTLP exporter behind a batch span processor,
// the sampler of Config.SampleRatio or OTEL_TRACES_SAMPLER. Metrics on: a
// MeterProvider read by a Prometheus exporter, served at
// http://<PrometheusAddr>/metrics.
func New(ctx context.Context, cfg Config) (*Telemetry, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	t := &Telemetry{cfg: cfg}
	res, err := resource.New(ctx,
		resource.WithFromEnv(), // OTEL_RESOURCE_ATTRIBUTES
		resource.WithTelemetrySDK(),
		resource.WithAttributes(semconv.ServiceName(cfg.ServiceName)), // after env: ours wins
	)
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, fmt.Errorf("telemetry: resource: %w", err)
	}
	if cfg.Enabled {
		exp, err := newExporter(ctx, cfg)
		if err != nil {
			return nil, err
		}
		sampler, err := cfg.sampler()
		if err != nil {
			_ = exp.Shutdown(ctx)
			return nil, err
		}
		opts := []sdktrace.TracerProviderOption{sdktrace.WithBatcher(exp), sdktrace.WithSampler(sampler), sdktrace.WithResource(res)}
		if cfg.Recorder != nil {
			opts = append(opts, sdktrace.WithSpanProcessor(cfg.Recorder))
		}
		t.tp = sdktrace.NewTracerProvider(opts...)
	} else if cfg.Recorder != nil {
		t.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(cfg.Recorder),
			sdktrace.WithSampler(RecorderSampler()), sdktrace.WithResource(res))
	}
	if cfg.PrometheusAddr != "" {
		if err := t.startMetrics(res); err != nil {
			_ = t.Shutdown(ctx)
			return nil, err
		}
	}
	return t, nil
}

func newExporter(ctx context.Context, cfg Config) (sdktrace.SpanExporter, error) {
	proto, err := cfg.protocol()
	if err != nil {
		return nil, err
	}
	url := cfg.Endpoint != "" && containsScheme(cfg.Endpoint)
	var exp sdktrace.SpanExporter
	switch proto {
	case ProtocolFile:
		return newFileExporter(cfg.Endpoint)
	case ProtocolHTTP:
		var opts []otlptracehttp.Option
		switch {
		case url:
			opts = append(opts, otlptracehttp.WithEndpointURL(httpTracesURL(cfg.Endpoint)))
		case cfg.Endpoint != "":
			opts = append(opts, otlptracehttp.WithEndpoint(cfg.Endpoint))
		}
		if cfg.Insecure {
			opts = append(opts, otlptracehttp.WithInsecure())
		}
		exp, err = otlptracehttp.New(ctx, opts...)
	default:
		var opts []otlptracegrpc.Option
		switch {
		case url:
			opts = append(opts, otlptracegrpc.WithEndpointURL(cfg.Endpoint))
		case cfg.Endpoint != "":
			opts = append(opts, otlptracegrpc.WithEndpoint(cfg.Endpoint))
		}
		if cfg.Insecure {
			opts = append(opts, otlptracegrpc.WithInsecure())
		}
		exp, err = otlptracegrpc.New(ctx, opts...)
	}
	if err != nil {
		return nil, fmt.Errorf("telemetry: OTLP %s exporter to %q: %w", proto, cfg.Endpoint, err)
	}
	return exp, nil
}

// httpTracesURL: a URL without a path is a base endpoint, like
// OTEL_EXPORTER_OTLP_ENDPOINT: traces go to its /v1/traces.
func httpTracesURL(endpoint string) string {
	if u, err := neturl.Parse(endpoint); err == nil && (u.Path == "" || u.Path == "/") {
		u.Path = "/v1/traces"
		return u.String()
	}
	return endpoint
}

func containsScheme(s string) bool {
	for i := 0; i+2 < len(s); i++ {
		if s[i] == ':' && s[i+1] == '/' && s[i+2] == '/' {
			return true
		}
	}
	return false
}

func (t *Telemetry) startMetrics(res *resource.Resource) error {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	t.metrics = NewMetrics() // the job and subtask series, which end with them
	exp, err := promexporter.New(promexporter.WithRegisterer(reg), promexporter.WithoutScopeInfo(), promexporter.WithProducer(t.metrics))
	if err != nil {
		return fmt.Errorf("telemetry: prometheus exporter: %w", err)
	}
	t.mp = sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp), sdkmetric.WithResource(res))
	ln, err := net.Listen("tcp", t.cfg.PrometheusAddr)
	if err != nil {
		return fmt.Errorf("telemetry: %s: listen on %s: %w", KeyMetricsListen, t.cfg.PrometheusAddr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	if t.cfg.Pprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index) // and the named profiles: heap, goroutine, block, ...
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	t.ln = ln
	t.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	t.served = make(chan error, 1)
	go func() { t.served <- t.srv.Serve(ln) }()
	return nil
}

// TracerProvider is the SDK provider when tracing is on, else a no-op one.
func (t *Telemetry) TracerProvider() trace.TracerProvider {
	if t == nil || t.tp == nil {
		return noop.NewTracerProvider()
	}
	return t.tp
}

// MeterProvider is the SDK provider when metrics are on, else a no-op one.
func (t *Telemetry) MeterProvider() metric.MeterProvider {
	if t == nil || t.mp == nil {
		return metricnoop.NewMeterProvider()
	}
	return t.mp
}

// Metrics are the streamd instruments, nil when metrics are off (every
// method of a nil *Metrics is a no-op).
func (t *Telemetry) Metrics() *Metrics {
	if t == nil {
		return nil
	}
	return t.metrics
}

// MetricsAddr is the address /metrics is served on ("" when off); with
// metrics.listen ":0" it tells the port chosen.
func (t *Telemetry) MetricsAddr() string {
	if t == nil || t.ln == nil {
		return ""
	}
	return t.ln.Addr().String()
}

// Install makes t's providers the global ones (otel.GetTracerProvider, the
// Tracer of this package) and sets the W3C trace-context and baggage
// propagator. With tracing off the global tracer provider is left alone: the
// default no-op.
func (t *Telemetry) Install() {
	otel.SetTextMapPropagator(Propagator)
	globalMetrics.Store(t.metrics)
	if t.tp != nil {
		otel.SetTracerProvider(t.tp)
	}
	if t.mp != nil {
		otel.SetMeterProvider(t.mp)
	}
}

var globalMetrics atomic.Pointer[Metrics]

// GlobalMetrics are the instruments of the installed Telemetry (Install,
// Setup), nil when metrics are off or nothing is installed. The runtime uses
// them when its options name no Metrics.
func GlobalMetrics() *Metrics { return globalMetrics.Load() }

// Shutdown exports the spans still buffered and stops the exporter and the
// metrics endpoint. It is safe to call on a nil or already shut down value.
func (t *Telemetry) Shutdown(ctx context.Context) error {
	if t == nil {
		return nil
	}
	var errs []error
	if t.tp != nil {
		if err := t.tp.Shutdown(ctx); err != nil {
			errs = append(errs, fmt.Errorf("telemetry: shut down tracing: %w", err))
		}
		t.tp = nil
	}
	if t.srv != nil {
		if err := t.srv.Shutdown(ctx); err != nil {
			errs = append(errs, fmt.Errorf("telemetry: stop metrics endpoint: %w", err))
		}
		<-t.served
		t.srv = nil
	}
	if t.mp != nil {
		if err := t.mp.Shutdown(ctx); err != nil {
			errs = append(errs, fmt.Errorf("telemetry: shut down metrics: %w", err))
		}
		t.mp = nil
	}
	return errors.Join(errs...)
}

// Setup is New followed by Install: the process-wide telemetry of a streamd
// command. Call the returned function before exiting (it flushes spans).
func Setup(ctx context.Context, cfg Config) (shutdown func(context.Context) error, err error) {
	t, err := New(ctx, cfg)
	if err != nil {
		return nil, err
	}
	t.Install()
	return t.Shutdown, nil
}
