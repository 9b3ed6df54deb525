package telemetry

import (
	"errors"
	"fmt"
	neturl "net/url"
	"os"
	"strconv"
	"strings"

	"github.com/spf13/pflag"
	"github.com/spf13/viper"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// Protocols of the OTLP trace exporter.
const (
	ProtocolGRPC = "grpc"
	ProtocolHTTP = "http" // OTLP/HTTP with protobuf bodies ("http/protobuf" is accepted too)
	// ProtocolFile writes every span as a JSON object to the file named by
	// Endpoint (appending), for looking at traces without a collector.
	ProtocolFile = "file"
)

// DefaultServiceName is the service name when none is configured. Every
// service name starts with it: a controller might be "streamd-controller", a
// host "streamd-host-<id>".
const DefaultServiceName = "streamd"

// Config is the telemetry part of streamd's configuration. The zero value is
// "everything off".
type Config struct {
	// Enabled turns tracing on (tracing.enabled; default off). Off, no
	// exporter, provider or sampler exists and every span is the global no-op.
	Enabled bool
	// Protocol is grpc, http or file (tracing.protocol). Empty: the standard
	// OTEL_EXPORTER_OTLP_TRACES_PROTOCOL / OTEL_EXPORTER_OTLP_PROTOCOL
	// ("grpc" or "http/protobuf"), else grpc.
	Protocol string
	// Endpoint is host:port or a URL (tracing.endpoint). Empty: the exporter
	// reads OTEL_EXPORTER_OTLP_TRACES_ENDPOINT / OTEL_EXPORTER_OTLP_ENDPOINT,
	// else localhost:4317 (grpc) or localhost:4318 (http). A http:// URL
	// implies Insecure.
	Endpoint string
	// Insecure sends without TLS (tracing.insecure). False leaves it to the
	// endpoint URL's scheme and OTEL_EXPORTER_OTLP_INSECURE.
	Insecure bool
	// SampleRatio is the share of new traces sampled, in [0, 1]
	// (tracing.sample_ratio); a span with a parent follows its parent's
	// decision. Nil means unset: then OTEL_TRACES_SAMPLER and
	// OTEL_TRACES_SAMPLER_ARG decide, else every trace is sampled.
	SampleRatio *float64
	// ServiceName is the OpenTelemetry service.name (tracing.service_name);
	// it must start with "streamd". Empty: "streamd".
	ServiceName string
	// PrometheusAddr is where /metrics is served, e.g. 127.0.0.1:9464
	// (metrics.listen). Empty: no metrics (the instruments are no-ops).
	PrometheusAddr string
	// Pprof serves Go's net/http/pprof profiles under /debug/pprof/ on the
	// metrics listener (metrics.pprof; needs metrics.listen).
	Pprof bool
	// UIURL is the trace UI (Jaeger) the web console links to
	// (tracing.ui_url), e.g. http://127.0.0.1:16686; "": no links.
	UIURL string
	// Recorder (nil: none) also gets the spans, for the web console's
	// trace view. With tracing off, New then makes a provider that samples
	// only the checkpoint traces, for the recorder alone (no exporter).
	Recorder *Recorder
}

// Configuration keys (viper), flags and STREAMD_ environment variables.
const (
	KeyTracingEnabled     = "tracing.enabled"
	KeyTracingProtocol    = "tracing.protocol"
	KeyTracingEndpoint    = "tracing.endpoint"
	KeyTracingInsecure    = "tracing.insecure"
	KeyTracingSampleRatio = "tracing.sample_ratio"
	KeyTracingService     = "tracing.service_name"
	KeyMetricsListen      = "metrics.listen"
	KeyMetricsPprof       = "metrics.pprof"
	KeyTracingUIURL       = "tracing.ui_url"
)

// Keys lists every configuration key of this package (for a configuration
// file's known-key check).
var Keys = []string{KeyTracingEnabled, KeyTracingProtocol, KeyTracingEndpoint, KeyTracingInsecure,
	KeyTracingSampleRatio, KeyTracingService, KeyMetricsListen, KeyMetricsPprof, KeyTracingUIURL}

// AddFlags defines --tracing, --tracing-protocol, --tracing-endpoint,
// --tracing-insecure, --tracing-sample-ratio, --tracing-service-name,
// --tracing-ui-url, --metrics-listen and --pprof on fs and binds them and the STREAMD_TRACING_ENABLED ...
// STREAMD_METRICS_LISTEN variables to the keys above in v.
func AddFlags(fs *pflag.FlagSet, v *viper.Viper) error {
	fs.Bool("tracing", false, "export OpenTelemetry traces over OTLP ("+KeyTracingEnabled+")")
	fs.String("tracing-protocol", "", "OTLP protocol: grpc or http, or file to write JSON spans to the file given as the endpoint ("+KeyTracingProtocol+"; default: OTEL_EXPORTER_OTLP_PROTOCOL, else grpc)")
	fs.String("tracing-endpoint", "", "OTLP endpoint, host:port or URL ("+KeyTracingEndpoint+"; default: OTEL_EXPORTER_OTLP_ENDPOINT, else localhost:4317/4318)")
	fs.Bool("tracing-insecure", false, "send traces without TLS ("+KeyTracingInsecure+")")
	fs.Float64("tracing-sample-ratio", -1, "share of new traces sampled, 0 to 1 ("+KeyTracingSampleRatio+"; default -1: OTEL_TRACES_SAMPLER, else 1)")
	fs.String("tracing-service-name", "", "service name, starting with streamd ("+KeyTracingService+")")
	fs.String("tracing-ui-url", "", "Jaeger UI the web console links traces to, e.g. http://127.0.0.1:16686 ("+KeyTracingUIURL+")")
	fs.String("metrics-listen", "", "serve Prometheus /metrics on this address, e.g. 127.0.0.1:9464 ("+KeyMetricsListen+")")
	fs.Bool("pprof", false, "serve Go's net/http/pprof profiles at /debug/pprof/ on the metrics listener ("+KeyMetricsPprof+"; needs "+KeyMetricsListen+")")
	for key, flag := range map[string]string{
		KeyTracingEnabled: "tracing", KeyTracingProtocol: "tracing-protocol", KeyTracingEndpoint: "tracing-endpoint",
		KeyTracingInsecure: "tracing-insecure", KeyTracingSampleRatio: "tracing-sample-ratio",
		KeyTracingService: "tracing-service-name", KeyMetricsListen: "metrics-listen",
		KeyTracingUIURL: "tracing-ui-url", KeyMetricsPprof: "pprof",
	} {
		if err := v.BindPFlag(key, fs.Lookup(flag)); err != nil {
			return fmt.Errorf("telemetry: bind flag --%s: %w", flag, err)
		}
	}
	BindEnv(v)
	return nil
}

// BindEnv binds each key to its STREAMD_ variable (tracing.sample_ratio to
// STREAMD_TRACING_SAMPLE_RATIO), independent of v's prefix settings.
func BindEnv(v *viper.Viper) {
	for _, k := range Keys {
		_ = v.BindEnv(k, "STREAMD_"+strings.ToUpper(strings.ReplaceAll(k, ".", "_")))
	}
}

// FromViper reads the keys above. tracing.sample_ratio counts as set only
// when it is given (flag, variable or file) and not negative, so that
// OTEL_TRACES_SAMPLER applies otherwise.
func FromViper(v *viper.Viper) (Config, error) {
	c := Config{
		Enabled:        v.GetBool(KeyTracingEnabled),
		Protocol:       v.GetString(KeyTracingProtocol),
		Endpoint:       v.GetString(KeyTracingEndpoint),
		Insecure:       v.GetBool(KeyTracingInsecure),
		ServiceName:    v.GetString(KeyTracingService),
		PrometheusAddr: v.GetString(KeyMetricsListen),
		Pprof:          v.GetBool(KeyMetricsPprof),
		UIURL:          v.GetString(KeyTracingUIURL),
	}
	if raw := v.Get(KeyTracingSampleRatio); raw != nil && fmt.Sprint(raw) != "" {
		r, err := strconv.ParseFloat(strings.TrimSpace(fmt.Sprint(raw)), 64)
		if err != nil {
			return Config{}, fmt.Errorf("telemetry: %s: want a number in [0, 1], got %v", KeyTracingSampleRatio, raw)
		}
		if r != -1 { // -1: the flag default, "unset"
			c.SampleRatio = &r
		}
	}
	if err := c.Validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}

// Validate checks the values and fills in defaults (service name).
func (c *Config) Validate() error {
	switch strings.ToLower(c.Protocol) {
	case "", ProtocolGRPC:
	case ProtocolHTTP, "http/protobuf":
		c.Protocol = ProtocolHTTP
	case ProtocolFile:
		if c.Endpoint == "" {
			return fmt.Errorf("telemetry: %s: file needs %s, the path of the file to write spans to", KeyTracingProtocol, KeyTracingEndpoint)
		}
	default:
		return fmt.Errorf("telemetry: %s: %q is not a protocol (want grpc, http or file)", KeyTracingProtocol, c.Protocol)
	}
	if r := c.SampleRatio; r != nil && !(*r >= 0 && *r <= 1) {
		return fmt.Errorf("telemetry: %s: %v outside [0, 1]", KeyTracingSampleRatio, *r)
	}
	if c.ServiceName == "" {
		c.ServiceName = DefaultServiceName
	}
	if c.Pprof && c.PrometheusAddr == "" {
		return fmt.Errorf("telemetry: %s: profiles are served on the metrics listener: set %s too (e.g. --metrics-listen 127.0.0.1:9464)", KeyMetricsPprof, KeyMetricsListen)
	}
	if u := c.UIURL; u != "" {
		pu, err := neturl.Parse(u)
		if err != nil || (pu.Scheme != "http" && pu.Scheme != "https") || pu.Host == "" {
			return fmt.Errorf("telemetry: %s: %q: want an http:// or https:// URL of the Jaeger UI", KeyTracingUIURL, u)
		}
	}
	if !strings.HasPrefix(c.ServiceName, DefaultServiceName) {
		return fmt.Errorf("telemetry: %s: %q must start with %q", KeyTracingService, c.ServiceName, DefaultServiceName)
	}
	return nil
}

// protocol resolves the exporter protocol: the configured one, else the
// standard variables, else grpc.
func (c *Config) protocol() (string, error) {
	if c.Protocol != "" {
		return c.Protocol, nil
	}
	for _, name := range []string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"} {
		switch p := strings.TrimSpace(os.Getenv(name)); p {
		case "":
			continue
		case "grpc":
			return ProtocolGRPC, nil
		case "http/protobuf", "http":
			return ProtocolHTTP, nil
		default:
			return "", fmt.Errorf("telemetry: %s=%q: unsupported protocol (want grpc or http/protobuf)", name, p)
		}
	}
	return ProtocolGRPC, nil
}

