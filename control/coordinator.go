package control

import (
	"errors"
	"fmt"
	"slices"
)

// JobState is the job's lifecycle state (DESIGN.md "States"): the one
// vocabulary of job states, used by `streamd status` and `--json`, traces,
// metrics and the docs.
type JobState string

const (
	JobCreated    JobState = "created"    // subtasks are being deployed
	JobRunning    JobState = "running"    // all subtasks deployed
	JobFinishing  JobState = "finishing"  // all sources reached end of data; final checkpoint pending
	JobFinished   JobState = "finished"   // every subtask finished (terminal)
	JobRestarting JobState = "restarting" // failing over: waiting for all subtasks to run again
	JobFailed     JobState = "failed"     // the restart strategy gave up (terminal)
	JobStopping   JobState = "stopping"   // stop-with-savepoint in progress
	JobStopped    JobState = "stopped"    // stopped with a savepoint (terminal)
	JobCanceled   JobState = "canceled"   // canceled (terminal)
)

// Terminal reports whether the job can no longer change state.
func (s JobState) Terminal() bool {
	return s == JobFinished || s == JobFailed || s == JobStopped || s == JobCanceled
}

// SubtaskState is a subtask's lifecycle state (DESIGN.md "States"). These
// words are the one vocabulary of subtask states: the coordinator's, the
// runtime's Stats, `streamd status` and `--json`, traces and the docs.
type SubtaskState string

const (
	SubtaskScheduled        SubtaskState = "scheduled" // placed on a host, not deployed yet (deployed jobs)
	SubtaskDeploying        SubtaskState = "deploying"
	SubtaskRunning          SubtaskState = "running"
	SubtaskEndOfData        SubtaskState = "end-of-data"          // logic finished, waiting for its final checkpoint
	SubtaskDeployedFinished SubtaskState = "deployed-as-finished" // restored as finished, waiting for a checkpoint
	SubtaskFinished         SubtaskState = "finished"
	SubtaskFailed           SubtaskState = "failed"
	SubtaskCanceled         SubtaskState = "canceled"
)

// Errors returned by Step, always wrapped in a "control: job ...: ..." message
// with the details, and carried by FailJob.
var (
	ErrUnknownSubtask            = errors.New("unknown subtask")
	ErrUnexpectedEvent           = errors.New("event does not fit the subtask's or job's state")
	ErrUnknownCheckpoint         = errors.New("unknown checkpoint")
	ErrTooManyCheckpointFailures = errors.New("control: too many failed checkpoints")
	ErrStopWithSavepointFailed   = errors.New("control: stop-with-savepoint failed")
)

// Config tunes a Coordinator. Times are in ticks. Start from DefaultConfig:
// the zero value disables periodic checkpoints and the immediate final
// checkpoint.
type Config struct {
	// IntervalTicks between periodic checkpoint triggers; 0 disables periodic
	// checkpoints (savepoints and final checkpoints still work).
	IntervalTicks int64
	// TimeoutTicks after its trigger a checkpoint that is not complete is
	// aborted; 0 means never.
	TimeoutTicks int64
	// MaxConcurrent pending checkpoints (including the ones being persisted)
	// before a periodic or final checkpoint waits; at least 1.
	MaxConcurrent int
	// MinPauseTicks between the end (completion or abort) of a checkpoint
	// and the trigger of the next periodic or final one.
	MinPauseTicks int64
	// TolerableFailures is how many consecutive counted checkpoint failures
	// are tolerated; the next one fails the job. Negative: unlimited.
	TolerableFailures int
	// FinalCheckpointImmediately triggers a checkpoint as soon as every
	// running subtask has reached end of data, rather than at the next
	// interval.
	FinalCheckpointImmediately bool
	// FirstID is the ID of the first checkpoint (after a restore: the
	// restored ID + 1, so IDs never repeat); 0 means 1.
	FirstID int64
}

// DefaultConfig returns the defaults: a checkpoint every 10 ticks, timeout
// after 100, one at a time, no pause, 3 tolerable failures, immediate final
// checkpoint.
func DefaultConfig() Config {
	return Config{IntervalTicks: 10, TimeoutTicks: 100, MaxConcurrent: 1, TolerableFailures: 3, FinalCheckpointImmediately: true}
}

