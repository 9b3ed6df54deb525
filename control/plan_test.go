package control

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
)

// randomGraph builds a random DAG of 1..7 vertices with parallelism 1..3.
// Vertex k may read from any earlier vertex; forward edges are used between
// equal parallelisms about half the time, all-to-all edges otherwise.
func randomGraph(t *testing.T, r *rand.Rand) *JobGraph {
	t.Helper()
	n := 1 + r.IntN(7)
	var vs []*Vertex
	for k := 0; k < n; k++ {
		vx := &Vertex{UID: fmt.Sprintf("v%d", k), Parallelism: 1 + r.IntN(3)}
		for j := 0; j < k; j++ {
			if r.IntN(3) != 0 {
				continue
			}
			part := []Partitioning{Hash, Rebalance, Broadcast}[r.IntN(3)]
			if vs[j].Parallelism == vx.Parallelism && r.IntN(2) == 0 {
				part = Forward
			}
			vx.Inputs = append(vx.Inputs, Edge{From: vs[j].UID, Partition: part})
		}
		vs = append(vs, vx)
	}
	// Declare them shuffled: the plan must follow the graph's order, not ours.
	r.Shuffle(len(vs), func(i, j int) { vs[i], vs[j] = vs[j], vs[i] })
	g, err := NewJobGraph("random", vs)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// subtaskEdges lists every subtask-level channel of g as (sender, receiver):
// all-to-all edges connect every pair, forward edges connect i to i.
func subtaskEdges(g *JobGraph) [][2]SubtaskID {
	var out [][2]SubtaskID
	for _, v := range g.Vertices {
		for _, e := range v.Inputs {
			up := g.Vertex(e.From)
			for i := 0; i < up.Parallelism; i++ {
				for j := 0; j < v.Parallelism; j++ {
					if e.Partition.Pointwise() && i != j {
						continue
					}
					out = append(out, [2]SubtaskID{{up.UID, i}, {v.UID, j}})
				}
			}
		}
	}
	return out
}

// referencePlan is the naive plan: it looks at every subtask-level channel.
func referencePlan(g *JobGraph, finished map[SubtaskID]bool) TriggerPlan {
	var p TriggerPlan
	edges := subtaskEdges(g)
	for _, s := range Subtasks(g) {
		if finished[s] {
			p.Finished = append(p.Finished, s)
			continue
		}
		p.Wait = append(p.Wait, s)
		canReceive := false
		for _, e := range edges {
			if e[1] == s && !finished[e[0]] {
				canReceive = true
			}
		}
		if !canReceive {
			p.Trigger = append(p.Trigger, s)
		}
	}
	for _, v := range g.Vertices {
		all := true
		for i := 0; i < v.Parallelism; i++ {
			all = all && finished[SubtaskID{v.UID, i}]
		}
		if all {
			p.FullyFinished = append(p.FullyFinished, v.UID)
		}
	}
	return p
}

// reached returns the subtasks a barrier reaches when injected at trigger and
// forwarded along channels between running subtasks only.
func reached(g *JobGraph, finished map[SubtaskID]bool, trigger []SubtaskID) map[SubtaskID]bool {
	seen := make(map[SubtaskID]bool)
	queue := slices.Clone(trigger)
	for _, s := range trigger {
		seen[s] = true
	}
	edges := subtaskEdges(g)
	for len(queue) > 0 {
		s := queue[0]
		queue = queue[1:]
		for _, e := range edges {
			if e[0] == s && !finished[e[1]] && !seen[e[1]] {
				seen[e[1]] = true
				queue = append(queue, e[1])
			}
		}
	}
	return seen
}

func TestPlanTriggerMatchesReference(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 147))
	for iter := 0; iter < 3000; iter++ {
		g := randomGraph(t, r)
		finished := make(map[SubtaskID]bool)
		q := r.Float64() // vary the share of finished subtasks per graph
		if iter%5 == 0 {
			q = 0
		}
		for _, s := range Subtasks(g) {
			if r.Float64() < q {
				finished[s] = true
			}
		}
		got := PlanTrigger(g, func(s SubtaskID) bool { return finished[s] })
		want := referencePlan(g, finished)
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("iteration %d: graph %s finished %v:\n got %+v\nwant %+v", iter, describeGraph(g), finished, got, want)
		}
		// Every running subtask gets the barrier: from the triggered set it
		// reaches all of Wait through running subtasks.
		seen := reached(g, finished, got.Trigger)
		for _, s := range got.Wait {
			if !seen[s] {
				t.Fatalf("iteration %d: graph %s finished %v: %v never receives a barrier (trigger %v)", iter, describeGraph(g), finished, s, got.Trigger)
			}
		}
		// With nothing finished, exactly the source subtasks are triggered.
		if len(finished) == 0 {
			var sources []SubtaskID
			for _, v := range g.Vertices {
				for i := 0; v.IsSource() && i < v.Parallelism; i++ {
					sources = append(sources, SubtaskID{v.UID, i})
				}
			}
			if !slices.Equal(got.Trigger, sources) {
				t.Fatalf("iteration %d: nothing finished: trigger %v, want the sources %v", iter, got.Trigger, sources)
			}
		}
	}
}

func describeGraph(g *JobGraph) string {
	s := ""
	for _, v := range g.Vertices {
		s += fmt.Sprintf("[%s p=%d", v.UID, v.Parallelism)
		for _, e := range v.Inputs {
			s += fmt.Sprintf(" <-%s:%s", e.From, e.Partition)
		}
		s += "]"
	}
	return s
}

func TestParseSubtaskID(t *testing.T) {
	for _, s := range []string{"map/0", "a/b/12"} {
		id, err := ParseSubtaskID(s)
		if err != nil || id.String() != s {
			t.Errorf("ParseSubtaskID(%q) = %v, %v", s, id, err)
		}
	}
	for _, s := range []string{"map", "/1", "map/-1", "map/x"} {
		if _, err := ParseSubtaskID(s); err == nil {
			t.Errorf("ParseSubtaskID(%q) succeeded", s)
		}
	}
}
