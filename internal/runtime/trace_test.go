package runtime

import (
	"context"
	"fmt"
	"go.opentelemetry.io/otel/codes"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/internal/checkpoint"
	"github.com/streamd/streamd/internal/jobfile"
	"github.com/streamd/streamd/internal/telemetry"
	"github.com/streamd/streamd/internal/testwasm"
)

// spans is what an in-memory exporter collected, with lookups.
type spans []tracetest.SpanStub

func (ss spans) named(name string) spans {
	var out spans
	for _, s := range ss {
		if s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

// childrenOf are the spans whose parent is p.
func (ss spans) childrenOf(p tracetest.SpanStub) spans {
	var out spans
	for _, s := range ss {
		if s.Parent.SpanID() == p.SpanContext.SpanID() && s.Parent.TraceID() == p.SpanContext.TraceID() {
			out = append(out, s)
		}
	}
	return out
}

func attr(s tracetest.SpanStub, k attribute.Key) (attribute.Value, bool) {
	for _, a := range s.Attributes {
		if a.Key == k {
			return a.Value, true
		}
	}
	return attribute.Value{}, false
}

func attrInt(t *testing.T, s tracetest.SpanStub, k attribute.Key) int64 {
	t.Helper()
	v, ok := attr(s, k)
	if !ok {
		t.Fatalf("span %s has no attribute %s: %v", s.Name, k, s.Attributes)
	}
	return v.AsInt64()
}

// subtaskOf is "operator[subtask]" of a span, checking job and attempt.
func subtaskOf(t *testing.T, s tracetest.SpanStub) string {
	t.Helper()
	job, _ := attr(s, telemetry.AttrJob)
	op, _ := attr(s, telemetry.AttrOperator)
	sub, ok := attr(s, telemetry.AttrSubtask)
	att, ok2 := attr(s, telemetry.AttrAttempt)
	if job.AsString() != "test" || op.AsString() == "" || !ok || !ok2 || att.AsInt64() != 0 {
		t.Fatalf("span %s: attributes %v: want job test, an operator, a subtask and attempt 0", s.Name, s.Attributes)
	}
	return fmt.Sprintf("%s[%d]", op.AsString(), sub.AsInt64())
}

func names(ss spans) []string {
	var out []string
	for _, s := range ss {
		out = append(out, s.Name)
	}
	slices.Sort(out)
	return out
}

// tracedRun runs gen(p) -> count (wasm, keyed state) -> file sink with
// checkpoints every 30 ms, tracing into an in-memory exporter and metrics into
// a manual reader.
func tracedRun(t *testing.T, n int64) (spans, *sdkmetric.ManualReader, Stats) {
	mod := testwasm.Path(t, "internal/testguests/failonce/failonce.wasm")
	dir := t.TempDir()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	m := telemetry.NewMetrics()
	reader := sdkmetric.NewManualReader(sdkmetric.WithProducer(m))
	_ = sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	const p = 2
	gen := &jobfile.SourceSpec{Type: "generator", Count: n, Rate: 4000, KeyPattern: "key-{k}", ValuePattern: "value-{n}", Keys: 13, TSStep: 1}
	g := graph(t,
		src("gen", p, gen),
		op("count", p, &jobfile.WasmSpec{Path: mod, Config: map[string]string{"mode": "count"}}, in("gen", control.Hash)),
		sink("out", p, &jobfile.SinkSpec{Type: "file", Path: filepath.Join(dir, "out")}, in("count", control.Forward)),
	)
	stats, err := Run(context.Background(), g, Options{Engine: cachedEngine(t), BatchSize: 64, TracerProvider: tp, Metrics: m,
		Checkpoint: &CheckpointOptions{Store: openStore(t, filepath.Join(dir, "chk")), Interval: 30 * time.Millisecond, Tick: 5 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	return spans(exp.GetSpans()), reader, stats
}

// TestTraceCheckpoint: each checkpoint is one trace: the driver's checkpoint
// span is its root; every subtask's task.snapshot and every non-source
// subtask's task.barrier_alignment are its children, the wasm operator's
// guest.snapshot_state is a child of its snapshot; the notifications are
// children too. Attributes name job, operator, subtask, attempt and
// checkpoint; state bytes add up to the checkpoint's.
func TestTraceCheckpoint(t *testing.T) {
	ss, reader, stats := tracedRun(t, 1200)
	if stats.Checkpoints < 2 {
		t.Fatalf("%d checkpoints, want a periodic one and the final one", stats.Checkpoints)
	}
	ckpts := ss.named(telemetry.SpanCheckpoint)
	if len(ckpts) < stats.Checkpoints {
		t.Fatalf("%d checkpoint spans, %d checkpoints", len(ckpts), stats.Checkpoints)
	}
	complete, full := 0, 0
	for _, c := range ckpts {
		if c.Parent.IsValid() {
			t.Fatalf("checkpoint span has a parent %v: want the root of its trace", c.Parent)
		}
		if len(c.Links) != 1 || ss.named(telemetry.SpanJob)[0].SpanContext.SpanID() != c.Links[0].SpanContext.SpanID() {
			t.Errorf("checkpoint span links %v: want the job span", c.Links)
		}
		id := attrInt(t, c, telemetry.AttrCheckpointID)
		size, ok := attr(c, telemetry.AttrStateBytes)
		if !ok {
			continue // aborted (e.g. overtaken by the final checkpoint)
		}
		complete++
		kids := ss.childrenOf(c)
		var snaps, aligns []string
		var sum int64
		for _, k := range kids {
			if k.SpanContext.TraceID() != c.SpanContext.TraceID() {
				t.Fatalf("child %s in another trace", k.Name)
			}
			if got := attrInt(t, k, telemetry.AttrCheckpointID); got != id {
				t.Fatalf("%s of checkpoint %d has checkpoint id %d", k.Name, id, got)
			}
			if k.Name == telemetry.SpanCheckpointPersist {
				continue
			}
			who := subtaskOf(t, k)
			switch k.Name {
			case telemetry.SpanCheckpointSubtask:
				if !k.StartTime.Equal(c.StartTime) || k.EndTime.After(c.EndTime) {
					t.Fatalf("checkpoint %d: %s's part %v..%v, want from the trigger %v to its ack, before the end %v", id, who, k.StartTime, k.EndTime, c.StartTime, c.EndTime)
				}
			case telemetry.SpanTaskSnapshot:
				snaps = append(snaps, who)
				sum += attrInt(t, k, telemetry.AttrStateBytes)
				guest := ss.childrenOf(k)
				if strings.HasPrefix(who, "count[") {
					if len(guest) != 1 || guest[0].Name != telemetry.SpanGuestSnapshotState || attrInt(t, guest[0], telemetry.AttrCheckpointID) != id {
						t.Fatalf("children of %s's snapshot: %v, want guest.snapshot_state of checkpoint %d", who, names(guest), id)
					}
					subtaskOf(t, guest[0])
				} else if len(guest) != 0 {
					t.Fatalf("children of %s's snapshot: %v, want none", who, names(guest))
				}
			case telemetry.SpanBarrierAlignment:
				aligns = append(aligns, who)
			case telemetry.SpanTaskNotifyComplete:
				if g := ss.childrenOf(k); strings.HasPrefix(who, "count[") && (len(g) != 1 || g[0].Name != telemetry.SpanGuestNotifyCheckpoint) {
					t.Fatalf("children of %s's notify: %v", who, names(g))
				}
			default:
				t.Fatalf("unexpected child %s of checkpoint %d", k.Name, id)
			}
		}
		slices.Sort(snaps)
		slices.Sort(aligns)
		// A generator subtask that already ended and closed (after the
		// checkpoint that followed its end of data) is finished: a later
		// checkpoint counts it as acknowledged without a snapshot (FLIP-147).
		// The other subtasks wait for the final checkpoint, so they are in all.
		all := []string{"count[0]", "count[1]", "gen[0]", "gen[1]", "out[0]", "out[1]"}
		if slices.Equal(snaps, all) {
			full++
		} else if rest := slices.DeleteFunc(slices.Clone(snaps), func(s string) bool { return strings.HasPrefix(s, "gen[") }); !slices.Equal(rest, []string{"count[0]", "count[1]", "out[0]", "out[1]"}) || len(snaps) < 4 {
			t.Fatalf("checkpoint %d: snapshots of %v, want %v (generators may be missing once finished)", id, snaps, all)
		}
		if want := []string{"count[0]", "count[1]", "out[0]", "out[1]"}; !slices.Equal(aligns, want) {
			t.Fatalf("checkpoint %d: alignments of %v, want %v", id, aligns, want)
		}
		if sum != size.AsInt64() || sum == 0 {
			t.Fatalf("checkpoint %d: state bytes %d, snapshots' sum %d", id, size.AsInt64(), sum)
		}
	}
	if complete != stats.Checkpoints {
		t.Fatalf("%d complete checkpoint spans, %d checkpoints", complete, stats.Checkpoints)
	}
	if full == 0 {
		t.Fatalf("no checkpoint has the snapshots of all six subtasks")
	}

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					got[m.Name] += p.Value
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					got[m.Name] += int64(p.Count)
				}
			case metricdata.Histogram[int64]:
				for _, p := range d.DataPoints {
					got[m.Name] += int64(p.Count)
				}
			case metricdata.Sum[float64]:
				got[m.Name]++
			}
		}
	}
	if got[telemetry.MetricRecordsIn] != 2*1200 || got[telemetry.MetricRecordsOut] != 2*1200 {
		t.Errorf("records in %d (want 2400: count and out), out %d (want 2400: gen and count; the sink emits none)",
			got[telemetry.MetricRecordsIn], got[telemetry.MetricRecordsOut])
	}
	if got[telemetry.MetricCheckpointDuration] != int64(stats.Checkpoints) || got[telemetry.MetricCheckpointSize] != int64(stats.Checkpoints) {
		t.Errorf("checkpoint duration/size recorded %d/%d times, want %d", got[telemetry.MetricCheckpointDuration], got[telemetry.MetricCheckpointSize], stats.Checkpoints)
	}
	if got[telemetry.MetricAlignmentTime] < 4*int64(stats.Checkpoints) || got[telemetry.MetricFinalCheckpointWait] != 6 ||
		got[telemetry.MetricBatchLatency] == 0 || got[telemetry.MetricBackPressure] == 0 {
		t.Errorf("metrics %v", got)
	}
}

// TestTraceCheckpointCoverage: the spans under a completed checkpoint (each
// subtask's part from the trigger to its acknowledgement, the metadata
// persist) cover at least 95% of its duration, so "why was checkpoint N
// slow" has an answer in the trace.
func TestTraceCheckpointCoverage(t *testing.T) {
	ss, _, stats := tracedRun(t, 1200)
	checked := 0
	for _, c := range ss.named(telemetry.SpanCheckpoint) {
		if _, ok := attr(c, telemetry.AttrStateBytes); !ok {
			continue // aborted
		}
		type iv struct{ from, to time.Time }
		var ivs []iv
		persist := false
		for _, k := range ss.childrenOf(c) {
			persist = persist || k.Name == telemetry.SpanCheckpointPersist
			from, to := k.StartTime, k.EndTime
			if from.Before(c.StartTime) {
				from = c.StartTime
			}
			if to.After(c.EndTime) {
				to = c.EndTime
			}
			if to.After(from) {
				ivs = append(ivs, iv{from, to})
			}
		}
		if !persist {
			t.Fatalf("checkpoint %d: no %s span", attrInt(t, c, telemetry.AttrCheckpointID), telemetry.SpanCheckpointPersist)
		}
		slices.SortFunc(ivs, func(a, b iv) int { return a.from.Compare(b.from) })
		var covered time.Duration
		var end time.Time
		for _, x := range ivs {
			if x.from.After(end) {
				covered += x.to.Sub(x.from)
				end = x.to
			} else if x.to.After(end) {
				covered += x.to.Sub(end)
				end = x.to
			}
		}
		total := c.EndTime.Sub(c.StartTime)
		if frac := float64(covered) / float64(total); frac < 0.95 {
			var lines []string
			for _, k := range ss.childrenOf(c) {
				who := ""
				if op, ok := attr(k, telemetry.AttrOperator); ok {
					sub, _ := attr(k, telemetry.AttrSubtask)
					who = fmt.Sprintf("%s[%d]", op.AsString(), sub.AsInt64())
				}
				lines = append(lines, fmt.Sprintf("  %s %s +%v..+%v", k.Name, who, k.StartTime.Sub(c.StartTime), k.EndTime.Sub(c.StartTime)))
			}
			slices.Sort(lines)
			t.Errorf("checkpoint %d: spans cover %v of %v (%.1f%%), want >= 95%%; its children:\n%s", attrInt(t, c, telemetry.AttrCheckpointID), covered, total, 100*frac, strings.Join(lines, "\n"))
		}
		checked++
	}
	if checked == 0 || checked != stats.Checkpoints {
		t.Fatalf("checked %d checkpoints, %d completed", checked, stats.Checkpoints)
	}
}

// TestTraceFinishingJob: the job span is the parent of one task span per
// subtask, each with its phases open, end_input (not for sources), finish
// (not for sources), final_checkpoint_wait and close; the wasm operator's
// guest.* spans are children of the phases. Records processed are
// attributes.
func TestTraceFinishingJob(t *testing.T) {
	const n = 600
	ss, _, stats := tracedRun(t, n)
	jobs := ss.named(telemetry.SpanJob)
	if len(jobs) != 1 || jobs[0].Parent.IsValid() {
		t.Fatalf("job spans %v, want one root", jobs)
	}
	job := jobs[0]
	if v, _ := attr(job, telemetry.AttrJob); v.AsString() != "test" {
		t.Fatalf("job span attributes %v", job.Attributes)
	}
	tasks := ss.childrenOf(job)
	if len(tasks) != 6 {
		t.Fatalf("job span children %v, want 6 task spans", names(tasks))
	}
	records := map[string]int64{}
	for _, task := range tasks {
		who := subtaskOf(t, task)
		if task.Name != telemetry.SpanTask || task.Status.Code != 0 {
			t.Fatalf("%s: %s status %v", who, task.Name, task.Status)
		}
		op := who[:strings.Index(who, "[")]
		records[op] += attrInt(t, task, telemetry.AttrRecords)
		phases := ss.childrenOf(task)
		want := []string{telemetry.SpanTaskClose, telemetry.SpanTaskEndInput, telemetry.SpanTaskFinish, telemetry.SpanFinalCheckpointWait, telemetry.SpanTaskOpen}
		if op == "gen" {
			want = []string{telemetry.SpanTaskClose, telemetry.SpanFinalCheckpointWait, telemetry.SpanTaskOpen}
		}
		slices.Sort(want)
		if got := names(phases); !slices.Equal(got, want) {
			t.Fatalf("%s: phases %v, want %v", who, got, want)
		}
		slices.SortFunc(phases, func(a, b tracetest.SpanStub) int { return a.StartTime.Compare(b.StartTime) })
		var order []string
		for _, ph := range phases {
			order = append(order, ph.Name)
			if subtaskOf(t, ph) != who {
				t.Fatalf("%s's %s names another subtask", who, ph.Name)
			}
			guest := ss.childrenOf(ph)
			if op == "count" && ph.Name != telemetry.SpanFinalCheckpointWait {
				wantGuest := "guest." + strings.TrimPrefix(ph.Name, "task.")
				if len(guest) != 1 || guest[0].Name != wantGuest {
					t.Fatalf("%s's %s: children %v, want %s", who, ph.Name, names(guest), wantGuest)
				}
			}
			if ph.Name == telemetry.SpanFinalCheckpointWait {
				if id := attrInt(t, ph, telemetry.AttrCheckpointID); id < 1 {
					t.Fatalf("%s: final checkpoint id %d", who, id)
				}
			}
		}
		if order[0] != telemetry.SpanTaskOpen || order[len(order)-1] != telemetry.SpanTaskClose || order[len(order)-2] != telemetry.SpanFinalCheckpointWait {
			t.Fatalf("%s: phases in order %v", who, order)
		}
	}
	if records["gen"] != n || records["count"] != n || records["out"] != n {
		t.Fatalf("records processed per operator %v, want %d each", records, n)
	}
	for _, o := range stats.Operators {
		if !slices.Equal(o.Subtasks, []string{StateFinished, StateFinished}) {
			t.Fatalf("%s: subtask states %v", o.UID, o.Subtasks)
		}
	}
	if len(stats.Recent) != stats.Checkpoints || stats.Recent[len(stats.Recent)-1].Size == 0 {
		t.Fatalf("recent checkpoints %+v, %d checkpoints", stats.Recent, stats.Checkpoints)
	}
}

// TestTraceStopAndRestore: a stop-with-savepoint is its own trace with the
// savepoint's checkpoint span as a child; a run restored from the savepoint
// has a restore span naming it.
func TestTraceStopAndRestore(t *testing.T) {
	dir := t.TempDir()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	g := graph(t,
		src("gen", 1, &jobfile.SourceSpec{Type: "generator", Count: 1 << 40, Rate: 2000, KeyPattern: "k", ValuePattern: "v{n}"}),
		sink("out", 1, &jobfile.SinkSpec{Type: "discard"}, in("gen", control.Forward)),
	)
	store := openStore(t, filepath.Join(dir, "chk"))
	stop := make(chan StopRequest, 1)
	stop <- StopRequest{}
	stats, err := Run(context.Background(), g, Options{TracerProvider: tp, Stop: stop,
		Checkpoint: &CheckpointOptions{Store: store, Interval: time.Hour, Tick: 5 * time.Millisecond}})
	if err != nil || stats.Savepoint == "" {
		t.Fatalf("stop: %v, savepoint %q", err, stats.Savepoint)
	}
	ss := spans(exp.GetSpans())
	stops := ss.named(telemetry.SpanStopWithSavepoint)
	if len(stops) != 1 || stops[0].Parent.IsValid() || len(stops[0].Links) != 1 {
		t.Fatalf("stop spans %v: want one root linked to the job", stops)
	}
	if v, _ := attr(stops[0], telemetry.AttrSavepoint); v.AsString() != stats.Savepoint {
		t.Fatalf("stop span savepoint %q, want %q", v.AsString(), stats.Savepoint)
	}
	kids := ss.childrenOf(stops[0])
	if len(kids) != 1 || kids[0].Name != telemetry.SpanCheckpoint {
		t.Fatalf("stop span children %v, want the savepoint's checkpoint", names(kids))
	}
	if v, _ := attr(kids[0], telemetry.AttrCheckpointKind); v.AsString() != string(control.KindSavepoint) {
		t.Fatalf("savepoint span kind %v", v)
	}
	if len(ss.childrenOf(kids[0]).named(telemetry.SpanTaskSnapshot)) != 2 {
		t.Fatalf("savepoint children %v", names(ss.childrenOf(kids[0])))
	}

	exp.Reset()
	rs, err := checkpoint.LoadRestore(context.Background(), stats.Savepoint, g)
	if err != nil {
		t.Fatal(err)
	}
	stop <- StopRequest{}
	if _, err := Run(context.Background(), g, Options{TracerProvider: tp, Stop: stop, Restore: rs,
		Checkpoint: &CheckpointOptions{Store: store, Interval: time.Hour, Tick: 5 * time.Millisecond}}); err != nil {
		t.Fatal(err)
	}
	restores := spans(exp.GetSpans()).named(telemetry.SpanRestore)
	if len(restores) != 1 || attrInt(t, restores[0], telemetry.AttrCheckpointID) != rs.Metadata.ID {
		t.Fatalf("restore spans %v, want one of %d", restores, rs.Metadata.ID)
	}
	if restores[0].Status.Code != 0 || restores[0].EndTime.IsZero() {
		t.Fatalf("restore span status %v", restores[0].Status)
	}
}

// TestTraceFailoverCancelsOthers: on a failover, the task span of the
// subtask that failed ends with status Error; those the failover ended
// (healthy subtasks) end with status Unset and a "canceled" event.
func TestTraceFailoverCancelsOthers(t *testing.T) {
	mod := testwasm.Path(t, "internal/testguests/failonce/failonce.wasm")
	dir := t.TempDir()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	gen := &jobfile.SourceSpec{Type: "generator", Count: 4000, Rate: 8000, KeyPattern: "key-{k}", ValuePattern: "value-{n}", Keys: 13, TSStep: 1}
	g := graph(t,
		src("gen", 2, gen),
		op("count", 2, &jobfile.WasmSpec{Path: mod, Config: map[string]string{"mode": "count", "fail_at": "500"}}, in("gen", control.Hash)),
		sink("out", 2, &jobfile.SinkSpec{Type: "file", Path: filepath.Join(dir, "out")}, in("count", control.Forward)),
	)
	stats, err := Run(context.Background(), g, Options{Engine: cachedEngine(t), BatchSize: 64, TracerProvider: tp,
		Restart:    jobfile.RestartSettings{Strategy: jobfile.RestartFixedDelay, Attempts: 2},
		Checkpoint: &CheckpointOptions{Store: openStore(t, filepath.Join(dir, "chk")), Interval: 30 * time.Millisecond, Tick: 5 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	if stats.Restarts != 1 {
		t.Fatalf("%d restarts, want 1", stats.Restarts)
	}
	failed, canceled := 0, 0
	for _, s := range spans(exp.GetSpans()).named(telemetry.SpanTask) {
		if a, _ := attr(s, telemetry.AttrAttempt); a.AsInt64() != 0 {
			continue
		}
		op, _ := attr(s, telemetry.AttrOperator)
		switch s.Status.Code {
		case codes.Error:
			failed++
			if op.AsString() != "count" {
				t.Errorf("task span of %s ends with Error %q: only the failing count subtask should", op.AsString(), s.Status.Description)
			}
		case codes.Unset:
			if slices.ContainsFunc(s.Events, func(e sdktrace.Event) bool { return e.Name == "canceled" }) {
				canceled++
			}
		}
	}
	if failed == 0 || canceled < 4 {
		t.Fatalf("attempt 0: %d task spans failed, %d canceled; want the failing subtask(s) and the healthy ones canceled", failed, canceled)
	}
}

// TestTraceJobAttributes: every span of a run names the job by id and name
// (streamd run: the id is the name; a deployed job's id comes in
// Options.JobID).
func TestTraceJobAttributes(t *testing.T) {
	ss, _, _ := tracedRun(t, 600)
	if len(ss) == 0 {
		t.Fatal("no spans")
	}
	for _, s := range ss {
		id, ok1 := attr(s, telemetry.AttrJobID)
		name, ok2 := attr(s, telemetry.AttrJobName)
		if !ok1 || !ok2 || id.AsString() != "test" || name.AsString() != "test" {
			t.Fatalf("span %s: streamd.job.id %q, streamd.job.name %q; want both \"test\"", s.Name, id.AsString(), name.AsString())
		}
	}
}
