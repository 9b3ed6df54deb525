package cluster_test

import (
	"fmt"
	"slices"
	"testing"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/streamd/streamd/internal/cluster"
	"github.com/streamd/streamd/internal/jobfile"
	"github.com/streamd/streamd/internal/telemetry"
)

func spanAttr(s tracetest.SpanStub, k attribute.Key) (attribute.Value, bool) {
	for _, a := range s.Attributes {
		if a.Key == k {
			return a.Value, true
		}
	}
	return attribute.Value{}, false
}

// TestCheckpointTraceAcrossHosts: a job spread over two hosts checkpoints;
// each completed checkpoint is one trace whose root is the controller's
// checkpoint span, with the snapshot of every subtask (on either host: its
// trace context came in the controller's command or in the barrier's NATS
// headers) and the alignments of the non-source subtasks as children, and
// the wasm operator's guest.snapshot_state under its snapshot.
func TestCheckpointTraceAcrossHosts(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	prev := otel.GetTracerProvider()
	otel.SetTracerProvider(tp)
	t.Cleanup(func() { otel.SetTracerProvider(prev) })

	tc := newCluster(t, 2, 2)
	path := spreadJob(t, 6000, 6000, 4, "checkpoint: {interval: 150ms, dir: chk}\n")
	id := deploy(t, tc, path, jobfile.Options{})
	// Where each subtask runs, while it runs.
	st := tc.waitJob(id, "running", func(st *cluster.JobStatus) bool {
		return cluster.TerminalJobState(st.State) || st.State == cluster.JobRunning && st.Operators[0].Subtasks[0].Host != ""
	})
	hostOf := map[string]string{}
	for _, op := range st.Operators {
		for _, s := range op.Subtasks {
			hostOf[fmt.Sprintf("%s[%d]", op.UID, s.Index)] = s.Host
		}
	}
	// Each host reports the states of its subtasks.
	st = tc.waitJob(id, "subtask states reported", func(st *cluster.JobStatus) bool {
		if cluster.TerminalJobState(st.State) {
			return true
		}
		for _, op := range st.Operators {
			for _, s := range op.Subtasks {
				if s.State != "running" && s.State != "end-of-data" && s.State != "finished" {
					return false
				}
			}
		}
		return true
	})
	if st.State != cluster.JobRunning && st.State != cluster.JobFinishing {
		t.Fatalf("job %s before the subtasks' states were reported: %+v", st.State, st.Operators)
	}
	st = tc.waitJob(id, "finished", state(cluster.JobFinished))
	if st.State != cluster.JobFinished {
		t.Fatalf("job %s: %s", st.State, st.Reason)
	}
	if len(st.Checkpoints) < 2 {
		t.Fatalf("status shows checkpoints %+v, want at least a periodic one and the final one", st.Checkpoints)
	}
	for _, cp := range st.Checkpoints {
		if cp.Duration <= 0 || cp.Size <= 0 || cp.Kind != "checkpoint" {
			t.Fatalf("status checkpoint %+v: want a duration and a size", cp)
		}
	}

	ss := exp.GetSpans()
	childrenOf := func(p tracetest.SpanStub) []tracetest.SpanStub {
		var out []tracetest.SpanStub
		for _, s := range ss {
			if s.Parent.SpanID() == p.SpanContext.SpanID() && s.Parent.TraceID() == p.SpanContext.TraceID() {
				out = append(out, s)
			}
		}
		return out
	}
	complete := 0
	for _, c := range ss {
		if c.Name != telemetry.SpanCheckpoint {
			continue
		}
		if _, ok := spanAttr(c, telemetry.AttrStateBytes); !ok {
			continue // aborted
		}
		if c.Parent.IsValid() {
			t.Fatalf("checkpoint span with a parent")
		}
		complete++
		id, _ := spanAttr(c, telemetry.AttrCheckpointID)
		var snaps, aligns []string
		hosts := map[string]bool{}
		for _, k := range childrenOf(c) {
			op, _ := spanAttr(k, telemetry.AttrOperator)
			sub, _ := spanAttr(k, telemetry.AttrSubtask)
			kid, _ := spanAttr(k, telemetry.AttrCheckpointID)
			if kid.AsInt64() != id.AsInt64() {
				t.Fatalf("%s of checkpoint %d names checkpoint %d", k.Name, id.AsInt64(), kid.AsInt64())
			}
			who := fmt.Sprintf("%s[%d]", op.AsString(), sub.AsInt64())
			switch k.Name {
			case telemetry.SpanTaskSnapshot:
				snaps = append(snaps, who)
				hosts[hostOf[who]] = true
				if op.AsString() == "upper" {
					g := childrenOf(k)
					if len(g) != 1 || g[0].Name != telemetry.SpanGuestSnapshotState {
						t.Fatalf("checkpoint %d: %s's snapshot has children %v, want guest.snapshot_state", id.AsInt64(), who, g)
					}
				}
			case telemetry.SpanBarrierAlignment:
				aligns = append(aligns, who)
			}
		}
		slices.Sort(snaps)
		slices.Sort(aligns)
		var wantSnaps, wantAligns []string
		for _, op := range []string{"gen", "out", "upper"} {
			for i := 0; i < 4; i++ {
				wantSnaps = append(wantSnaps, fmt.Sprintf("%s[%d]", op, i))
				if op != "gen" {
					wantAligns = append(wantAligns, fmt.Sprintf("%s[%d]", op, i))
				}
			}
		}
		slices.Sort(wantAligns)
		if !slices.Equal(snaps, wantSnaps) || !slices.Equal(aligns, wantAligns) {
			t.Fatalf("checkpoint %d: snapshots %v, alignments %v; want %v and %v", id.AsInt64(), snaps, aligns, wantSnaps, wantAligns)
		}
		if !hosts["h1"] || !hosts["h2"] {
			t.Fatalf("checkpoint %d: snapshots from hosts %v, want h1 and h2", id.AsInt64(), hosts)
		}
	}
	if complete < 2 {
		t.Fatalf("%d complete checkpoint traces, want a periodic one and the final one", complete)
	}
}
