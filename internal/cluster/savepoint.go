package cluster

// Savepoints and stops with a savepoint of a job spread over hosts.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/internal/cluster/wire"
)

// distSavepoint takes a savepoint of a job spread over hosts, or stops it
// with one, and waits for it: on the job's changes (ctlJob.changed) and, for
// a savepoint, on the driver's answer. dir, if set, is a directory on the
// controller the savepoint is copied into (ExportSavepoint). A stop that
// fails (its savepoint aborted, or the attempt failed before the job
// stopped, e.g. in notify_checkpoint_complete of the savepoint) returns an
// error as soon as the attempt ended; the job is restarting by then (or
// failed), never left stopping. rescale: the stop is the adaptive
// scheduler's (scaleUpLocked): the job starts again at another parallelism
// once stopped, so the request ends with an error then, the job no longer
// being on the attempt it stopped.
func (c *Controller) distSavepoint(jobID, verb, dir string, drain, rescale bool) (string, error) {
	c.mu.Lock()
	j := c.jobs[jobID]
	if j == nil || j.dist == nil {
		c.mu.Unlock()
		return "", wire.NotFoundf("cluster: no job %q spread over hosts", jobID)
	}
	dj := j.dist
	attempt := j.attempt
	c.mu.Unlock()
	if !dj.ckpt {
		return "", errors.New("cluster: stop with a savepoint needs checkpointing: the job file has no checkpoint section (use streamd cancel)")
	}
	// The driver takes the request in the job's loop.
	var wait chan string
	if verb != wire.HostVerbStop {
		wait = make(chan string, 1)
	}
	taken := make(chan error, 1)
	ok := dj.post(func() {
		dj.mu.Lock()
		active := dj.active && dj.attempt == attempt
		dj.mu.Unlock()
		if !active || !dj.d.CanStop() {
			taken <- fmt.Errorf("cluster: %s job %s: the job is %s, not running", verb, jobID, dj.d.State())
			return
		}
		if verb == wire.HostVerbStop {
			dj.mu.Lock()
			dj.stopping, dj.stopSP, dj.rescaleStop = true, "", rescale
			dj.mu.Unlock()
			dj.step(control.StopWithSavepoint{Drain: drain})
			if st := dj.d.State(); st != control.JobStopping {
				dj.mu.Lock()
				dj.stopping, dj.rescaleStop = false, false
				dj.mu.Unlock()
				taken <- fmt.Errorf("cluster: stop job %s: the checkpoint coordinator did not take the stop (it is %s)", jobID, st)
				return
			}
		} else {
			dj.mu.Lock()
			dj.spWait = wait
			dj.mu.Unlock()
			dj.step(control.TriggerSavepoint{})
		}
		taken <- nil
	})
	if !ok {
		return "", fmt.Errorf("cluster: %s job %s: the job has ended", verb, jobID)
	}
	select {
	case err := <-taken:
		if err != nil {
			return "", err
		}
	case <-c.done:
		return "", errors.New("cluster: controller closed")
	}
	c.mu.Lock()
	if verb == wire.HostVerbStop && j.attempt == attempt && !wire.TerminalJobState(j.state) {
		j.state, j.updated = wire.JobStopping, time.Now()
		c.changedLocked(j)
	}
	changed := j.changed
	c.mu.Unlock()

	// ended reports why the request is over without its savepoint, or ""
	// while it may still come; for a stop, path is set once stopped.
	ended := func() (path, why string) {
		c.mu.Lock()
		defer c.mu.Unlock()
		changed = j.changed
		switch {
		case j.state == wire.JobStopped && verb == wire.HostVerbStop:
			return j.savepoint, ""
		case wire.TerminalJobState(j.state) || j.attempt != attempt:
			dj.mu.Lock()
			sp := dj.stopSP
			dj.mu.Unlock()
			why = fmt.Sprintf("the job is %s: %s", j.state, j.reason)
			if j.attempt != attempt {
				// The next attempt may be placed already, which clears
				// j.reason: say why the stop's attempt ended.
				for _, a := range j.attempts {
					if a.Attempt == attempt && a.Reason != "" {
						why = fmt.Sprintf("attempt %d failed: %s; the job is %s", attempt, a.Reason, j.state)
					}
				}
			}
			if verb == wire.HostVerbStop && sp != "" {
				why = fmt.Sprintf("its savepoint %s was written, but the job did not stop with it: %s", sp, why)
			}
			return "", why
		}
		return "", ""
	}
	timeout := 10 * time.Minute
	if cs := j.spec.Checkpoint; cs != nil && cs.Timeout > 0 && verb != wire.HostVerbStop {
		timeout = cs.Timeout + time.Second
	}
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	var path string
	for path == "" {
		select {
		case path = <-wait: // nil for a stop: never
		case <-changed:
			p, why := ended()
			if why != "" {
				what := "savepoint of job " + jobID
				if verb == wire.HostVerbStop {
					what = "stop job " + jobID + ": stop-with-savepoint"
				}
				return "", fmt.Errorf("cluster: %s failed: %s", what, why)
			}
			path = p
		case <-deadline.C:
			if verb == wire.HostVerbStop {
				return "", fmt.Errorf("cluster: stop job %s: not stopped after %s (the job is %s)", jobID, timeout, c.jobState(j))
			}
			return "", fmt.Errorf("cluster: savepoint of job %s: not complete after %s", jobID, timeout)
		case <-c.done:
			return "", errors.New("cluster: controller closed")
		}
	}
	if dir != "" {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		out, err := wire.ExportSavepoint(ctx, dj.c.nc, path, dir)
		if err != nil {
			return "", fmt.Errorf("cluster: savepoint of job %s is at %s but could not be copied to %s: %w", jobID, path, dir, err)
		}
		path = out
	}
	return path, nil
}

// jobState is j's state, read under the mutex.
func (c *Controller) jobState(j *ctlJob) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return j.state
}
