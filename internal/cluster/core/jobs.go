package core

import (
	"fmt"
	"reflect"
	"slices"
	"strings"

	"github.com/streamd/streamd/control"
)

// JobSpec is a job as the core needs it.
type JobSpec struct {
	ID string
	// Graph is the job at its declared parallelism; each vertex's
	// MinParallelism is the least it runs at (adaptive scheduling).
	Graph      *control.JobGraph
	Restart    control.RestartConfig
	Checkpoint *control.Config // nil: the job does not checkpoint
	// From is the checkpoint or savepoint it is deployed from; nil: fresh.
	From *control.RestorePoint
	Seed uint64
}

// Record is what the store keeps of a job: enough for another leader to
// adopt its running attempt or to start its next one.
type Record struct {
	Job  string
	Term uint64 // of the leader that wrote it
	Spec JobSpec
	// State is the job's state; Reason why, for a job that waits or ended.
	State  control.JobState
	Reason string
	// Attempt is the last attempt number used; Placement (nil: not placed)
	// the slots of attempt Attempt once it was placed: an attempt that may
	// run. A new leader adopts it, or starts Attempt+1.
	Attempt   int
	Placement []string
	// Slots is the parallelism the job runs (or is to run) at.
	Slots    int
	Latest   *control.RestorePoint
	Restarts *control.RestartState
}

func (r Record) String() string {
	s := fmt.Sprintf("%s term=%d attempt=%d %s p=%d", r.Job, r.Term, r.Attempt, r.State, r.Slots)
	if r.Placement != nil {
		s += " on=" + strings.Join(r.Placement, ",")
	}
	if r.Latest != nil {
		s += " latest=" + r.Latest.String()
	}
	return s
}

// Terminal reports whether the job is over.
func Terminal(st control.JobState) bool {
	switch st {
	case control.JobFinished, control.JobStopped, control.JobCanceled, control.JobFailed:
		return true
	}
	return false
}

type job struct {
	spec  JobSpec
	graph *control.JobGraph // at slots
	slots int
	life  *control.Lifecycle // nil: the job ended before this core had it
	state control.JobState   // of an ended job without a lifecycle
	// reason why it waits or ended.
	reason string

	start     *control.StartAttempt // started by the lifecycle, not placed yet
	attempt   int                   // of placement; the last one used
	placement []string              // nil: not placed
	parts     map[string]*part      // of the placed attempt, per host

	slotWait   int64 // since when fewer slots than it runs at are free (-1: not)
	moreSince  int64 // since when more slots are free for a scale-up (-1: not)
	rescaledAt int64

	// The store: the revision last seen, the version of the record (ver)
	// and the version durable; inFlight: a Persist awaits its result.
	rev, ver, durable uint64
	inFlight          bool
	retry             bool
	retryAt           int64   // no Persist before this tick
	saved             *Record // the record as last handed to Persist
	held              []heldAction
	shown             JobChanged
}

// part is a host's part of the placed attempt.
type part struct {
	ended    bool // the host reported its end (or was lost)
	assigned bool // the host took the assignment (or runs the adopted attempt)
	lost     bool
	asked    bool  // AskOutcome went out
	askedAt  int64 // when
}

// heldAction waits until version ver of the job's record is durable.
type heldAction struct {
	ver uint64
	a   Action
}

func (j *job) ref() AttemptRef { return AttemptRef{Job: j.spec.ID, Attempt: j.attempt} }

func (j *job) placedHere(ref AttemptRef, h string) bool {
	return j.placement != nil && ref.Attempt == j.attempt && j.parts[h] != nil
}

func (j *job) slotsOn(h string) int {
	n := 0
	for _, x := range j.placement {
		if x == h {
			n++
		}
	}
	return n
}

// jobState is the job's state; an attempt not placed yet, or whose hosts
// have not all taken their part, does not run (a job without checkpoints
// has no subtask reports to say so).
func (j *job) jobState() control.JobState {
	deploying := j.start != nil
	for _, p := range j.parts {
		deploying = deploying || !p.assigned
	}
	switch {
	case j.life == nil:
		return j.state
	case j.life.Ended() || !deploying:
	case j.attempt == 1:
		return control.JobCreated
	default:
		return control.JobRestarting
	}
	if st := j.life.State(); st != control.JobCreated || j.attempt == 1 {
		return st
	}
	return control.JobRestarting // a later attempt whose subtasks do not all run yet
}

