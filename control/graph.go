// Package control is streamd's control plane: the job graph, its validation,
// and (later) the checkpoint coordinator, restore checks and finishing logic.
// Everything here is pure: no goroutines, clocks or IO.
package control

// Partitioning says how records of an edge are distributed among the
// subtasks of the receiving operator.
type Partitioning string

const (
	Forward   Partitioning = "forward"   // subtask i sends to subtask i; equal parallelism (POINTWISE)
	Rebalance Partitioning = "rebalance" // round robin over all receivers (ALL_TO_ALL)
	Hash      Partitioning = "hash"      // by key group of the record key, or of the value when it has no key (ALL_TO_ALL)
	Broadcast Partitioning = "broadcast" // every record to every receiver (ALL_TO_ALL)
)

// Pointwise reports whether the edge connects subtask i only to subtask i.
func (p Partitioning) Pointwise() bool { return p == Forward }

// Valid reports whether p is a known partitioning.
func (p Partitioning) Valid() bool {
	switch p {
	case Forward, Rebalance, Hash, Broadcast:
		return true
	}
	return false
}

// Edge is one input of a vertex.
type Edge struct {
	From      string       // uid of the upstream vertex
	To        string       // uid of the downstream vertex
	Partition Partitioning // how records are distributed
	Input     int          // index of this edge among To's inputs (0-based), the abi input index
	// Output is the side output of From the edge carries (job file
	// "from: OP.OUTPUT"); "" is From's main output. Only an operator (not a
	// source) has side outputs.
	Output string `json:",omitempty"`
}

// Vertex is one operator of the job graph.
type Vertex struct {
	UID            string
	Parallelism    int
	MaxParallelism int
	// MinParallelism is the least parallelism a controller may run the
	// vertex at when fewer slots are free than the job needs (adaptive
	// scheduling, AdaptiveSlots); 0 means 1. At most Parallelism.
	MinParallelism int
	Kind           Kind   // source, operator or sink; checked by NewJobGraph
	Inputs         []Edge // in declaration order; Inputs[i].Input == i
	Spec           any    // what runs: a source, a sink or a wasm operator spec (set by the job file loader)
}

// IsSource reports whether v has no inputs.
func (v *Vertex) IsSource() bool { return len(v.Inputs) == 0 }

// JobGraph is a validated job: its vertices in topological order. Build it with NewJobGraph.
type JobGraph struct {
	Name     string
	Vertices []*Vertex
	byUID    map[string]*Vertex
}

// Vertex returns the vertex with uid, or nil.
func (g *JobGraph) Vertex(uid string) *Vertex { return g.byUID[uid] }

// Outputs returns the edges leaving uid, in the topological order of their receivers.
func (g *JobGraph) Outputs(uid string) []Edge {
	var out []Edge
	for _, v := range g.Vertices {
		for _, e := range v.Inputs {
			if e.From == uid {
				out = append(out, e)
			}
		}
	}
	return out
}
