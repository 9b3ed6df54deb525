package control

import (
	"errors"
	"fmt"
	"strings"
)

// FinishedState is an operator's finished status as a checkpoint records it
// (FLIP-147's extended checkpoint format).
type FinishedState int

const (
	// OperatorRunning: no subtask had finished; also every operator the
	// checkpoint does not know (a new operator).
	OperatorRunning FinishedState = iota
	// OperatorPartiallyFinished: some but not all subtasks had finished. The
	// state is that of the running subtasks and redistributes on restore.
	OperatorPartiallyFinished
	// OperatorFullyFinished: all subtasks had finished; the state is only
	// this flag and the operator is deployed as finished.
	OperatorFullyFinished
)

func (s FinishedState) String() string {
	switch s {
	case OperatorRunning:
		return "running"
	case OperatorPartiallyFinished:
		return "partially finished"
	case OperatorFullyFinished:
		return "fully finished"
	}
	return fmt.Sprintf("FinishedState(%d)", int(s))
}

// ErrRestoreFinishedState is matched (errors.Is) by every *RestoreError.
var ErrRestoreFinishedState = errors.New("control: job graph does not fit the finished operators of the checkpoint")

// RestoreProblem is one violated rule: Operator cannot be restored because of
// its input from Predecessor.
type RestoreProblem struct {
	Operator    string
	State       FinishedState // Operator's state in the checkpoint
	Predecessor string
	PredState   FinishedState // Predecessor's state in the checkpoint
	Partition   Partitioning  // of the edge Predecessor -> Operator
}

func (p RestoreProblem) String() string {
	return fmt.Sprintf("operator %q is %s in the checkpoint but its %s input %q is %s",
		p.Operator, p.State, p.Partition, p.Predecessor, p.PredState)
}

// RestoreError lists every problem CheckRestore found, in topological order.
type RestoreError struct {
	Job      string
	Problems []RestoreProblem
}

func (e *RestoreError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "control: job %q cannot restore the finished state of its checkpoint: ", e.Job)
	for i, p := range e.Problems {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(p.String())
	}
	b.WriteString(" (operators finish in topological order, so this graph was changed in front of a finished operator)")
	return b.String()
}

func (e *RestoreError) Unwrap() error { return ErrRestoreFinishedState }

// CheckRestore validates, before anything is deployed, that graph g can
// restore a checkpoint whose operators had the finished states in restored
// (keyed by uid; a uid missing from the map is OperatorRunning). It mirrors
// Flink's VertexFinishedStateChecker. Operators finish in topological order,
// so a checkpoint can only show these combinations; anything else means the
// graph was changed (for example an operator added in front of a finished
// one) and restoring would run a finished operator's input again:
//
//   - a fully finished operator needs every predecessor fully finished;
//   - a partially finished operator needs each all-to-all predecessor fully
//     finished (any of its subtasks finishing required all upstream subtasks
//     to finish);
//   - a partially finished operator needs each pointwise predecessor to be
//     at least partially finished (subtask i finished only after upstream
//     subtask i did).
//
// The error is a *RestoreError naming every offending operator and input.
func CheckRestore(g *JobGraph, restored map[string]FinishedState) error {
	var probs []RestoreProblem
	for _, v := range g.Vertices {
		st := restored[v.UID]
		if st == OperatorRunning {
			continue
		}
		for _, e := range v.Inputs {
			up := restored[e.From]
			bad := false
			switch {
			case st == OperatorFullyFinished:
				bad = up != OperatorFullyFinished
			case !e.Partition.Pointwise():
				bad = up != OperatorFullyFinished
			default:
				bad = up == OperatorRunning
			}
			if bad {
				probs = append(probs, RestoreProblem{Operator: v.UID, State: st, Predecessor: e.From, PredState: up, Partition: e.Partition})
			}
		}
	}
	if len(probs) > 0 {
		return &RestoreError{Job: g.Name, Problems: probs}
	}
	return nil
}

// DeployAsFinished returns the subtasks of g to deploy as finished after
// restoring a checkpoint with the finished states in restored: every subtask
// of each fully finished operator, whatever its new parallelism. Such a
// subtask runs no user code: it emits MAX watermark and EndOfData(drain) at
// once, reports TaskRunning{DeployedFinished: true}, and acknowledges later
// checkpoints with Ack.DeployedFinished so the operator stays fully finished.
// Subtasks of partially finished operators are deployed running: their
// state is the running subtasks' state, redistributed.
func DeployAsFinished(g *JobGraph, restored map[string]FinishedState) []SubtaskID {
	var out []SubtaskID
	for _, v := range g.Vertices {
		if restored[v.UID] != OperatorFullyFinished {
			continue
		}
		for i := 0; i < v.Parallelism; i++ {
			out = append(out, SubtaskID{v.UID, i})
		}
	}
	return out
}
