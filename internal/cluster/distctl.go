package cluster

// What a job's loop (dist.go) tells the controller: running, ended, failed,
// restarting, given up, and its lifecycle's state for the job's record. Each
// runs on a goroutine of the controller's wait group (goTracked) and takes
// Controller.mu, which the loop never does.

import (
	"time"

	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/internal/cluster/wire"
)

// lifecycleState keeps what the job's lifecycle knows in its record: the
// latest restore point (what a new leader's next attempt restores) and the
// restart strategy's state.
func (c *Controller) lifecycleState(dj *distJob, latest *control.RestorePoint, rs control.RestartState) {
	c.mu.Lock()
	defer c.mu.Unlock()
	j := c.jobOfLocked(dj)
	if j == nil || wire.TerminalJobState(j.state) {
		return
	}
	changed := false
	if latest != nil && (j.latest == nil || latest.ID > j.latest.ID) {
		j.latest, changed = latest, true
	}
	if j.restarts == nil || rs.Restarts > j.restarts.Restarts || (rs.Restarts == j.restarts.Restarts && rs.Lost >= j.restarts.Lost) {
		j.restarts, changed = &rs, true
	}
	if changed {
		c.saveLocked(j)
	}
}

// distRunning: every subtask of attempt runs (the coordinator says so).
func (c *Controller) distRunning(jobID string, attempt int) {
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	j := c.jobs[jobID]
	if j == nil || j.attempt != attempt || (j.state != wire.JobCreated && j.state != wire.JobRestarting) {
		return
	}
	j.state, j.reason, j.updated = wire.JobRunning, "", now
	c.upgradeRunningLocked(j)
	c.changedLocked(j)
	c.log.Info("job running", "job", j.id, "attempt", j.attempt, "hosts", j.placement.Hosts())
}

// jobOfLocked is the job whose controller side dj is; nil when there is
// none, or when the job has another one now (an upgrade started a new
// version: what the lifecycle of the version before says is stale).
func (c *Controller) jobOfLocked(dj *distJob) *ctlJob {
	if j := c.jobs[dj.id]; j != nil && j.dist == dj {
		return j
	}
	return nil
}

// lifecycleRestart: the job's lifecycle started a new attempt after a
// failure (its restart strategy's delay has passed, or a host was lost):
// the scheduler places it once failLocked has heard of the failure too.
func (c *Controller) lifecycleRestart(dj *distJob) {
	now := time.Now()
	c.mu.Lock()
	j := c.jobOfLocked(dj)
	if j == nil || wire.TerminalJobState(j.state) || j.canceling {
		c.mu.Unlock()
		return
	}
	if j.placement == nil {
		c.log.Info("job restarting", "job", j.id, "attempt", j.attempt)
	}
	effects := c.scheduleLocked(now)
	c.mu.Unlock()
	c.run(effects)
}

// lifecycleGaveUp: the job's lifecycle gives up (its restart strategy, or
// MaxFailovers lost attempts) after attempt, its last: the job fails. An
// attempt still placed is canceled on its hosts; the attempt number
// failLocked counted on for a restart that never came goes back to the
// lifecycle's last.
func (c *Controller) lifecycleGaveUp(dj *distJob, attempt int, reason string) {
	now := time.Now()
	c.mu.Lock()
	j := c.jobOfLocked(dj)
	if j == nil || wire.TerminalJobState(j.state) {
		c.mu.Unlock()
		return
	}
	var effects []effect
	if j.placement != nil {
		effects = c.cancelEffects(j, "")
	} else if attempt < j.attempt {
		j.attempt = attempt
	}
	c.endLocked(j, now, wire.JobFailed, reason)
	effects = append(effects, c.scheduleLocked(now)...)
	c.mu.Unlock()
	c.run(effects)
}

// distFailed fails the attempt after the driver asked to (FailJob).
func (c *Controller) distFailed(jobID string, attempt int, reason string) {
	now := time.Now()
	c.mu.Lock()
	j := c.jobs[jobID]
	if j == nil || j.attempt != attempt || wire.TerminalJobState(j.state) || j.placement == nil || j.canceling {
		c.mu.Unlock()
		return
	}
	effects := c.failLocked(j, now, failure{reason: reason, kind: failTask})
	effects = append(effects, c.scheduleLocked(now)...)
	c.mu.Unlock()
	c.run(effects)
}

// maybeEndDist ends a job spread over hosts when every host finished its
// part and (with checkpointing) the coordinator says the job is done.
func (c *Controller) maybeEndDist(jobID string) {
	now := time.Now()
	c.mu.Lock()
	defer func() {
		effects := c.scheduleLocked(now)
		c.mu.Unlock()
		c.run(effects)
	}()
	j := c.jobs[jobID]
	if j == nil || j.dist == nil || j.placement == nil || wire.TerminalJobState(j.state) {
		return
	}
	dj := j.dist
	dj.mu.Lock()
	all := dj.active
	for _, h := range j.placement.Hosts() {
		all = all && dj.finished[h]
	}
	done, savepoint := dj.done, dj.savepath
	adopted, rescale := dj.adopted, dj.rescaleStop
	dj.mu.Unlock()
	if all && dj.ckpt && done == nil && adopted {
		// Taken over from another controller, and every host's part ended
		// well before the coordinator heard every subtask again (their
		// last events went to the old leader): a subtask finishes only
		// after its final checkpoint, so the job is done.
		c.log.Info("every host finished its part of the adopted attempt", "job", j.id, "attempt", j.attempt)
	} else if !all || (dj.ckpt && done == nil) {
		return
	}
	if done != nil && done.State == control.JobStopped && rescale && j.rescale != nil {
		c.rescaleStoppedLocked(j, now, savepoint, done.SavepointID)
		return
	}
	if done != nil && done.State == control.JobStopped {
		c.setAttemptState(j, wire.JobStopped, "")
		j.savepoint = savepoint
		c.endLocked(j, now, wire.JobStopped, "stopped with savepoint "+savepoint)
		return
	}
	c.setAttemptState(j, wire.JobFinished, "")
	c.endLocked(j, now, wire.JobFinished, "")
}