type subtask struct {
	id      SubtaskID
	state   SubtaskState
	drain   bool  // the EndOfData was drained: finish() ran
	eodAt   int64 // checkpoints with ID >= eodAt were triggered after its end of data
	closing bool  // a completed checkpoint it acked after end of data was notified: it closes
}

// atEndOfData reports whether the subtask has emitted EndOfData and not finished.
func (s *subtask) atEndOfData() bool {
	return s.state == SubtaskEndOfData || s.state == SubtaskDeployedFinished
}

type pendingCheckpoint struct {
	id         int64
	kind       CheckpointKind
	stop       bool // the stop-with-savepoint savepoint
	drain      bool
	tick       int64
	plan       TriggerPlan
	waiting    map[SubtaskID]bool // acks still missing
	acks       map[SubtaskID]AckedState
	union      map[string]bool // operators with union list state in an ack
	afterEOD   map[SubtaskID]bool
	persisting bool
	attempt    int // the job attempt it was triggered in
}

type stopRequest struct {
	drain     bool
	id        int64 // 0 until the savepoint is triggered
	completed bool
}

// Coordinator is the checkpoint coordinator of one job: a deterministic
// state machine in the style of etcd's raft. It owns no goroutine, clock or IO. The driver
//
//   - feeds it events with Step: Tick from its ticker, task state changes,
//     acknowledgements and declines from the subtasks, Persisted when the
//     metadata it was asked to write is durable, and user requests;
//   - reads the resulting actions with Ready, carries them out in order
//     (trigger, persist, notify, abort, fail, ...), and calls Advance.
//
// Protocol (aligned barriers, FLIP-147 "checkpoints after tasks finished"):
//
//  1. Trigger. A checkpoint is planned with PlanTrigger over the subtasks
//     that have not finished: the running subtasks nothing running can send
//     a barrier to are triggered, every running subtask is waited for, and
//     finished subtasks count as acknowledged. Periodic checkpoints start
//     every Config.IntervalTicks, no sooner than Config.MinPauseTicks after
//     the previous checkpoint ended, with at most Config.MaxConcurrent
//     pending, and only while every subtask is deployed.
//  2. Acknowledge. Each waited-for subtask acks (or declines). A subtask
//     that has reached end of data still acks normally; pending checkpoints
//     are not cancelled when subtasks reach end of data or finish. A subtask
//     finishing without acknowledging a checkpoint that waits for it aborts
//     that checkpoint (it finished between plan and trigger).
//  3. Complete. With every ack in, the coordinator asks the driver to
//     persist the metadata (PersistMetadata): operators are fully finished
//     when all their subtasks were finished at trigger time or finished in
//     their snapshot, partially finished when some were. If a partially
//     finished operator has union list state, the checkpoint is aborted
//     instead, without counting as a failure.
//  4. Notify. Only after Persisted does it emit NotifyComplete; subtasks
//     that took this snapshot after their end of data close afterwards.
//  5. Finish. A subtask at end of data waits for any checkpoint it
//     acknowledges after its end of data. When every running subtask has
//     reached end of data (and Config.FinalCheckpointImmediately), the
//     coordinator triggers that final checkpoint at once instead of waiting
//     for the interval: one checkpoint serves a whole chain of
//     two-phase-commit operators. When all subtasks have finished and no
//     checkpoint is pending, it emits JobDone.
//  6. Stop with savepoint. StopWithSavepoint aborts the pending checkpoints
//     that are not yet being persisted (reason superseded-by-stop, not a
//     failure) so that the savepoint is the one final checkpoint of every
//     subtask, including those already at end of data. If a checkpoint is
//     being persisted, the savepoint waits until it is persisted and the
//     subtasks it released have closed. Then it emits StopSources and the
//     savepoint's TriggerCheckpoint (Sync, Drain). If the savepoint fails in
//     any way, it emits FailJob with ErrStopWithSavepointFailed; when it
//     completes and all subtasks have closed, JobDone{JobStopped}.
//  7. Fail. Checkpoint failures (declines, timeouts, failed persists) count
//     against Config.TolerableFailures until a checkpoint completes; one
//     more fails the job (FailJob). A TaskFailed or FailJob aborts every
//     pending checkpoint and waits for all subtasks to run again. A
//     checkpoint whose metadata is being persisted is never aborted: it may
//     already be durable. Its Persisted or PersistFailed still counts after
//     a failover (it then notifies nobody), so the driver must learn its
//     outcome before it picks the checkpoint to restore from.
//
// A Coordinator is not safe for concurrent use; the driver serializes Step,
// Ready and Advance.
type Coordinator struct {
	g        *JobGraph
	cfg      Config
	now      int64
	state    JobState
	subtasks map[SubtaskID]*subtask
	order    []SubtaskID
	nextID   int64
	pending  []*pendingCheckpoint // ascending ID
	nextDue  int64
	lastEnd  int64
	ended    bool
	// triggerFailedAt is the tick of the latest checkpoint aborted
	// because its trigger failed (anyTriggerFailed: there was one). The final
	// checkpoint is not triggered again in that tick: a trigger that fails
	// at once (the attempt's subtasks gone) would otherwise trigger the
	// next one within the same step, forever, and the executor's loop
	// would never see the events that end the attempt.
	triggerFailedAt  int64
	anyTriggerFailed bool
	failures         int // consecutive counted failures
	latest           int64
	stop             *stopRequest
	attempt          int // incremented on every failover
	ready            []Action
}

