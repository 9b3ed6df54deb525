package control

import (
	"errors"
	"fmt"
	"math"
	"slices"
)

// Lifecycle is the life of one job, whether `streamd run`, deployed on one
// host or spread over hosts (DESIGN.md "One lifecycle, one path"): its
// attempts, the restart strategy, which checkpoint or savepoint an attempt
// restores, stop, savepoint and cancel requests and the job state, around
// the job's Coordinator. Like the Coordinator it is a pure state machine:
// the job's loop (one goroutine per job, the only caller of Step) feeds it
// events and carries out its actions in order:
//
//   - StartAttempt: deploy every subtask of attempt Attempt, restored from
//     Restore (nil: fresh state). Events of earlier attempts must be
//     dropped from then on.
//   - CancelAttempt: tear the attempt down (its subtasks, on every host).
//     The loop reports AttemptEnded or AttemptFailed once they are gone.
//   - StopFailed: a stop-with-savepoint did not stop the job; tell whoever
//     asked (the savepoint may have been written: Savepoint).
//   - JobEnded: the job is over; nothing follows.
//   - and the Coordinator's actions (trigger, persist, notify, abort, ...),
//     except FailJob, which becomes CancelAttempt and a restart.
//
// Time is counted in ticks, as in the Coordinator; restart delays are ticks.
type Lifecycle struct {
	g       *JobGraph
	cfg     LifecycleConfig
	coord   *Coordinator // nil: the job does not checkpoint
	restart *RestartTracker
	now     int64

	state     JobState // the job state when it is not the coordinator's
	attempt   int
	executing bool  // the current attempt was started and has not ended
	waiting   bool  // restarting: the next attempt starts at restartAt
	restartAt int64 // tick
	// held: the next attempt (its number already counted) waits for the
	// outcome of the checkpoints being persisted (startAttempt).
	held  bool
	ended bool
	done  *JobDone // the coordinator's JobDone of the current attempt

	latest  *RestorePoint            // the latest completed checkpoint or savepoint
	kinds   map[int64]CheckpointKind // of the checkpoints being persisted
	stopReq *StopWithSavepoint       // a stop asked for before the job runs
	stopID  int64                    // the stop's savepoint, once triggered
	// terminate: a stop that must end the job was asked for
	// (StopWithSavepoint.Terminate): if it fails, the job is canceled.
	terminate bool
	// openReason, openStreak: the reason of the latest attempts that failed
	// in open (FailureInOpen), and how many in a row failed with it.
	openReason string
	openStreak int
	gaveUp     string // why a failed job was not restarted
	ready      []Action
}

// LifecycleConfig configures a Lifecycle.
type LifecycleConfig struct {
	// Checkpoint is the coordinator's configuration; nil: the job does not
	// checkpoint (nothing waits for a final checkpoint; a failure restarts
	// from the beginning).
	Checkpoint *Config
	Restart    RestartConfig
	// Seed makes the restart jitter deterministic.
	Seed uint64
	// FirstAttempt is the number of the first attempt.
	FirstAttempt int
	// From is the checkpoint or savepoint the job was deployed from; nil:
	// fresh state. For a job taken over by another controller (Adopt) it
	// is the latest completed checkpoint or savepoint the job had.
	From *RestorePoint
	// Adopt: attempt FirstAttempt already runs (a controller took the job
	// over from another, or from its own earlier run): StartJob emits no
	// StartAttempt; the attempt is executing and its subtasks report their
	// state again (TaskRunning, TaskEndOfData, TaskFinished) as if it had
	// just been deployed.
	Adopt bool
	// Restarts is the restart strategy's state carried over from the
	// controller that ran the job before (RestartTracker.State); nil: none.
	Restarts *RestartState
	// OpenFailureLimit: the job fails once this many attempts in a row
	// failed in open (FailureInOpen) with the same reason; 0:
	// DefaultOpenFailureLimit.
	OpenFailureLimit int
	// MaxLost bounds the restarts after attempts lost to causes outside the
	// job (AttemptLost: a lost host, an assignment a host refused), which
	// the restart strategy does not count: MaxLost of them in the job's
	// life (RestartState.Lost carries the count to another controller),
	// and the next lost attempt fails the job. 0: no bound. Attempts that
	// never ran (AttemptLost.Busy) count against nothing.
	MaxLost int
}