// step steps the job's lifecycle and carries out its actions.
func (j *job) step(c *Core, ev control.Event) {
	if err := j.life.Step(ev); err != nil {
		j.reason = err.Error()
	}
	acts := j.life.Ready()
	j.life.Advance()
	for _, a := range acts {
		switch x := a.(type) {
		case control.StartAttempt:
			s := x
			j.start = &s
			j.attempt = max(j.attempt, x.Attempt)
		case control.CancelAttempt:
			j.cancelPlaced(c, x.Reason)
			j.start = nil
		case control.JobEnded:
			j.start, j.reason, j.placement, j.parts = nil, x.Reason, nil, nil
		default:
			c.emit(JobAction{Ref: AttemptRef{Job: j.spec.ID, Attempt: j.life.Attempt()}, Action: a})
		}
	}
}

// cancelPlaced tears the placed attempt down on its hosts; their slots stay
// held until each confirms.
func (j *job) cancelPlaced(c *Core, reason string) {
	if j.placement == nil {
		return
	}
	held := j.held[:0]
	for _, h := range j.held {
		if a, ok := h.a.(Assign); ok && a.Ref == j.ref() {
			c.release(a.Host, a.Ref) // never sent: nothing to cancel there
			j.parts[a.Host].ended = true
			continue
		}
		held = append(held, h)
	}
	j.held = held
	for _, h := range hostsOf(j.placement) {
		if p := j.parts[h]; !p.ended {
			c.emit(CancelAttempt{Ref: j.ref(), Term: c.term, Host: h, Reason: reason})
		}
	}
	j.placement, j.parts = nil, nil
}

func hostsOf(p []string) []string {
	out := slices.Clone(p)
	slices.Sort(out)
	return slices.Compact(out)
}

// newLifecycle makes j's lifecycle on its graph at `slots` slots; attempt,
// from and restarts carry over from the one before (a rescale, a
// takeover). adopt: attempt runs already.
func (j *job) newLifecycle(slots, attempt int, from *control.RestorePoint, restarts *control.RestartState, adopt bool) error {
	g, err := scaleGraph(j.spec.Graph, slots)
	if err != nil {
		return err
	}
	l, err := control.NewLifecycle(g, control.LifecycleConfig{Checkpoint: j.spec.Checkpoint, Restart: j.spec.Restart, Seed: j.spec.Seed,
		FirstAttempt: attempt, From: from, Restarts: restarts, Adopt: adopt})
	if err != nil {
		return err
	}
	j.graph, j.slots, j.life = g, slots, l
	return nil
}

// scaleGraph is g with every vertex at min(declared, slots).
func scaleGraph(g *control.JobGraph, slots int) (*control.JobGraph, error) {
	if slots >= control.SlotsNeeded(g) {
		return g, nil
	}
	vs := make([]*control.Vertex, len(g.Vertices))
	for i, v := range g.Vertices {
		x := *v
		x.Parallelism = control.ScaledParallelism(control.Bounds{Declared: v.Parallelism, Min: v.MinParallelism}, slots)
		x.MinParallelism = min(x.MinParallelism, x.Parallelism)
		x.Inputs = slices.Clone(v.Inputs)
		vs[i] = &x
	}
	return control.NewJobGraph(g.Name, vs)
}

// ---- requests ----

func (c *Core) deploy(e Deploy) {
	reply := Reply{Request: e.Request, Job: e.Spec.ID}
	switch {
	case !c.acting():
		reply.Code, reply.Msg = CodeUnavailable, "this controller does not lead"
	case e.Spec.ID == "" || e.Spec.Graph == nil:
		reply.Code, reply.Msg = CodeBadRequest, "deploy: the job needs an id and a graph"
	case c.jobs[e.Spec.ID] != nil:
		reply.Code, reply.Msg = CodeConflict, fmt.Sprintf("job %s exists", e.Spec.ID)
	}
	if reply.Code != "" {
		c.emit(reply)
		return
	}
	j := &job{spec: e.Spec, slotWait: -1, moreSince: -1, rescaledAt: c.now}
	slots, _, _ := control.AdaptiveSlots(control.VertexBounds(e.Spec.Graph), control.SlotsNeeded(e.Spec.Graph))
	if err := j.newLifecycle(slots, 1, e.Spec.From, nil, false); err != nil {
		c.emit(Reply{Request: e.Request, Job: e.Spec.ID, Code: CodeBadRequest, Msg: err.Error()})
		return
	}
	c.jobs[j.spec.ID] = j
	c.order = append(c.order, j.spec.ID)
	j.step(c, control.StartJob{})
	c.flushJob(j) // the record first: the reply says the job is durable
	j.held = append(j.held, heldAction{ver: j.ver, a: reply})
}

