package cluster

// The control API's handlers (service.go registers them as the endpoints
// of the controller's micro service) and a job's status.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/nats-io/nats.go/micro"

	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/internal/cluster/wire"
	"github.com/streamd/streamd/internal/connector"
	"github.com/streamd/streamd/internal/runtime"
	"github.com/streamd/streamd/internal/telemetry"
)

func (c *Controller) handleDeploy(msg micro.Request) {
	var req wire.DeployRequest
	if err := json.Unmarshal(msg.Data(), &req); err != nil {
		reply(msg, wire.DeployReply{Reply: wire.Reply{Error: "cluster: deploy: bad request: " + err.Error(), Code: wire.CodeBadRequest}})
		return
	}
	if cs := req.Job.Checkpoint; cs != nil && cs.Storage == "" && c.opts.CheckpointStorage != "" {
		withStorage := *cs
		withStorage.Storage = c.opts.CheckpointStorage
		req.Job.Checkpoint = &withStorage
	}
	// Validate the graph (artifacts are not resolved here).
	if _, err := req.Job.Graph(func(a wire.Artifact) (string, error) { return "/" + a.Name, nil }); err != nil {
		reply(msg, wire.DeployReply{Reply: wire.Reply{Error: err.Error()}})
		return
	}
	now := time.Now()
	if req.From != "" && req.Job.Checkpoint == nil {
		reply(msg, wire.DeployReply{Reply: wire.Reply{Error: "cluster: deploy --from: the job has no checkpoint section"}})
		return
	}
	if err := req.Job.Restart.Control(time.Millisecond).Validate(); err != nil {
		reply(msg, wire.DeployReply{Reply: wire.Reply{Error: "cluster: deploy: " + err.Error()}})
		return
	}
	if req.From == "" {
		req.Job.PinNewStart(now) // a restart before the first checkpoint reads from the deploy on
	}
	j := &ctlJob{id: newJobID(req.Job.Name), requestID: req.RequestID, spec: req.Job, state: wire.JobCreated, slots: req.Job.SlotsNeeded(),
		subtaskState: wire.SubtaskScheduled, created: now, updated: now, from: req.From,
		placed: map[int]control.Placement{}, changed: make(chan struct{})}
	c.mu.Lock()
	if old := c.deployedLocked(req.RequestID); old != nil {
		// The same request again: its first try made old.
		oldVer := old.ver
		c.mu.Unlock()
		if err := c.saved(old.id, oldVer); err != nil {
			reply(msg, wire.DeployReply{Reply: wire.Reply{Error: fmt.Sprintf("cluster: deploy: job %s not saved: %v", old.id, err), Retry: true}})
			return
		}
		reply(msg, wire.DeployReply{JobID: old.id})
		return
	}
	for c.jobs[j.id] != nil {
		j.id = newJobID(req.Job.Name)
	}
	j.spec.OwnFiles(j.id)
	c.jobs[j.id] = j
	c.order = append(c.order, j.id)
	c.log.Info("job deployed", "job", j.id, "name", j.spec.Name, "slots", j.slots)
	ver := c.saveLocked(j)
	effects := c.scheduleLocked(now)
	c.mu.Unlock()
	c.run(effects)
	// The job is in the bucket before its id is given out.
	if err := c.saved(j.id, ver); err != nil {
		reply(msg, wire.DeployReply{Reply: wire.Reply{Error: fmt.Sprintf("cluster: deploy: job %s not saved: %v", j.id, err), Retry: true}})
		return
	}
	reply(msg, wire.DeployReply{JobID: j.id})
}

// deployedLocked is the job that deploy request id made, if any.
func (c *Controller) deployedLocked(id string) *ctlJob {
	if id == "" {
		return nil
	}
	for _, j := range c.jobs {
		if j.requestID == id {
			return j
		}
	}
	return nil
}