// RestorePoint is a completed checkpoint or savepoint an attempt restores.
type RestorePoint struct {
	ID       int64
	Kind     CheckpointKind
	Location string
}

func (p *RestorePoint) String() string {
	if p == nil {
		return "the beginning"
	}
	return fmt.Sprintf("%s %d", p.Kind, p.ID)
}

// Events the Lifecycle takes besides the Coordinator's.

// StartJob starts the job: the first attempt.
type StartJob struct{}

// AttemptFailed reports that attempt Attempt failed: a subtask failed (trap,
// channel gap), a host was lost, or the attempt could not be deployed.
// Subtask is the failing subtask when known. Class says whether a restart
// can fix it (ClassOf, at the edge where the error arose): a
// non-recoverable failure fails the job at once, and a failure in open
// fails it after OpenFailureLimit attempts in a row with the same Reason.
type AttemptFailed struct {
	Attempt int
	Subtask SubtaskID
	Reason  string
	Class   FailureClass
}

// AttemptEnded reports that every subtask of attempt Attempt has ended
// without an error (finished, stopped, or canceled on request).
type AttemptEnded struct{ Attempt int }

// AttemptLost reports that attempt Attempt ended for a reason outside the
// job (a lost host, an assignment a host refused): the job restarts at
// once, from the checkpoint the restore rule picks, without counting against
// its restart strategy; LifecycleConfig.MaxLost bounds such restarts.
// Busy: the attempt never ran (a host refused it for busy slots, or no host
// listened for it): it is placed again and counts against nothing.
type AttemptLost struct {
	Attempt int
	Reason  string
	Busy    bool
}

func (StartJob) isEvent()      {}
func (AttemptFailed) isEvent() {}
func (AttemptEnded) isEvent()  {}
func (AttemptLost) isEvent()   {}

func (StartJob) String() string { return "start" }
func (e AttemptFailed) String() string {
	s := fmt.Sprintf("attempt-failed %d", e.Attempt)
	if e.Subtask.Operator != "" {
		s += " " + e.Subtask.String()
	}
	if e.Class != FailureRestartable {
		s += " class=" + e.Class.String()
	}
	return s + fmt.Sprintf(" reason=%q", e.Reason)
}
func (e AttemptEnded) String() string { return fmt.Sprintf("attempt-ended %d", e.Attempt) }
func (e AttemptLost) String() string {
	s := fmt.Sprintf("attempt-lost %d", e.Attempt)
	if e.Busy {
		s += " busy"
	}
	return s + fmt.Sprintf(" reason=%q", e.Reason)
}

// Actions of the Lifecycle besides the Coordinator's.

// StartAttempt deploys attempt Attempt restored from Restore (nil: fresh).
type StartAttempt struct {
	Attempt int
	Restore *RestorePoint
}

// CancelAttempt tears attempt Attempt down; Reason says why. Err is the
// Coordinator's error when it failed the attempt (FailJob), else nil.
type CancelAttempt struct {
	Attempt int
	Reason  string
	Err     error
}

// StopFailed: the stop-with-savepoint in progress failed and the job goes on
// (restarting as its strategy says) or failed. Savepoint is the stop's
// savepoint when it was written before the failure.
type StopFailed struct {
	SavepointID int64
	Savepoint   *RestorePoint
	Reason      string
}

// JobEnded: the job is over in State (finished, stopped, failed, canceled).
// Savepoint is the stop's savepoint of a stopped job.
type JobEnded struct {
	State     JobState
	Reason    string
	Savepoint *RestorePoint
	// GaveUp, of a job failed by a failure no restart can fix, says why
	// ("no restart can fix it", "3 attempts in a row failed in open with
	// this error"); "" when the restart strategy gave up (Reason says why).
	GaveUp string
}

func (StartAttempt) isAction()  {}
func (CancelAttempt) isAction() {}
func (StopFailed) isAction()    {}
func (JobEnded) isAction()      {}

func (a StartAttempt) String() string {
	return fmt.Sprintf("start-attempt %d from=%s", a.Attempt, a.Restore)
}
func (a CancelAttempt) String() string {
	return fmt.Sprintf("cancel-attempt %d reason=%q", a.Attempt, a.Reason)
}
func (a StopFailed) String() string {
	s := fmt.Sprintf("stop-failed sp=%d", a.SavepointID)
	if a.Savepoint != nil {
		s += " written=" + a.Savepoint.Location
	}
	return s + fmt.Sprintf(" reason=%q", a.Reason)
}
func (a JobEnded) String() string {
	s := "job-ended " + string(a.State)
	if a.Savepoint != nil {
		s += " savepoint=" + a.Savepoint.Location
	}
	if a.Reason != "" {
		s += fmt.Sprintf(" reason=%q", a.Reason)
	}
	return s
}