func (c *Core) cancelJob(e CancelJob) {
	j := c.jobs[e.Job]
	switch {
	case !c.acting():
		c.emit(Reply{Request: e.Request, Job: e.Job, Code: CodeUnavailable, Msg: "this controller does not lead"})
	case j == nil:
		c.emit(Reply{Request: e.Request, Job: e.Job, Code: CodeNotFound, Msg: fmt.Sprintf("no job %s", e.Job)})
	case j.life == nil || j.life.Ended():
		c.emit(Reply{Request: e.Request, Job: e.Job, Code: CodeConflict, Msg: fmt.Sprintf("job %s is %s", e.Job, j.jobState())})
	default:
		j.step(c, control.Cancel{})
		c.flushJob(j)
		j.held = append(j.held, heldAction{ver: j.ver, a: Reply{Request: e.Request, Job: e.Job}})
	}
}

// ---- reports ----

func (c *Core) report(e AttemptReport) {
	j := c.jobs[e.Ref.Job]
	if e.Task == nil {
		c.release(e.Host, e.Ref) // its part ended there
	}
	if j == nil || j.life == nil || !c.acting() || j.placement == nil || e.Ref.Attempt != j.attempt {
		return // of an earlier attempt, or one this core does not want
	}
	if e.Task != nil {
		j.step(c, e.Task)
		return
	}
	p := j.parts[e.Host]
	if p == nil || p.ended {
		return
	}
	switch {
	case e.Failed != "":
		p.ended = true
		j.step(c, control.AttemptFailed{Attempt: e.Ref.Attempt, Subtask: e.Subtask, Reason: fmt.Sprintf("on host %s: %s", e.Host, e.Failed), Class: e.Class})
	case e.Ended:
		p.ended = true
		for _, q := range j.parts {
			if !q.ended {
				return
			}
		}
		j.step(c, control.AttemptEnded{Attempt: e.Ref.Attempt})
	}
}

func (c *Core) assignResult(e AssignResult) {
	h := c.hosts[e.Host]
	if h == nil {
		return
	}
	if e.Err == "" {
		if hd := h.holds[e.Ref]; hd != nil {
			hd.settled = true
		}
		if j := c.jobs[e.Ref.Job]; j != nil && j.placedHere(e.Ref, e.Host) {
			j.parts[e.Host].assigned = true
		}
		return
	}
	c.release(e.Host, e.Ref)
	j := c.jobs[e.Ref.Job]
	if j == nil || j.life == nil || !c.acting() || !j.placedHere(e.Ref, e.Host) {
		return
	}
	// Not the job's failure: placed again elsewhere (no placing on that
	// host for a heartbeat timeout), not counted by the restart strategy.
	h.refused = c.now + c.cfg.HeartbeatTimeout
	j.parts[e.Host].ended = true
	j.step(c, control.AttemptLost{Attempt: e.Ref.Attempt, Reason: fmt.Sprintf("host %s refused the assignment: %s", e.Host, e.Err)})
}

// ---- placement ----

// schedule places the attempts the lifecycles started, oldest job first,
// on the parallelism the free slots allow.
func (c *Core) schedule() {
	if len(c.awaiting) > 0 && c.now < c.adoptUntil {
		return
	}
	c.awaiting = map[string]bool{}
	for _, id := range c.order {
		j := c.jobs[id]
		if j.start == nil || j.life == nil || j.life.Ended() {
			continue
		}
		if c.holding(id) {
			// The slots of its earlier attempt are not confirmed free yet:
			// they are its own, no later job takes them meanwhile.
			j.reason = "waiting for the hosts of its earlier attempt to confirm its end"
			break
		}
		free := c.free()
		total := totalFree(free)
		slots, declared, least := control.AdaptiveSlots(control.VertexBounds(j.spec.Graph), total)
		switch {
		case slots == 0:
			j.slotWait = -1
			j.reason = fmt.Sprintf("waiting for slots: %d free, it runs on no fewer than %d (declared %d)", total, least, declared)
			continue
		case slots < j.slots:
			if j.slotWait < 0 {
				j.slotWait = c.now
			}
			if at := j.slotWait + c.cfg.SlotWait; c.now < at {
				j.reason = fmt.Sprintf("waiting for slots: %d free, runs at parallelism %d at tick %d unless more are free", total, slots, at)
				continue
			}
			if !c.rescale(j, slots) {
				continue
			}
		case slots > j.slots:
			if !c.rescale(j, slots) {
				continue
			}
		}
		j.slotWait = -1
		p, err := control.Schedule(free, j.slots, false)
		if err != nil {
			j.reason = "waiting for slots: " + err.Error()
			continue
		}
		c.place(j, p.Slots)
	}
}

