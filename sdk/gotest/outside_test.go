package gotest

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/host"
	"github.com/streamd/streamd/internal/testwasm"
)

// A user's operator written for the first SDK (the deprecated ValueState
// handle with explicit keys, and Emit): it keeps compiling and running, and it
// runs on a host without the SPEC14 imports.
const outsideOperator = `package main

import streamd "github.com/streamd/streamd/sdk/go"

type Counter struct {
	streamd.Base
	count streamd.Value
}

func (c *Counter) Open(ctx *streamd.Context) error {
	c.count = streamd.ValueState("count")
	return nil
}

func (c *Counter) ProcessElement(r streamd.Record, input int) error {
	n, _ := c.count.GetUint64(r.Key)
	c.count.PutUint64(r.Key, n+1)
	streamd.Emit(r.Key, append(r.Value, byte('0'+n+1)), r.Timestamp)
	return nil
}

func init() { streamd.Register(&Counter{}) }
func main() {}
`

// hostModules are module path prefixes of the host's dependencies: none may
// reach a user's operator module.
var hostModules = []string{
	"github.com/streamd/streamd ", "github.com/nats-io/", "github.com/tetratelabs/wazero",
	"go.opentelemetry.io/", "google.golang.org/", "github.com/prometheus/", "github.com/spf13/",
	"gopkg.in/yaml", "golang.org/x/",
}

// TestOutsideModule builds an operator the way sdk/go/README.md tells a user
// to: a fresh module outside the repository that requires only the SDK (here
// through a replace to this checkout), built to a WASI reactor. Its go.sum and
// module graph hold nothing of the host, and the module runs in the host.
func TestOutsideModule(t *testing.T) {
	root, err := testwasm.Root()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	env := append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off")
	gocmd := func(extraEnv []string, args ...string) string {
		t.Helper()
		cmd := exec.Command("go", args...)
		cmd.Dir = dir
		cmd.Env = append(env, extraEnv...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(outsideOperator), 0o644); err != nil {
		t.Fatal(err)
	}
	gocmd(nil, "mod", "init", "example.com/counter")
	gocmd(nil, "mod", "edit", "-replace", "github.com/streamd/streamd/sdk/go="+filepath.Join(root, "sdk", "go"))
	gocmd(nil, "mod", "tidy")
	wasm := filepath.Join(dir, "counter.wasm")
	gocmd([]string{"GOOS=wasip1", "GOARCH=wasm"}, "build", "-buildmode=c-shared", "-o", wasm, ".")

	modules := gocmd(nil, "list", "-m", "all")
	lines := strings.Split(strings.TrimSpace(modules), "\n")
	if len(lines) != 2 || lines[0] != "example.com/counter" || !strings.HasPrefix(lines[1], "github.com/streamd/streamd/sdk/go ") {
		t.Fatalf("the module graph is more than the user's module and the SDK:\n%s", modules)
	}
	sum, err := os.ReadFile(filepath.Join(dir, "go.sum"))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	for _, m := range hostModules {
		if strings.Contains(string(sum), m) {
			t.Fatalf("go.sum lists %q, a module of the host:\n%s", m, sum)
		}
	}
	if len(strings.TrimSpace(string(sum))) != 0 {
		t.Fatalf("go.sum of an operator that needs only the SDK is not empty:\n%s", sum)
	}

	inst := newInstance(t, newEngine(t), wasm, host.InstanceConfig{Operator: "counter", MaxParallelism: 1})
	var c collector
	recs := []abi.Record{
		{Key: []byte("a"), Value: []byte("x"), Timestamp: 1},
		{Key: []byte("a"), Value: []byte("y"), Timestamp: 2},
		{Key: []byte("b"), Value: []byte("z"), Timestamp: 3},
	}
	if err := inst.Process(context.Background(), 0, recs, c.emit); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(c.values(), " "); got != "x1 y2 z1" {
		t.Fatalf("the outside operator emitted %q, want %q", got, "x1 y2 z1")
	}
}