// NewCoordinator returns a coordinator for g in state created, with every
// subtask deploying.
func NewCoordinator(g *JobGraph, cfg Config) (*Coordinator, error) {
	if g == nil || len(g.Vertices) == 0 {
		return nil, errors.New("control: coordinator needs a job graph with operators")
	}
	if cfg.IntervalTicks < 0 || cfg.TimeoutTicks < 0 || cfg.MinPauseTicks < 0 || cfg.FirstID < 0 {
		return nil, fmt.Errorf("control: job %q: checkpoint config: ticks and IDs must not be negative: %+v", g.Name, cfg)
	}
	if cfg.MaxConcurrent < 1 {
		return nil, fmt.Errorf("control: job %q: checkpoint config: max concurrent checkpoints must be at least 1, got %d", g.Name, cfg.MaxConcurrent)
	}
	c := &Coordinator{g: g, cfg: cfg, state: JobCreated, subtasks: make(map[SubtaskID]*subtask), nextID: max(cfg.FirstID, 1)}
	for _, id := range Subtasks(g) {
		c.subtasks[id] = &subtask{id: id, state: SubtaskDeploying}
		c.order = append(c.order, id)
	}
	return c, nil
}

// State returns the job state.
func (c *Coordinator) State() JobState { return c.state }

// Now returns the number of ticks seen.
func (c *Coordinator) Now() int64 { return c.now }

// LatestCompleted returns the ID of the latest completed (persisted)
// checkpoint or savepoint, 0 if none.
func (c *Coordinator) LatestCompleted() int64 { return c.latest }

// SubtaskStatus is one line of Status.
type SubtaskStatus struct {
	Subtask SubtaskID
	State   SubtaskState
}

// Status is a snapshot of the coordinator for `streamd status`.
type Status struct {
	Job             JobState
	Tick            int64
	Subtasks        []SubtaskStatus // in subtask order
	Pending         []int64         // pending checkpoint IDs, ascending
	LatestCompleted int64
}

// Status returns the current state of the job, its subtasks and checkpoints.
func (c *Coordinator) Status() Status {
	st := Status{Job: c.state, Tick: c.now, LatestCompleted: c.latest}
	for _, id := range c.order {
		st.Subtasks = append(st.Subtasks, SubtaskStatus{id, c.subtasks[id].state})
	}
	for _, p := range c.pending {
		st.Pending = append(st.Pending, p.id)
	}
	return st
}

