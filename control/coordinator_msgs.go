package control

import (
	"fmt"
	"strconv"
	"strings"
)

// This file holds what flows into the Coordinator (events) and out of it
// (actions). Their String forms are the lines of the scenario scripts in
// testdata/ and are meant for logs.

// CheckpointKind says whether a checkpoint was taken by the coordinator on
// its own (checkpoint) or asked for by a user (savepoint).
type CheckpointKind string

const (
	KindCheckpoint CheckpointKind = "checkpoint"
	KindSavepoint  CheckpointKind = "savepoint"
)

// Event is an input to Coordinator.Step. The driver reports each event once,
// in the order it observed them; events of one subtask must keep the order
// the subtask produced them in (for example TaskEndOfData before an Ack with
// AfterEndOfData), and the driver drops events of an earlier job attempt.
type Event interface {
	isEvent()
	String() string
}

// Tick advances the coordinator's clock by one tick. Intervals, timeouts and
// pauses in Config are counted in ticks; the driver owns the real ticker.
type Tick struct{}

// TaskRunning reports that a subtask is deployed and running. After a
// restore, a subtask of a fully finished operator (see DeployAsFinished)
// reports DeployedFinished: it runs no user code, has already emitted
// EndOfData(drain) and, like a subtask at end of data, waits for a
// checkpoint to complete before it closes.
type TaskRunning struct {
	Subtask          SubtaskID
	DeployedFinished bool
}

// TaskEndOfData reports that a running subtask emitted EndOfData: its logic
// has finished (after finish() if Drain) and it now waits for its final
// checkpoint, any checkpoint whose barrier it receives after this point, or
// the stop-with-savepoint savepoint. It still takes part in checkpoints.
type TaskEndOfData struct {
	Subtask SubtaskID
	Drain   bool
}

// TaskFinished reports that a subtask closed and emitted EndOfPartition. It
// will send no barrier again, so later trigger plans treat it as finished.
// Normally it follows end of data and the notification of the subtask's
// final checkpoint. A pending checkpoint still waiting for the subtask's ack
// is aborted (finished-before-ack, not counted).
type TaskFinished struct{ Subtask SubtaskID }

// TaskFailed reports that a subtask failed (trap, lost host, channel gap).
// The whole job fails over: every pending checkpoint is aborted and the
// coordinator waits for all subtasks to report TaskRunning again.
type TaskFailed struct {
	Subtask SubtaskID
	Reason  string
}

// Ack is a subtask's acknowledgement of a checkpoint: its snapshot is stored
// (StateRef names it for the driver; Size is in bytes).
type Ack struct {
	CheckpointID int64
	Subtask      SubtaskID
	StateRef     string
	Size         int64
	// AfterEndOfData: the subtask took this snapshot after it emitted
	// EndOfData, so this checkpoint is its final one and it closes once the
	// checkpoint completes. Requires an earlier TaskEndOfData (or
	// DeployedFinished). With a drained end of data the subtask's operator
	// counts as finished in this snapshot.
	AfterEndOfData bool
	// DeployedFinished: the subtask was deployed as finished; it carries no
	// state and its operator stays fully finished. Implies AfterEndOfData.
	DeployedFinished bool
	// UnionState: the snapshot holds operator list state with union
	// redistribution. Such state cannot be checkpointed while its operator
	// is partially finished; the coordinator then aborts the checkpoint
	// without counting it as a failure (see AbortUnionState).
	UnionState bool
}

// DeclineKind classifies a Decline.
type DeclineKind string

const (
	// DeclineFailure: the subtask could not take its snapshot. Counts as a
	// checkpoint failure.
	DeclineFailure DeclineKind = "failure"
	// DeclineUnionStatePartiallyFinished: the operator uses union list state
	// and some of its subtasks have finished. Not a failure; subtasks that
	// wait for a final checkpoint keep waiting.
	DeclineUnionStatePartiallyFinished DeclineKind = "union-state-partially-finished"
	// DeclineNotReady: the subtask cannot checkpoint yet (still restoring,
	// already closing). Not a failure.
	DeclineNotReady DeclineKind = "not-ready"
)