// holding reports whether a host holds slots for an attempt of job id.
func (c *Core) holding(id string) bool {
	for _, h := range c.hosts {
		for ref := range h.holds {
			if ref.Job == id {
				return true
			}
		}
	}
	return false
}

// rescale makes j's lifecycle anew at `slots` slots, carrying its pending
// attempt, restore point and restart state over.
func (c *Core) rescale(j *job, slots int) bool {
	st, old := *j.start, j.life
	rs := old.RestartState()
	if err := j.newLifecycle(slots, st.Attempt, st.Restore, &rs, false); err != nil {
		j.reason = fmt.Sprintf("cannot run at parallelism %d: %v", slots, err)
		return false
	}
	j.rescaledAt, j.moreSince = c.now, -1
	j.step(c, control.StartJob{})
	return j.start != nil
}

// place puts j's pending attempt on slots p: the record naming it is
// persisted, then the assignments go out.
func (c *Core) place(j *job, p []string) {
	st := *j.start
	j.start, j.attempt, j.placement, j.parts = nil, st.Attempt, p, map[string]*part{}
	j.reason = ""
	for _, h := range hostsOf(p) {
		j.parts[h] = &part{}
		c.hosts[h].holds[j.ref()] = &hold{slots: j.slotsOn(h)}
	}
	c.flushJob(j)
	for _, h := range hostsOf(p) {
		var idx []int
		for i, x := range p {
			if x == h {
				idx = append(idx, i)
			}
		}
		j.held = append(j.held, heldAction{ver: j.ver, a: Assign{Ref: j.ref(), Term: c.term, Host: h, Graph: j.graph, Placement: slices.Clone(p), Slots: idx, Restore: st.Restore}})
	}
}

// scaleUp restarts each running job that runs below its declared
// parallelism on more slots once they have been free for SlotWait (and
// RescaleInterval passed since its last rescale), from its latest
// checkpoint, as Flink's adaptive scheduler does. The lifecycle sees the
// attempt lost (not counted by its restart strategy). Jobs without
// checkpoints are left as they are: a restart would lose their progress.
func (c *Core) scaleUp() {
	free := totalFree(c.free())
	for _, id := range c.order {
		j := c.jobs[id]
		if j.life == nil || j.life.Coordinator() == nil || j.life.State() != control.JobRunning || j.placement == nil {
			j.moreSince = -1
			continue
		}
		slots, declared, _ := control.AdaptiveSlots(control.VertexBounds(j.spec.Graph), free+j.slots)
		if slots <= j.slots {
			j.moreSince = -1
			continue
		}
		if j.moreSince < 0 {
			j.moreSince = c.now
		}
		if c.now-j.moreSince < c.cfg.SlotWait || c.now-j.rescaledAt < c.cfg.RescaleInterval {
			continue
		}
		free -= slots - j.slots
		j.step(c, control.AttemptLost{Attempt: j.attempt, Reason: fmt.Sprintf("rescale: %d more slot(s) free, declared %d", slots-j.slots, declared)})
	}
}

// ---- the store ----

func (c *Core) record(j *job) Record {
	r := Record{Job: j.spec.ID, Term: c.term, Spec: j.spec, State: j.jobState(), Reason: j.reason, Attempt: j.attempt, Slots: j.slots}
	if j.placement != nil {
		r.Placement = slices.Clone(j.placement)
	}
	if j.life != nil {
		r.Latest = j.life.Latest()
		rs := j.life.RestartState()
		r.Restarts = &rs
	}
	return r
}

// flush persists every job whose record changed and says which changed.
func (c *Core) flush() {
	for _, id := range c.order {
		j := c.jobs[id]
		c.flushJob(j)
		ch := JobChanged{Job: id, State: j.jobState(), Slots: j.slots, Reason: j.reason}
		if ch != j.shown {
			j.shown = ch
			c.emit(ch)
		}
	}
}

