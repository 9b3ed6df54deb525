package cluster

// The hosts' messages: heartbeats (registration, slots, lost hosts,
// attempts whose end was never reported), attempt reports and the answers
// to assignments.

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/internal/cluster/wire"
)

// checkHeartbeat decodes a heartbeat and checks its values: a host id as
// StartHost allows, 1 to MaxSlots slots, an interval (default the
// controller's) from 1ms to 1h. Nothing out of range registers a host.
func (c *Controller) checkHeartbeat(data []byte) (wire.Heartbeat, time.Duration, error) {
	var hb wire.Heartbeat
	if err := json.Unmarshal(data, &hb); err != nil {
		return hb, 0, fmt.Errorf("not a heartbeat: %w", err)
	}
	if !wire.HostIDRE.MatchString(hb.HostID) {
		return hb, 0, fmt.Errorf("host id %q: want 1 to 128 letters, digits, '-' and '_'", hb.HostID)
	}
	if hb.Slots < 1 || hb.Slots > wire.MaxSlots {
		return hb, 0, fmt.Errorf("host %s: slots %d out of range [1, %d]", hb.HostID, hb.Slots, wire.MaxSlots)
	}
	interval := c.opts.HeartbeatInterval
	if hb.Interval != "" {
		d, err := time.ParseDuration(hb.Interval)
		if err != nil || d < time.Millisecond || d > time.Hour {
			return hb, 0, fmt.Errorf("host %s: heartbeat interval %q: want a duration from 1ms to 1h", hb.HostID, hb.Interval)
		}
		interval = d
	}
	return hb, interval, nil
}

// handleLeader hears the leader's announcements: a leader that hears of a
// later term than its own was taken over (it may not have noticed yet, its
// renewals held up by a NATS outage) and stops acting at once.
func (c *Controller) handleLeader(msg *nats.Msg) {
	var a wire.LeaderAnnounce
	if err := json.Unmarshal(msg.Data, &a); err != nil {
		return
	}
	c.mu.Lock()
	term := c.term
	c.mu.Unlock()
	if term != 0 && a.Term > term {
		c.depose(fmt.Errorf("cluster: controller %s: controller %s announced term %d, later than this one's %d", c.id, a.ID, a.Term, term))
	}
}

func (c *Controller) handleHeartbeat(msg *nats.Msg) {
	hb, interval, err := c.checkHeartbeat(msg.Data)
	if err != nil {
		c.log.Warn("heartbeat refused", "err", err)
		return
	}
	now := time.Now()
	c.mu.Lock()
	h := c.hosts[hb.HostID]
	wasLost := false
	switch {
	case h == nil:
		h = &ctlHost{id: hb.HostID, busy: map[wire.AttemptRef]*slotUse{}, ended: map[wire.AttemptRef]time.Time{}}
		c.hosts[hb.HostID] = h
		c.log.Info("host registered", "host", hb.HostID, "slots", hb.Slots)
	case h.unconfirmed && !h.lost:
		c.log.Info("host registered", "host", hb.HostID, "slots", hb.Slots)
	case h.lost:
		wasLost = true
		c.log.Info("host is back", "host", hb.HostID, "slots", hb.Slots)
	}
	h.slots, h.interval, h.lastSeen, h.lost, h.unconfirmed = hb.Slots, interval, now, false, false
	delete(c.awaiting, hb.HostID)
	c.reconcileSlotsLocked(h, hb, wasLost, now)
	// A host that runs an attempt the controller no longer wants there (it
	// was lost and its jobs moved, or the job ended) is told to cancel it.
	var effects []effect
	for _, r := range hb.Running {
		j := c.jobs[r.JobID]
		if j != nil && j.attempt == r.Attempt && j.placement != nil && contains(j.placement.Slots, hb.HostID) && !wire.TerminalJobState(j.state) {
			continue
		}
		req := wire.HostRequest{JobID: r.JobID, Attempt: r.Attempt, Term: c.term}
		hostID := hb.HostID
		c.log.Info("host runs a stale attempt; canceling it", "host", hostID, "job", r.JobID, "attempt", r.Attempt)
		effects = append(effects, func() {
			var rep wire.Reply
			if err := wire.RequestTimeout(c.nc, wire.HostSubject(hostID, wire.HostVerbCancel), c.opts.RequestTimeout, req, &rep); err == nil && rep.Err() == nil {
				c.slotsFreed(hostID, wire.AttemptRef{JobID: req.JobID, Attempt: req.Attempt}, "stale attempt canceled")
			}
		})
	}
	effects = append(effects, c.checkUnreportedLocked(hb, h, now)...)
	effects = append(effects, c.scheduleLocked(now)...)
	c.mu.Unlock()
	c.run(effects)
}

