package control

import (
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

func restoreGraph(t *testing.T) *JobGraph {
	t.Helper()
	// a ─forward─> b ─hash─> c     (a, b: p=2; c: p=1)
	g, err := NewJobGraph("restore", []*Vertex{
		{UID: "a", Parallelism: 2},
		{UID: "b", Parallelism: 2, Inputs: []Edge{{From: "a", Partition: Forward}}},
		{UID: "c", Parallelism: 1, Inputs: []Edge{{From: "b", Partition: Hash}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func TestCheckRestore(t *testing.T) {
	const (
		R = OperatorRunning
		P = OperatorPartiallyFinished
		F = OperatorFullyFinished
	)
	tests := []struct {
		a, b, c FinishedState
		bad     string // offending operators, "" if fine
	}{
		{R, R, R, ""},
		{F, F, F, ""},
		{F, R, R, ""},
		{P, R, R, ""},
		{P, P, R, ""}, // pointwise: partially finished upstream is enough
		{F, P, R, ""},
		{F, F, P, ""},
		{R, F, R, "b"}, // fully finished behind a running one
		{P, F, R, "b"},
		{R, P, R, "b"}, // pointwise predecessor all running
		{F, P, P, "c"}, // all-to-all predecessor not fully finished
		{F, R, F, "c"},
		{R, R, F, "c"},
		{R, F, P, "b"},
	}
	g := restoreGraph(t)
	for _, tt := range tests {
		st := map[string]FinishedState{"a": tt.a, "b": tt.b, "c": tt.c}
		err := CheckRestore(g, st)
		var got []string
		var re *RestoreError
		if errors.As(err, &re) {
			for _, p := range re.Problems {
				got = append(got, p.Operator)
			}
		} else if err != nil {
			t.Fatalf("%v: unexpected error type %T: %v", st, err, err)
		}
		if strings.Join(got, ",") != tt.bad {
			t.Errorf("a=%v b=%v c=%v: offending %v, want %q (err %v)", tt.a, tt.b, tt.c, got, tt.bad, err)
		}
		if err != nil && !errors.Is(err, ErrRestoreFinishedState) {
			t.Errorf("%v: error does not match ErrRestoreFinishedState", err)
		}
	}
}

// TestCheckRestoreAcceptsReachableStates: any finished state the job itself
// can produce (subtasks finish only after all their upstream subtasks have)
// passes the check.
func TestCheckRestoreAcceptsReachableStates(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 147))
	for iter := 0; iter < 2000; iter++ {
		g := randomGraph(t, r)
		finished := make(map[SubtaskID]bool)
		edges := subtaskEdges(g)
		for _, s := range Subtasks(g) { // topological order
			ok := r.IntN(3) != 0
			for _, e := range edges {
				if e[1] == s && !finished[e[0]] {
					ok = false
				}
			}
			finished[s] = ok
		}
		states := make(map[string]FinishedState)
		for _, v := range g.Vertices {
			n := 0
			for i := 0; i < v.Parallelism; i++ {
				if finished[SubtaskID{v.UID, i}] {
					n++
				}
			}
			switch {
			case n == v.Parallelism:
				states[v.UID] = OperatorFullyFinished
			case n > 0:
				states[v.UID] = OperatorPartiallyFinished
			}
		}
		if err := CheckRestore(g, states); err != nil {
			t.Fatalf("graph %s states %v: %v", describeGraph(g), states, err)
		}
	}
}

func TestDeployAsFinished(t *testing.T) {
	g := restoreGraph(t)
	got := DeployAsFinished(g, map[string]FinishedState{"a": OperatorFullyFinished, "b": OperatorPartiallyFinished, "gone": OperatorFullyFinished})
	if want := []SubtaskID{{"a", 0}, {"a", 1}}; !slices.Equal(got, want) {
		t.Fatalf("DeployAsFinished = %v, want %v", got, want)
	}
	err := CheckRestore(g, map[string]FinishedState{"b": OperatorFullyFinished})
	want := `control: job "restore" cannot restore the finished state of its checkpoint: operator "b" is fully finished in the checkpoint but its forward input "a" is running`
	if err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Fatalf("error = %v\nwant prefix %s", err, want)
	}
}