// HasReady reports whether actions wait to be read.
func (c *Coordinator) HasReady() bool { return len(c.ready) > 0 }

// Ready returns the actions produced since the last Advance, in the order
// the driver must carry them out. It does not consume them.
func (c *Coordinator) Ready() []Action { return slices.Clone(c.ready) }

// Advance acknowledges that the driver has taken the actions last returned
// by Ready.
func (c *Coordinator) Advance() { c.ready = c.ready[:0] }

func (c *Coordinator) emit(a Action) { c.ready = append(c.ready, a) }

// Step applies one event. An error means the event does not fit the
// coordinator's state (an unknown subtask, a duplicate ack, a task event
// in the wrong order); the event is then ignored and the state is
// unchanged. Late acks, declines and trigger failures of checkpoints that
// no longer exist are normal and not errors. In a terminal job state every
// event is ignored (late acks still yield DiscardState).
func (c *Coordinator) Step(ev Event) error {
	switch ev.(type) {
	case TriggerSavepoint, StopWithSavepoint:
		if c.state != JobRunning && c.state != JobFinishing {
			what := "take a savepoint"
			if _, ok := ev.(StopWithSavepoint); ok {
				what = "stop with a savepoint"
			}
			return fmt.Errorf("control: job %q: cannot %s while the job is %s: %w", c.g.Name, what, c.state, ErrUnexpectedEvent)
		}
	}
	if c.state.Terminal() {
		if a, ok := ev.(Ack); ok && a.StateRef != "" {
			c.emit(DiscardState{a.CheckpointID, a.Subtask, a.StateRef})
		}
		return nil
	}
	var err error
	switch e := ev.(type) {
	case Tick:
		c.now++
		c.checkTimeouts()
	case TaskRunning:
		err = c.taskRunning(e)
	case TaskEndOfData:
		err = c.taskEndOfData(e)
	case TaskFinished:
		err = c.taskFinished(e)
	case TaskFailed:
		if _, err = c.subtask(e.Subtask); err == nil {
			c.failover(fmt.Sprintf("subtask %v failed: %s", e.Subtask, e.Reason), nil)
		}
	case Ack:
		err = c.ack(e)
	case Decline:
		err = c.decline(e)
	case TriggerFailed:
		err = c.triggerFailed(e)
	case Persisted:
		err = c.persisted(e.CheckpointID)
	case PersistFailed:
		p := c.find(e.CheckpointID)
		if p == nil || !p.persisting {
			return fmt.Errorf("control: job %q: persist failed for checkpoint %d, which is not being persisted: %w", c.g.Name, e.CheckpointID, ErrUnknownCheckpoint)
		}
		c.abort(p, AbortPersistFailed, e.Reason, true)
	case TriggerSavepoint:
		c.trigger(KindSavepoint, false, false)
	case StopWithSavepoint:
		err = c.stopWithSavepoint(e)
	case Cancel:
		c.terminate(JobCanceled, "job canceled")
	case RestartsExhausted:
		c.terminate(JobFailed, "restarts exhausted: "+e.Reason)
	default:
		return fmt.Errorf("control: job %q: unknown event %T", c.g.Name, ev)
	}
	if err != nil {
		return err
	}
	c.settle()
	return nil
}

func (c *Coordinator) subtask(id SubtaskID) (*subtask, error) {
	s := c.subtasks[id]
	if s == nil {
		return nil, fmt.Errorf("control: job %q: subtask %v: %w", c.g.Name, id, ErrUnknownSubtask)
	}
	return s, nil
}

func (c *Coordinator) badEvent(id SubtaskID, what string) error {
	return fmt.Errorf("control: job %q: subtask %v is %s: %s: %w", c.g.Name, id, c.subtasks[id].state, what, ErrUnexpectedEvent)
}

func (c *Coordinator) taskRunning(e TaskRunning) error {
	s, err := c.subtask(e.Subtask)
	if err != nil {
		return err
	}
	if s.state != SubtaskDeploying {
		return c.badEvent(e.Subtask, "reported running again")
	}
	s.state, s.closing = SubtaskRunning, false
	if e.DeployedFinished {
		s.state, s.drain, s.eodAt = SubtaskDeployedFinished, true, c.nextID
	}
	return nil
}

