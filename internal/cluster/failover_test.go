package cluster

import (
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
	nc := testNATS(t)
	c, err := StartController(nc, ControllerOptions{HeartbeatInterval: 20 * time.Millisecond, LostAfter: 50})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	h1 := startFakeHost(t, nc, "h1", 1)
	waitHostsListed(t, nc, 1)
	var dr wire.DeployReply
	spec := testSpec(1)
	spec.Restart = jobfile.RestartSettings{Strategy: jobfile.RestartFixedDelay, Attempts: 5}
	if err := wire.RequestTimeout(nc, wire.SubjectDeploy, 5*time.Second, wire.DeployRequest{Job: spec}, &dr); err != nil || dr.Err() != nil {
		t.Fatalf("deploy: %v %v", err, dr.Err())
	}
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
