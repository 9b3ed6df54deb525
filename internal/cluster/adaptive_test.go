package cluster

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/internal/cluster/wire"
	"github.com/streamd/streamd/internal/connector"
	"github.com/streamd/streamd/internal/jobfile"
)

// fixedSourceType is a source type whose positions do not rescale (every
// built-in one's do).
const fixedSourceType = "fixed_test"

func init() {
	connector.MustRegisterSource(fixedSourceType, connector.NewConfigSpec().Summary("A source that keeps its parallelism (tests)."),
		func(*connector.SourceSpec, connector.SourceEnv) (connector.Source, error) {
			return nil, errors.New("not for running")
		})
}

// TestScaleSpec: a job declared at 4 (a source at 2 that keeps its
// parallelism; a keyed operator at 4 with min 2; a sink at 4) scaled to 2
// slots runs every operator at min(declared, 2), remembers what it
// declared (also in its record, for the next leader), and scaled back to
// 4 is its declared spec again.
func TestScaleSpec(t *testing.T) {
	spec := wire.JobSpec{Name: "adaptive", Vertices: []wire.VertexSpec{
		{UID: "gen", Kind: control.KindSource, Parallelism: 2, MaxParallelism: 128, Source: &jobfile.SourceSpec{Type: fixedSourceType}},
		{UID: "count", Kind: control.KindOperator, Parallelism: 4, MinParallelism: 2, MaxParallelism: 128,
			Inputs: []control.Edge{{From: "gen", Partition: control.Hash}}, Wasm: &wire.WasmSpec{Module: wire.Artifact{Name: "count.wasm"}}},
		{UID: "out", Kind: control.KindSink, Parallelism: 4, MaxParallelism: 128,
			Inputs: []control.Edge{{From: "count"}}, Sink: &jobfile.SinkSpec{Type: "discard"}},
	}}
	j := &ctlJob{id: "adaptive-1", spec: spec, slots: spec.SlotsNeeded()}
	if got := j.bounds(); got[0] != (control.Bounds{Declared: 2, Min: 2}) || got[1] != (control.Bounds{Declared: 4, Min: 2}) || got[2] != (control.Bounds{Declared: 4}) {
		t.Fatalf("bounds %v: the source keeps its 2, count at least 2", got)
	}
	if fs := j.fixedSources(); fs != "gen 2" {
		t.Errorf("fixed sources %q, want gen 2", fs)
	}
	j.scaleLocked(2)
	pars := func(s wire.JobSpec) [3]int {
		return [3]int{s.Vertices[0].Parallelism, s.Vertices[1].Parallelism, s.Vertices[2].Parallelism}
	}
	if got := pars(j.spec); got != [3]int{2, 2, 2} || j.slots != 2 {
		t.Fatalf("scaled to 2: %v on %d slots, want [2 2 2] on 2", got, j.slots)
	}
	if got := pars(j.declaredSpec()); got != [3]int{2, 4, 4} || j.declaredSlots() != 4 {
		t.Fatalf("declared %v (%d slots), want [2 4 4] (4)", got, j.declaredSlots())
	}
	if pars(spec) != [3]int{2, 4, 4} {
		t.Fatal("scaling changed the spec it was made from")
	}
	if _, err := j.spec.Graph(func(a wire.Artifact) (string, error) { return "/" + a.Name, nil }); err != nil {
		t.Fatalf("the scaled spec is not a valid graph: %v", err)
	}
	st := (&Controller{}).statusLocked(j)
	if st.Parallelism != 2 || st.DeclaredParallelism != 4 || st.MinParallelism != 2 || st.Operators[1].Parallelism != 2 || st.Operators[1].DeclaredParallelism != 4 {
		t.Errorf("status: parallelism %d (declared %d, min %d), count %d of %d; want 2 (4, 2), 2 of 4",
			st.Parallelism, st.DeclaredParallelism, st.MinParallelism, st.Operators[1].Parallelism, st.Operators[1].DeclaredParallelism)
	}

	// The next leader knows what the job declared.
	b, err := json.Marshal((&Controller{}).recordLocked(j))
	if err != nil {
		t.Fatal(err)
	}
	var r jobRecord
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	j2 := jobFromRecord(r, time.Now())
	if got := pars(j2.declaredSpec()); got != [3]int{2, 4, 4} || pars(j2.spec) != [3]int{2, 2, 2} {
		t.Fatalf("from the record: runs %v, declared %v; want [2 2 2], [2 4 4]", pars(j2.spec), got)
	}

	j.scaleLocked(4)
	if got := pars(j.spec); got != [3]int{2, 4, 4} || j.declared != nil || j.slots != 4 {
		t.Fatalf("scaled back to 4: %v (declared %v) on %d slots, want the declared spec", got, j.declared, j.slots)
	}
}
