package control

import (
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strings"

	"github.com/streamd/streamd/abi"
)

// Kind says what a vertex runs. The graph checks the rules that follow from it:
// a source takes no inputs, operators and sinks take at least one, and nothing
// reads from a sink. KindUnknown (the zero value) skips those checks.
type Kind string

const (
	KindUnknown  Kind = ""
	KindSource   Kind = "source"   // a built-in source: no inputs
	KindOperator Kind = "operator" // a wasm (or native) operator: one input or more
	KindSink     Kind = "sink"     // a built-in sink: one input or more, no outputs
)

// MaxMaxParallelism is the largest allowed max parallelism (number of key groups).
const MaxMaxParallelism = 32768

// DefaultMaxParallelism is the max parallelism of a vertex that sets none
// (abi.DefaultMaxParallelism).
const DefaultMaxParallelism = 128

// ErrInvalidGraph is matched (errors.Is) by every *InvalidGraphError.
var ErrInvalidGraph = errors.New("control: invalid job graph")

// Problem is one reason a job graph is invalid. Field uses the job file's
// names: "uid", "parallelism", "max_parallelism", "inputs", "inputs[1].from",
// "inputs[0].partition".
type Problem struct {
	Operator string // uid of the vertex at fault; "" for the job as a whole
	Field    string
	Message  string
}

func (p Problem) String() string {
	var b strings.Builder
	if p.Operator != "" {
		fmt.Fprintf(&b, "operator %q: ", p.Operator)
	}
	if p.Field != "" {
		b.WriteString(p.Field)
		b.WriteString(": ")
	}
	b.WriteString(p.Message)
	return b.String()
}

// InvalidGraphError lists every problem NewJobGraph found, in vertex
// declaration order.
type InvalidGraphError struct {
	Job      string
	Problems []Problem
}

func (e *InvalidGraphError) Error() string {
	lines := make([]string, len(e.Problems))
	for i, p := range e.Problems {
		lines[i] = fmt.Sprintf("control: job %q: %s", e.Job, p)
	}
	return strings.Join(lines, "\n")
}

func (e *InvalidGraphError) Unwrap() error { return ErrInvalidGraph }

var uidRE = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)

// MaxUIDLength bounds a uid; uids name checkpoint entries and NATS subject tokens.
const MaxUIDLength = 128

// NewJobGraph checks vertices and returns them as a job graph in topological
// order. Among vertices whose inputs are all placed, declaration order wins, so
// the order is stable. It fills in what the caller may leave out: Edge.To,
// Edge.Input, an empty Partition (forward) and a zero MaxParallelism
// (DefaultMaxParallelism). The vertices are modified in place.
//
// It reports every problem it finds as an *InvalidGraphError: an empty job
// name, no vertices, an empty, malformed or duplicate uid, parallelism below 1
// or above max parallelism, a min parallelism below 0 or above the
// parallelism, an input from an unknown operator or from a sink,
// an unknown partitioning, forward between different parallelisms, a source
// with inputs, an operator or sink without inputs, and cycles (each named by
// its operators).
func NewJobGraph(name string, vertices []*Vertex) (*JobGraph, error) {
	var probs []Problem
	add := func(op, field, format string, args ...any) {
		probs = append(probs, Problem{Operator: op, Field: field, Message: fmt.Sprintf(format, args...)})
	}
	if name == "" {
		add("", "name", "the job needs a name")
	}
	if len(vertices) == 0 {
		add("", "operators", "the job has no operators")
	}

	byUID := make(map[string]*Vertex, len(vertices))
	var unique []*Vertex // first vertex of each uid, in declaration order
	for i, v := range vertices {
		if v == nil {
			add("", fmt.Sprintf("operators[%d]", i), "nil vertex")
			continue
		}
		switch {
		case v.UID == "":
			add("", fmt.Sprintf("operators[%d].uid", i), "every operator needs a uid")
			continue
		case len(v.UID) > MaxUIDLength:
			add(v.UID, "uid", "longer than %d characters", MaxUIDLength)
		case !uidRE.MatchString(v.UID):
			add(v.UID, "uid", "may contain only letters, digits, '-' and '_'")
		}
		if _, dup := byUID[v.UID]; dup {
			add(v.UID, "uid", "duplicate uid %q: uids must be unique", v.UID)
			continue
		}
		byUID[v.UID] = v
		unique = append(unique, v)
	}

	for _, v := range unique {
		if v.MaxParallelism == 0 {
			v.MaxParallelism = DefaultMaxParallelism
		}
		if v.MaxParallelism < 1 || v.MaxParallelism > MaxMaxParallelism {
			add(v.UID, "max_parallelism", "must be between 1 and %d, got %d", MaxMaxParallelism, v.MaxParallelism)
		}
		switch {
		case v.Parallelism < 1:
			add(v.UID, "parallelism", "must be at least 1, got %d", v.Parallelism)
		case v.Parallelism > v.MaxParallelism:
			add(v.UID, "parallelism", "%d is above max_parallelism %d", v.Parallelism, v.MaxParallelism)
		case v.MinParallelism < 0:
			add(v.UID, "min_parallelism", "must be at least 1, got %d", v.MinParallelism)
		case v.MinParallelism > v.Parallelism:
			add(v.UID, "min_parallelism", "%d is above the operator's parallelism %d", v.MinParallelism, v.Parallelism)
		}
		switch v.Kind {
		case KindSource:
			if len(v.Inputs) > 0 {
				add(v.UID, "inputs", "a source takes no inputs")
			}
		case KindOperator, KindSink:
			if len(v.Inputs) == 0 {
				article := "a"
				if v.Kind == KindOperator {
					article = "an"
				}
				add(v.UID, "inputs", "%s %s needs at least one input", article, v.Kind)
			}
		case KindUnknown:
		default:
			add(v.UID, "", "unknown vertex kind %q", v.Kind)
		}
		for i := range v.Inputs {
			e := &v.Inputs[i]
			e.To, e.Input = v.UID, i
			if e.Partition == "" {
				e.Partition = Forward
			}
			field := fmt.Sprintf("inputs[%d]", i)
			if !e.Partition.Valid() {
				add(v.UID, field+".partition", "unknown partitioning %q (want forward, rebalance, hash or broadcast)", e.Partition)
			}
			if e.From == "" {
				add(v.UID, field+".from", "missing: name the upstream operator's uid")
				continue
			}
			up, ok := byUID[e.From]
			if !ok {
				add(v.UID, field+".from", "unknown operator %q", e.From)
				continue
			}
			if up.Kind == KindSink {
				add(v.UID, field+".from", "%q is a sink and has no output", e.From)
			}
			if e.Output != "" {
				if err := abi.CheckOutputName(e.Output); err != nil {
					add(v.UID, field+".from", "%s.%s: %v", e.From, e.Output, err)
				} else if up.Kind != KindOperator {
					add(v.UID, field+".from", "%s.%s: %q is a %s; only an operator has side outputs", e.From, e.Output, e.From, up.Kind)
				}
			}
			if e.Partition == Forward && up != v && up.Parallelism != v.Parallelism && up.Parallelism >= 1 && v.Parallelism >= 1 {
				add(v.UID, field+".partition", "forward from %q (parallelism %d) to %q (parallelism %d) needs equal parallelism; use rebalance, hash or broadcast",
					e.From, up.Parallelism, v.UID, v.Parallelism)
			}
		}
	}

	order, cycles := topoOrder(unique, byUID)
	for _, c := range cycles {
		// Blame the input of the first vertex that closes the cycle.
		field, last := "inputs", c[len(c)-1]
		for i, e := range byUID[c[0]].Inputs {
			if e.From == last {
				field = fmt.Sprintf("inputs[%d].from", i)
				break
			}
		}
		add(c[0], field, "cycle: %s", strings.Join(append(c, c[0]), " -> "))
	}

	if len(probs) > 0 {
		return nil, &InvalidGraphError{Job: name, Problems: probs}
	}
	return &JobGraph{Name: name, Vertices: order, byUID: byUID}, nil
}

