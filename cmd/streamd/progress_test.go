package main

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/streamd/streamd/internal/runtime"
)

func stats(elapsed time.Duration, srcOut, opIn, opOut int64) runtime.Stats {
	return runtime.Stats{Elapsed: elapsed, Operators: []runtime.OperatorStats{
		{UID: "src", Parallelism: 1, RecordsOut: srcOut},
		{UID: "op", Parallelism: 4, RecordsIn: opIn, RecordsOut: opOut},
	}}
}

// squeeze collapses runs of spaces, so tests do not depend on column widths.
func squeeze(s string) string {
	for strings.Contains(s, "  ") {
		s = strings.ReplaceAll(s, "  ", " ")
	}
	return s
}

func TestProgressTable(t *testing.T) {
	var out bytes.Buffer
	p := newProgress(progressTable, &out, slog.Default())
	p.update(stats(time.Second, 1000, 900, 450))
	first := out.String()
	for _, want := range []string{"running 1s\n", "OPERATOR PARALLELISM IN OUT RATE/S", "src 1 0 1000 1000", "op 4 900 450 900"} {
		if !strings.Contains(squeeze(first), want) {
			t.Errorf("first table lacks %q:\n%s", want, first)
		}
	}
	out.Reset()
	p.update(stats(3*time.Second, 5000, 4900, 2450))
	if !strings.HasPrefix(out.String(), "\x1b[4A\x1b[J") {
		t.Errorf("second table does not redraw over the first 4 lines: %q", out.String())
	}
	if !strings.Contains(squeeze(out.String()), "op 4 4900 2450 2000") {
		t.Errorf("rate over the last 2s should be 2000/s:\n%s", out.String())
	}
	out.Reset()
	p.finish(stats(4*time.Second, 6000, 6000, 3000), "finished")
	if !strings.HasPrefix(out.String(), "\x1b[4A\x1b[Jfinished in 4s\n") || !strings.Contains(squeeze(out.String()), "op 4 6000 3000 1500") {
		t.Errorf("final table (average rates):\n%q", out.String())
	}
}

func TestProgressLog(t *testing.T) {
	var out bytes.Buffer
	log := slog.New(slog.NewTextHandler(&out, nil))
	p := newProgress(progressLog, &out, log)
	for s := 1; s <= 11; s++ {
		p.update(stats(time.Duration(s)*time.Second, int64(s*100), int64(s*100), 0))
	}
	// Lines at 5s and 10s, one per operator.
	if n := strings.Count(out.String(), "msg=progress"); n != 4 {
		t.Errorf("%d progress lines, want 4:\n%s", n, out.String())
	}
	if !strings.Contains(out.String(), "msg=progress operator=op parallelism=4 in=1000 out=0 rate=100/s elapsed=10s") {
		t.Errorf("unexpected log:\n%s", out.String())
	}
	out.Reset()
	p.finish(stats(12*time.Second, 1200, 1200, 0), "finished")
	if n := strings.Count(out.String(), "msg=summary"); n != 2 {
		t.Errorf("%d summary lines, want 2:\n%s", n, out.String())
	}
}
