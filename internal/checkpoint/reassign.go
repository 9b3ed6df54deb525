package checkpoint

import (
	"context"
	"fmt"
	"maps"
	"slices"

	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/host"
	"github.com/streamd/streamd/internal/connector"
)

// Reassign redistributes one operator's state to newParallelism subtasks
// (FLIP-147 rules for finished operators included):
//
//   - keyed state, with its timers, by key group: new subtask i gets the key
//     groups of abi.RangeForSubtask(i, maxParallelism, newParallelism) from
//     whichever old subtask held them; newMaxParallelism must equal the
//     checkpoint's when there is keyed state (0 means the checkpoint's);
//   - split list state: at unchanged parallelism each subtask keeps its own
//     entries; otherwise the entries of all old subtasks, in subtask order,
//     are dealt round robin to the new subtasks;
//   - union list state: every new subtask gets all entries of all old
//     subtasks;
//   - broadcast list state: new subtask i gets the entries of the i mod n-th
//     of the n old subtasks that reported the list;
//   - source positions: at unchanged parallelism each subtask its own (a
//     subtask that had finished restores as SourceFinished); at another
//     one only through op.RescalePositions (error naming the operator
//     otherwise);
//   - sink pending-commit data of old subtask j goes to new subtask
//     j mod newParallelism (commits are idempotent).
//
// A finished subtask (or every subtask of a fully finished operator)
// contributes no operator state: only its sink pending-commit data, which
// must still be committed, and, for a source, the fact that it finished.
// Reassign does not copy: the result shares memory with op.
func Reassign(op *OperatorSnapshot, newParallelism, newMaxParallelism int) ([]*SubtaskRestore, error) {
	uid := op.Meta.UID
	oldP := len(op.Subtasks)
	if op.Meta.Parallelism != 0 && op.Meta.Parallelism != oldP {
		return nil, fmt.Errorf("checkpoint: operator %q: %d subtask states for parallelism %d", uid, oldP, op.Meta.Parallelism)
	}
	if newParallelism < 1 {
		return nil, fmt.Errorf("checkpoint: operator %q: new parallelism %d", uid, newParallelism)
	}
	maxP := op.Meta.MaxParallelism
	if maxP == 0 {
		maxP = abi.DefaultMaxParallelism
	}
	if newMaxParallelism == 0 {
		newMaxParallelism = maxP
	}
	fully := op.Meta.Finished == control.OperatorFullyFinished
	finished := func(j int) bool {
		return fully || (j < len(op.Meta.Subtasks) && op.Meta.Subtasks[j].Finished)
	}

	out := make([]*SubtaskRestore, newParallelism)
	for i := range out {
		out[i] = &SubtaskRestore{}
	}

	// Sources.
	source := op.Source
	for _, s := range op.Subtasks {
		source = source || (s != nil && s.SourcePosition != nil)
	}
	if source && fully {
		for i := range out {
			out[i].SourceFinished = true // deployed as finished: reads nothing
		}
	} else if source && oldP != newParallelism && op.RescalePositions != nil {
		old := make([][]byte, oldP)
		for j, s := range op.Subtasks {
			if s != nil && !finished(j) {
				old[j] = s.SourcePosition
			}
		}
		pos, err := op.RescalePositions(old, newParallelism)
		if err != nil {
			return nil, fmt.Errorf("checkpoint: operator %q: rescale the source from %d to %d subtasks: %w", uid, oldP, newParallelism, err)
		}
		if len(pos) != newParallelism {
			return nil, fmt.Errorf("checkpoint: operator %q: rescale the source: %d positions for %d subtasks", uid, len(pos), newParallelism)
		}
		for i, p := range pos {
			out[i].SourcePosition = p
		}
	} else if source && oldP != newParallelism {
		return nil, fmt.Errorf("checkpoint: operator %q is a source: its parallelism cannot change on restore (%d in the checkpoint, %d now) because each subtask resumes its own position", uid, oldP, newParallelism)
	} else if source {
		for j, s := range op.Subtasks {
			if finished(j) {
				out[j].SourceFinished = true
			} else if s != nil {
				out[j].SourcePosition = s.SourcePosition
			}
		}
	}

	// Sink pending-commit data, also of finished subtasks.
	for j, s := range op.Subtasks {
		if s != nil && s.SinkPending != nil {
			i := j % newParallelism
			out[i].SinkPending = append(out[i].SinkPending, s.SinkPending)
		}
	}

	// Operator state of the running subtasks.
	var snaps []*host.Snapshot // by old index; nil when none or finished
	keyed := false
	for j, s := range op.Subtasks {
		var snap *host.Snapshot
		if s != nil && s.Operator != nil && !finished(j) {
			snap = s.Operator
			keyed = keyed || len(snap.KeyGroups) > 0 || len(snap.Files) > 0 || len(snap.Sources) > 0
		}
		snaps = append(snaps, snap)
	}
	if keyed && newMaxParallelism != maxP {
		return nil, fmt.Errorf("checkpoint: operator %q: max parallelism %d differs from the checkpoint's %d; keyed state is partitioned into that many key groups and cannot be restored otherwise", uid, newMaxParallelism, maxP)
	}
	if newParallelism > maxP && keyed {
		return nil, fmt.Errorf("checkpoint: operator %q: parallelism %d exceeds max parallelism %d", uid, newParallelism, maxP)
	}
	newSnap := func(i int) *host.Snapshot {
		if out[i].Snapshot == nil {
			out[i].Snapshot = &host.Snapshot{KeyGroups: map[int]*host.KeyGroupState{}, Lists: map[string]*host.ListState{}}
		}
		return out[i].Snapshot
	}

	// Keyed state by key group.
	owner := map[int]int{} // key group -> old subtask
	for j, snap := range snaps {
		if snap == nil {
			continue
		}
		for kg, g := range snap.KeyGroups {
			if g == nil {
				continue
			}
			if kg < 0 || kg >= maxP {
				return nil, fmt.Errorf("checkpoint: operator %q subtask %d: key group %d outside [0,%d)", uid, j, kg, maxP)
			}
			if prev, dup := owner[kg]; dup {
				return nil, fmt.Errorf("checkpoint: operator %q: key group %d is in the state of subtasks %d and %d", uid, kg, prev, j)
			}
			owner[kg] = j
			i := abi.SubtaskForKeyGroup(kg, maxP, newParallelism)
			newSnap(i).KeyGroups[kg] = g
		}
	}

	// Keyed state still in the old subtasks' blobs (LoadRestoreFrom): every
	// new subtask gets the part of each old subtask's in its key groups,
	// read when it restores.
	for j, snap := range snaps {
		if snap == nil {
			continue
		}
		for _, src := range snap.Sources {
			for _, kg := range src.KeyGroups() {
				if kg < 0 || kg >= maxP {
					return nil, fmt.Errorf("checkpoint: operator %q subtask %d: key group %d outside [0,%d)", uid, j, kg, maxP)
				}
				if prev, dup := owner[kg]; dup {
					return nil, fmt.Errorf("checkpoint: operator %q: key group %d is in the state of subtasks %d and %d", uid, kg, prev, j)
				}
				owner[kg] = j
			}
			for i := range out {
				if part := clipSource(src, abi.RangeForSubtask(i, maxP, newParallelism)); part != nil {
					newSnap(i).Sources = append(newSnap(i).Sources, part)
				}
			}
		}
	}

	// Keyed state as files (incremental checkpoints): every new subtask
	// gets the parts whose key groups overlap its own, and takes from them
	// only its key groups.
	for j, snap := range snaps {
		if snap == nil {
			continue
		}
		for _, part := range snap.Files {
			if part.MaxParallelism != maxP || part.KeyGroups.Start < 0 || part.KeyGroups.End >= maxP {
				return nil, fmt.Errorf("checkpoint: operator %q subtask %d: state files of key groups %s, max parallelism %d (the operator's is %d)", uid, j, part.KeyGroups, part.MaxParallelism, maxP)
			}
			for i := range out {
				r := abi.RangeForSubtask(i, maxP, newParallelism)
				if r.Start <= part.KeyGroups.End && part.KeyGroups.Start <= r.End {
					newSnap(i).Files = append(newSnap(i).Files, part)
				}
			}
		}
	}

	// Operator list state, by name in sorted order.
	type listInfo struct {
		mode abi.ListMode
		from []int // old subtasks that reported it
	}
	lists := map[string]*listInfo{}
	for j, snap := range snaps {
		if snap == nil {
			continue
		}
		for name, l := range snap.Lists {
			if l == nil {
				continue
			}
			li := lists[name]
			if li == nil {
				li = &listInfo{mode: l.Mode}
				lists[name] = li
			} else if li.mode != l.Mode {
				return nil, fmt.Errorf("checkpoint: operator %q: list state %q is %s in subtask %d but %s in subtask %d", uid, name, l.Mode, j, li.mode, li.from[0])
			}
			li.from = append(li.from, j)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(lists)) {
		li := lists[name]
		switch li.mode {
		case abi.ListSplit:
			for i := range out {
				newSnap(i).Lists[name] = &host.ListState{Mode: abi.ListSplit, Entries: [][]byte{}}
			}
			k := 0
			for _, j := range li.from {
				for _, e := range snaps[j].Lists[name].Entries {
					i := k % newParallelism
					if oldP == newParallelism {
						i = j
					}
					l := out[i].Snapshot.Lists[name]
					l.Entries = append(l.Entries, e)
					k++
				}
			}
		case abi.ListUnion:
			all := [][]byte{}
			for _, j := range li.from {
				all = append(all, snaps[j].Lists[name].Entries...)
			}
			for i := range out {
				newSnap(i).Lists[name] = &host.ListState{Mode: abi.ListUnion, Entries: slices.Clip(all)}
			}
		case abi.ListBroadcast:
			for i := range out {
				src := snaps[li.from[i%len(li.from)]].Lists[name]
				entries := src.Entries
				if entries == nil {
					entries = [][]byte{}
				}
				newSnap(i).Lists[name] = &host.ListState{Mode: abi.ListBroadcast, Entries: slices.Clip(entries)}
			}
		default:
			return nil, fmt.Errorf("checkpoint: operator %q: list state %q has unknown mode %d", uid, name, li.mode)
		}
	}
	return out, nil
}

// StateReader reads state blobs; every Store is one.
type StateReader interface {
	ReadState(ctx context.Context, md *Metadata, sub SubtaskMeta) (*SubtaskState, error)
}

// fileReader reads blobs of a checkpoint found by Resolve.
type fileReader struct{}

func (fileReader) ReadState(ctx context.Context, md *Metadata, sub SubtaskMeta) (*SubtaskState, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return ReadState(md, sub)
}

// LoadRestore resolves path (see Resolve) and prepares the restore of job
// graph g from it (see LoadRestoreFrom).
func LoadRestore(ctx context.Context, path string, g *control.JobGraph) (*Restore, error) {
	md, err := Resolve(path)
	if err != nil {
		return nil, err
	}
	return LoadRestoreFrom(ctx, fileReader{}, md, g)
}

// rescaler is the RescalePositions of a source of type typ, nil when its
// connector has none.
func rescaler(typ string) func([][]byte, int) ([][]byte, error) {
	if !connector.SourceRescales(typ) {
		return nil
	}
	return func(positions [][]byte, n int) ([][]byte, error) {
		out, _, err := connector.RescaleSourcePositions(typ, positions, n)
		return out, err
	}
}

// LoadRestoreFrom prepares the restore of job graph g from checkpoint md:
// it checks the finished states against g (control.CheckRestore), refuses
// state of an operator g does not have, loads every blob through r and
// redistributes each operator's state to its parallelism in g (Reassign)
// and the channel state of unaligned checkpoints to the receiving subtasks
// (ReassignChannels, into SubtaskRestore.InFlight). The readers of this
// package read each blob as a stream, checking it whole, and leave the
// keyed state of full snapshots in the blobs: a subtask's Snapshot.Sources
// read its key groups again when it restores (stream.go), so memory does
// not grow with the state. Other readers load the blobs (ReadState).
func LoadRestoreFrom(ctx context.Context, r StateReader, md *Metadata, g *control.JobGraph) (*Restore, error) {
	where := fmt.Sprintf("%s %d (%s)", md.Kind, md.ID, md.Location)
	finished := md.FinishedStates()
	if err := control.CheckRestore(g, finished); err != nil {
		return nil, fmt.Errorf("checkpoint: restore from %s: %w", where, err)
	}
	for _, op := range md.Operators {
		if g.Vertex(op.UID) != nil || op.Finished == control.OperatorFullyFinished && op.StateSize() == 0 {
			continue
		}
		if op.StateSize() > 0 {
			return nil, fmt.Errorf("checkpoint: restore from %s: it has state of operator %q, which job %q does not have (was the uid changed?)", where, op.UID, g.Name)
		}
	}
	res := &Restore{Metadata: md, Finished: map[string]control.FinishedState{}, Subtasks: map[control.SubtaskID]*SubtaskRestore{}}
	states := map[string][]*SubtaskState{}
	for _, v := range g.Vertices {
		om := md.Operator(v.UID)
		if om == nil {
			continue
		}
		res.Finished[v.UID] = om.Finished
		snap := &OperatorSnapshot{Meta: *om, Subtasks: make([]*SubtaskState, om.Parallelism), Source: v.IsSource()}
		if src, ok := v.Spec.(*connector.SourceSpec); ok {
			snap.RescalePositions = rescaler(src.Type)
		}
		for _, s := range om.Subtasks {
			var st *SubtaskState
			var err error
			if o, ok := r.(stateOpener); ok {
				st, err = scanState(ctx, o, md, s) // keyed state stays in the blob
			} else {
				st, err = r.ReadState(ctx, md, s)
			}
			if err != nil {
				return nil, fmt.Errorf("checkpoint: restore operator %q from %s: %w", v.UID, where, err)
			}
			snap.Subtasks[s.Index] = st
		}
		states[v.UID] = snap.Subtasks
		rs, err := Reassign(snap, v.Parallelism, v.MaxParallelism)
		if err != nil {
			return nil, fmt.Errorf("%w (restoring from %s)", err, where)
		}
		for i, sr := range rs {
			if sr.Snapshot != nil || sr.SourcePosition != nil || sr.SourceFinished || sr.SinkPending != nil {
				res.Subtasks[control.SubtaskID{Operator: v.UID, Index: i}] = sr
			}
		}
	}
	inflight, err := ReassignChannels(g, md, states)
	if err != nil {
		return nil, fmt.Errorf("%w (restoring from %s)", err, where)
	}
	for id, chans := range inflight {
		sr := res.Subtasks[id]
		if sr == nil {
			sr = &SubtaskRestore{}
			res.Subtasks[id] = sr
		}
		sr.InFlight = chans
	}
	return res, nil
}