func (c *Coordinator) taskEndOfData(e TaskEndOfData) error {
	s, err := c.subtask(e.Subtask)
	if err != nil {
		return err
	}
	if s.state != SubtaskRunning {
		return c.badEvent(e.Subtask, "reported end of data but only a running subtask can reach it")
	}
	s.state, s.drain, s.eodAt = SubtaskEndOfData, e.Drain, c.nextID
	return nil
}

func (c *Coordinator) taskFinished(e TaskFinished) error {
	s, err := c.subtask(e.Subtask)
	if err != nil {
		return err
	}
	if s.state == SubtaskDeploying || s.state == SubtaskFinished {
		return c.badEvent(e.Subtask, "reported finished")
	}
	s.state, s.closing = SubtaskFinished, false
	// A checkpoint still waiting for it can never complete: it finished
	// between plan and trigger (or its trigger failure is yet to come).
	for _, p := range slices.Clone(c.pending) {
		if p.waiting[e.Subtask] && c.find(p.id) != nil {
			c.abort(p, AbortFinishedBeforeAck, fmt.Sprintf("subtask %v finished without acknowledging", e.Subtask), false)
		}
	}
	return nil
}

func (c *Coordinator) ack(e Ack) error {
	p := c.find(e.CheckpointID)
	if p == nil {
		if e.CheckpointID > 0 && e.CheckpointID < c.nextID {
			if e.StateRef != "" {
				c.emit(DiscardState{e.CheckpointID, e.Subtask, e.StateRef})
			}
			return nil
		}
		return fmt.Errorf("control: job %q: ack from %v for checkpoint %d that was never triggered: %w", c.g.Name, e.Subtask, e.CheckpointID, ErrUnknownCheckpoint)
	}
	s, err := c.subtask(e.Subtask)
	if err != nil {
		return err
	}
	if !p.waiting[e.Subtask] {
		if _, dup := p.acks[e.Subtask]; dup {
			return fmt.Errorf("control: job %q: duplicate ack from %v for checkpoint %d: %w", c.g.Name, e.Subtask, e.CheckpointID, ErrUnexpectedEvent)
		}
		return fmt.Errorf("control: job %q: ack from %v for checkpoint %d, which does not wait for it: %w", c.g.Name, e.Subtask, e.CheckpointID, ErrUnexpectedEvent)
	}
	if e.DeployedFinished && s.state != SubtaskDeployedFinished {
		return c.badEvent(e.Subtask, "acked as deployed finished")
	}
	if e.AfterEndOfData && !s.atEndOfData() {
		return c.badEvent(e.Subtask, "acked after end of data without reporting end of data first")
	}
	afterEOD := e.AfterEndOfData || e.DeployedFinished
	delete(p.waiting, e.Subtask)
	p.acks[e.Subtask] = AckedState{Subtask: e.Subtask, StateRef: e.StateRef, Size: e.Size, Finished: e.DeployedFinished || (afterEOD && s.drain)}
	p.afterEOD[e.Subtask] = afterEOD
	if e.UnionState {
		p.union[e.Subtask.Operator] = true
	}
	if len(p.waiting) == 0 {
		c.complete(p)
	}
	return nil
}

func (c *Coordinator) decline(e Decline) error {
	if _, err := c.subtask(e.Subtask); err != nil {
		return err
	}
	p := c.find(e.CheckpointID)
	if p == nil || p.persisting {
		return nil // already over
	}
	reason, counted, op := AbortDeclined, true, ""
	switch e.Kind {
	case DeclineUnionStatePartiallyFinished:
		reason, counted, op = AbortUnionState, false, e.Subtask.Operator
	case DeclineNotReady:
		reason, counted = AbortNotReady, false
	}
	c.abortAbout(p, reason, fmt.Sprintf("subtask %v: %s", e.Subtask, e.Reason), counted, op)
	return nil
}