// Decline is a subtask's refusal to take part in a checkpoint. The
// checkpoint is aborted.
type Decline struct {
	CheckpointID int64
	Subtask      SubtaskID
	Kind         DeclineKind
	Reason       string
}

// TriggerFailed reports that the trigger of a checkpoint could not be
// delivered to a subtask because it finished between the plan and the
// trigger. That checkpoint is aborted (not counted as a failure); the job
// goes on. Report the subtask's TaskFinished as well.
type TriggerFailed struct {
	CheckpointID int64
	Subtask      SubtaskID
	Reason       string
}

// Persisted reports that the metadata of a checkpoint (after its state
// blobs) is durable: the checkpoint is complete.
type Persisted struct {
	CheckpointID int64
	// Location is where the checkpoint is (its metadata's location), for
	// the Lifecycle to restore later attempts from; the Coordinator does
	// not need it.
	Location string
}

// PersistFailed reports that writing a checkpoint's metadata failed. The
// checkpoint is aborted and counts as a failure.
type PersistFailed struct {
	CheckpointID int64
	Reason       string
}

// TriggerSavepoint asks for a savepoint of the running job. It is triggered
// at once, regardless of the interval, the minimum pause and the limit of
// concurrent checkpoints; its failure does not count against
// TolerableFailures. It can serve as a subtask's final checkpoint.
type TriggerSavepoint struct{}

// StopWithSavepoint asks to stop the job with a savepoint (FLIP-147): the
// sources end (emitting EndOfData(Drain)), the savepoint's barrier follows
// the EndOfData on every channel, every subtask waits for exactly that
// savepoint and then closes. With Drain the operators finish() (timers fire,
// the job ends for good); without, no finish() runs and a job resumed from
// the savepoint continues as if never stopped.
//
// With Terminate the stop must end the job (Ctrl-C on `streamd run`): when
// no savepoint can be taken (the job restarts) or the stop fails, the
// Lifecycle cancels the job instead of restarting it.
type StopWithSavepoint struct{ Drain, Terminate bool }

// Cancel cancels the job: pending checkpoints are aborted; the job ends
// canceled.
type Cancel struct{}

// RestartsExhausted reports that the restart strategy gave up after a
// failure; the job ends failed.
type RestartsExhausted struct{ Reason string }

func (Tick) isEvent()              {}
func (TaskRunning) isEvent()       {}
func (TaskEndOfData) isEvent()     {}
func (TaskFinished) isEvent()      {}
func (TaskFailed) isEvent()        {}
func (Ack) isEvent()               {}
func (Decline) isEvent()           {}
func (TriggerFailed) isEvent()     {}
func (Persisted) isEvent()         {}
func (PersistFailed) isEvent()     {}
func (TriggerSavepoint) isEvent()  {}
func (StopWithSavepoint) isEvent() {}
func (Cancel) isEvent()            {}
func (RestartsExhausted) isEvent() {}