// sampler: the configured ratio (parent-based), else OTEL_TRACES_SAMPLER /
// OTEL_TRACES_SAMPLER_ARG, else parent-based always-on.
func (c *Config) sampler() (sdktrace.Sampler, error) {
	if c.SampleRatio != nil {
		return sdktrace.ParentBased(sdktrace.TraceIDRatioBased(*c.SampleRatio)), nil
	}
	return SamplerFromEnv()
}

// SamplerFromEnv parses OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG as the
// OpenTelemetry specification defines them (always_on, always_off,
// traceidratio, parentbased_always_on, parentbased_always_off,
// parentbased_traceidratio). Unset: parentbased_always_on. Unlike the SDK,
// which logs and falls back, a bad value is an error.
func SamplerFromEnv() (sdktrace.Sampler, error) {
	name := strings.ToLower(strings.TrimSpace(os.Getenv("OTEL_TRACES_SAMPLER")))
	arg := strings.TrimSpace(os.Getenv("OTEL_TRACES_SAMPLER_ARG"))
	ratio := func() (float64, error) {
		if arg == "" {
			return 1, nil
		}
		r, err := strconv.ParseFloat(arg, 64)
		if err != nil || r < 0 || r > 1 {
			return 0, fmt.Errorf("telemetry: OTEL_TRACES_SAMPLER_ARG=%q: want a ratio in [0, 1]", arg)
		}
		return r, nil
	}
	switch name {
	case "", "parentbased_always_on":
		return sdktrace.ParentBased(sdktrace.AlwaysSample()), nil
	case "always_on":
		return sdktrace.AlwaysSample(), nil
	case "always_off":
		return sdktrace.NeverSample(), nil
	case "parentbased_always_off":
		return sdktrace.ParentBased(sdktrace.NeverSample()), nil
	case "traceidratio":
		r, err := ratio()
		if err != nil {
			return nil, err
		}
		return sdktrace.TraceIDRatioBased(r), nil
	case "parentbased_traceidratio":
		r, err := ratio()
		if err != nil {
			return nil, err
		}
		return sdktrace.ParentBased(sdktrace.TraceIDRatioBased(r)), nil
	}
	return nil, errors.New("telemetry: OTEL_TRACES_SAMPLER=" + strconv.Quote(name) + ": unsupported sampler (want always_on, always_off, traceidratio, parentbased_always_on, parentbased_always_off or parentbased_traceidratio)")
}
