package cluster

// Upgrades (streamd upgrade): a running job is stopped with a savepoint and
// started again, under the same job id, as a new version (another module,
// or another job file) restored from that savepoint. The controller drives
// it, so it goes on without the client: if the new version fails to start
// or restore (its restart strategy gives up, or it does not run within the
// request's start timeout), the controller starts the version before it
// again from the same savepoint (a rollback). Each job keeps the history of
// its versions (JobStatus.Versions), in its record.
//
// Keeping the job id keeps what is keyed by it: the job's checkpoint store
// (the checkpoint ids go on after the savepoint's), the writer names of its
// exactly-once sinks, its logs, metrics and status. Each version's attempts
// are numbered on from the last attempt of the one before.

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/micro"

	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/internal/cluster/wire"
)

// upgradeState is a job's upgrade waiting for its version to run (kept in
// the job's record: a new leader carries it on).
type upgradeState struct {
	Version   int           `json:"version"` // the version started (VersionStatus.Version)
	Savepoint string        `json:"savepoint"`
	Previous  wire.JobSpec  `json:"previous"`           // the version before it: a rollback starts it again
	Rollback  bool          `json:"rollback,omitempty"` // the version started is that rollback
	Timeout   time.Duration `json:"timeout"`
	Deadline  time.Time     `json:"deadline"`
}

func (c *Controller) handleUpgrade(msg micro.Request) {
	var req wire.UpgradeRequest
	if err := json.Unmarshal(msg.Data(), &req); err != nil {
		reply(msg, wire.UpgradeReply{Reply: wire.Reply{Error: "cluster: upgrade: bad request: " + err.Error(), Code: wire.CodeBadRequest}})
		return
	}
	sp, version, replaced, err := c.upgrade(req)
	reply(msg, wire.UpgradeReply{Reply: wire.ErrorReply(err), Savepoint: sp, Version: version, Replaced: replaced})
}

// upgrade checks the new version against the running job and the state of
// its latest checkpoint, stops the job with a savepoint, checks the
// savepoint, and starts the new version from it (or the old one again if
// the savepoint does not restore into the new version).
func (c *Controller) upgrade(req wire.UpgradeRequest) (string, int, bool, error) {
	c.catchUp(req.JobID)
	timeout := req.StartTimeout
	if timeout <= 0 {
		timeout = wire.DefaultUpgradeStartTimeout
	}
	c.mu.Lock()
	j := c.jobs[req.JobID]
	if j == nil {
		c.mu.Unlock()
		return "", 0, false, wire.NotFoundf("cluster: no job %q (streamd list shows the jobs)", req.JobID)
	}
	spec, replace, err := c.newVersionLocked(j, req)
	if err != nil {
		c.mu.Unlock()
		return "", 0, false, fmt.Errorf("cluster: upgrade job %s: %w", j.id, err)
	}
	j.upgrading = true
	if replace {
		c.mu.Unlock()
		sp, v, err := c.replaceVersion(j, spec, timeout)
		return sp, v, true, err
	}
	old, check := j.declaredSpec(), j.restoreFrom()
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		j.upgrading = false
		c.mu.Unlock()
	}()
	g, err := spec.Graph(func(a wire.Artifact) (string, error) { return "/" + a.Name, nil })
	if err != nil {
		return "", 0, false, fmt.Errorf("cluster: upgrade job %s: %w", j.id, err)
	}
	// The restore checks of deploy --from, first against the job's latest
	// checkpoint (the savepoint will have its operators): a new version that
	// cannot take the job's state is refused before the job stops.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := c.checkLatest(ctx, j, check, g); err != nil {
		return "", 0, false, fmt.Errorf("cluster: upgrade job %s: the new version cannot restore the job's latest checkpoint, so the job was not stopped: %w", j.id, err)
	}
	sp, err := c.distSavepoint(j.id, wire.HostVerbStop, "", false, false)
	if err != nil {
		return "", 0, false, fmt.Errorf("cluster: upgrade job %s: %w", j.id, err)
	}
	_, restoreErr := wire.LoadRestore(ctx, c.nc, sp, g)
	now := time.Now()
	c.mu.Lock()
	if j.state != wire.JobStopped || c.jobs[j.id] != j {
		st := j.state
		c.mu.Unlock()
		return sp, 0, false, fmt.Errorf("cluster: upgrade job %s: stopped with savepoint %s, then it became %s; start it with streamd deploy --from %s", j.id, sp, st, sp)
	}
	if len(j.versions) == 0 {
		j.versions = []wire.VersionStatus{newVersion(1, old, j.from, j.created, 0)}
	}
	j.versions[len(j.versions)-1].State = wire.VersionReplaced
	v := newVersion(len(j.versions)+1, spec, sp, now, j.attempt+1)
	v.State, v.Timeout = wire.VersionStarting, timeout.String()
	j.versions = append(j.versions, v)
	j.upgrade = &upgradeState{Version: v.Version, Savepoint: sp, Previous: old, Timeout: timeout, Deadline: now.Add(timeout)}
	if restoreErr != nil {
		c.log.Warn("upgrade: the new version cannot restore the savepoint; starting the old one again", "job", j.id, "savepoint", sp, "err", restoreErr)
		c.rollbackLocked(j, now, fmt.Sprintf("cannot restore savepoint %s: %v", sp, restoreErr))
	} else {
		c.log.Info("upgrade: starting the new version", "job", j.id, "version", v.Version, "savepoint", sp, "timeout", timeout)
		c.startVersionLocked(j, spec, sp, now, fmt.Sprintf("upgrading to version %d from savepoint %s", v.Version, sp))
	}
	ver := j.ver
	c.mu.Unlock()
	// The new version (and the upgrade waiting for it) is in the bucket
	// before the answer: a new leader carries it on.
	if err := c.saved(j.id, ver); err != nil {
		return sp, v.Version, false, fmt.Errorf("cluster: upgrade job %s: stopped with savepoint %s, but version %d was not saved before the controller stopped: %w (streamd status %s shows what the next leader runs; streamd deploy --from %s starts a stopped job)",
			j.id, sp, v.Version, err, j.id, sp)
	}
	return sp, v.Version, false, nil
}

