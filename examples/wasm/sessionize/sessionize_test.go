package main

import (
	"flag"
	"strings"
	"testing"

	streamd "github.com/streamd/streamd/sdk/go"

	"github.com/streamd/streamd/examples/wasm/internal/jsonl"
	"github.com/streamd/streamd/examples/wasm/internal/pipeline"
)

var update = flag.Bool("update", false, "rewrite expected.txt and expected-late.txt")

// TestSessionize runs job.yaml's pipeline on the harness (keyby, then the
// sessions over a hash edge) at parallelism 1 and 4, and stopped with a
// snapshot in the middle and restored at another parallelism, and checks
// the output and the late output against expected.txt and
// expected-late.txt (what the job writes to out/ and late/, sorted).
func TestSessionize(t *testing.T) {
	views := jsonl.Read(t, "input.jsonl")
	for _, c := range []struct {
		name               string
		p, after, restoreP int
	}{
		{"p1", 1, 0, 0}, {"p4", 4, 0, 0}, {"savepoint-p2-to-p3", 2, 7, 3}, {"savepoint-p4-to-p1", 4, 9, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			res, err := pipeline.Run(pipeline.Job{
				New: newOperator, Parallelism: c.p, Sides: []string{"late"},
				Config:        streamd.Config{"gap": "30s", "allowed_lateness": "1m"},
				SnapshotAfter: c.after, RestoreParallelism: c.restoreP,
			}, pipeline.Input{Records: views, KeyBy: streamd.Config{"key": "user", "max_out_of_orderness": "5s"}})
			if err != nil {
				t.Fatal(err)
			}
			jsonl.Compare(t, "expected.txt", res.Output, *update)
			jsonl.Compare(t, "expected-late.txt", res.Side["late"], *update)
		})
	}
}

func TestSessionizeConfig(t *testing.T) {
	_, err := pipeline.Run(pipeline.Job{New: newOperator, Parallelism: 1, Config: streamd.Config{"gap": "soon"}},
		pipeline.Input{KeyBy: streamd.Config{"key": "user"}})
	if err == nil || !strings.Contains(err.Error(), "sessionize: config gap is soon, not a positive Go duration (30s, 1m)") {
		t.Fatalf("bad gap: %v", err)
	}
}
