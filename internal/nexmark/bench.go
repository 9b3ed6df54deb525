package nexmark

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// FlinkPerCore is Flink's published throughput per core on Nexmark
// (nexmark/nexmark README: Flink 1.13, 8 TaskManagers x 1 slot, RocksDB,
// incremental checkpoints), events per second per core.
var FlinkPerCore = map[string]float64{
	"q0": 155e3, "q1": 158e3, "q2": 175e3, "q3": 152e3,
	"q4": 34e3, "q5": 22e3, "q7": 12e3, "q8": 146e3,
}

// Stateful is whether a query keeps keyed state (and runs on both backends).
func Stateful(q string) bool {
	switch q {
	case "q0", "q1", "q2":
		return false
	}
	return true
}

// BenchOptions says what Bench runs.
type BenchOptions struct {
	Streamd  string   // the streamd binary
	Dir      string   // examples/nexmark: the job files and the modules they name
	Queries  []string // job file names without .yaml: q0, q5, q0-go, ...
	Events   int64    // events per run
	Backends []string // state backends of the stateful queries: memory, pebble
	Work     string   // a directory for the runs' checkpoints
}

// BenchRow is one measured run.
type BenchRow struct {
	Job, Backend string
	Events       int64
	Wall, CPU    time.Duration // CPU: user + system time of the streamd process, from the OS
	MaxRSSKiB    int64
}

// PerSecond is events per second of wall-clock time.
func (r BenchRow) PerSecond() float64 { return float64(r.Events) / r.Wall.Seconds() }

// PerCore is events per CPU second.
func (r BenchRow) PerCore() float64 { return float64(r.Events) / r.CPU.Seconds() }

// Query is the Nexmark query of the row's job (q0 for q0-go).
func (r BenchRow) Query() string { q, _, _ := strings.Cut(r.Job, "-"); return q }

// Bench runs each query's job file as `streamd run` in a child process with
// the source at opts.Events events and the file sink replaced by discard
// (Flink's blackhole), checkpoints on as in the file (exactly-once, 10 s),
// and measures its wall-clock and CPU time.
func Bench(ctx context.Context, opts BenchOptions, progress func(BenchRow)) ([]BenchRow, error) {
	var rows []BenchRow
	for _, job := range opts.Queries {
		backends := []string{"memory"}
		if Stateful(strings.SplitN(job, "-", 2)[0]) {
			backends = opts.Backends
		}
		for _, backend := range backends {
			r, err := benchOne(ctx, opts, job, backend)
			if err != nil {
				return rows, err
			}
			rows = append(rows, r)
			if progress != nil {
				progress(r)
			}
		}
	}
	return rows, nil
}

func benchOne(ctx context.Context, opts BenchOptions, job, backend string) (BenchRow, error) {
	src := filepath.Join(opts.Dir, job+".yaml")
	b, err := os.ReadFile(src)
	if err != nil {
		return BenchRow{}, fmt.Errorf("nexmark bench: %w", err)
	}
	text := string(b)
	for from, to := range map[string]string{
		"source: {type: nexmark, events: 1000000}": fmt.Sprintf("source: {type: nexmark, events: %d}", opts.Events),
		"sink: {type: file, path: out/}":           "sink: {type: discard}",
	} {
		if !strings.Contains(text, from) {
			return BenchRow{}, fmt.Errorf("nexmark bench: %s has no %q to replace", src, from)
		}
		text = strings.Replace(text, from, to, 1)
	}
	abs, err := filepath.Abs(opts.Dir)
	if err != nil {
		return BenchRow{}, err
	}
	// Modules are named relative to the job file: point them at opts.Dir.
	text = strings.ReplaceAll(text, "wasm: nexmark_", "wasm: "+abs+"/nexmark_")
	if backend != "memory" {
		text += "state: {backend: " + backend + "}\n"
	}
	dir, err := os.MkdirTemp(opts.Work, "nexmark-"+job+"-")
	if err != nil {
		return BenchRow{}, err
	}
	defer os.RemoveAll(dir)
	if err := os.WriteFile(filepath.Join(dir, "job.yaml"), []byte(text), 0o644); err != nil {
		return BenchRow{}, err
	}
	cmd := exec.CommandContext(ctx, opts.Streamd, "run", "--progress", "off", "--http", "off", "job.yaml")
	cmd.Dir = dir
	var errb bytes.Buffer
	cmd.Stderr = &errb
	start := time.Now()
	if err := cmd.Run(); err != nil {
		return BenchRow{}, fmt.Errorf("nexmark bench: %s (%s): streamd run: %v\n%s", job, backend, err, errb.String())
	}
	row := BenchRow{Job: job, Backend: backend, Events: opts.Events, Wall: time.Since(start)}
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		row.CPU = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
		row.MaxRSSKiB = ru.Maxrss
	}
	return row, nil
}

// RenderBench is the rows as a Markdown table.
func RenderBench(rows []BenchRow) string {
	var b strings.Builder
	b.WriteString("| query | state | events | wall s | events/s | CPU s | events/s per core | Flink per core | x Flink | max RSS MiB |\n")
	b.WriteString("|---|---|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, r := range rows {
		state := r.Backend
		if !Stateful(r.Query()) {
			state = "-"
		}
		flink := FlinkPerCore[r.Query()]
		fmt.Fprintf(&b, "| %s | %s | %s | %.1f | %s | %.1f | %s | %s | %.2f | %d |\n",
			r.Job, state, count(float64(r.Events)), r.Wall.Seconds(), count(r.PerSecond()), r.CPU.Seconds(),
			count(r.PerCore()), count(flink), r.PerCore()/flink, r.MaxRSSKiB/1024)
	}
	return b.String()
}

// count spells n with a K or M suffix.
func count(n float64) string {
	switch {
	case n >= 1e6:
		return strconv.FormatFloat(n/1e6, 'f', 2, 64) + "M"
	case n >= 1e3:
		return strconv.FormatFloat(n/1e3, 'f', 0, 64) + "K"
	}
	return strconv.FormatFloat(n, 'f', 0, 64)
}

// ParseCount reads an event count: 100000, 100K, 10M or 1G.
func ParseCount(s string) (int64, error) {
	orig, mult := s, int64(1)
	switch {
	case strings.HasSuffix(s, "K"), strings.HasSuffix(s, "k"):
		mult = 1e3
	case strings.HasSuffix(s, "M"):
		mult = 1e6
	case strings.HasSuffix(s, "G"):
		mult = 1e9
	}
	if mult > 1 {
		s = s[:len(s)-1]
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("%q is not a positive count of events (e.g. 100000, 100K, 10M)", orig)
	}
	return n * mult, nil
}
