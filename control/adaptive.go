package control

// Adaptive scheduling (pure), as Flink's adaptive scheduler: a job declares a
// parallelism per vertex and may set the least it runs at (its min
// parallelism). When fewer slots can be had than the job declares, it runs
// on the slots there are, every vertex at min(declared, slots), as long as
// no vertex falls below its minimum; with fewer than that it waits. Slot
// sharing stays as in Schedule: the job runs on as many slots as its
// largest parallelism, and two vertices of equal declared parallelism (a
// forward edge) stay equal.

// Bounds is one vertex's declared parallelism and the least it may run at
// (0 means 1; above Declared counts as Declared).
type Bounds struct {
	Declared int
	Min      int
}

// AdaptiveSlots is the number of slots a job whose vertices have bounds
// runs on when `available` slots can be had: its declared slots (the
// largest declared parallelism) when there are that many, else all
// available ones, and 0 when they are fewer than the least the job runs on
// (the largest minimum). declared and least are those two numbers.
func AdaptiveSlots(bounds []Bounds, available int) (slots, declared, least int) {
	for _, b := range bounds {
		declared = max(declared, b.Declared)
		least = max(least, min(max(b.Min, 1), b.Declared))
	}
	slots = min(declared, available)
	if slots < least {
		slots = 0
	}
	return slots, declared, least
}

// ScaledParallelism is a vertex's parallelism when its job runs on `slots`
// slots: its declared one, at most slots.
func ScaledParallelism(b Bounds, slots int) int { return min(b.Declared, slots) }

// VertexBounds is the Bounds of each vertex of g, in g's order.
func VertexBounds(g *JobGraph) []Bounds {
	out := make([]Bounds, len(g.Vertices))
	for i, v := range g.Vertices {
		out[i] = Bounds{Declared: v.Parallelism, Min: v.MinParallelism}
	}
	return out
}