// newJobID is the job's name, with every byte but letters, digits, '-' and
// '_' replaced by '_' (the id names a directory and goes into NATS subjects
// and file names), then '-' and 8 random hex digits.
func newJobID(name string) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	safe := []byte(name)
	for i, c := range safe {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			safe[i] = '_'
		}
	}
	return string(safe) + "-" + hex.EncodeToString(b[:])
}

func (c *Controller) handleList(msg micro.Request) {
	var req wire.ListRequest
	if len(msg.Data()) > 0 {
		if err := json.Unmarshal(msg.Data(), &req); err != nil {
			reply(msg, wire.ListReply{Reply: wire.ErrorReply(fmt.Errorf("cluster: bad request: %w", err))})
			return
		}
	}
	now := time.Now()
	c.mu.Lock()
	var out wire.ListReply
	out.Jobs = []wire.JobStatus{}
	for i := len(c.order) - 1; i >= 0; i-- {
		j := c.jobs[c.order[i]]
		if !req.All && c.retiredLocked(j, now) {
			continue
		}
		out.Jobs = append(out.Jobs, c.statusLocked(j))
	}
	c.mu.Unlock()
	reply(msg, out)
}

// retiredLocked reports whether j finished, failed or was canceled longer
// ago than the job retention: the list leaves it out (not ListRequest.All).
// Stopped jobs stay: their record says where their savepoint is.
func (c *Controller) retiredLocked(j *ctlJob, now time.Time) bool {
	switch j.state {
	case wire.JobFinished, wire.JobFailed, wire.JobCanceled:
		return j.ended != nil && now.Sub(*j.ended) > c.opts.JobRetention
	}
	return false
}

// handleDelete removes the record of an ended job: from the table and from
// the bucket (a new leader does not bring it back), after its checkpoints
// when the request says so. A job that has not ended is refused.
func (c *Controller) handleDelete(msg micro.Request) {
	var req wire.DeleteRequest
	if err := json.Unmarshal(msg.Data(), &req); err != nil {
		reply(msg, wire.JobReply{Reply: wire.ErrorReply(fmt.Errorf("cluster: bad request: %w", err))})
		return
	}
	c.catchUp(req.JobID)
	c.mu.Lock()
	j := c.jobs[req.JobID]
	switch {
	case j == nil:
		c.mu.Unlock()
		reply(msg, wire.JobReply{Reply: wire.ErrorReply(wire.NotFoundf("cluster: no job %q (streamd list --all shows the jobs)", req.JobID))})
		return
	case !wire.TerminalJobState(j.state) || j.canceling:
		c.mu.Unlock()
		reply(msg, wire.JobReply{Reply: wire.ErrorReply(wire.Conflictf("cluster: job %s is %s: cancel it first (streamd cancel %s)", j.id, j.state, j.id))})
		return
	case j.deleting:
		c.mu.Unlock()
		reply(msg, wire.JobReply{Reply: wire.Reply{Error: fmt.Sprintf("cluster: job %s is being deleted", j.id)}})
		return
	case j.upgrading:
		c.mu.Unlock()
		reply(msg, wire.JobReply{Reply: wire.Reply{Error: fmt.Sprintf("cluster: job %s is being upgraded", j.id)}})
		return
	}
	j.deleting = true
	st := c.statusLocked(j)
	cs := j.spec.Checkpoint
	c.mu.Unlock()
	if req.Checkpoints && cs != nil {
		ctx, cancel := context.WithTimeout(context.Background(), c.opts.RequestTimeout)
		err := wire.DeleteStore(ctx, c.nc, cs, j.id)
		cancel()
		if err != nil {
			c.mu.Lock()
			j.deleting = false
			c.mu.Unlock()
			reply(msg, wire.JobReply{Reply: wire.ErrorReply(err)})
			return
		}
	}
	c.mu.Lock()
	ver := c.forgetLocked(j)
	c.mu.Unlock()
	if err := c.saved(j.id, ver); err != nil {
		reply(msg, wire.JobReply{Reply: wire.Reply{Error: err.Error(), Retry: true}})
		return
	}
	c.log.Info("job deleted", "job", j.id, "checkpoints", req.Checkpoints && cs != nil)
	reply(msg, wire.JobReply{Job: &st})
}