// reconcileSlotsLocked matches the slots the controller counts as held on h
// with the attempts h's heartbeat lists. An attempt it omits, whose
// assignment was answered at least one interval ago, frees its slots after
// unlistedRelease such heartbeats in a row (at once when h comes back after
// it was declared lost). An attempt it lists that holds no slots (h ran it
// while declared lost, or runs one of a job this controller does not know)
// takes them again, unless h confirmed its end already (a heartbeat sent
// before that).
func (c *Controller) reconcileSlotsLocked(h *ctlHost, hb wire.Heartbeat, wasLost bool, now time.Time) {
	listed := map[wire.AttemptRef]bool{}
	for _, r := range hb.Running {
		listed[r] = true
	}
	for ref, u := range h.busy {
		switch {
		case listed[ref]:
			u.unlisted = 0
		case u.settled.IsZero():
		case wasLost:
			c.releaseLocked(h.id, ref, false, now, "not listed by the host that came back")
		case now.Sub(u.settled) >= h.interval:
			if u.unlisted++; u.unlisted >= unlistedRelease {
				c.releaseLocked(h.id, ref, false, now, "no longer listed in the host's heartbeats")
			}
		}
	}
	for ref := range listed {
		if h.busy[ref] != nil {
			continue
		}
		if _, ended := h.ended[ref]; ended {
			continue
		}
		slots := h.slots // an unknown attempt: as if it took the whole host
		if j := c.jobs[ref.JobID]; j != nil {
			if p, ok := j.placed[ref.Attempt]; ok {
				slots = 0
				for _, id := range p.Slots {
					if id == h.id {
						slots++
					}
				}
			}
		}
		c.log.Info("host runs an attempt the controller counted no slots for; they are taken", "host", h.id, "job", ref.JobID, "attempt", ref.Attempt, "slots", slots)
		h.busy[ref] = &slotUse{slots: slots, settled: now}
	}
}

// checkUnreportedLocked notices attempts whose end a host never reported: the
// controller believes the attempt runs on host h (its placement has h, the job
// is not over, no end report of h arrived) but h's heartbeats stopped listing
// it (a host lists an attempt from the assignment until it reported its end).
// After opts.UnreportedAfter such heartbeats in a row, and only if the attempt
// was assigned at least that many of h's intervals ago (a heartbeat may
// overtake the assignment), the controller asks h for the outcome.
func (c *Controller) checkUnreportedLocked(hb wire.Heartbeat, h *ctlHost, now time.Time) []effect {
	listed := map[wire.AttemptRef]bool{}
	for _, r := range hb.Running {
		listed[r] = true
	}
	k := c.opts.UnreportedAfter
	var effects []effect
	for _, jid := range c.order {
		j := c.jobs[jid]
		if j.placement == nil || wire.TerminalJobState(j.state) || j.canceling || !contains(j.placement.Slots, h.id) ||
			j.endedOn[h.id] || j.asking[h.id] {
			continue
		}
		if listed[wire.AttemptRef{JobID: j.id, Attempt: j.attempt}] || now.Sub(j.assignedAt) < time.Duration(k)*h.interval {
			j.unlisted[h.id] = 0
			continue
		}
		j.unlisted[h.id]++
		if j.unlisted[h.id] < k {
			continue
		}
		j.asking[h.id] = true
		req, host := wire.HostRequest{JobID: j.id, Attempt: j.attempt, Term: c.term}, h.id
		c.log.Warn("host no longer runs an attempt whose end it did not report; asking for its outcome",
			"host", host, "job", j.id, "attempt", j.attempt, "heartbeats", j.unlisted[host])
		effects = append(effects, func() {
			var rep wire.OutcomeReply
			err := wire.RequestTimeout(c.nc, wire.HostSubject(host, wire.HostVerbOutcome), c.opts.RequestTimeout, req, &rep)
			if err == nil {
				err = rep.Err()
			}
			c.outcome(req, host, rep, err)
		})
	}
	return effects
}