func (c *Coordinator) triggerFailed(e TriggerFailed) error {
	if _, err := c.subtask(e.Subtask); err != nil {
		return err
	}
	p := c.find(e.CheckpointID)
	if p == nil || p.persisting {
		return nil
	}
	c.abort(p, AbortTriggerFailed, fmt.Sprintf("subtask %v: %s", e.Subtask, e.Reason), false)
	return nil
}

func (c *Coordinator) stopWithSavepoint(e StopWithSavepoint) error {
	c.state = JobStopping
	c.stop = &stopRequest{drain: e.Drain}
	for _, p := range slices.Clone(c.pending) {
		if !p.persisting {
			c.abort(p, AbortSupersededByStop, "the stop-with-savepoint savepoint is the final checkpoint", false)
		}
	}
	return nil
}

func (c *Coordinator) find(id int64) *pendingCheckpoint {
	for _, p := range c.pending {
		if p.id == id {
			return p
		}
	}
	return nil
}

func (c *Coordinator) remove(p *pendingCheckpoint) {
	c.pending = slices.DeleteFunc(c.pending, func(q *pendingCheckpoint) bool { return q == p })
}

// trigger plans and starts a checkpoint.
func (c *Coordinator) trigger(kind CheckpointKind, stop, drain bool) {
	plan := PlanTrigger(c.g, func(id SubtaskID) bool { return c.subtasks[id].state == SubtaskFinished })
	p := &pendingCheckpoint{
		id: c.nextID, kind: kind, stop: stop, drain: drain, tick: c.now, plan: plan,
		waiting: make(map[SubtaskID]bool), acks: make(map[SubtaskID]AckedState),
		union: make(map[string]bool), afterEOD: make(map[SubtaskID]bool), attempt: c.attempt,
	}
	c.nextID++
	for _, id := range plan.Wait {
		p.waiting[id] = true
	}
	if stop {
		var srcs []SubtaskID
		for _, id := range plan.Wait {
			if c.g.Vertex(id.Operator).IsSource() && c.subtasks[id].state == SubtaskRunning {
				srcs = append(srcs, id)
			}
		}
		c.stop.id = p.id
		c.emit(StopSources{SavepointID: p.id, Drain: drain, Tasks: srcs})
	}
	c.emit(TriggerCheckpoint{
		ID: p.id, Kind: kind, Sync: stop, Drain: drain, Tick: c.now,
		Tasks: plan.Trigger, Wait: plan.Wait, Finished: plan.Finished, FinishedOperators: plan.FullyFinished,
	})
	c.pending = append(c.pending, p)
	if len(p.waiting) == 0 {
		c.complete(p)
	}
}

// complete is called when every ack of p is in.
func (c *Coordinator) complete(p *pendingCheckpoint) {
	finished := make(map[string]int)
	for _, id := range p.plan.Finished {
		finished[id.Operator]++
	}
	for _, a := range p.acks {
		if a.Finished {
			finished[a.Subtask.Operator]++
		}
	}
	md := PersistMetadata{ID: p.id, Kind: p.kind, TriggerTick: p.tick, Finished: p.plan.Finished}
	for _, v := range c.g.Vertices {
		switch n := finished[v.UID]; {
		case n == v.Parallelism:
			md.FullyFinished = append(md.FullyFinished, v.UID)
		case n > 0:
			if p.union[v.UID] {
				c.abortAbout(p, AbortUnionState, fmt.Sprintf("operator %q has union list state and %d of %d subtasks finished", v.UID, n, v.Parallelism), false, v.UID)
				return
			}
			md.PartiallyFinished = append(md.PartiallyFinished, v.UID)
		}
	}
	for _, id := range c.order {
		if a, ok := p.acks[id]; ok {
			md.Acks = append(md.Acks, a)
			md.Size += a.Size
		}
	}
	p.persisting = true
	c.emit(md)
}

