package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/streamd/streamd/internal/nexmark"
)

// nexmarkQueries are the Nexmark rows of make bench: every query, the
// stateless ones with the Go SDK too.
var nexmarkQueries = []string{"q0", "q0-go", "q1", "q1-go", "q2", "q2-go", "q3", "q4", "q5", "q7", "q8"}

// nexmarkSection runs `streamd bench nexmark`'s measurement (bin/streamd,
// built by make bench) and renders it with the targets of issue 27.
func nexmarkSection(events int64) (string, error) {
	bin, err := filepath.Abs("bin/streamd")
	if err != nil {
		return "", err
	}
	rows, err := nexmark.Bench(context.Background(), nexmark.BenchOptions{
		Streamd: bin, Dir: "examples/nexmark", Queries: nexmarkQueries, Events: events,
		Backends: []string{"memory", "pebble"}, Work: os.TempDir(),
	}, func(r nexmark.BenchRow) {
		fmt.Fprintf(os.Stderr, "nexmark %s (%s): %.1fs, %.1f CPU s\n", r.Job, r.Backend, r.Wall.Seconds(), r.CPU.Seconds())
	})
	if err != nil {
		return "", err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n## Nexmark (docs/nexmark.md)\n\n")
	fmt.Fprintf(&b, "`streamd bench nexmark` over every query, %d events each, parallelism 2, checkpoints every 10 s (exactly-once), sink discard. ", events)
	fmt.Fprintf(&b, "Per core = events / CPU seconds of the streamd process (user + system, from the OS). Targets: q0-q2 at least 5x Flink's published per-core figure, the others at least 1x.\n\n")
	b.WriteString(nexmark.RenderBench(rows))
	return b.String(), nil
}
