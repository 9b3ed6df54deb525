package control

import (
	"errors"
	"strings"
	"testing"
)

// v builds a vertex: inputs are "from" or "from:partition".
func v(uid string, kind Kind, p int, inputs ...string) *Vertex {
	vx := &Vertex{UID: uid, Kind: kind, Parallelism: p}
	for _, in := range inputs {
		from, part, _ := strings.Cut(in, ":")
		vx.Inputs = append(vx.Inputs, Edge{From: from, Partition: Partitioning(part)})
	}
	return vx
}

func uids(g *JobGraph) string {
	var s []string
	for _, v := range g.Vertices {
		s = append(s, v.UID)
	}
	return strings.Join(s, " ")
}

func TestNewJobGraphOrder(t *testing.T) {
	tests := []struct {
		name     string
		vertices []*Vertex
		want     string
	}{
		{"chain", []*Vertex{v("src", KindSource, 1), v("op", KindOperator, 1, "src"), v("out", KindSink, 1, "op")}, "src op out"},
		{"declared backwards", []*Vertex{v("out", KindSink, 1, "op"), v("op", KindOperator, 1, "src"), v("src", KindSource, 1)}, "src op out"},
		{"two sources join, declaration order among ready", []*Vertex{
			v("b", KindSource, 2), v("join", KindOperator, 2, "a:hash", "b:hash"), v("a", KindSource, 2), v("out", KindSink, 2, "join"),
		}, "b a join out"},
		{"diamond", []*Vertex{
			v("s", KindSource, 1), v("x", KindOperator, 3, "s:rebalance"), v("y", KindOperator, 1, "s"),
			v("u", KindOperator, 2, "y:broadcast", "x:hash"), v("o", KindSink, 2, "u"),
		}, "s x y u o"},
		{"earlier vertex becomes ready later", []*Vertex{
			v("late", KindOperator, 1, "mid"), v("src", KindSource, 1), v("mid", KindOperator, 1, "src"),
		}, "src mid late"},
		{"kind unknown skips role checks", []*Vertex{v("a", KindUnknown, 1), v("b", KindUnknown, 1)}, "a b"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g, err := NewJobGraph("job", tt.vertices)
			if err != nil {
				t.Fatal(err)
			}
			if got := uids(g); got != tt.want {
				t.Fatalf("order = %q, want %q", got, tt.want)
			}
			for _, vx := range g.Vertices {
				if g.Vertex(vx.UID) != vx {
					t.Errorf("Vertex(%q) does not return the vertex", vx.UID)
				}
				if vx.MaxParallelism != DefaultMaxParallelism {
					t.Errorf("%s: MaxParallelism = %d, want default", vx.UID, vx.MaxParallelism)
				}
				for i, e := range vx.Inputs {
					if e.To != vx.UID || e.Input != i || !e.Partition.Valid() {
						t.Errorf("%s: edge %d = %+v: To, Input or Partition not filled in", vx.UID, i, e)
					}
				}
			}
		})
	}
}

func TestNewJobGraphDefaultsForward(t *testing.T) {
	g, err := NewJobGraph("job", []*Vertex{v("s", KindSource, 2), v("o", KindSink, 2, "s")})
	if err != nil {
		t.Fatal(err)
	}
	if p := g.Vertex("o").Inputs[0].Partition; p != Forward {
		t.Fatalf("default partition = %q, want forward", p)
	}
	out := g.Outputs("s")
	if len(out) != 1 || out[0].To != "o" {
		t.Fatalf("Outputs(s) = %+v", out)
	}
}