func (c *Coordinator) persisted(id int64) error {
	p := c.find(id)
	if p == nil || !p.persisting {
		return fmt.Errorf("control: job %q: checkpoint %d persisted but it was not being persisted: %w", c.g.Name, id, ErrUnknownCheckpoint)
	}
	c.remove(p)
	c.latest = max(c.latest, id)
	c.lastEnd, c.ended = c.now, true
	if p.kind == KindCheckpoint {
		c.failures = 0
	}
	// A completed checkpoint subsumes older pending checkpoints. Savepoints
	// neither subsume nor are subsumed: they stand apart from the chain.
	for _, q := range slices.Clone(c.pending) {
		if p.kind == KindCheckpoint && q.id < id && q.kind == KindCheckpoint && !q.persisting {
			c.abort(q, AbortSubsumed, fmt.Sprintf("checkpoint %d completed", id), false)
		}
	}
	var tasks []SubtaskID
	for _, sid := range c.order {
		if _, ok := p.acks[sid]; !ok || p.attempt != c.attempt {
			continue // the subtasks of an earlier attempt are gone
		}
		s := c.subtasks[sid]
		if s.state == SubtaskFinished || s.state == SubtaskDeploying {
			continue
		}
		tasks = append(tasks, sid)
		if p.afterEOD[sid] {
			s.closing = true
		}
	}
	if p.stop && c.stop != nil {
		c.stop.completed = true
	}
	c.emit(NotifyComplete{ID: id, Kind: p.kind, Tasks: tasks})
	return nil
}

// abort ends p without completing it. A stop-with-savepoint failure fails
// the job; counted failures beyond the tolerable number too.
func (c *Coordinator) abort(p *pendingCheckpoint, reason AbortReason, detail string, counted bool) {
	c.abortAbout(p, reason, detail, counted, "")
}

// abortAbout is abort of a checkpoint that failed because of operator op.
func (c *Coordinator) abortAbout(p *pendingCheckpoint, reason AbortReason, detail string, counted bool, op string) {
	counted = counted && p.kind == KindCheckpoint
	c.remove(p)
	c.lastEnd, c.ended = c.now, true
	if reason == AbortTriggerFailed {
		c.triggerFailedAt, c.anyTriggerFailed = c.now, true
	}
	a := AbortCheckpoint{ID: p.id, Kind: p.kind, Reason: reason, Detail: detail, Counted: counted, Operator: op}
	for _, id := range p.plan.Wait {
		if c.subtasks[id].state != SubtaskFinished && c.subtasks[id].state != SubtaskDeploying {
			a.Tasks = append(a.Tasks, id)
		}
	}
	for _, id := range c.order {
		if s, ok := p.acks[id]; ok && s.StateRef != "" {
			a.Discard = append(a.Discard, s)
		}
	}
	c.emit(a)
	switch {
	case p.stop && c.stop != nil && c.state == JobStopping:
		c.failover("", fmt.Errorf("%w: savepoint %d aborted: %s (%s)", ErrStopWithSavepointFailed, p.id, reason, detail))
	case counted:
		c.failures++
		if c.cfg.TolerableFailures >= 0 && c.failures > c.cfg.TolerableFailures {
			c.failover("", fmt.Errorf("%w: %d in a row, %d tolerated; last: checkpoint %d %s (%s)",
				ErrTooManyCheckpointFailures, c.failures, c.cfg.TolerableFailures, p.id, reason, detail))
		}
	}
}

// failover aborts everything pending and waits for all subtasks to be
// deployed again. With err it emits FailJob{err} (the coordinator decided
// the job fails); without, the failure came from a subtask (why says which).
func (c *Coordinator) failover(why string, err error) {
	if err != nil {
		why = err.Error()
	}
	c.stop = nil
	c.state = JobRestarting
	c.attempt++
	for _, p := range slices.Clone(c.pending) {
		if !p.persisting {
			c.abort(p, AbortJobFailover, why, false)
		}
	}
	for _, s := range c.subtasks {
		*s = subtask{id: s.id, state: SubtaskDeploying}
	}
	c.failures = 0
	if err != nil {
		c.emit(FailJob{Err: err})
	}
}

func (c *Coordinator) terminate(st JobState, why string) {
	c.stop = nil
	c.state = st
	for _, p := range slices.Clone(c.pending) {
		if !p.persisting {
			c.abort(p, AbortJobTerminated, why, false)
		}
	}
}