// outcome applies a host's answer to an outcome request: its final report as
// if it had arrived, or, if the host does not know the attempt or did not
// answer, a failure of the attempt (failed over like a lost host).
func (c *Controller) outcome(req wire.HostRequest, host string, rep wire.OutcomeReply, err error) {
	now := time.Now()
	c.mu.Lock()
	var effects []effect
	defer func() {
		c.mu.Unlock()
		c.run(effects)
	}()
	ref := wire.AttemptRef{JobID: req.JobID, Attempt: req.Attempt}
	if err == nil && !rep.Running && rep.Event == nil && c.releaseLocked(host, ref, true, now, "the host does not know the attempt") {
		effects = c.scheduleLocked(now)
	}
	j := c.jobs[req.JobID]
	if j == nil || j.attempt != req.Attempt || wire.TerminalJobState(j.state) || j.placement == nil || j.canceling || j.endedOn[host] {
		return
	}
	j.asking[host] = false
	j.unlisted[host] = 0
	switch {
	case err == nil && rep.Running:
		c.log.Info("host says the attempt still runs", "host", host, "job", req.JobID, "attempt", req.Attempt)
		return
	case err == nil && rep.Event != nil && rep.Event.JobID == req.JobID && rep.Event.Attempt == req.Attempt:
		ev := *rep.Event
		ev.HostID = host
		c.log.Warn("host's final report was lost; taking its outcome", "host", host, "job", req.JobID, "attempt", req.Attempt, "state", ev.State)
		effects = append(effects, func() { c.hostEvent(ev) })
		return
	}
	reason := fmt.Sprintf("host %s reported no end for attempt %d of job %s", host, req.Attempt, req.JobID)
	if err != nil {
		reason += fmt.Sprintf(" (outcome request: %v)", err)
	} else {
		reason += " (the host does not know its outcome)"
	}
	j.endedOn[host] = true
	effects = append(effects, c.failLocked(j, now, failure{reason: reason, kind: failInfra, host: host, skip: true})...)
	effects = append(effects, c.scheduleLocked(now)...)
}

func (c *Controller) handleHostEvent(msg *nats.Msg) {
	var ev wire.HostEvent
	if err := json.Unmarshal(msg.Data, &ev); err != nil {
		wire.Respond(msg, wire.Reply{Error: "cluster: bad host event: " + err.Error()})
		return
	}
	c.hostEvent(ev)
	wire.Respond(msg, wire.Reply{})
}

func (c *Controller) hostEvent(ev wire.HostEvent) {
	now := time.Now()
	c.mu.Lock()
	var effects []effect
	switch ev.State {
	case wire.SubtaskFinished, wire.SubtaskFailed, wire.SubtaskCanceled:
		// The attempt's slots on that host are free, whatever attempt it is.
		if c.releaseLocked(ev.HostID, wire.AttemptRef{JobID: ev.JobID, Attempt: ev.Attempt}, true, now, "end reported: "+ev.State) {
			effects = c.scheduleLocked(now)
		}
	}
	j := c.jobs[ev.JobID]
	if j == nil || j.attempt != ev.Attempt || wire.TerminalJobState(j.state) || j.placement == nil || j.canceling {
		c.mu.Unlock()
		c.log.Debug("stale host event ignored", "host", ev.HostID, "job", ev.JobID, "attempt", ev.Attempt, "state", ev.State)
		c.run(effects)
		return
	}
	if ev.Checkpoints != nil {
		j.checkpoints = ev.Checkpoints
	}
	if ev.Stats != nil {
		j.stats = ev.Stats
		if j.dist != nil {
			j.hostStats[ev.HostID] = ev.Stats
			j.stats = sumStats(j.hostStats)
		}
	}
	if ev.Elapsed != "" {
		j.elapsed = ev.Elapsed
	}
	if ev.Stats != nil {
		effects = append(effects, c.autoscaleLocked(j, now)...)
	}
	switch ev.State {
	case wire.SubtaskFinished, wire.SubtaskFailed, wire.SubtaskCanceled:
		j.endedOn[ev.HostID] = true
	}
	switch ev.State {
	case wire.SubtaskDeploying:
		j.subtaskState = wire.SubtaskDeploying
	case wire.SubtaskRunning:
		j.subtaskState = wire.SubtaskRunning
		if j.dist != nil {
			j.dist.hostRunning(ev.HostID)
		}
		// A job spread over hosts with checkpoints runs once its coordinator
		// sees every subtask running (distRunning).
		if (j.state == wire.JobCreated || j.state == wire.JobRestarting) && !j.dist.ckpt {
			j.state, j.reason = wire.JobRunning, ""
			c.changedLocked(j)
			c.log.Info("job running", "job", j.id, "attempt", j.attempt, "host", ev.HostID)
		}
		c.setAttemptState(j, wire.SubtaskRunning, "")
	case wire.SubtaskFinished:
		j.dist.mu.Lock()
		j.dist.finished[ev.HostID] = true
		j.dist.mu.Unlock()
		j.updated = now
		c.mu.Unlock()
		c.run(effects)
		c.maybeEndDist(j.id)
		return
	case wire.SubtaskFailed, wire.SubtaskCanceled:
		f := failure{reason: "canceled on host " + ev.HostID, kind: failTask, host: ev.HostID, skip: true}
		if ev.Error != "" {
			// A subtask's error starts with "streamd: " (host.Error), said once by the CLI.
			f.reason = fmt.Sprintf("on host %s: %s", ev.HostID, strings.TrimPrefix(ev.Error, "streamd: "))
		}
		if len(ev.Subtasks) > 0 {
			f.subtask = &control.SubtaskID{Operator: ev.Subtasks[0].Operator, Index: ev.Subtasks[0].Subtask}
		}
		if ev.Class != "" {
			if cl, err := control.ParseFailureClass(ev.Class); err == nil {
				f.class = cl
			} else {
				c.log.Warn("host event with an unknown failure class: taken as restartable", "host", ev.HostID, "err", err)
			}
		}
		effects = append(effects, c.failLocked(j, now, f)...)
		effects = append(effects, c.scheduleLocked(now)...)
	}
	j.updated = now
	c.mu.Unlock()
	c.run(effects)
}