func (c *Controller) lookup(msg micro.Request) (*ctlJob, wire.JobRequest, error) {
	var req wire.JobRequest
	if err := json.Unmarshal(msg.Data(), &req); err != nil {
		return nil, req, wire.BadRequestf("cluster: bad request: %v", err)
	}
	j := c.jobs[req.JobID]
	if j == nil {
		return nil, req, wire.NotFoundf("cluster: no job %q (streamd list shows the jobs)", req.JobID)
	}
	return j, req, nil
}

// catchUpRequest is catchUp of the job a JobRequest names.
func (c *Controller) catchUpRequest(msg micro.Request) {
	var req wire.JobRequest
	if json.Unmarshal(msg.Data(), &req) == nil {
		c.catchUp(req.JobID)
	}
}

func (c *Controller) handleStatus(msg micro.Request) {
	c.catchUpRequest(msg)
	c.mu.Lock()
	j, _, err := c.lookup(msg)
	var out wire.JobReply
	if err != nil {
		out.Reply = wire.ErrorReply(err)
	} else {
		st := c.statusLocked(j)
		out.Job = &st
	}
	c.mu.Unlock()
	reply(msg, out)
}

func (c *Controller) handleCancel(msg micro.Request) {
	c.catchUpRequest(msg)
	c.mu.Lock()
	j, _, err := c.lookup(msg)
	if err != nil {
		c.mu.Unlock()
		reply(msg, wire.JobReply{Reply: wire.ErrorReply(err)})
		return
	}
	if wire.TerminalJobState(j.state) || j.canceling {
		st := c.statusLocked(j)
		c.mu.Unlock()
		what := "already " + j.state
		if j.canceling {
			what = "being canceled"
		}
		reply(msg, wire.JobReply{Reply: wire.ErrorReply(wire.Conflictf("cluster: job %s is %s", j.id, what)), Job: &st})
		return
	}
	c.cancelAttemptAndWaitLocked(j) // before answering
	c.endLocked(j, time.Now(), wire.JobCanceled, "canceled by request")
	st := c.statusLocked(j)
	effects := c.scheduleLocked(time.Now()) // freed slots
	c.mu.Unlock()
	reply(msg, wire.JobReply{Job: &st})
	c.run(effects)
}

// cancelAttemptAndWaitLocked cancels j's attempt on its hosts, if it is
// placed, and waits until they stopped it, with c.mu released meanwhile (so
// j may have changed when it returns); j is marked canceling while it waits.
// Called and returns with c.mu held.
func (c *Controller) cancelAttemptAndWaitLocked(j *ctlJob) {
	var effects []effect
	if j.placement != nil {
		effects = c.cancelEffects(j, "")
	}
	j.canceling = true
	c.mu.Unlock()
	var wg sync.WaitGroup
	for _, e := range effects {
		wg.Add(1)
		go func() { defer wg.Done(); e() }()
	}
	wg.Wait()
	c.mu.Lock()
	j.canceling = false
}

func (c *Controller) handleSavepoint(msg micro.Request) {
	var req wire.SavepointRequest
	if err := json.Unmarshal(msg.Data(), &req); err != nil {
		reply(msg, wire.SavepointReply{Reply: wire.Reply{Error: "cluster: savepoint: bad request: " + err.Error(), Code: wire.CodeBadRequest}})
		return
	}
	path, err := c.forwardSavepoint(req.JobID, wire.HostRequest{Dir: req.Dir}, wire.HostVerbSavepoint)
	reply(msg, wire.SavepointReply{Reply: wire.ErrorReply(err), Path: path})
}