// replaceVersion upgrades job j, which does not run (it restarts, or waits
// for slots), so cannot take a savepoint: its attempt (if one is placed) is
// canceled, and the new version starts from the job's latest checkpoint,
// or from nothing if it never completed one (the reply's Savepoint is then
// ""). A new version that cannot restore that checkpoint is refused before
// anything is canceled. The rollback, if the new version fails, starts the
// old one from the same checkpoint.
func (c *Controller) replaceVersion(j *ctlJob, spec wire.JobSpec, timeout time.Duration) (string, int, error) {
	defer func() {
		c.mu.Lock()
		j.upgrading = false
		c.mu.Unlock()
	}()
	c.mu.Lock()
	old, from := j.declaredSpec(), j.restoreFrom()
	c.mu.Unlock()
	g, err := spec.Graph(func(a wire.Artifact) (string, error) { return "/" + a.Name, nil })
	if err != nil {
		return "", 0, fmt.Errorf("cluster: upgrade job %s: %w", j.id, err)
	}
	if from != "" {
		if spec.Checkpoint == nil {
			return "", 0, fmt.Errorf("cluster: upgrade job %s: the new job has no checkpoint section: it cannot restore the job's latest checkpoint %s", j.id, from)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		if err := c.checkLatest(ctx, j, from, g); err != nil {
			return "", 0, fmt.Errorf("cluster: upgrade job %s: the new version cannot restore the job's latest checkpoint, so the job was left as it was: %w", j.id, err)
		}
	}
	c.mu.Lock()
	c.cancelAttemptAndWaitLocked(j)
	now := time.Now()
	if c.jobs[j.id] != j || wire.TerminalJobState(j.state) {
		st := j.state
		c.mu.Unlock()
		return "", 0, fmt.Errorf("cluster: upgrade job %s: the job became %s while its attempt was canceled", j.id, st)
	}
	what := "from nothing (the job never completed a checkpoint)"
	if from != "" {
		what = "from its latest checkpoint " + from
	}
	c.endLocked(j, now, wire.JobStopped, "replaced by an upgrade while it restarted, "+what)
	if len(j.versions) == 0 {
		j.versions = []wire.VersionStatus{newVersion(1, old, j.from, j.created, 0)}
	}
	j.versions[len(j.versions)-1].State = wire.VersionReplaced
	v := newVersion(len(j.versions)+1, spec, from, now, j.attempt+1)
	v.State, v.Timeout = wire.VersionStarting, timeout.String()
	j.versions = append(j.versions, v)
	j.upgrade = &upgradeState{Version: v.Version, Savepoint: from, Previous: old, Timeout: timeout, Deadline: now.Add(timeout)}
	c.log.Info("upgrade: replacing a job that does not run", "job", j.id, "version", v.Version, "from", from, "timeout", timeout)
	c.startVersionLocked(j, spec, from, now, fmt.Sprintf("upgrading to version %d %s", v.Version, what))
	ver := j.ver
	effects := c.scheduleLocked(now)
	c.mu.Unlock()
	c.run(effects)
	if err := c.saved(j.id, ver); err != nil {
		return from, v.Version, fmt.Errorf("cluster: upgrade job %s: version %d was not saved before the controller stopped: %w (streamd status %s shows what the next leader runs)",
			j.id, v.Version, err, j.id)
	}
	return from, v.Version, nil
}

// checkLatest runs the restore checks of g against checkpoint check, the
// latest of job j ("": none yet). The retention of a newer checkpoint may
// remove it under the check (its _metadata first): then the check is of
// the newer one.
func (c *Controller) checkLatest(ctx context.Context, j *ctlJob, check string, g *control.JobGraph) error {
	for try := 0; check != ""; try++ {
		_, err := wire.LoadRestore(ctx, c.nc, check, g)
		if err == nil {
			return nil
		}
		if _, _, rerr := wire.ResolveIn(ctx, c.nc, check); rerr == nil || try == 4 {
			return err // it is there: it does not fit
		}
		// Removed: the job's record names the newer one soon.
		gone := check
		for deadline := time.Now().Add(2 * time.Second); check == gone && time.Now().Before(deadline); {
			time.Sleep(20 * time.Millisecond)
			c.mu.Lock()
			check = j.restoreFrom()
			c.mu.Unlock()
		}
		if check == gone {
			return err
		}
	}
	return nil
}

// newVersionLocked is the spec of the version req asks for, checked as a
// deploy checks its job; j must be running, with checkpoints, and not being
// upgraded or deleted.
//
// replace says that j does not run (it restarts, or waits to be placed):
// it cannot take a savepoint, so the new version replaces it from its
// latest checkpoint, or from nothing (replaceVersion).
func (c *Controller) newVersionLocked(j *ctlJob, req wire.UpgradeRequest) (spec wire.JobSpec, replace bool, err error) {
	replace = j.state == wire.JobRestarting || j.state == wire.JobCreated
	switch {
	case j.upgrading || j.upgrade != nil:
		return wire.JobSpec{}, false, wire.Conflictf("an upgrade of the job is in progress (streamd status %s shows it)", j.id)
	case j.canceling || j.preparing:
		return wire.JobSpec{}, false, wire.Conflictf("the job is being %s", map[bool]string{true: "canceled", false: "prepared"}[j.canceling])
	case j.rescale != nil:
		return wire.JobSpec{}, false, wire.Conflictf("the job is being rescaled (stopped with a savepoint to run at parallelism %d); try again once it runs", j.rescale.To)
	case !replace && (j.placement == nil || j.dist == nil || (j.state != wire.JobRunning && j.state != wire.JobFinishing)):
		return wire.JobSpec{}, false, wire.Conflictf("the job is %s, not running (an upgrade stops a running job with a savepoint; start a stopped one with streamd deploy --from)", j.state)
	case !replace && !j.dist.ckpt:
		return wire.JobSpec{}, false, wire.Conflictf("the job has no checkpoints, so no savepoint to upgrade from (use streamd cancel and deploy)")
	case (req.Job == nil) == (req.Module == nil):
		return wire.JobSpec{}, false, wire.BadRequestf("want a new job or a new module, got %s", map[bool]string{true: "both", false: "neither"}[req.Job != nil])
	}
	spec, err = c.newSpecLocked(j, req, replace)
	return spec, replace, err
}

// newSpecLocked is the spec of j's new version as req asks for it.
func (c *Controller) newSpecLocked(j *ctlJob, req wire.UpgradeRequest, replace bool) (wire.JobSpec, error) {
	var spec wire.JobSpec
	if req.Job != nil {
		if req.Operator != "" {
			return wire.JobSpec{}, fmt.Errorf("an operator (%q) names the module to replace; a job file replaces the whole job", req.Operator)
		}
		spec = *req.Job
		if cs := spec.Checkpoint; cs != nil && cs.Storage == "" {
			withStorage := *cs
			withStorage.Storage = j.spec.Checkpoint.Storage // where the job's checkpoints are
			spec.Checkpoint = &withStorage
		}
	} else {
		var err error
		if spec, err = j.declaredSpec().WithModule(req.Operator, *req.Module); err != nil {
			return wire.JobSpec{}, err
		}
	}
	if spec.Checkpoint == nil && !replace {
		return wire.JobSpec{}, fmt.Errorf("the new job has no checkpoint section: it cannot restore the savepoint")
	}
	if _, err := spec.Graph(func(a wire.Artifact) (string, error) { return "/" + a.Name, nil }); err != nil {
		return wire.JobSpec{}, err
	}
	if err := spec.Restart.Control(time.Millisecond).Validate(); err != nil {
		return wire.JobSpec{}, err
	}
	return spec, nil
}

// newVersion is the history entry of spec, started at when from from.
func newVersion(n int, spec wire.JobSpec, from string, when time.Time, attempt int) wire.VersionStatus {
	v := wire.VersionStatus{Version: n, Modules: []wire.ModuleVersion{}, Started: when, From: from, Attempt: attempt, State: wire.VersionRunning}
	for _, vx := range spec.Vertices {
		if vx.Wasm != nil {
			v.Modules = append(v.Modules, wire.ModuleVersion{Operator: vx.UID, Name: vx.Wasm.Module.Name, Digest: vx.Wasm.Module.Digest})
		}
	}
	if spec.JobFile != nil {
		v.JobFile = spec.JobFile.Digest
	}
	return v
}

// startVersionLocked makes the ended job j a new job of spec under the same
// id, restored from from, with fresh restart counts, waiting for why; it is
// placed by the next schedule.
func (c *Controller) startVersionLocked(j *ctlJob, spec wire.JobSpec, from string, now time.Time, why string) {
	spec.OwnFiles(j.id)
	j.spec, j.slots, j.from = spec, spec.SlotsNeeded(), from
	// The new version runs as declared; the adaptive scheduler rescales it
	// as the slots call for (adaptive.go).
	j.declared, j.noRescale, j.carryRestarts, j.slotWait, j.moreSince = nil, "", false, time.Time{}, time.Time{}
	j.autoscaleNewVersion()
	j.latest, j.restarts, j.resumed = nil, nil, false
	j.state, j.reason, j.ended, j.savepoint = wire.JobCreated, why, nil, ""
	j.dist, j.placement = nil, nil
	j.subtaskState, j.stats, j.checkpoints, j.hostStats, j.elapsed = wire.SubtaskScheduled, nil, nil, nil, ""
	j.attempt++ // the new version's attempts are numbered on
	j.restartAt = now
	j.updated = now
	c.changedLocked(j)
}

// rollbackLocked starts the version before the one j's upgrade started
// again, from the upgrade's savepoint: the new version failed (why).
func (c *Controller) rollbackLocked(j *ctlJob, now time.Time, why string) {
	u := j.upgrade
	failed := &j.versions[u.Version-1]
	failed.State, failed.Reason = wire.VersionRolledBack, why
	rerun := u.Version - 1
	for rerun > 1 && j.versions[rerun-1].Rerun != 0 {
		rerun = j.versions[rerun-1].Rerun
	}
	v := newVersion(len(j.versions)+1, u.Previous, u.Savepoint, now, j.attempt+1)
	v.State, v.Rerun = wire.VersionStarting, rerun
	j.versions = append(j.versions, v)
	j.upgrade = &upgradeState{Version: v.Version, Savepoint: u.Savepoint, Previous: u.Previous, Rollback: true,
		Timeout: max(u.Timeout, wire.DefaultUpgradeStartTimeout), Deadline: now.Add(max(u.Timeout, wire.DefaultUpgradeStartTimeout))}
	c.log.Warn("upgrade failed; rolling back", "job", j.id, "failed_version", failed.Version, "version", v.Version,
		"runs_again", rerun, "savepoint", u.Savepoint, "reason", why)
	c.startVersionLocked(j, u.Previous, u.Savepoint, now,
		fmt.Sprintf("rolling back to version %d %s: version %d failed: %s", rerun, wire.StartsFrom(u.Savepoint), failed.Version, why))
}

// upgradeEndedLocked: job j ended (endLocked) while its upgrade waited for
// the version it started. A new version that failed is rolled back; a
// rollback that failed leaves the job failed; any other end ends the
// upgrade.
func (c *Controller) upgradeEndedLocked(j *ctlJob, now time.Time, state, reason string) {
	u := j.upgrade
	if u == nil {
		return
	}
	v := &j.versions[u.Version-1]
	switch {
	case state == wire.JobFailed && !u.Rollback:
		c.rollbackLocked(j, now, reason)
		return
	case state == wire.JobFailed:
		v.State, v.Reason = wire.VersionFailed, reason
		j.reason = fmt.Sprintf("the rollback to version %d %s failed too: %s", v.Rerun, wire.StartsFrom(u.Savepoint), reason)
	default:
		v.State, v.Reason = state, reason
	}
	j.upgrade = nil
	c.saveLocked(j)
}

// upgradeRunningLocked: every subtask of j's current attempt runs; a
// version its upgrade waited for runs.
func (c *Controller) upgradeRunningLocked(j *ctlJob) {
	if u := j.upgrade; u != nil {
		j.versions[u.Version-1].State = wire.VersionRunning
		j.upgrade = nil
		c.log.Info("upgrade: the version runs", "job", j.id, "version", u.Version, "rollback", u.Rollback)
	}
}

// sameFailuresToRollBack is how many attempts in a row of a new version
// must fail in open with the same error before the upgrade rolls back
// without waiting for its start timeout: a module that fails that way
// fails so every time.
const sameFailuresToRollBack = 2

// upgradeTimeoutsLocked fails the versions that upgrades started and that
// do not run by their deadline, and a new version whose attempts failed in
// open the same way sameFailuresToRollBack times in a row: a new version is
// rolled back.
func (c *Controller) upgradeTimeoutsLocked(now time.Time) []effect {
	var effects []effect
	for _, id := range c.order {
		j := c.jobs[id]
		u := j.upgrade
		if u == nil || wire.TerminalJobState(j.state) || j.canceling || j.preparing {
			continue
		}
		var why string
		switch same := repeatedOpenFailure(j, j.versions[u.Version-1].Attempt); {
		case !u.Rollback && same != "":
			why = fmt.Sprintf("its attempts failed in open %d times in a row the same way: %s", sameFailuresToRollBack, same)
		case !now.Before(u.Deadline):
			why = fmt.Sprintf("not running %s after it started", u.Timeout)
			if f := lastFailure(j, j.versions[u.Version-1].Attempt); f != "" {
				why += " (the last failure: " + f + ")"
			}
		default:
			continue
		}
		if j.placement != nil {
			effects = append(effects, c.cancelEffects(j, "")...)
		}
		c.endLocked(j, now, wire.JobFailed, why)
	}
	return effects
}

// repeatedOpenFailure is the failure, as "attempt N failed: why", of j's
// latest sameFailuresToRollBack attempts from attempt `from` on when each
// of them failed in open with the same error; else "".
func repeatedOpenFailure(j *ctlJob, from int) string {
	var reason string
	n := 0
	for i := len(j.attempts) - 1; i >= 0 && j.attempts[i].Attempt >= from && n < sameFailuresToRollBack; i-- {
		a := j.attempts[i]
		if a.State != wire.SubtaskFailed {
			if n == 0 && !wire.TerminalJobState(a.State) {
				continue // the attempt that runs now
			}
			return ""
		}
		if !strings.Contains(a.Reason, "phase open") || (n > 0 && a.Reason != reason) {
			return ""
		}
		reason = a.Reason
		n++
	}
	if n < sameFailuresToRollBack {
		return ""
	}
	return reason
}

// lastFailure is the latest failure of j's attempts from attempt `from` on,
// as "attempt N failed: why"; "" if none failed.
func lastFailure(j *ctlJob, from int) string {
	for i := len(j.attempts) - 1; i >= 0 && j.attempts[i].Attempt >= from; i-- {
		if a := j.attempts[i]; a.State == wire.SubtaskFailed && a.Reason != "" {
			return fmt.Sprintf("attempt %d failed: %s", a.Attempt, a.Reason)
		}
	}
	return ""
}

// versionsLocked is j's version history for its status.
func versionsLocked(j *ctlJob) []wire.VersionStatus {
	out := slices.Clone(j.versions)
	if n := len(out); n > 0 && out[n-1].State == wire.VersionRunning && wire.TerminalJobState(j.state) {
		out[n-1].State = j.state
	}
	return out
}