// ErrNoCheckpointing refuses savepoints and stops of a job without checkpoints.
var ErrNoCheckpointing = errors.New("the job does not checkpoint (no checkpoint section)")

// NewLifecycle returns the lifecycle of job g, not started.
func NewLifecycle(g *JobGraph, cfg LifecycleConfig) (*Lifecycle, error) {
	if g == nil || len(g.Vertices) == 0 {
		return nil, errors.New("control: lifecycle needs a job graph with operators")
	}
	rt, err := NewRestartTracker(cfg.Restart, cfg.Seed)
	if err != nil {
		return nil, fmt.Errorf("control: job %q: %w", g.Name, err)
	}
	l := &Lifecycle{g: g, cfg: cfg, restart: rt, state: JobCreated, attempt: cfg.FirstAttempt, kinds: map[int64]CheckpointKind{}}
	if cfg.From != nil {
		from := *cfg.From
		l.latest = &from
	}
	if cfg.Restarts != nil {
		rt.restore(*cfg.Restarts)
	}
	if cfg.Checkpoint != nil {
		cc := *cfg.Checkpoint
		if cfg.From != nil && cc.FirstID <= cfg.From.ID {
			cc.FirstID = cfg.From.ID + 1 // ids never repeat those of the run it resumes
		}
		if l.coord, err = NewCoordinator(g, cc); err != nil {
			return nil, err
		}
	}
	return l, nil
}

// Coordinator is the job's checkpoint coordinator, nil without checkpointing.
// Read it (Status, LatestCompleted); step it only through the Lifecycle.
func (l *Lifecycle) Coordinator() *Coordinator { return l.coord }

// Attempt is the current (or last) attempt's number.
func (l *Lifecycle) Attempt() int { return l.attempt }

// Executing reports whether the current attempt runs: its events count.
func (l *Lifecycle) Executing() bool { return l.executing }

// Restarts is the number of restarts so far.
func (l *Lifecycle) Restarts() int { return l.restart.Restarts() }

// RestartState is the restart strategy's state now, to carry over to the
// lifecycle of a controller that takes the job over
// (LifecycleConfig.Restarts).
func (l *Lifecycle) RestartState() RestartState { return l.restart.State() }

// Latest is the latest completed checkpoint or savepoint (or the one the job
// was deployed from), nil if none.
func (l *Lifecycle) Latest() *RestorePoint { return l.latest }

// Ended reports whether the job is over.
func (l *Lifecycle) Ended() bool { return l.ended }

// State is the job state.
func (l *Lifecycle) State() JobState {
	if l.ended || l.coord == nil || l.waiting {
		return l.state
	}
	return l.coord.State()
}

// CanSavepoint reports whether a savepoint or a stop is taken now.
func (l *Lifecycle) CanSavepoint() bool {
	st := l.State()
	return l.coord != nil && !l.ended && (st == JobRunning || st == JobFinishing)
}

// HasReady reports whether actions wait to be read.
func (l *Lifecycle) HasReady() bool { return len(l.ready) > 0 }

// Ready returns the actions produced since the last Advance, in order.
func (l *Lifecycle) Ready() []Action { return slices.Clone(l.ready) }

// Advance drops the actions returned by Ready.
func (l *Lifecycle) Advance() { l.ready = l.ready[:0] }

func (l *Lifecycle) emit(a Action) { l.ready = append(l.ready, a) }

