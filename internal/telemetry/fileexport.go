package telemetry

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// fileExporter writes spans as JSON objects (the stdouttrace format, one per
// span) to a file, and closes the file when the provider shuts down.
type fileExporter struct {
	sdktrace.SpanExporter
	f *os.File
}

func newFileExporter(path string) (sdktrace.SpanExporter, error) {
	if dir := filepath.Dir(path); dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("telemetry: trace file %s: %w", path, err)
		}
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("telemetry: trace file: %w", err)
	}
	exp, err := stdouttrace.New(stdouttrace.WithWriter(f))
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("telemetry: trace file %s: %w", path, err)
	}
	return &fileExporter{SpanExporter: exp, f: f}, nil
}

func (e *fileExporter) Shutdown(ctx context.Context) error {
	return errors.Join(e.SpanExporter.Shutdown(ctx), e.f.Sync(), e.f.Close())
}
