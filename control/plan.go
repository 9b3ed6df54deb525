package control

import (
	"fmt"
	"strconv"
	"strings"
)

// SubtaskID names one parallel instance of an operator: Operator is the
// vertex uid, Index its subtask index in [0, parallelism). Its text form is
// "uid/index", e.g. "map/1".
type SubtaskID struct {
	Operator string
	Index    int
}

func (s SubtaskID) String() string { return s.Operator + "/" + strconv.Itoa(s.Index) }

// ParseSubtaskID parses the "uid/index" form written by SubtaskID.String.
func ParseSubtaskID(s string) (SubtaskID, error) {
	i := strings.LastIndexByte(s, '/')
	if i <= 0 {
		return SubtaskID{}, fmt.Errorf("control: subtask %q: want uid/index", s)
	}
	n, err := strconv.Atoi(s[i+1:])
	if err != nil || n < 0 {
		return SubtaskID{}, fmt.Errorf("control: subtask %q: index must be a non-negative integer", s)
	}
	return SubtaskID{Operator: s[:i], Index: n}, nil
}

// Subtasks returns every subtask of g: vertices in topological order, then by
// index. Every list of subtasks this package returns uses this order.
func Subtasks(g *JobGraph) []SubtaskID {
	var out []SubtaskID
	for _, v := range g.Vertices {
		for i := 0; i < v.Parallelism; i++ {
			out = append(out, SubtaskID{v.UID, i})
		}
	}
	return out
}

// TriggerPlan says how to start one checkpoint on a job some of whose
// subtasks may have finished (FLIP-147). Lists are in topological order of
// their vertices, then by subtask index.
type TriggerPlan struct {
	// Trigger are the subtasks the coordinator starts the checkpoint at: the
	// running subtasks that no running subtask can still send a barrier to.
	// With no finished subtask they are exactly the source subtasks.
	// A triggered subtask that is not a source snapshots and forwards the
	// barrier itself, as a source does.
	Trigger []SubtaskID
	// Wait are all running subtasks: the checkpoint completes when each of
	// them has acknowledged, and it commits to (notifies) them.
	Wait []SubtaskID
	// Finished are the subtasks finished at plan time. They count as
	// acknowledged and contribute no state.
	Finished []SubtaskID
	// FullyFinished are the vertices all of whose subtasks are finished, in
	// topological order. Their state in the checkpoint is only the flag.
	FullyFinished []string
}

// PlanTrigger computes the trigger plan for g given which subtasks are
// finished (closed: they have emitted EndOfPartition and will never send
// another barrier). Every other subtask counts as running, including those
// that reached end of data and wait for their final checkpoint.
//
// The rule (Flink's DefaultCheckpointPlanCalculator): walk the vertices in
// topological order. A vertex with no running subtask is fully finished. A
// running subtask is triggered when no predecessor can still send it a
// barrier: it has no all-to-all input from a vertex with any running subtask,
// and no pointwise (forward, subtask i <- subtask i) input from a running
// subtask. When nothing is finished this triggers exactly the sources.
//
// PlanTrigger is pure; finished may be called any number of times.
func PlanTrigger(g *JobGraph, finished func(SubtaskID) bool) TriggerPlan {
	var p TriggerPlan
	running := make(map[string][]bool, len(g.Vertices)) // per vertex, per subtask
	anyRunning := make(map[string]bool, len(g.Vertices))
	for _, v := range g.Vertices {
		r := make([]bool, v.Parallelism)
		for i := range r {
			id := SubtaskID{v.UID, i}
			r[i] = !finished(id)
			if r[i] {
				anyRunning[v.UID] = true
				p.Wait = append(p.Wait, id)
			} else {
				p.Finished = append(p.Finished, id)
			}
		}
		running[v.UID] = r
	}
	for _, v := range g.Vertices {
		if !anyRunning[v.UID] {
			p.FullyFinished = append(p.FullyFinished, v.UID)
			continue
		}
		// Vertex-level shortcut: an all-to-all input from a vertex with a
		// running subtask feeds every subtask of v, so none is triggered.
		blocked := false
		for _, e := range v.Inputs {
			if !e.Partition.Pointwise() && anyRunning[e.From] {
				blocked = true
				break
			}
		}
		if blocked {
			continue
		}
		for i, r := range running[v.UID] {
			if !r {
				continue
			}
			fed := false
			for _, e := range v.Inputs {
				// Only pointwise inputs remain; forward needs equal
				// parallelism, so subtask i reads from upstream subtask i.
				if up := running[e.From]; i < len(up) && up[i] {
					fed = true
					break
				}
			}
			if !fed {
				p.Trigger = append(p.Trigger, SubtaskID{v.UID, i})
			}
		}
	}
	return p
}