// flushJob persists j's record if it changed since it was last handed to
// Persist, one Persist of a job at a time.
func (c *Core) flushJob(j *job) {
	if j.life == nil {
		return // ended before this leader took it: its record stays
	}
	r := c.record(j)
	if j.saved == nil || !reflect.DeepEqual(*j.saved, r) {
		j.saved = &r
		j.ver++
	}
	if j.inFlight || c.now < j.retryAt || (j.durable == j.ver && !j.retry) {
		return
	}
	j.inFlight, j.retry = true, false
	c.emit(Persist{Record: *j.saved, Ver: j.ver, Rev: j.rev})
}

func (c *Core) storeResult(e StoreResult) {
	j := c.jobs[e.Job]
	if j == nil || !j.inFlight || c.Term() == 0 {
		return
	}
	j.inFlight = false
	switch {
	case e.OK:
		j.rev, j.durable = e.Rev, e.Ver
		keep := j.held[:0]
		for _, h := range j.held {
			if h.ver <= j.durable {
				c.emit(h.a)
			} else {
				keep = append(keep, h)
			}
		}
		j.held = keep
	case e.Err != "":
		j.retry, j.retryAt = true, c.now+1 // the store could not be reached: written again next tick
	case e.Term > c.term:
		c.depose(fmt.Sprintf("job %s was written in term %d, later than this one's %d", e.Job, e.Term, c.term))
	case e.Term == c.term:
		c.depose(fmt.Sprintf("job %s was written by another controller in term %d (revision %d is not the latest)", e.Job, c.term, j.rev))
	default:
		// A record of an earlier leader that had not stopped yet: this
		// leader's replaces it.
		j.rev, j.retry = e.Rev, true
	}
}

// ---- taking the lead ----

func (c *Core) tableLoaded(recs []Stored) {
	for _, s := range recs {
		if s.Record.Term > c.term {
			// Read late: a later leader wrote already.
			c.depose(fmt.Sprintf("job %s was written in term %d, later than this one's %d", s.Record.Job, s.Record.Term, c.term))
			return
		}
	}
	c.loading = false
	c.adoptUntil = c.now + c.cfg.AdoptWait
	for _, s := range recs {
		c.take(s)
	}
	// Hosts fence older terms from now on, and report the state of the
	// attempts they run to this leader, which has their jobs now.
	c.emit(Announce{ID: c.cfg.ID, Term: c.term})
}

// take makes the job of a stored record this leader's: an attempt that was
// placed is adopted (its hosts' heartbeats confirm it), one that was not is
// started anew with the next attempt number. Every live record is written
// again in this term, so a deposed leader's later write fails.
func (c *Core) take(s Stored) {
	r := s.Record
	if c.jobs[r.Job] != nil {
		return
	}
	j := &job{spec: r.Spec, rev: s.Rev, attempt: r.Attempt, slots: r.Slots, state: r.State, reason: r.Reason, slotWait: -1, moreSince: -1, rescaledAt: c.now}
	c.jobs[r.Job] = j
	c.order = append(c.order, r.Job)
	if Terminal(r.State) {
		j.saved = &r
		j.ver, j.durable = 1, 1
		return
	}
	adopt := r.Placement != nil
	attempt := r.Attempt
	if !adopt {
		attempt++
	}
	if err := j.newLifecycle(r.Slots, attempt, r.Latest, r.Restarts, adopt); err != nil {
		j.state, j.reason = control.JobFailed, fmt.Sprintf("controller term %d could not take the job over: %v", c.term, err)
		return
	}
	if adopt {
		j.placement, j.parts = slices.Clone(r.Placement), map[string]*part{}
		for _, h := range hostsOf(r.Placement) {
			j.parts[h] = &part{assigned: true}
			hs := c.hosts[h]
			if hs == nil {
				hs = &host{id: h, lastSeen: c.now, holds: map[AttemptRef]*hold{}, canceled: map[AttemptRef]int64{}}
				c.hosts[h] = hs
			}
			c.awaiting[h] = true
			hs.holds[j.ref()] = &hold{slots: j.slotsOn(h), settled: true}
		}
	}
	j.step(c, control.StartJob{})
}

// recordSeen: a record of a later term means another controller leads;
// one of an earlier term, of a job this leader does not know, was written
// by the previous leader before it stopped: taken as if it had been in
// the table.
func (c *Core) recordSeen(s Stored) {
	if !c.acting() || s.Record.Term == c.term {
		return
	}
	if s.Record.Term > c.term {
		c.depose(fmt.Sprintf("job %s was written in term %d, later than this one's %d", s.Record.Job, s.Record.Term, c.term))
		return
	}
	if c.jobs[s.Record.Job] == nil {
		c.take(s)
	}
}