func (c *Controller) handleStop(msg micro.Request) {
	var req wire.StopRequest
	if err := json.Unmarshal(msg.Data(), &req); err != nil {
		reply(msg, wire.SavepointReply{Reply: wire.Reply{Error: "cluster: stop: bad request: " + err.Error(), Code: wire.CodeBadRequest}})
		return
	}
	path, err := c.forwardSavepoint(req.JobID, wire.HostRequest{Dir: req.SavepointDir, Drain: req.Drain}, wire.HostVerbStop)
	reply(msg, wire.SavepointReply{Reply: wire.ErrorReply(err), Path: path})
}

// forwardSavepoint takes a savepoint of a running job, or stops it with
// one (distSavepoint): the controller drives every deployed job's
// checkpoints. A stop that fails leaves the job running or restarting,
// never stopping.
func (c *Controller) forwardSavepoint(jobID string, hr wire.HostRequest, verb string) (string, error) {
	c.mu.Lock()
	j := c.jobs[jobID]
	switch {
	case j == nil:
		c.mu.Unlock()
		return "", wire.NotFoundf("cluster: no job %q (streamd list shows the jobs)", jobID)
	case j.placement == nil || j.dist == nil || (j.state != wire.JobRunning && j.state != wire.JobFinishing):
		st := j.state
		c.mu.Unlock()
		return "", wire.Conflictf("cluster: %s job %s: the job is %s, not running", verb, jobID, st)
	}
	c.mu.Unlock()
	return c.distSavepoint(jobID, verb, hr.Dir, hr.Drain, false)
}

func (c *Controller) handleHosts(msg micro.Request) {
	c.mu.Lock()
	out := wire.HostsReply{Hosts: []wire.HostStatus{}}
	free := map[string]int{}
	for _, h := range c.freeSlotsLocked() {
		free[h.ID] = h.Free
	}
	for _, id := range c.hostIDs() {
		h := c.hosts[id]
		st, seen := wire.HostAlive, h.lastSeen
		switch {
		case h.lost:
			st = wire.HostLost
		case h.unconfirmed:
			st = wire.HostUnconfirmed
		}
		if h.unconfirmed {
			seen = time.Time{} // never by this controller
		}
		// An adopted attempt holds slots on a host before it reported
		// how many it has: none are free, not fewer than none.
		out.Hosts = append(out.Hosts, wire.HostStatus{ID: id, Slots: h.slots, Free: max(free[id], 0), State: st, LastSeen: seen})
	}
	c.mu.Unlock()
	reply(msg, out)
}

func (c *Controller) setAttemptState(j *ctlJob, state, reason string) {
	if n := len(j.attempts); n > 0 && j.attempts[n-1].Attempt == j.attempt {
		j.attempts[n-1].State, j.attempts[n-1].Reason = state, reason
	}
}