func (Tick) String() string { return "tick" }
func (e TaskRunning) String() string {
	if e.DeployedFinished {
		return "running " + e.Subtask.String() + " deployed-finished"
	}
	return "running " + e.Subtask.String()
}
func (e TaskEndOfData) String() string {
	return fmt.Sprintf("end-of-data %v drain=%t", e.Subtask, e.Drain)
}
func (e TaskFinished) String() string { return "finished " + e.Subtask.String() }
func (e TaskFailed) String() string {
	return fmt.Sprintf("task-failed %v reason=%q", e.Subtask, e.Reason)
}
func (e Ack) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "ack cp=%d %v", e.CheckpointID, e.Subtask)
	if e.StateRef != "" || e.Size != 0 {
		fmt.Fprintf(&b, " state=%s size=%d", e.StateRef, e.Size)
	}
	writeFlag(&b, e.AfterEndOfData, "after-eod")
	writeFlag(&b, e.DeployedFinished, "deployed-finished")
	writeFlag(&b, e.UnionState, "union")
	return b.String()
}
func (e Decline) String() string {
	return fmt.Sprintf("decline cp=%d %v kind=%s reason=%q", e.CheckpointID, e.Subtask, e.Kind, e.Reason)
}
func (e TriggerFailed) String() string {
	return fmt.Sprintf("trigger-failed cp=%d %v reason=%q", e.CheckpointID, e.Subtask, e.Reason)
}
func (e Persisted) String() string { return fmt.Sprintf("persisted cp=%d", e.CheckpointID) }
func (e PersistFailed) String() string {
	return fmt.Sprintf("persist-failed cp=%d reason=%q", e.CheckpointID, e.Reason)
}
func (TriggerSavepoint) String() string {
	return "savepoint"
}
func (e StopWithSavepoint) String() string {
	if e.Terminate {
		return fmt.Sprintf("stop drain=%t terminate", e.Drain)
	}
	return fmt.Sprintf("stop drain=%t", e.Drain)
}
func (Cancel) String() string { return "cancel" }
func (e RestartsExhausted) String() string {
	return fmt.Sprintf("restarts-exhausted reason=%q", e.Reason)
}

// Action is an output of the Coordinator, read with Ready. The driver carries
// out the actions of one Ready in order, then calls Advance.
type Action interface {
	isAction()
	String() string
}

// TriggerCheckpoint starts checkpoint ID. The driver sends the trigger
// (checkpoint ID, Kind, Sync, Drain) to each subtask in Tasks; those start
// the checkpoint themselves (a source injects the barrier; a non-source
// whose predecessors have finished enqueues the barrier behind the data
// already in each input channel that has not delivered EndOfPartition, then
// snapshots and forwards it). The other subtasks of Wait receive the barrier
// from upstream. If a subtask in Tasks has finished and cannot take the
// trigger, report TriggerFailed.
//
// For a stop-with-savepoint the StopSources action of the same ID comes
// first and must reach each source subtask before this trigger does.
type TriggerCheckpoint struct {
	ID   int64
	Kind CheckpointKind
	// Sync: the stop-with-savepoint savepoint. Every subtask waits for
	// exactly this savepoint to complete and then closes.
	Sync bool
	// Drain: the stop-with-savepoint drains (the sources called finish()).
	Drain bool
	// Tick is the coordinator's time at the trigger.
	Tick int64
	// Tasks are the subtasks to trigger (TriggerPlan.Trigger).
	Tasks []SubtaskID
	// Wait are the subtasks whose acknowledgements complete the checkpoint
	// (TriggerPlan.Wait): every subtask not finished at plan time.
	Wait []SubtaskID
	// Finished are the subtasks finished at plan time; they count as
	// acknowledged and contribute no state.
	Finished []SubtaskID
	// FinishedOperators are the operators fully finished at plan time.
	FinishedOperators []string
}

// StopSources starts a stop-with-savepoint. The driver tells each source
// subtask in Tasks to end its input now: with Drain it emits MAX watermark,
// calls end_input and finish(); in both cases it emits EndOfData(Drain) and
// then waits for savepoint SavepointID (and only it) to complete before it
// closes. It must be delivered to a source before the TriggerCheckpoint of
// SavepointID, which always follows it in the same Ready; in practice both
// travel in one message so the barrier follows EndOfData on every channel.
type StopSources struct {
	SavepointID int64
	Drain       bool
	Tasks       []SubtaskID
}

// AckedState is one subtask's acknowledged snapshot within a checkpoint.
type AckedState struct {
	Subtask  SubtaskID
	StateRef string
	Size     int64
	// Finished: the subtask's operator had finished in this snapshot
	// (snapshot after a drained end of data, or deployed as finished).
	Finished bool
}