// topoOrder returns the vertices in topological order (declaration order among
// ready vertices) and, when the graph is not acyclic, its cycles, each as the
// uids along the data flow starting with the earliest declared one.
// Edges from unknown uids are ignored (reported elsewhere).
func topoOrder(vs []*Vertex, byUID map[string]*Vertex) (order []*Vertex, cycles [][]string) {
	decl := make(map[string]int, len(vs))
	for i, v := range vs {
		decl[v.UID] = i
	}
	placed := make([]bool, len(vs))
	ready := func(v *Vertex) bool {
		for _, e := range v.Inputs {
			if i, ok := decl[e.From]; ok && !placed[i] {
				return false
			}
		}
		return true
	}
	for progress := true; progress; {
		progress = false
		for i, v := range vs {
			if !placed[i] && ready(v) {
				placed[i] = true
				order = append(order, v)
				progress = true
				break // restart: an earlier-declared vertex may have become ready
			}
		}
	}
	if len(order) == len(vs) {
		return order, nil
	}

	// Find the cycles among the rest with a DFS along input edges. Every
	// unplaced vertex reaches a cycle upstream; each back edge closes one.
	const (
		white = iota
		grey
		black
	)
	color := make(map[string]int)
	var stack []string
	seen := make(map[string]bool) // canonical cycle keys
	var visit func(uid string)
	visit = func(uid string) {
		color[uid] = grey
		stack = append(stack, uid)
		for _, e := range byUID[uid].Inputs {
			i, ok := decl[e.From]
			if !ok || placed[i] {
				continue
			}
			switch color[e.From] {
			case white:
				visit(e.From)
			case grey:
				// stack[j:] is the cycle against the data flow: from e.From down to uid.
				j := len(stack) - 1
				for stack[j] != e.From {
					j--
				}
				c := make([]string, 0, len(stack)-j)
				for k := len(stack) - 1; k >= j; k-- {
					c = append(c, stack[k])
				}
				// c runs along the data flow; start it at the earliest declared vertex.
				c = rotateToEarliest(c, decl)
				key := strings.Join(c, "\x00")
				if !seen[key] {
					seen[key] = true
					cycles = append(cycles, c)
				}
			}
		}
		stack = stack[:len(stack)-1]
		color[uid] = black
	}
	for i, v := range vs {
		if !placed[i] && color[v.UID] == white {
			visit(v.UID)
		}
	}
	sort.SliceStable(cycles, func(a, b int) bool { return decl[cycles[a][0]] < decl[cycles[b][0]] })
	return order, cycles
}

func rotateToEarliest(c []string, decl map[string]int) []string {
	m := 0
	for i := range c {
		if decl[c[i]] < decl[c[m]] {
			m = i
		}
	}
	return append(append([]string(nil), c[m:]...), c[:m]...)
}