// Step applies one event: the lifecycle's own (StartJob, AttemptFailed,
// AttemptEnded), a user request (StopWithSavepoint, TriggerSavepoint,
// Cancel), a Tick, or a subtask's event for the Coordinator (the caller
// drops events of attempts other than Attempt()). An error means the event
// does not fit; nothing changed then.
func (l *Lifecycle) Step(ev Event) error {
	if l.ended {
		if a, ok := ev.(Ack); ok && l.coord != nil {
			return l.stepCoord(a) // late acks still yield DiscardState
		}
		return nil
	}
	switch e := ev.(type) {
	case StartJob:
		if l.executing || l.waiting || l.attempt != l.cfg.FirstAttempt || l.state != JobCreated {
			return fmt.Errorf("control: job %q: started twice: %w", l.g.Name, ErrUnexpectedEvent)
		}
		if l.cfg.Adopt {
			l.adoptAttempt()
			return nil
		}
		l.startAttempt()
		return nil
	case Tick:
		l.now++
		if l.coord != nil && !l.waiting {
			if err := l.stepCoord(e); err != nil {
				return err
			}
		}
		if l.waiting && l.now >= l.restartAt {
			l.attempt++
			l.startAttempt()
		}
		return nil
	case AttemptFailed:
		if e.Attempt != l.attempt || !l.executing {
			return nil // an earlier attempt's, or already handled
		}
		l.failed(e.Subtask, e.Reason, true, nil, l.noRestart(e))
		return nil
	case AttemptEnded:
		if e.Attempt != l.attempt || !l.executing {
			return nil
		}
		l.executing = false
		l.attemptEnded()
		return nil
	case AttemptLost:
		if e.Attempt != l.attempt || !l.executing {
			return nil
		}
		l.lost(e)
		return nil
	case RestartsExhausted:
		// The executor gives up.
		if l.coord != nil {
			_ = l.stepCoord(e)
		}
		if l.executing {
			l.emit(CancelAttempt{Attempt: l.attempt, Reason: e.Reason})
		}
		l.end(JobFailed, e.Reason, nil)
		return nil
	case StopWithSavepoint:
		return l.stopRequest(e)
	case TriggerSavepoint:
		if l.coord == nil {
			return fmt.Errorf("control: job %q: no savepoint: %w", l.g.Name, ErrNoCheckpointing)
		}
		if l.waiting {
			return fmt.Errorf("control: job %q: cannot take a savepoint while the job is %s: %w", l.g.Name, JobRestarting, ErrUnexpectedEvent)
		}
		return l.stepCoord(e)
	case Cancel:
		if l.coord != nil {
			_ = l.stepCoord(Cancel{})
		}
		if l.executing {
			l.emit(CancelAttempt{Attempt: l.attempt, Reason: "job canceled"})
		}
		l.end(JobCanceled, "canceled by request", nil)
		return nil
	case Persisted:
		if l.coord == nil {
			return fmt.Errorf("control: job %q: %s without checkpointing: %w", l.g.Name, ev, ErrUnexpectedEvent)
		}
		if err := l.stepCoord(e); err != nil {
			return err
		}
		kind := l.kinds[e.CheckpointID]
		delete(l.kinds, e.CheckpointID)
		if l.latest == nil || e.CheckpointID > l.latest.ID {
			l.latest = &RestorePoint{ID: e.CheckpointID, Kind: kind, Location: e.Location}
		}
		l.release()
		return nil
	}
	if l.coord == nil {
		return fmt.Errorf("control: job %q: %s without checkpointing: %w", l.g.Name, ev, ErrUnexpectedEvent)
	}
	if e, ok := ev.(PersistFailed); ok {
		err := l.stepCoord(ev) // its outcome counts after a failover too
		delete(l.kinds, e.CheckpointID)
		l.release()
		return err
	}
	if l.waiting || !l.executing {
		return nil // a straggler between attempts
	}
	return l.stepCoord(ev)
}

// stepCoord steps the coordinator and takes over its actions.
func (l *Lifecycle) stepCoord(ev Event) error {
	before := l.coord.State()
	err := l.coord.Step(ev)
	acts := l.coord.Ready()
	l.coord.Advance()
	var fail error
	for _, a := range acts {
		switch x := a.(type) {
		case FailJob:
			fail = x.Err // after the other actions (the aborts) went out
			continue
		case PersistMetadata:
			l.kinds[x.ID] = x.Kind
		case TriggerCheckpoint:
			if x.Sync {
				l.stopID = x.ID
			}
		case JobDone:
			d := x
			l.done = &d
		}
		l.emit(a)
	}
	if fail != nil && l.executing {
		l.failed(SubtaskID{}, fail.Error(), false, fail, l.noRestart(AttemptFailed{Reason: fail.Error(), Class: ClassOf(fail, false)}))
	}
	if err != nil {
		return err
	}
	if before != JobRunning && l.coord.State() == JobRunning && l.executing {
		l.restart.Running(l.now)
		if s := l.stopReq; s != nil {
			l.stopReq = nil
			return l.stepCoord(*s)
		}
	}
	return nil
}