func TestNewJobGraphInvalid(t *testing.T) {
	tests := []struct {
		name     string
		job      string
		vertices []*Vertex
		want     []string // each problem, as Problem.String(), in order
	}{
		{"no name", "", []*Vertex{v("s", KindSource, 1)}, []string{"name: the job needs a name"}},
		{"no operators", "job", nil, []string{"operators: the job has no operators"}},
		{"empty uid", "job", []*Vertex{v("", KindSource, 1)}, []string{"operators[0].uid: every operator needs a uid"}},
		{"bad uid", "job", []*Vertex{v("a.b", KindSource, 1)}, []string{`operator "a.b": uid: may contain only letters, digits, '-' and '_'`}},
		{"duplicate uid", "job", []*Vertex{v("s", KindSource, 1), v("s", KindSink, 1, "s")},
			[]string{`operator "s": uid: duplicate uid "s": uids must be unique`}},
		{"unknown input", "job", []*Vertex{v("lines", KindSource, 1), v("count", KindOperator, 1, "lnes")},
			[]string{`operator "count": inputs[0].from: unknown operator "lnes"`}},
		{"missing from", "job", []*Vertex{v("s", KindSource, 1), v("o", KindSink, 1, "")},
			[]string{`operator "o": inputs[0].from: missing: name the upstream operator's uid`}},
		{"unknown partition", "job", []*Vertex{v("s", KindSource, 1), v("o", KindSink, 1, "s:hsh")},
			[]string{`operator "o": inputs[0].partition: unknown partitioning "hsh" (want forward, rebalance, hash or broadcast)`}},
		{"forward between parallelisms", "job", []*Vertex{v("s", KindSource, 4), v("o", KindSink, 2, "s")},
			[]string{`operator "o": inputs[0].partition: forward from "s" (parallelism 4) to "o" (parallelism 2) needs equal parallelism; use rebalance, hash or broadcast`}},
		{"explicit forward between parallelisms", "job", []*Vertex{v("s", KindSource, 1), v("o", KindSink, 2, "s:rebalance", "s:forward")},
			[]string{`operator "o": inputs[1].partition: forward from "s" (parallelism 1) to "o" (parallelism 2) needs equal parallelism; use rebalance, hash or broadcast`}},
		{"parallelism zero", "job", []*Vertex{v("s", KindSource, 0)}, []string{`operator "s": parallelism: must be at least 1, got 0`}},
		{"parallelism above max", "job", []*Vertex{{UID: "s", Kind: KindSource, Parallelism: 9, MaxParallelism: 8}},
			[]string{`operator "s": parallelism: 9 is above max_parallelism 8`}},
		{"parallelism above default max", "job", []*Vertex{v("s", KindSource, 129)}, []string{`operator "s": parallelism: 129 is above max_parallelism 128`}},
		{"max parallelism too big", "job", []*Vertex{{UID: "s", Kind: KindSource, Parallelism: 1, MaxParallelism: 40000}},
			[]string{`operator "s": max_parallelism: must be between 1 and 32768, got 40000`}},
		{"source with input", "job", []*Vertex{v("a", KindSource, 1), v("b", KindSource, 1, "a")},
			[]string{`operator "b": inputs: a source takes no inputs`}},
		{"sink without input", "job", []*Vertex{v("s", KindSource, 1), v("o", KindSink, 1)},
			[]string{`operator "o": inputs: a sink needs at least one input`}},
		{"operator without input", "job", []*Vertex{v("op", KindOperator, 1)},
			[]string{`operator "op": inputs: an operator needs at least one input`}},
		{"input from sink", "job", []*Vertex{v("s", KindSource, 1), v("o", KindSink, 1, "s"), v("x", KindOperator, 1, "o")},
			[]string{`operator "x": inputs[0].from: "o" is a sink and has no output`}},
		{"self loop", "job", []*Vertex{v("s", KindSource, 1), v("a", KindOperator, 1, "s", "a")},
			[]string{`operator "a": inputs[1].from: cycle: a -> a`}},
		{"three cycle", "job", []*Vertex{
			v("s", KindSource, 1), v("a", KindOperator, 1, "s", "c"), v("b", KindOperator, 1, "a"), v("c", KindOperator, 1, "b"), v("o", KindSink, 1, "c"),
		}, []string{`operator "a": inputs[1].from: cycle: a -> b -> c -> a`}},
		{"cycle declared out of order", "job", []*Vertex{
			v("s", KindSource, 1), v("c", KindOperator, 1, "b"), v("a", KindOperator, 1, "s", "c"), v("b", KindOperator, 1, "a"),
		}, []string{`operator "c": inputs[0].from: cycle: c -> a -> b -> c`}},
		{"two cycles", "job", []*Vertex{
			v("s", KindSource, 1), v("a", KindOperator, 1, "s", "b"), v("b", KindOperator, 1, "a"),
			v("x", KindOperator, 1, "b", "y"), v("y", KindOperator, 1, "x"),
		}, []string{`operator "a": inputs[1].from: cycle: a -> b -> a`, `operator "x": inputs[1].from: cycle: x -> y -> x`}},
		{"many problems at once", "job", []*Vertex{
			v("s", KindSource, 0), v("s", KindSource, 1), v("o", KindSink, 2, "nope", "s:bad"),
		}, []string{
			`operator "s": uid: duplicate uid "s": uids must be unique`,
			`operator "s": parallelism: must be at least 1, got 0`,
			`operator "o": inputs[0].from: unknown operator "nope"`,
			`operator "o": inputs[1].partition: unknown partitioning "bad" (want forward, rebalance, hash or broadcast)`,
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g, err := NewJobGraph(tt.job, tt.vertices)
			if err == nil {
				t.Fatalf("NewJobGraph succeeded with order %q, want errors %q", uids(g), tt.want)
			}
			if !errors.Is(err, ErrInvalidGraph) {
				t.Errorf("error %v does not match ErrInvalidGraph", err)
			}
			var ige *InvalidGraphError
			if !errors.As(err, &ige) {
				t.Fatalf("error %T is not *InvalidGraphError", err)
			}
			var got []string
			for _, p := range ige.Problems {
				got = append(got, p.String())
			}
			if strings.Join(got, "\n") != strings.Join(tt.want, "\n") {
				t.Fatalf("problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tt.want, "\n"))
			}
			if !strings.HasPrefix(err.Error(), `control: job "`+tt.job+`": `) {
				t.Errorf("Error() = %q: want the control prefix and job name", err)
			}
		})
	}
}

// TestTopoOrderRespectsEdges checks on many generated DAGs that every vertex
// comes after all its inputs and that the order is the greedy
// declaration-order one computed by a naive reference.
func TestTopoOrderRespectsEdges(t *testing.T) {
	rnd := uint64(42)
	next := func(n int) int {
		rnd ^= rnd << 13
		rnd ^= rnd >> 7
		rnd ^= rnd << 17
		return int(rnd % uint64(n))
	}
	for iter := 0; iter < 300; iter++ {
		n := 1 + next(12)
		// Make a DAG along a random permutation, then declare in another order.
		perm := make([]int, n)
		for i := range perm {
			perm[i] = i
		}
		for i := n - 1; i > 0; i-- {
			j := next(i + 1)
			perm[i], perm[j] = perm[j], perm[i]
		}
		vs := make([]*Vertex, n)
		for i := range vs {
			vs[i] = &Vertex{UID: string(rune('a' + i)), Parallelism: 1}
		}
		for pi := 1; pi < n; pi++ {
			for pj := 0; pj < pi; pj++ {
				if next(3) == 0 {
					to, from := vs[perm[pi]], vs[perm[pj]]
					to.Inputs = append(to.Inputs, Edge{From: from.UID, Partition: Rebalance})
				}
			}
		}
		// Reference: repeatedly take the first declared vertex whose inputs are placed.
		placed := map[string]bool{}
		var want []string
		for len(want) < n {
			for _, vx := range vs {
				if placed[vx.UID] {
					continue
				}
				ok := true
				for _, e := range vx.Inputs {
					ok = ok && placed[e.From]
				}
				if ok {
					placed[vx.UID] = true
					want = append(want, vx.UID)
					break
				}
			}
		}
		g, err := NewJobGraph("job", vs)
		if err != nil {
			t.Fatal(err)
		}
		if got := uids(g); got != strings.Join(want, " ") {
			t.Fatalf("iteration %d: order %q, want %q", iter, got, strings.Join(want, " "))
		}
	}
}