func (c *Coordinator) checkTimeouts() {
	if c.cfg.TimeoutTicks == 0 {
		return
	}
	for _, p := range slices.Clone(c.pending) {
		if !p.persisting && c.now-p.tick >= c.cfg.TimeoutTicks && c.find(p.id) != nil {
			c.abort(p, AbortTimeout, fmt.Sprintf("not complete %d ticks after its trigger", c.cfg.TimeoutTicks), true)
		}
	}
}

// settle moves the job state forward and triggers what is due.
func (c *Coordinator) settle() {
	if c.state == JobCreated || c.state == JobRestarting {
		for _, s := range c.subtasks {
			if s.state == SubtaskDeploying {
				return
			}
		}
		c.state = JobRunning
		c.nextDue = c.now + c.cfg.IntervalTicks
	}
	if c.state == JobRunning && c.sourcesEnded() {
		c.state = JobFinishing
	}
	c.maybeTrigger()
	c.maybeFinish()
}

func (c *Coordinator) sourcesEnded() bool {
	for _, id := range c.order {
		if s := c.subtasks[id]; c.g.Vertex(id.Operator).IsSource() && s.state == SubtaskRunning {
			return false
		}
	}
	return true
}

func (c *Coordinator) maybeTrigger() {
	anyClosing, anyActive := false, false
	for _, s := range c.subtasks {
		anyClosing = anyClosing || s.closing
		anyActive = anyActive || (s.state != SubtaskFinished && !s.closing)
	}
	persisting := false
	for _, p := range c.pending {
		persisting = persisting || p.persisting
	}
	switch {
	case c.state == JobStopping && c.stop.id == 0:
		// Wait until nothing else can complete and every subtask released by
		// a completed checkpoint has closed, so the savepoint's plan is exact.
		if !persisting && !anyClosing {
			c.trigger(KindSavepoint, true, c.stop.drain)
		}
		return
	case c.state == JobStopping && !c.stop.completed:
		return
	case c.state != JobRunning && c.state != JobFinishing && c.state != JobStopping:
		return
	}
	free := len(c.pending) < c.cfg.MaxConcurrent && (!c.ended || c.now >= c.lastEnd+c.cfg.MinPauseTicks)
	if !free || !anyActive {
		return
	}
	if c.cfg.FinalCheckpointImmediately && !anyClosing && c.needFinal() && (!c.anyTriggerFailed || c.now > c.triggerFailedAt) {
		c.trigger(KindCheckpoint, false, false)
		c.nextDue = c.now + c.cfg.IntervalTicks
		return
	}
	if c.cfg.IntervalTicks > 0 && c.now >= c.nextDue && c.state != JobStopping {
		c.trigger(KindCheckpoint, false, false)
		c.nextDue = c.now + c.cfg.IntervalTicks
	}
}

// needFinal reports whether every subtask that has not finished is at end
// of data, some of them still wait for a final checkpoint, and no pending
// checkpoint was triggered after the latest end of data.
func (c *Coordinator) needFinal() bool {
	waiting, last := false, int64(0)
	for _, s := range c.subtasks {
		switch {
		case s.state == SubtaskFinished || s.closing:
		case !s.atEndOfData():
			return false
		default:
			waiting, last = true, max(last, s.eodAt)
		}
	}
	if !waiting {
		return false
	}
	for _, p := range c.pending {
		if p.id >= last {
			return false
		}
	}
	return true
}

func (c *Coordinator) maybeFinish() {
	if c.state != JobRunning && c.state != JobFinishing && c.state != JobStopping {
		return
	}
	if len(c.pending) > 0 {
		return
	}
	for _, s := range c.subtasks {
		if s.state != SubtaskFinished {
			return
		}
	}
	if c.state == JobStopping {
		if !c.stop.completed {
			return
		}
		c.state = JobStopped
		c.emit(JobDone{State: JobStopped, SavepointID: c.stop.id})
		return
	}
	c.state = JobFinished
	c.emit(JobDone{State: JobFinished})
}