// assigned takes a host's answer to an assignment (or the request's error).
// Accepted: the host holds the slots until it reports the end. Refused for
// busy slots: the slots are not taken and the attempt is rescheduled, which
// does not count as a failure of the job. Refused otherwise, or no answer:
// the attempt fails over (an infrastructure failure: it counts against
// MaxFailovers, not against the job's restart strategy).
func (c *Controller) assigned(a wire.Assignment, h string, rep wire.AssignReply, err error) {
	now := time.Now()
	ref := wire.AttemptRef{JobID: a.JobID, Attempt: a.Attempt}
	if err == nil {
		err = rep.Err()
	}
	c.mu.Lock()
	var effects []effect
	defer func() {
		c.mu.Unlock()
		c.run(effects)
	}()
	c.settleLocked(h, ref, now)
	if err == nil {
		return
	}
	if rep.NewerTerm > c.term {
		// Not the host's fault: another controller leads now.
		effects = append(effects, func() {
			c.depose(fmt.Errorf("cluster: controller %s: host %s knows a later term %d", c.id, h, rep.NewerTerm))
		})
		return
	}
	f := failure{reason: fmt.Sprintf("assign to host %s: %v", h, err), kind: failInfra, host: h, skip: true}
	switch {
	case rep.Busy:
		f.kind, f.reason = failBusy, fmt.Sprintf("host %s refused the assignment: its slots are busy (%v); rescheduled", h, err)
		fallthrough
	case errors.Is(err, nats.ErrNoResponders):
		if !rep.Busy {
			// Nobody listens for the host (it reconnects to NATS, or is
			// gone, which its missed heartbeats will tell): not the job's
			// failure, tried again after a heartbeat interval.
			f.kind, f.reason = failBusy, fmt.Sprintf("host %s did not take the assignment (%v); rescheduled", h, err)
		}
		fallthrough
	case rep.Error != "":
		// The host does not run it.
		if c.releaseLocked(h, ref, true, now, "assignment refused") {
			effects = c.scheduleLocked(now)
		}
	default:
		f.skip = false // no answer: it may run there after all
	}
	j := c.jobs[a.JobID]
	if j == nil || j.attempt != a.Attempt || wire.TerminalJobState(j.state) || j.placement == nil || j.canceling {
		return
	}
	c.log.Warn("assignment refused", "job", a.JobID, "attempt", a.Attempt, "host", h, "busy", rep.Busy, "err", err)
	effects = append(effects, c.failLocked(j, now, f)...)
	effects = append(effects, c.scheduleLocked(now)...)
}
