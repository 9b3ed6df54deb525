//go:build !wasip1

package gotest

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/host"
	"github.com/streamd/streamd/internal/testguests/windowsop"
	"github.com/streamd/streamd/internal/testwasm"
	streamd "github.com/streamd/streamd/sdk/go"
	"github.com/streamd/streamd/sdk/go/streamdtest"
)

const windowsWasm = "internal/testguests/windows/windows.wasm"

// step is one event of a scenario: a record of key at event time ts (and
// processing time now), or a watermark ts.
type step struct {
	key       string
	ts, now   int64
	watermark bool
}

func scenario(rng *rand.Rand, n int) []step {
	var steps []step
	var maxTS, wm, now int64 = 0, -1, 1000
	for i := 0; i < n; i++ {
		now += int64(rng.IntN(4))
		if rng.IntN(8) == 0 {
			if w := maxTS - int64(rng.IntN(30)); w > wm {
				wm = w
				steps = append(steps, step{ts: w, now: now, watermark: true})
			}
			continue
		}
		ts := int64(rng.IntN(400))
		maxTS = max(maxTS, ts)
		steps = append(steps, step{key: fmt.Sprintf("k%d", rng.IntN(5)), ts: ts, now: now})
	}
	return steps
}

func render(recs []abi.Record) string {
	var b strings.Builder
	for _, r := range recs {
		fmt.Fprintf(&b, "%s %s @%d\n", r.Key, r.Value, r.Timestamp)
	}
	return b.String()
}

