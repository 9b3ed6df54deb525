package main

import (
	"context"
	"strings"
	"time"

	"github.com/streamd/streamd/internal/telemetry"
)

// telemetryShutdownTimeout bounds the flush of the spans still buffered when
// a command exits.
const telemetryShutdownTimeout = 5 * time.Second

// startTelemetry sets up tracing and metrics (tracing.*, metrics.*; both off
// by default) for this process under service (e.g. "streamd-run") unless
// tracing.service_name names one. The returned function flushes and stops
// them; call it before exiting. A controller, server or run also keeps its
// recent checkpoint traces for the web console (c.traces).
func (c *cli) startTelemetry(ctx context.Context, service string) (func(), error) {
	cfg, err := telemetry.FromViper(c.v)
	if err != nil {
		return nil, usageError{err}
	}
	if c.v.GetString(telemetry.KeyTracingService) == "" {
		cfg.ServiceName = service
	}
	if !strings.HasPrefix(service, "streamd-host") {
		// The web console's trace view: this process keeps its recent
		// checkpoint traces, with or without a trace backend.
		cfg.Recorder = telemetry.NewRecorder()
		c.traces = cfg.Recorder
	}
	t, err := telemetry.New(ctx, cfg)
	if err != nil {
		return nil, err
	}
	t.Install()
	c.service = cfg.ServiceName
	if cfg.Enabled {
		c.log.Debug("tracing on", "service", cfg.ServiceName, "protocol", cfg.Protocol, "endpoint", cfg.Endpoint)
	}
	if addr := t.MetricsAddr(); addr != "" {
		c.log.Info("metrics served", "url", "http://"+addr+"/metrics")
		if cfg.Pprof {
			c.log.Info("profiles served", "url", "http://"+addr+"/debug/pprof/")
		}
	}
	return func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), telemetryShutdownTimeout)
		defer cancel()
		if err := t.Shutdown(sctx); err != nil {
			c.log.Warn("telemetry shutdown", "err", err)
		}
	}, nil
}

func init() { knownKeys = append(knownKeys, telemetry.Keys...) }