// PersistMetadata says that every subtask of checkpoint ID has acknowledged.
// The driver writes the checkpoint's metadata file atomically: it references
// the acknowledged states (already written by the subtasks) and records each
// operator's finished flag. The metadata file is the commit point: only once
// it is durable does the driver Step(Persisted{ID}); on failure,
// Step(PersistFailed{ID}). The coordinator emits NotifyComplete for ID only
// after Persisted, so a driver that performs actions in order can never
// announce a checkpoint that is not durable. Timeouts no longer apply to a
// checkpoint once its metadata is being persisted.
type PersistMetadata struct {
	ID          int64
	Kind        CheckpointKind
	TriggerTick int64
	// Acks are the acknowledged states, in subtask order.
	Acks []AckedState
	// Finished are the subtasks finished at trigger time: they have no state.
	Finished []SubtaskID
	// FullyFinished are the operators all of whose subtasks were finished at
	// trigger time or finished in their snapshot. Their state is only the
	// flag; on restore they are deployed as finished.
	FullyFinished []string
	// PartiallyFinished are the operators with some, not all, subtasks
	// finished. Their state is that of the acknowledged subtasks.
	PartiallyFinished []string
	// Size is the sum of the acknowledged sizes.
	Size int64
}

// NotifyComplete says checkpoint ID is complete and durable. The driver
// calls notify_checkpoint_complete on each subtask in Tasks (those that
// acknowledged and have not finished since): two-phase-commit sinks commit
// now. A subtask that acknowledged ID after its end of data (its final
// checkpoint) then closes and reports TaskFinished. Completing ID subsumes
// older pending checkpoints, which are aborted before this action.
type NotifyComplete struct {
	ID    int64
	Kind  CheckpointKind
	Tasks []SubtaskID
}

// AbortReason says why a checkpoint was aborted.
type AbortReason string

const (
	AbortDeclined          AbortReason = "declined"
	AbortTimeout           AbortReason = "timeout"
	AbortTriggerFailed     AbortReason = "trigger-failed"      // a subtask finished between plan and trigger
	AbortFinishedBeforeAck AbortReason = "finished-before-ack" // a waited-for subtask finished without acknowledging
	AbortUnionState        AbortReason = "union-state"         // union list state of a partially finished operator
	AbortSubsumed          AbortReason = "subsumed"            // a newer checkpoint completed first
	AbortSupersededByStop  AbortReason = "superseded-by-stop"  // stop-with-savepoint takes over as the final checkpoint
	AbortPersistFailed     AbortReason = "persist-failed"      // the metadata could not be written
	AbortJobFailover       AbortReason = "job-failover"        // a task failed or the job is failing over
	AbortJobTerminated     AbortReason = "job-terminated"      // canceled, or failed for good
	AbortNotReady          AbortReason = "not-ready"           // a subtask declined as not ready
)

// AbortReasons are every AbortReason (metrics export each from 0).
var AbortReasons = []AbortReason{AbortDeclined, AbortTimeout, AbortTriggerFailed, AbortFinishedBeforeAck, AbortUnionState,
	AbortSubsumed, AbortSupersededByStop, AbortPersistFailed, AbortJobFailover, AbortJobTerminated, AbortNotReady}

// AbortCheckpoint says checkpoint ID will never complete. The driver sends
// CancelCheckpoint(ID) to the subtasks in Tasks (those it waited for that
// have not finished) and deletes the states in Discard (acknowledged, never
// referenced by metadata). Counted reports whether it counted against
// Config.TolerableFailures. Subtasks waiting for a final checkpoint keep
// waiting for a later one.
type AbortCheckpoint struct {
	ID      int64
	Kind    CheckpointKind
	Reason  AbortReason
	Detail  string
	Counted bool
	// Operator is the operator the abort is about, when it is one
	// (union-state: the partially finished operator with union list state).
	Operator string
	Tasks    []SubtaskID
	Discard  []AckedState
}

// DiscardState says a late acknowledgement arrived for a checkpoint that no
// longer exists (aborted or failed over): the driver deletes the state.
type DiscardState struct {
	CheckpointID int64
	Subtask      SubtaskID
	StateRef     string
}

// FailJob says the job must fail: the driver applies the restart strategy,
// that is it restarts every subtask from the latest completed checkpoint
// or savepoint (reporting TaskRunning for each again), or gives up and
// reports RestartsExhausted. Err matches ErrTooManyCheckpointFailures or
// ErrStopWithSavepointFailed. Pending checkpoints were aborted before it.
type FailJob struct{ Err error }

