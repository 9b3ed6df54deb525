package cluster

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/internal/cluster/wire"
	"github.com/streamd/streamd/internal/runtime"
	"github.com/streamd/streamd/internal/telemetry"
)

// autoscaleSpec is a job src -> slow -> out, every operator declared at 1.
func autoscaleSpec() wire.JobSpec {
	return wire.JobSpec{Name: "a", Vertices: []wire.VertexSpec{
		{UID: "src", Parallelism: 1, MaxParallelism: 128},
		{UID: "slow", Parallelism: 1, MaxParallelism: 128, Inputs: []control.Edge{{From: "src", To: "slow", Partition: control.Hash}}},
		{UID: "out", Parallelism: 1, MaxParallelism: 128, Inputs: []control.Edge{{From: "slow", To: "out", Partition: control.Rebalance}}},
	}}
}

// TestAutoscaleTargets: the autoscaler's parallelism per operator stands in
// for the declared one (a job on fewer slots runs each at min(target,
// slots)); status still shows the declared one; the targets, decisions and
// the last rescale survive the job's record (a new leader).
func TestAutoscaleTargets(t *testing.T) {
	j := &ctlJob{spec: autoscaleSpec(), slots: 1}
	last := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	j.auto = &autoscaleJob{targets: map[string]int{"src": 1, "slow": 3, "out": 1}, last: last,
		decided: []wire.AutoscaleDecisionStatus{{Time: last, Operator: "slow", From: 1, To: 3, Reason: "scale up", Outcome: "rescaled"}}}
	j.scaleLocked(3)
	want := map[string]int{"src": 1, "slow": 3, "out": 1}
	for _, v := range j.spec.Vertices {
		if v.Parallelism != want[v.UID] || j.declaredOf(v) != 1 {
			t.Errorf("at 3 slots: %s at %d (declared %d), want %d (declared 1)", v.UID, v.Parallelism, j.declaredOf(v), want[v.UID])
		}
	}
	if _, slots, _ := control.AdaptiveSlots(j.bounds(), 0); slots != 3 {
		t.Errorf("the job wants %d slots, want 3 (the autoscaler's)", slots)
	}
	if _, slots, _ := control.AdaptiveSlots(j.declaredBounds(), 0); slots != 1 {
		t.Errorf("the job declares %d slots, want 1", slots)
	}
	j.scaleLocked(2) // a lost host: fewer slots
	if p := j.spec.Vertices[1].Parallelism; p != 2 {
		t.Errorf("at 2 slots: slow at %d, want 2", p)
	}

	b, err := json.Marshal(j.autoscaleRecord())
	if err != nil {
		t.Fatal(err)
	}
	var r autoscaleRecord
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	k := &ctlJob{spec: j.declaredSpec(), auto: autoscaleFromRecord(&r)}
	if got := k.wantOf(k.spec.Vertices[1]); got != 3 {
		t.Errorf("from the record: slow wants %d, want 3", got)
	}
	if st := k.autoscaleStatus(); st != nil {
		t.Errorf("status of a job without an autoscaler section: %+v, want nil", st)
	}
	if len(k.auto.decided) != 1 || !k.auto.last.Equal(last) {
		t.Errorf("from the record: decisions %+v, last rescale %v; want one, %v", k.auto.decided, k.auto.last, last)
	}
}

// TestAutoscaleSample: an operator's counters are summed over the hosts'
// subtasks, its lag over those that know one.
func TestAutoscaleSample(t *testing.T) {
	stats := []runtime.OperatorStats{
		{UID: "src", RecordsOut: 100, Live: []telemetry.SubtaskLive{{Busy: time.Second, SourceLag: 40, HasSourceLag: true}}},
		{UID: "slow", RecordsIn: 90, RecordsOut: 90, Live: []telemetry.SubtaskLive{{Busy: 2 * time.Second}, {Busy: 3 * time.Second}}},
	}
	now := time.Now()
	s := autoscaleSample(autoscaleSpec().Vertices, stats, now)
	want := []control.OpSample{
		{Parallelism: 1, RecordsOut: 100, Busy: time.Second, Lag: 40, HasLag: true},
		{Parallelism: 1, RecordsIn: 90, RecordsOut: 90, Busy: 5 * time.Second},
		{Parallelism: 1},
	}
	if !s.Time.Equal(now) || len(s.Ops) != 3 {
		t.Fatalf("sample %+v", s)
	}
	for i := range want {
		if s.Ops[i] != want[i] {
			t.Errorf("operator %d: %+v, want %+v", i, s.Ops[i], want[i])
		}
	}
}