// statusLocked builds the JobStatus of j.
func (c *Controller) statusLocked(j *ctlJob) wire.JobStatus {
	_, declared, least := control.AdaptiveSlots(j.declaredBounds(), 0)
	st := wire.JobStatus{ID: j.id, Name: j.spec.Name, State: j.state, Reason: j.reason, Attempt: j.attempt,
		Slots: j.slots, Parallelism: j.slots, DeclaredParallelism: declared, MinParallelism: least, Rescales: slices.Clone(j.rescales), Created: j.created, Updated: j.updated, Ended: j.ended, Elapsed: j.elapsed, Savepoint: j.savepoint,
		Attempts: append([]wire.AttemptStatus(nil), j.attempts...), Checkpoints: append([]runtime.CheckpointStats(nil), j.checkpoints...),
		Leader: c.id, Term: c.term, Versions: versionsLocked(j), Autoscaler: j.autoscaleStatus()}
	if j.dist != nil && j.dist.d != nil {
		st.Checkpoints = j.dist.d.Recent() // the controller drives its checkpoints
	}
	if cs := j.spec.Checkpoint; cs != nil {
		st.CheckpointMode = cs.ModeString()
	}
	if j.placement != nil {
		st.Hosts = j.placement.Hosts()
	} else if n := len(j.attempts); n > 0 && j.attempts[n-1].Attempt == j.attempt {
		st.Hosts = j.attempts[n-1].Hosts
	}
	stats := map[string]runtime.OperatorStats{}
	for _, s := range j.stats {
		stats[s.UID] = s
	}
	for _, v := range j.spec.Vertices {
		op := wire.OperatorStatus{UID: v.UID, Parallelism: v.Parallelism, DeclaredParallelism: j.declaredOf(v), RecordsIn: stats[v.UID].RecordsIn, RecordsOut: stats[v.UID].RecordsOut,
			UnionDeclines: stats[v.UID].UnionDeclines, Kind: string(v.Kind), Inputs: wire.EdgeStatuses(v.Inputs)}
		if v.Source != nil {
			op.Connector = connector.Describe(v.Source)
		} else if v.Sink != nil {
			op.Connector = connector.Describe(v.Sink)
		}
		if j.dist != nil && j.dist.d != nil {
			op.UnionDeclines = j.dist.d.UnionDeclines()[v.UID] // the controller drives its checkpoints
		}
		for i := 0; i < v.Parallelism; i++ {
			s := wire.SubtaskStatus{Index: i, State: j.subtaskState}
			if sub := stats[v.UID].Subtasks; i < len(sub) && sub[i] != "" && !wire.TerminalJobState(j.state) && j.placement != nil {
				// As the subtask's host reported it, while its attempt is
				// placed: between attempts (a lost host, a rescale) the
				// last attempt's states are stale.
				s.State = sub[i]
			} else if i < len(sub) && sub[i] == runtime.StateDeployedFinished {
				s.State = sub[i]
			}
			if sub := stats[v.UID].Subtasks; i < len(sub) && sub[i] != "" && i < len(stats[v.UID].Live) {
				live := stats[v.UID].Live[i] // as the subtask's host reported it last
				s.Live = &live
			}
			if j.placement != nil {
				s.Host = j.placement.Host(i)
			} else if wire.TerminalJobState(j.state) && j.lastPlaced != nil {
				s.Host = j.lastPlaced.Host(i) // where the subtask ran last
			} else if len(st.Hosts) == 1 {
				s.Host = st.Hosts[0]
			}
			op.Subtasks = append(op.Subtasks, s)
		}
		st.Operators = append(st.Operators, op)
	}
	return st
}

// sumStats adds up the operators' counters of every host.
func sumStats(byHost map[string][]runtime.OperatorStats) []runtime.OperatorStats {
	var out []runtime.OperatorStats
	idx := map[string]int{}
	hosts := make([]string, 0, len(byHost))
	for h := range byHost {
		hosts = append(hosts, h)
	}
	sort.Strings(hosts)
	for _, h := range hosts {
		for _, s := range byHost[h] {
			i, ok := idx[s.UID]
			if !ok {
				idx[s.UID] = len(out)
				out = append(out, runtime.OperatorStats{UID: s.UID, Parallelism: s.Parallelism})
				i = len(out) - 1
			}
			out[i].RecordsIn += s.RecordsIn
			out[i].RecordsOut += s.RecordsOut
			for k, state := range s.Subtasks { // each host knows the states of its own subtasks
				if state == "" {
					continue
				}
				if len(out[i].Subtasks) < len(s.Subtasks) {
					out[i].Subtasks = append(out[i].Subtasks, make([]string, len(s.Subtasks)-len(out[i].Subtasks))...)
				}
				out[i].Subtasks[k] = state
				if k < len(s.Live) {
					if len(out[i].Live) < len(s.Live) {
						out[i].Live = append(out[i].Live, make([]telemetry.SubtaskLive, len(s.Live)-len(out[i].Live))...)
					}
					out[i].Live[k] = s.Live[k]
				}
			}
		}
	}
	return out
}
