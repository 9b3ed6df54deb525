package cluster

import (
	"strings"
	"testing"
	"time"

	"github.com/streamd/streamd/internal/cluster/wire"
	"github.com/streamd/streamd/internal/jobfile"
)

// TestFailureBeforeQueuedDeployIsTaken: a subtask failure that reaches the
// controller while the attempt's deploy still waits in the job's loop (a
// new leader's adopt is posted only after it subscribed to the hosts) goes
// to the job's lifecycle after that deploy, which restarts the job; it was
// dropped, and the job waited in restarting for a restart nobody decided
// (TestChaos, a leader killed in round 20).
func TestFailureBeforeQueuedDeployIsTaken(t *testing.T) {
	c, h1, dr := deployOnFakeHost(t, jobfile.RestartSettings{Strategy: jobfile.RestartFixedDelay, Attempts: 5}, 0)
	a0 := wire.AttemptRef{JobID: dr.JobID, Attempt: 0}
	h1.waitLog(t, "assign "+refString(a0))

	// The job's controller side as a new leader has it: the attempt not
	// yet deployed in the loop, its adopt queued behind other work.
	c.mu.Lock()
	j := c.jobs[dr.JobID]
	dj, p := j.dist, *j.placement
	c.mu.Unlock()
	release := make(chan struct{})
	dj.post(func() { <-release })
	dj.mu.Lock()
	dj.active = false
	dj.mu.Unlock()
	dj.adopt(0, p)

	h1.fail(a0, "injected failure while the adopt is queued")
	c.mu.Lock()
	state, attempt := j.state, j.attempt
	c.mu.Unlock()
	if state != wire.JobRestarting || attempt != 1 {
		t.Fatalf("after the failure: %s attempt %d, want restarting attempt 1", state, attempt)
	}
	close(release)
	h1.waitLog(t, "assign "+refString(wire.AttemptRef{JobID: dr.JobID, Attempt: 1}))
}

// TestFailureBeforeAdoptIsPosted: a new leader subscribes to the hosts
// before it posts the adopts of the running attempts, so a subtask failure
// can reach the job's side first. It waits there for the adopt (it was
// dropped, and the job waited in restarting for a restart its lifecycle
// never heard of; reading the placement the failure had cleared crashed
// the leader: TestChaos).
func TestFailureBeforeAdoptIsPosted(t *testing.T) {
	c, h1, dr := deployOnFakeHost(t, jobfile.RestartSettings{Strategy: jobfile.RestartFixedDelay, Attempts: 5}, 0)
	a0 := wire.AttemptRef{JobID: dr.JobID, Attempt: 0}
	h1.waitLog(t, "assign "+refString(a0))

	// The job's side as a new leader has it before it posts the adopt.
	c.mu.Lock()
	j := c.jobs[dr.JobID]
	dj, p := j.dist, *j.placement
	c.mu.Unlock()
	dj.mu.Lock()
	dj.active, dj.adoptPending = false, true
	dj.mu.Unlock()

	h1.fail(a0, "injected failure before the adopt is posted")
	waitJobChange(t, c, dr.JobID, func(j *ctlJob) bool { return j.state == wire.JobRestarting && j.attempt == 1 })
	dj.mu.Lock()
	held := len(dj.heldFails)
	dj.mu.Unlock()
	if held != 1 {
		t.Fatalf("%d failures held for the adopt, want 1", held)
	}
	dj.adopt(0, p)
	h1.waitLog(t, "assign "+refString(wire.AttemptRef{JobID: dr.JobID, Attempt: 1}))
}

// TestLostAttemptsBoundedByLifecycle: attempts lost to the hosts (here
// assignments refused with an error) restart at once even under restart
// strategy none, which a task failure would end: the job's lifecycle
// bounds them by MaxFailovers (2), and fails the job at the third.
func TestLostAttemptsBoundedByLifecycle(t *testing.T) {
	c, h1, dr := deployOnFakeHost(t, jobfile.RestartSettings{Strategy: jobfile.RestartNone}, 3)
	nc := c.nc
	for a := 0; a < 3; a++ {
		h1.waitLog(t, "refuse "+refString(wire.AttemptRef{JobID: dr.JobID, Attempt: a}))
	}
	waitJobChange(t, c, dr.JobID, func(j *ctlJob) bool { return wire.TerminalJobState(j.state) })
	var jr wire.JobReply
	if err := wire.RequestTimeout(nc, wire.SubjectStatus, 5*time.Second, wire.JobRequest{JobID: dr.JobID}, &jr); err != nil || jr.Job == nil {
		t.Fatalf("status: %v %+v", err, jr)
	}
	st := jr.Job
	if st.State != wire.JobFailed || st.Attempt != 2 || !strings.Contains(st.Reason, "2 failovers after lost or refusing hosts, the limit") {
		t.Fatalf("after 3 refused attempts: %s attempt %d (%s), want failed in attempt 2 at the limit of 2 failovers", st.State, st.Attempt, st.Reason)
	}
	for _, e := range h1.entries() {
		if strings.HasPrefix(e, "assign ") {
			t.Errorf("h1 log %v: an attempt after the limit was assigned", h1.entries())
		}
	}
}

// waitJobChange waits until cond holds for job id (checked at each change
// of the job, under the controller's mutex).
func waitJobChange(t *testing.T, c *Controller, id string, cond func(*ctlJob) bool) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		c.mu.Lock()
		j := c.jobs[id]
		if j != nil && cond(j) {
			c.mu.Unlock()
			return
		}
		var changed chan struct{}
		if j != nil {
			changed = j.changed
		}
		c.mu.Unlock()
		select {
		case <-changed:
		case <-time.After(20 * time.Millisecond): // the job is not known yet
		case <-deadline:
			t.Fatalf("job %s: condition not reached in 10 s", id)
		}
	}
}

// deployOnFakeHost starts a controller (MaxFailovers 2) and one fake host
// of one slot that refuses its first `refuse` assignments with an error,
// and deploys a one-slot job with restart strategy rs.
func deployOnFakeHost(t *testing.T, rs jobfile.RestartSettings, refuse int) (*Controller, *fakeHost, wire.DeployReply) {
	t.Helper()
	nc := testNATS(t)
	c, err := StartController(nc, ControllerOptions{HeartbeatInterval: 20 * time.Millisecond, LostAfter: 50, MaxFailovers: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	h1 := startFakeHost(t, nc, "h1", 1)
	h1.refuse = refuse
	waitHostsListed(t, nc, 1)
	var dr wire.DeployReply
	spec := testSpec(1)
	spec.Restart = rs
	if err := wire.RequestTimeout(nc, wire.SubjectDeploy, 5*time.Second, wire.DeployRequest{Job: spec}, &dr); err != nil || dr.Err() != nil {
		t.Fatalf("deploy: %v %v", err, dr.Err())
	}
	return c, h1, dr
}