// startAttempt starts attempt l.attempt, restored from the latest completed
// checkpoint or savepoint (StartAttempt).
//
// An attempt restores the latest completed checkpoint, so it waits while
// one is being persisted (held): its metadata may be in the store already.
// Restored from an older one instead, the attempt would produce again what
// the newer one's sinks hold pending, and remove their files as stale;
// the next restore, from the newer one, would then find them gone, or
// commit a second copy of records the attempt had committed.
func (l *Lifecycle) startAttempt() {
	if len(l.kinds) > 0 {
		l.held, l.waiting, l.restartAt, l.state = true, true, math.MaxInt64, JobRestarting
		return
	}
	l.held, l.waiting, l.executing, l.done, l.stopID = false, false, true, nil, 0
	if l.coord == nil {
		l.state = JobRunning
		l.restart.Running(l.now)
	} else if l.attempt == l.cfg.FirstAttempt {
		l.state = JobCreated
	}
	var from *RestorePoint
	if l.latest != nil && l.coord != nil {
		p := *l.latest
		from = &p
	}
	l.emit(StartAttempt{Attempt: l.attempt, Restore: from})
}

// release starts the held attempt once no checkpoint is being persisted.
func (l *Lifecycle) release() {
	if l.held && len(l.kinds) == 0 && !l.ended {
		l.startAttempt()
	}
}

// adoptAttempt takes the running attempt FirstAttempt over: executing, as
// after a StartAttempt, but nothing is deployed.
func (l *Lifecycle) adoptAttempt() {
	l.executing = true
	if l.coord == nil {
		l.state = JobRunning
		l.restart.Running(l.now)
	}
}

// noRestart says why no restart can fix failure e ("" when one may): it is
// non-recoverable, or the latest attempts all failed in open with its
// reason, OpenFailureLimit of them. It counts e among those attempts.
func (l *Lifecycle) noRestart(e AttemptFailed) string {
	switch e.Class {
	case FailureNonRecoverable:
		return ErrNonRecoverable.Error()
	case FailureInOpen:
		if e.Reason == l.openReason {
			l.openStreak++
		} else {
			l.openReason, l.openStreak = e.Reason, 1
		}
		limit := l.cfg.OpenFailureLimit
		if limit <= 0 {
			limit = DefaultOpenFailureLimit
		}
		if l.openStreak >= limit {
			return fmt.Sprintf("%s in a row failed in open with this error", restartPlural(l.openStreak, "attempt"))
		}
		return ""
	}
	l.openReason, l.openStreak = "", 0
	return ""
}

// failed handles the failure of the current attempt: the subtasks are torn
// down, then the job restarts as the strategy says or fails. toCoord: tell
// the coordinator (it did not decide the failure itself). final, when not
// "", says why no restart can fix it: the job fails at once.
func (l *Lifecycle) failed(sub SubtaskID, reason string, toCoord bool, err error, final string) {
	stopping := l.coord != nil && (l.coord.State() == JobStopping || l.stopID != 0 || l.stopReq != nil)
	if l.coord != nil && toCoord && l.coord.State() != JobRestarting {
		if sub.Operator == "" || l.coord.subtasks[sub] == nil {
			sub = l.coord.order[0] // the coordinator only needs to fail over
		}
		_ = l.stepCoord(TaskFailed{Subtask: sub, Reason: reason})
	}
	l.executing = false
	l.emit(CancelAttempt{Attempt: l.attempt, Reason: reason, Err: err})
	if stopping {
		l.stopFailed(reason)
	}
	if l.terminate && final == "" {
		l.canceledAfterStop(reason)
		return
	}
	var delay int64
	ok, why := false, final
	if final == "" {
		delay, ok, why = l.restart.Failed(l.now)
	}
	if !ok {
		if l.coord != nil {
			_ = l.stepCoord(RestartsExhausted{Reason: reason})
		}
		l.gaveUp = final
		l.end(JobFailed, fmt.Sprintf("attempt %d failed: %s (%s)", l.attempt, reason, why), nil)
		return
	}
	l.state, l.waiting, l.restartAt = JobRestarting, true, l.now+delay
	if delay == 0 {
		l.attempt++
		l.startAttempt()
	}
}

