package telemetry

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A file exporter writes every ended span as a JSON object that names it,
// and the file is complete once the provider shut down.
func TestFileExporter(t *testing.T) {
	path := filepath.Join(t.TempDir(), "traces", "spans.json")
	tel, err := New(context.Background(), Config{Enabled: true, Protocol: ProtocolFile, Endpoint: path, ServiceName: "streamd-test"})
	if err != nil {
		t.Fatal(err)
	}
	tr := tel.TracerProvider().Tracer("test")
	ctx, parent := tr.Start(context.Background(), "checkpoint")
	_, child := tr.Start(ctx, "task.snapshot")
	child.End()
	parent.End()
	if err := tel.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(strings.NewReader(string(b)))
	var names []string
	for dec.More() {
		var span struct{ Name string }
		if err := dec.Decode(&span); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		names = append(names, span.Name)
	}
	if strings.Join(names, ",") != "task.snapshot,checkpoint" {
		t.Fatalf("spans in file: %v, want task.snapshot then checkpoint", names)
	}
}

func TestFileExporterNeedsPath(t *testing.T) {
	c := Config{Enabled: true, Protocol: ProtocolFile}
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), KeyTracingEndpoint) {
		t.Fatalf("err = %v, want one naming %s", err, KeyTracingEndpoint)
	}
}
