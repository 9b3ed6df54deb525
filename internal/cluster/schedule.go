package cluster

// Scheduling: the hosts' slots, placing jobs on them, assigning and
// canceling attempts, failing attempts over and ending jobs (all with
// Controller.mu held; the effects run after it is released).

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"time"

	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/internal/cluster/wire"
	"github.com/streamd/streamd/internal/runtime"
	"github.com/streamd/streamd/internal/telemetry"
)

func (c *Controller) hostIDs() []string {
	ids := make([]string, 0, len(c.hosts))
	for id := range c.hosts {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// freeSlotsLocked is each alive host's capacity and free slots: those no
// attempt holds (ctlHost.busy), so a slot of a failed or canceled attempt is
// free only once the controller has seen it freed.
func (c *Controller) freeSlotsLocked() []control.HostSlots {
	var out []control.HostSlots
	for _, id := range c.hostIDs() {
		h := c.hosts[id]
		if !h.lost {
			used := 0
			for _, u := range h.busy {
				used += u.slots
			}
			out = append(out, control.HostSlots{ID: id, Capacity: h.slots, Free: h.slots - used})
		}
	}
	return out
}

// holdLocked records that the current attempt of j holds its slots of p.
func (c *Controller) holdLocked(j *ctlJob, p control.Placement) {
	ref := wire.AttemptRef{JobID: j.id, Attempt: j.attempt}
	for _, id := range p.Slots {
		h := c.hosts[id]
		if h == nil {
			continue
		}
		u := h.busy[ref]
		if u == nil {
			u = &slotUse{}
			h.busy[ref] = u
		}
		u.slots++
	}
}

// releaseLocked frees the slots attempt ref holds on host id; ended: the
// host confirmed the attempt's end there. It reports whether slots were
// freed (then scheduleLocked may place waiting jobs).
func (c *Controller) releaseLocked(id string, ref wire.AttemptRef, ended bool, now time.Time, why string) bool {
	h := c.hosts[id]
	if h == nil {
		return false
	}
	if ended {
		h.ended[ref] = now
		for r, t := range h.ended {
			if now.Sub(t) > time.Minute {
				delete(h.ended, r)
			}
		}
	}
	u := h.busy[ref]
	if u == nil {
		return false
	}
	delete(h.busy, ref)
	c.log.Debug("slots freed", "host", id, "job", ref.JobID, "attempt", ref.Attempt, "slots", u.slots, "why", why)
	return true
}

// settleLocked notes that the assignment of ref to host id was answered
// (or failed without an answer).
func (c *Controller) settleLocked(id string, ref wire.AttemptRef, now time.Time) {
	if h := c.hosts[id]; h != nil {
		if u := h.busy[ref]; u != nil && u.settled.IsZero() {
			u.settled = now
		}
	}
}

// slotsFreed releases ref's slots on host id after the host confirmed its
// end outside an event (a cancel it answered), and places waiting jobs.
func (c *Controller) slotsFreed(id string, ref wire.AttemptRef, why string) {
	now := time.Now()
	c.mu.Lock()
	var effects []effect
	if c.releaseLocked(id, ref, true, now, why) {
		effects = c.scheduleLocked(now)
	}
	c.mu.Unlock()
	c.run(effects)
}

// changedLocked wakes the requests waiting on a change of j.
// The job's record is saved with every such change.
func (c *Controller) changedLocked(j *ctlJob) {
	close(j.changed)
	j.changed = make(chan struct{})
	c.saveLocked(j)
}

// scheduleLocked places waiting jobs, oldest first, and returns the
// assignments to send.
func (c *Controller) scheduleLocked(now time.Time) []effect {
	if c.term == 0 || c.closed || c.adoptionLocked(now) {
		return nil
	}
	var effects []effect
	for _, jid := range c.order {
		j := c.jobs[jid]
		if j.placement != nil || j.canceling || j.preparing || (j.state != wire.JobCreated && j.state != wire.JobRestarting) || now.Before(j.restartAt) {
			continue
		}
		if j.dist != nil && j.dist.startedAttempt() < j.attempt {
			continue // the job's lifecycle has not restarted it yet (failLocked)
		}
		free := c.freeSlotsLocked()
		rescaled, why := c.adaptLocked(j, now, free)
		if rescaled {
			free = c.freeSlotsLocked()
		}
		p, err := control.Schedule(free, j.slots, false)
		switch {
		case err != nil:
			reason := fmt.Sprintf("waiting for slots: %v", err)
			if why != "" {
				reason += "; " + why
			}
			if j.reason != reason {
				if !strings.HasPrefix(j.reason, "waiting for slots") {
					c.log.Info("job waits for slots", "job", j.id, "reason", reason)
				}
				j.reason, j.updated = reason, now
			}
			continue
		}
		if j.dist == nil {
			// Its controller side opens the checkpoint store (IO): set up
			// outside the mutex, then the job is scheduled again.
			j.preparing = true
			effects = append(effects, c.prepareDist(j))
			continue
		}
		j.placement = &p
		j.lastPlaced = &p
		j.slotWait = time.Time{}
		c.holdLocked(j, p)
		j.placed[j.attempt] = p
		j.hostStats = map[string][]runtime.OperatorStats{}
		j.assignedAt, j.endedOn, j.unlisted, j.asking = now, map[string]bool{}, map[string]int{}, map[string]bool{}
		j.subtaskState = wire.SubtaskDeploying
		j.reason = ""
		j.updated = now
		j.attempts = append(j.attempts, wire.AttemptStatus{Attempt: j.attempt, Hosts: p.Hosts(), State: wire.SubtaskDeploying, Parallelism: j.slots})
		c.log.Info("job scheduled", "job", j.id, "attempt", j.attempt, "hosts", p.Hosts(), "slots", j.slots)
		effects = append(effects, c.assignEffects(j, c.saveLocked(j))...)
	}
	return effects
}

// prepareDist returns the effect that sets up the controller side of job j,
// which the scheduler found must be spread over hosts (j.preparing is set).
func (c *Controller) prepareDist(j *ctlJob) effect {
	id, spec, from, attempt, resumed, takeover := j.id, j.spec, j.restoreFrom(), j.attempt, j.resumed, j.rescaleTakeover()
	scaled := takeover != nil && j.declared != nil
	return func() {
		var dj *distJob
		err := c.checkRescaled(j, spec, from, scaled)
		if err == nil {
			dj, err = c.newDistJob(id, spec, from, attempt, resumed, takeover)
		}
		now := time.Now()
		c.mu.Lock()
		j.preparing = false
		var effects []effect
		var notFit *rescaleMisfit
		switch {
		case wire.TerminalJobState(j.state) || j.canceling:
			if dj != nil {
				dj.close(control.Cancel{})
			}
		case errors.As(err, &notFit):
			// Its state does not restore at this parallelism: it runs
			// only as declared from now on, waiting for the slots.
			j.noRescale = notFit.Error()
			c.log.Warn("the job runs only at its declared parallelism", "job", j.id, "err", notFit.err)
			j.scaleLocked(j.declaredSlots())
			if j.rescaleSpan != nil {
				telemetry.EndSpan(j.rescaleSpan, notFit)
				j.rescaleCtx, j.rescaleSpan = nil, nil
			}
		case err != nil:
			c.endLocked(j, now, wire.JobFailed, err.Error())
		default:
			j.dist = dj
			j.carryRestarts = false
			j.rescaleTrace(dj)
		}
		effects = c.scheduleLocked(now)
		c.mu.Unlock()
		c.run(effects)
	}
}

// assignEffects sends the current attempt of j to each of its hosts. The
// job's loop records the attempt first (dist.deploy: after any failover
// queued before it, so the restore is the latest checkpoint the failed
// attempt completed) and waits until version ver of the job's record, which
// has the attempt and its placement, is in the bucket (a later leader never
// reuses the attempt number); then the assignments go out.
func (c *Controller) assignEffects(j *ctlJob, ver uint64) []effect {
	p := *j.placement
	dj, id, attempt, spec, term := j.dist, j.id, j.attempt, j.spec, c.term
	locals := map[string][]wire.SubtaskRef{}
	for _, v := range spec.Vertices {
		for i := 0; i < v.Parallelism; i++ {
			locals[p.Host(i)] = append(locals[p.Host(i)], wire.SubtaskRef{Operator: v.UID, Subtask: i})
		}
	}
	dj.post(func() {
		restore := dj.deploy(attempt, p)
		if err := c.saved(id, ver); err != nil {
			dj.log.Warn("attempt not assigned", "attempt", attempt, "err", err)
			return
		}
		tr := dj.attemptTrace()
		var effects []effect
		for _, h := range p.Hosts() {
			a := wire.Assignment{JobID: id, Attempt: attempt, Term: term, Job: spec, Placement: p.Slots, Distributed: true, Restore: restore, Trace: tr, Local: locals[h]}
			effects = append(effects, func() {
				var r wire.AssignReply
				err := wire.RequestTimeout(c.nc, wire.HostSubject(h, wire.HostVerbAssign), c.opts.RequestTimeout, a, &r)
				c.assigned(a, h, r, err)
			})
		}
		c.run(effects)
	})
	return nil
}

// failKind says what ended an attempt.
type failKind int

const (
	failTask  failKind = iota // a subtask failed: the job's restart strategy decides
	failInfra                 // a host was lost, refused or never reported: the lifecycle restarts it, up to MaxFailovers times
	failBusy                  // a host refused the assignment for busy slots, or nobody listened for it: rescheduled, counts against nothing
)

// failure is why an attempt ended.
type failure struct {
	reason string
	kind   failKind
	// host is where it failed, when known; skip: it is not sent a cancel
	// (it is lost, or its part already ended).
	host string
	skip bool
	// subtask is the subtask whose failure it is, when known.
	subtask *control.SubtaskID
	// class says what a restart can do about a task failure.
	class control.FailureClass
}

// failLocked handles the failure of j's current attempt: it is canceled on
// its hosts, the job's lifecycle is told, and the job waits in restarting.
// Whether and when a next attempt runs is the lifecycle's decision only
// (control.Lifecycle: the restart strategy after a task failure, at once up
// to MaxFailovers times after lost or refusing hosts): the scheduler places
// attempt N once the lifecycle started it (distJob.startedAttempt), and
// the job fails when the lifecycle gives up (lifecycleGaveUp). A busy
// refusal waits a heartbeat interval more before it is placed again (no
// tight loop while a host's view of its slots and the controller's differ).
func (c *Controller) failLocked(j *ctlJob, now time.Time, f failure) []effect {
	var effects []effect
	reason := f.reason
	if j.dist != nil {
		j.dist.failover(j.attempt, reason, f.host, f.subtask, f.kind, f.class)
	}
	if j.placement != nil {
		skip := ""
		if f.skip {
			skip = f.host
		}
		effects = c.cancelEffects(j, skip)
	}
	if n := len(j.attempts); n > 0 && j.attempts[n-1].Attempt == j.attempt {
		j.attempts[n-1].State, j.attempts[n-1].Reason = wire.SubtaskFailed, reason
	}
	j.placement = nil
	defer c.changedLocked(j)
	var delay time.Duration
	if f.kind == failBusy {
		delay = c.opts.HeartbeatInterval
		if h := c.hosts[f.host]; h != nil && h.interval > 0 {
			delay = h.interval
		}
	}
	blamed := ""
	if f.subtask != nil {
		blamed = f.subtask.String()
	}
	c.log.Warn("attempt failed", "job", j.id, "failed_attempt", j.attempt, "reason", reason, "host", f.host, "subtask", blamed, "infrastructure", f.kind != failTask)
	j.attempt++
	j.state = wire.JobRestarting
	j.reason = fmt.Sprintf("attempt %d failed: %s", j.attempt-1, reason)
	j.subtaskState = wire.SubtaskScheduled
	j.restartAt = now.Add(delay)
	j.updated = now
	return effects
}

// cancelEffects tells j's hosts (but skip) to cancel the current attempt.
func (c *Controller) cancelEffects(j *ctlJob, skip string) []effect {
	var effects []effect
	for _, h := range j.placement.Hosts() {
		if h == skip {
			continue
		}
		req := wire.HostRequest{JobID: j.id, Attempt: j.attempt, Term: c.term}
		effects = append(effects, func() {
			var r wire.Reply
			err := wire.RequestTimeout(c.nc, wire.HostSubject(h, wire.HostVerbCancel), c.opts.RequestTimeout, req, &r)
			if err == nil {
				err = r.Err()
			}
			if err != nil {
				c.log.Warn("cancel on host failed", "job", req.JobID, "attempt", req.Attempt, "host", h, "err", err)
				return
			}
			// The host answers once the attempt stopped there.
			c.slotsFreed(h, wire.AttemptRef{JobID: req.JobID, Attempt: req.Attempt}, "cancel answered")
		})
	}
	return effects
}

func (c *Controller) endLocked(j *ctlJob, now time.Time, state, reason string) {
	if j.dist != nil {
		var final control.Event
		switch state {
		case wire.JobCanceled:
			final = control.Cancel{}
		case wire.JobFailed:
			final = control.RestartsExhausted{Reason: reason}
		}
		j.dist.close(final)
	}
	j.state, j.reason, j.updated = state, reason, now
	t := now
	j.ended = &t
	j.placement = nil
	c.changedLocked(j)
	switch state {
	case wire.JobFinished, wire.JobStopped:
		j.subtaskState = wire.SubtaskFinished
	case wire.JobCanceled:
		j.subtaskState = wire.SubtaskCanceled
	case wire.JobFailed:
		if j.subtaskState != wire.SubtaskFinished {
			j.subtaskState = wire.SubtaskFailed
		}
	}
	if n := len(j.attempts); n > 0 && j.attempts[n-1].Attempt == j.attempt && !wire.TerminalJobState(j.attempts[n-1].State) && j.attempts[n-1].State != wire.SubtaskFailed {
		j.attempts[n-1].State = state
		if state != wire.JobFinished {
			j.attempts[n-1].Reason = reason
		}
	}
	lvl := slog.LevelInfo
	if state == wire.JobFailed {
		lvl = slog.LevelWarn
	}
	attrs := []any{"job", j.id, "attempt", j.attempt, "reason", reason}
	if j.savepoint != "" {
		attrs = append(attrs, "savepoint", j.savepoint)
	}
	c.log.Log(context.Background(), lvl, "job "+state, attrs...)
	c.upgradeEndedLocked(j, now, state, reason) // a failed new version is rolled back
}