// hostRun runs steps through the windows guest in the host, with a
// snapshot and a restore into a fresh instance after step cut (if > 0).
func hostRun(t *testing.T, eng *host.Engine, cfg map[string]string, steps []step, cut int) string {
	ctx := context.Background()
	var now int64
	clock := func() time.Time { return time.UnixMilli(now) }
	mk := func(restore *host.Snapshot) *host.Instance {
		return newInstance(t, eng, testwasm.Path(t, windowsWasm), host.InstanceConfig{Operator: "windows", Config: cfg,
			AllowClock: true, Clock: clock, Restore: restore})
	}
	inst := mk(nil)
	var out collector
	wm := abi.MinWatermark
	for i, s := range steps {
		if i == cut && cut > 0 {
			snap, err := inst.SnapshotState(ctx, 1)
			if err != nil {
				t.Fatal(err)
			}
			inst = mk(snap)
			if wm > abi.MinWatermark {
				if err := inst.AdvanceWatermark(ctx, wm, out.emit); err != nil {
					t.Fatal(err)
				}
			}
		}
		now = s.now
		if err := inst.FireProcessingTimers(ctx, now, out.emit); err != nil {
			t.Fatal(err)
		}
		var err error
		if s.watermark {
			wm = s.ts
			err = inst.AdvanceWatermark(ctx, s.ts, out.emit)
		} else {
			err = inst.Process(ctx, 0, []abi.Record{{Key: []byte(s.key), Value: []byte(fmt.Sprint(s.ts)), Timestamp: s.ts}}, out.emit)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	now += 1000
	if err := inst.FireProcessingTimers(ctx, now, out.emit); err != nil {
		t.Fatal(err)
	}
	if err := inst.EndInput(ctx, 0, out.emit); err != nil {
		t.Fatal(err)
	}
	if err := inst.AdvanceWatermark(ctx, abi.MaxWatermark, out.emit); err != nil {
		t.Fatal(err)
	}
	if err := inst.Finish(ctx, out.emit); err != nil {
		t.Fatal(err)
	}
	return render(out.recs)
}

// harnessRun runs the same steps through the same operator on streamdtest.
func harnessRun(t *testing.T, cfg map[string]string, steps []step, cut int) string {
	opts := streamdtest.Options{Config: cfg, AllowClock: true}
	h := streamdtest.New(windowsop.New(), opts)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(h.Open())
	var recs []abi.Record
	take := func() {
		for _, r := range h.Output() {
			recs = append(recs, abi.Record{Key: r.Key, Value: r.Value, Timestamp: r.Timestamp})
		}
		h.ClearOutput()
	}
	for i, s := range steps {
		if i == cut && cut > 0 {
			take()
			snap := h.Snapshot(1)
			must(h.Err())
			wm := h.Watermark()
			opts.Restore, opts.ProcessingTime = &snap, h.ProcessingTime()
			h = streamdtest.New(windowsop.New(), opts)
			must(h.Open())
			if wm > streamd.MinWatermark {
				must(h.ProcessWatermark(wm))
			}
		}
		must(h.SetProcessingTime(s.now))
		if s.watermark {
			must(h.ProcessWatermark(s.ts))
		} else {
			must(h.ProcessElement(streamd.Record{Key: []byte(s.key), Value: []byte(fmt.Sprint(s.ts)), Timestamp: s.ts}, 0))
		}
	}
	must(h.SetProcessingTime(h.ProcessingTime() + 1000))
	must(h.EndOfInput())
	take()
	return render(recs)
}

// TestWindowsGuestMatchesHarness runs random scenarios through the Go SDK's
// windows (and typed state with TTL) twice: compiled to Wasm in the host,
// and natively on the streamdtest harness; the outputs must be the same,
// record for record, also across a snapshot and restore in the middle.
func TestWindowsGuestMatchesHarness(t *testing.T) {
	eng := newEngine(t)
	rng := rand.New(rand.NewPCG(11, 12))
	configs := []map[string]string{
		{"kind": "tumbling", "size": "20"},
		{"kind": "tumbling", "size": "15", "lateness": "25"},
		{"kind": "sliding", "size": "30", "slide": "10", "lateness": "10"},
		{"kind": "session", "gap": "12"},
		{"kind": "session", "gap": "8", "lateness": "40"},
		{"kind": "ptumbling", "size": "10"},
		{"kind": "psession", "gap": "3"},
	}
	for _, cfg := range configs {
		for round := 0; round < 2; round++ {
			steps := scenario(rng, 150)
			cut := 0
			if round == 1 {
				cut = len(steps) / 2
			}
			name := fmt.Sprintf("%v/cut=%d", cfg, cut)
			got, want := hostRun(t, eng, cfg, steps, cut), harnessRun(t, cfg, steps, cut)
			if got != want {
				t.Fatalf("%s: host\n%s\nharness\n%s", name, got, want)
			}
			if testing.Verbose() && cut > 0 {
				t.Logf("%s: %d windows, first: %s", name, strings.Count(got, "\n"), strings.SplitN(got, "\n", 2)[0])
			}
			if strings.Count(got, "\n") < 5 {
				t.Fatalf("%s: only %d windows fired", name, strings.Count(got, "\n"))
			}
		}
	}
}

const intervalJoinWasm = "examples/wasm/interval-join/interval-join.wasm"

// jsonRecords reads a JSON-lines file as keyby leaves it: keyed by field
// key, event time from "ts".
func jsonRecords(t *testing.T, file, key string) []abi.Record {
	var recs []abi.Record
	for _, l := range readLines(t, file) {
		var v map[string]any
		if err := json.Unmarshal([]byte(l), &v); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		recs = append(recs, abi.Record{Key: []byte(fmt.Sprint(v[key])), Value: []byte(l), Timestamp: int64(v["ts"].(float64))})
	}
	return recs
}

// TestIntervalJoinGuest runs the interval-join example's module in the host
// (map state with TTL, event-time timers, two inputs) over its two input
// files, with the watermarks of the job's sources (highest ts - 1m, the
// minimum of both inputs), at parallelism 1 and 3, against expected.txt.
func TestIntervalJoinGuest(t *testing.T) {
	eng := newEngine(t)
	ctx := context.Background()
	dir := "../../examples/wasm/interval-join/"
	inputs := [][]abi.Record{jsonRecords(t, dir+"orders.jsonl", "order"), jsonRecords(t, dir+"shipments.jsonl", "order")}
	want := readLines(t, dir+"expected.txt")
	for _, par := range []int{1, 3} {
		var out collector
		subs := make([]*host.Instance, par)
		for s := range subs {
			subs[s] = newInstance(t, eng, testwasm.Path(t, intervalJoinWasm), host.InstanceConfig{Operator: "join", Subtask: s,
				Parallelism: par, NumInputs: 2, Config: map[string]string{"lower": "0s", "upper": "10m", "ttl": "1h"}})
		}
		maxTS := []int64{abi.MinWatermark, abi.MinWatermark}
		for turn := 0; turn < max(len(inputs[0]), len(inputs[1])); turn++ {
			for in := range inputs {
				if turn >= len(inputs[in]) {
					continue
				}
				r := inputs[in][turn]
				s := abi.SubtaskForKeyGroup(abi.KeyGroup(r.Key, abi.DefaultMaxParallelism), abi.DefaultMaxParallelism, par)
				if err := subs[s].Process(ctx, in, []abi.Record{r}, out.emit); err != nil {
					t.Fatal(err)
				}
				maxTS[in] = max(maxTS[in], r.Timestamp)
				if wm := min(maxTS[0], maxTS[1]); wm > abi.MinWatermark {
					for _, sub := range subs {
						if err := sub.AdvanceWatermark(ctx, wm-60_000, out.emit); err != nil {
							t.Fatal(err)
						}
					}
				}
			}
		}
		for _, sub := range subs {
			if err := sub.AdvanceWatermark(ctx, abi.MaxWatermark, out.emit); err != nil {
				t.Fatal(err)
			}
		}
		got := out.values()
		sort.Strings(got)
		sort.Strings(want)
		if strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Fatalf("parallelism %d: pairs\n%s\nwant\n%s", par, strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
	}
}

// BenchmarkTypedVsRawGuest runs batches of 1024 records through MapOf(Int64,
// Int64) and through the raw byte API doing the same, in the host, batch by
// batch in turn, and reports the typed time over the raw time (the SDK's
// contract: within 10%).
func BenchmarkTypedVsRawGuest(b *testing.B) {
	eng := newEngine(b)
	ctx := context.Background()
	typed := newInstance(b, eng, testwasm.Path(b, "internal/testguests/typedmap/typedmap.wasm"), host.InstanceConfig{Operator: "typed"})
	raw := newInstance(b, eng, testwasm.Path(b, "internal/testguests/rawmap/rawmap.wasm"), host.InstanceConfig{Operator: "raw"})
	recs := make([]abi.Record, 1024)
	for i := range recs {
		recs[i] = abi.Record{Key: []byte("k"), Value: binary.LittleEndian.AppendUint64(nil, uint64(i)), Timestamp: int64(i)}
	}
	emit := func([]abi.Record) {}
	process := func(inst *host.Instance) time.Duration {
		start := time.Now()
		if err := inst.Process(ctx, 0, recs, emit); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	for i := 0; i < 20; i++ { // warm up
		process(typed)
		process(raw)
	}
	b.ResetTimer()
	// Batch by batch, turn and turn about, so that a busy machine slows both.
	var tt, tr time.Duration
	for i := 0; i < b.N; i++ {
		tt += process(typed)
		tr += process(raw)
	}
	b.ReportMetric(float64(tt)/float64(tr), "typed/raw")
	b.ReportMetric(float64(tt.Nanoseconds())/float64(b.N*len(recs)), "ns/record-typed")
	b.ReportMetric(float64(tr.Nanoseconds())/float64(b.N*len(recs)), "ns/record-raw")
}
