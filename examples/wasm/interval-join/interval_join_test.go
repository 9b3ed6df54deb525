package main

import (
	"flag"
	"testing"

	streamd "github.com/streamd/streamd/sdk/go"
	"github.com/streamd/streamd/sdk/go/streamdtest"

	"github.com/streamd/streamd/examples/wasm/internal/jsonl"
	"github.com/streamd/streamd/examples/wasm/internal/pipeline"
)

var update = flag.Bool("update", false, "rewrite expected.txt")

var config = streamd.Config{"lower": "0s", "upper": "10m", "ttl": "1h"}

// TestIntervalJoin runs job.yaml's pipeline on the harness: both files
// through keyby (with the sources' watermarks, highest ts - 1m) into the
// join over hash edges, at parallelism 1 and 4 and restored from a snapshot
// at another parallelism, against expected.txt.
func TestIntervalJoin(t *testing.T) {
	orders := pipeline.Input{Records: jsonl.Read(t, "orders.jsonl"), KeyBy: streamd.Config{"key": "order", "max_out_of_orderness": "1m"}}
	shipments := pipeline.Input{Records: jsonl.Read(t, "shipments.jsonl"), KeyBy: streamd.Config{"key": "order", "max_out_of_orderness": "1m"}}
	for _, c := range []struct {
		name               string
		p, after, restoreP int
	}{
		{"p1", 1, 0, 0}, {"p4", 4, 0, 0}, {"savepoint-p1-to-p4", 1, 8, 4}, {"savepoint-p3-to-p2", 3, 11, 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			res, err := pipeline.Run(pipeline.Job{New: newOperator, Parallelism: c.p, Config: config,
				SnapshotAfter: c.after, RestoreParallelism: c.restoreP}, orders, shipments)
			if err != nil {
				t.Fatal(err)
			}
			jsonl.Compare(t, "expected.txt", res.Output, *update)
		})
	}
}

// TestIntervalJoinCleansUp checks that timers remove what can join no more,
// and that the TTL removes what a stalled watermark leaves behind.
func TestIntervalJoinCleansUp(t *testing.T) {
	h := streamdtest.New(newOperator(), streamdtest.Options{NumInputs: 2, Config: config})
	must(t, h.Open())
	order := func(ts int64) streamd.Record {
		return streamd.Record{Key: []byte("o1"), Value: []byte(`{"n":1}`), Timestamp: ts}
	}
	must(t, h.ProcessElement(order(0), 0))
	must(t, h.ProcessElement(order(1000), 1))
	must(t, h.ProcessElement(order(700_000), 1)) // 700 s after the order: no pair
	if got := len(h.Output()); got != 1 {
		t.Fatalf("%d pairs, want 1", got)
	}
	must(t, h.ProcessWatermark(600_001)) // the order (0 + 10m) and the first shipment (1000 - 0) can pair no more
	if n := h.StateEntries(); n != 1 {
		t.Fatalf("%d entries after the watermark, want the later shipment only", n)
	}
	must(t, h.ProcessElement(order(500_000), 0)) // behind the watermark: dropped
	if len(h.Output()) != 1 || len(h.Logs()) != 1 {
		t.Fatalf("late order joined (%d pairs) or not logged %q", len(h.Output()), h.Logs())
	}
	must(t, h.SetProcessingTime(3_600_000)) // an hour later the TTL has removed the shipment too
	if n := h.StateEntries(); n != 0 {
		t.Fatalf("%d entries after the TTL", n)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