// stopFailed says that the stop in progress (or asked for) failed with the
// attempt, naming its savepoint if it was written, and drops the request.
func (l *Lifecycle) stopFailed(reason string) {
	sf := StopFailed{SavepointID: l.stopID, Reason: reason}
	if l.latest != nil && l.stopID != 0 && l.latest.ID == l.stopID {
		p := *l.latest
		sf.Savepoint = &p
	}
	l.emit(sf)
	l.stopReq = nil
}

// lost handles an attempt that ended for a reason outside the job: torn
// down and started again at once, not counted by the restart strategy.
func (l *Lifecycle) lost(e AttemptLost) {
	reason := e.Reason
	if l.coord != nil && l.coord.State() != JobRestarting {
		_ = l.stepCoord(TaskFailed{Subtask: l.coord.order[0], Reason: reason})
	}
	l.executing = false
	l.emit(CancelAttempt{Attempt: l.attempt, Reason: reason})
	if l.stopID != 0 || l.stopReq != nil {
		l.stopFailed(reason)
	}
	if l.terminate {
		l.canceledAfterStop(reason)
		return
	}
	if !e.Busy {
		if n := l.restart.lost; l.cfg.MaxLost > 0 && n >= l.cfg.MaxLost {
			if l.coord != nil {
				_ = l.stepCoord(RestartsExhausted{Reason: reason})
			}
			l.end(JobFailed, fmt.Sprintf("attempt %d failed: %s (%d failovers after lost or refusing hosts, the limit)", l.attempt, reason, n), nil)
			return
		}
		l.restart.lost++
	}
	l.attempt++
	l.startAttempt()
}

// canceledAfterStop ends the job canceled: a stop that must end it
// (StopWithSavepoint.Terminate) failed with the attempt (reason), and the
// job does not restart.
func (l *Lifecycle) canceledAfterStop(reason string) {
	if l.coord != nil {
		_ = l.stepCoord(Cancel{})
	}
	l.end(JobCanceled, fmt.Sprintf("canceled without a savepoint: the stop-with-savepoint failed: %s", reason), nil)
}

// attemptEnded: every subtask of the current attempt ended without error.
func (l *Lifecycle) attemptEnded() {
	switch {
	case l.coord == nil:
		l.end(JobFinished, "", nil)
	case l.done != nil && l.done.State == JobStopped:
		var sp *RestorePoint
		if l.latest != nil && l.latest.ID == l.done.SavepointID {
			p := *l.latest
			sp = &p
		}
		l.end(JobStopped, "", sp)
	case l.done != nil:
		l.end(JobFinished, "", nil)
	default:
		// Every subtask ended, yet the coordinator has not finished the
		// job: a subtask ended without reporting. A failure of the attempt.
		l.executing = true
		l.failed(SubtaskID{}, fmt.Sprintf("every subtask ended but the checkpoint coordinator has not finished the job (state %s)", l.coord.State()), true, nil, "")
	}
}

func (l *Lifecycle) stopRequest(e StopWithSavepoint) error {
	if l.coord == nil {
		return fmt.Errorf("control: job %q: no stop with a savepoint: %w", l.g.Name, ErrNoCheckpointing)
	}
	switch st := l.State(); {
	case st == JobStopping || l.stopReq != nil:
		if e.Terminate && !l.terminate {
			l.terminate = true // the stop in progress must end the job now
			return nil
		}
		return fmt.Errorf("control: job %q: a stop with a savepoint is already in progress: %w", l.g.Name, ErrUnexpectedEvent)
	case e.Terminate && (st == JobRestarting || (st == JobCreated && l.attempt != l.cfg.FirstAttempt)):
		// The job restarts: no savepoint can be taken, and none may ever be.
		if l.coord != nil {
			_ = l.stepCoord(Cancel{})
		}
		if l.executing {
			l.emit(CancelAttempt{Attempt: l.attempt, Reason: "stopped while restarting"})
		}
		l.end(JobCanceled, fmt.Sprintf("canceled without a savepoint: the job was %s when the stop was asked for", st), nil)
		return nil
	case st == JobCreated || st == JobRestarting:
		l.terminate = l.terminate || e.Terminate
		l.stopReq = &e // once every subtask runs
		return nil
	}
	l.terminate = l.terminate || e.Terminate
	return l.stepCoord(e)
}

func (l *Lifecycle) end(st JobState, reason string, sp *RestorePoint) {
	l.ended, l.executing, l.waiting, l.state = true, false, false, st
	l.emit(JobEnded{State: st, Reason: reason, Savepoint: sp, GaveUp: l.gaveUp})
}