// JobDone says every subtask has finished and no checkpoint is pending: the
// job ended in State (JobFinished, or JobStopped after stop-with-savepoint
// SavepointID).
type JobDone struct {
	State       JobState
	SavepointID int64
}

func (TriggerCheckpoint) isAction() {}
func (StopSources) isAction()       {}
func (PersistMetadata) isAction()   {}
func (NotifyComplete) isAction()    {}
func (AbortCheckpoint) isAction()   {}
func (DiscardState) isAction()      {}
func (FailJob) isAction()           {}
func (JobDone) isAction()           {}

func (a TriggerCheckpoint) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "trigger cp=%d %s", a.ID, a.Kind)
	writeFlag(&b, a.Sync, "sync")
	writeFlag(&b, a.Drain, "drain")
	fmt.Fprintf(&b, " tasks=%s wait=%s", ids(a.Tasks), ids(a.Wait))
	if len(a.Finished) > 0 {
		fmt.Fprintf(&b, " finished=%s", ids(a.Finished))
	}
	if len(a.FinishedOperators) > 0 {
		fmt.Fprintf(&b, " finished-ops=%s", strings.Join(a.FinishedOperators, ","))
	}
	return b.String()
}

func (a StopSources) String() string {
	return fmt.Sprintf("stop-sources sp=%d drain=%t tasks=%s", a.SavepointID, a.Drain, ids(a.Tasks))
}

func (a PersistMetadata) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "persist cp=%d %s acks=", a.ID, a.Kind)
	for i, s := range a.Acks {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(s.Subtask.String())
		if s.Finished {
			b.WriteString("(finished)")
		}
	}
	if len(a.Acks) == 0 {
		b.WriteByte('-')
	}
	if len(a.Finished) > 0 {
		fmt.Fprintf(&b, " finished=%s", ids(a.Finished))
	}
	if len(a.FullyFinished) > 0 {
		fmt.Fprintf(&b, " fully-finished=%s", strings.Join(a.FullyFinished, ","))
	}
	if len(a.PartiallyFinished) > 0 {
		fmt.Fprintf(&b, " partially-finished=%s", strings.Join(a.PartiallyFinished, ","))
	}
	fmt.Fprintf(&b, " size=%d", a.Size)
	return b.String()
}

func (a NotifyComplete) String() string {
	return fmt.Sprintf("notify-complete cp=%d %s tasks=%s", a.ID, a.Kind, ids(a.Tasks))
}

func (a AbortCheckpoint) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "abort cp=%d %s reason=%s", a.ID, a.Kind, a.Reason)
	if a.Detail != "" {
		fmt.Fprintf(&b, " (%s)", a.Detail)
	}
	writeFlag(&b, a.Counted, "counted")
	fmt.Fprintf(&b, " tasks=%s", ids(a.Tasks))
	if len(a.Discard) > 0 {
		b.WriteString(" discard=")
		for i, s := range a.Discard {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(s.Subtask.String())
		}
	}
	return b.String()
}

func (a DiscardState) String() string {
	return fmt.Sprintf("discard cp=%d %v state=%s", a.CheckpointID, a.Subtask, a.StateRef)
}

func (a FailJob) String() string { return "fail-job: " + a.Err.Error() }

func (a JobDone) String() string {
	if a.SavepointID != 0 {
		return fmt.Sprintf("job-done %s savepoint=%d", a.State, a.SavepointID)
	}
	return "job-done " + string(a.State)
}

func writeFlag(b *strings.Builder, on bool, name string) {
	if on {
		b.WriteByte(' ')
		b.WriteString(name)
	}
}

// ids formats subtasks as "a/0,a/1"; "-" when empty.
func ids(s []SubtaskID) string {
	if len(s) == 0 {
		return "-"
	}
	parts := make([]string, len(s))
	for i, id := range s {
		parts[i] = id.Operator + "/" + strconv.Itoa(id.Index)
	}
	return strings.Join(parts, ",")
}
