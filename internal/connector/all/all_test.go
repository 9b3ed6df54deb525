package all

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/streamd/streamd/internal/connector"
)

//go:generate go test -run TestConnectorsDoc -update .

var update = flag.Bool("update", false, "rewrite docs/connectors.md from the registry")

// TestConnectorsDoc keeps docs/connectors.md what the registry generates,
// with every connector registered (go test -run TestConnectorsDoc -update
// ., or go generate, rewrites it).
func TestConnectorsDoc(t *testing.T) {
	path := filepath.Join("..", "..", "..", "docs", "connectors.md")
	want := append(connector.Markdown(), '\n')
	if *update {
		if err := os.WriteFile(path, want, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (go generate ./internal/connector/all writes it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("docs/connectors.md is not what the registry generates: run go generate ./internal/connector/all")
	}
}

// TestKafkaRegistered: the kafka source, sink and deploy scheme are in
// the registry once this package is imported.
func TestKafkaRegistered(t *testing.T) {
	if _, ok := connector.LookupSource("kafka"); !ok {
		t.Error("no kafka source")
	}
	if _, ok := connector.LookupSink("kafka"); !ok {
		t.Error("no kafka sink")
	}
	if _, ok := connector.InputScheme("kafka"); !ok {
		t.Error("no kafka input scheme")
	}
	if _, ok := connector.OutputScheme("kafka"); !ok {
		t.Error("no kafka output scheme")
	}
}
