package cluster

// Deployed jobs, on one host or spread over several. The controller runs
// the job's checkpoint coordinator through a runtime.Driver (the same driver
// `streamd run` uses); each host runs its subtasks with
// runtime.StartAttempt (package agent, dist.go), with NATS channels
// (dataplane/natsch) to the subtasks on other hosts and in-process channels
// between its own. The subtasks' events go to the controller on
// wire.TaskEventsSubject, the driver's commands to each host on
// wire.TaskCommandSubject; both carry the attempt, so nothing of an earlier
// attempt is ever mixed into a later one. This file is the controller's end.
//
// One goroutine per job (a runtime.JobLoop, the same loop `streamd run`
// runs a job on, with the distJob as its Executor) steps its driver;
// everything else posts work to it. Lock order: Controller.mu before distJob.mu; distJob.mu
// is held only briefly for plain fields, never while the driver steps (and
// so never during the driver's store IO), and the loop never takes
// Controller.mu (what it tells the controller goes through goroutines).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/streamd/streamd/internal/cluster/wire"

	"github.com/nats-io/nats.go"

	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/internal/checkpoint"
	"github.com/streamd/streamd/internal/runtime"
	"github.com/streamd/streamd/internal/telemetry"
)

// ---- host side ----

// ---- controller side ----

// distJob is the controller's side of a deployed job. One goroutine, its
// loop, is the only one to step its driver (d): subtask events, ticks,
// failovers, stops and the start of each attempt are queued for it (post),
// so a slow checkpoint store stalls only this job, and the controller's
// mutex is never held while the driver does IO.
type distJob struct {
	c     *Controller
	id    string
	g     *control.JobGraph
	store checkpoint.Store // nil: no checkpointing
	log   *slog.Logger
	tick  time.Duration
	sub   *nats.Subscription
	d     *runtime.Driver // the job's lifecycle and (ckpt) coordinator; stepped by the loop only
	ckpt  bool            // the job checkpoints
	term  uint64          // the controller's term: sent with every command

	// Of the loop only.
	restore string  // the checkpoint the next attempt restores from (the lifecycle's choice)
	obs     distObs // the attempt, failover and restore spans (trace.go)
	running bool    // the coordinator saw every subtask of the attempt running
	// published: the latest restore point and restart count last told to
	// the controller (for the job's record).
	pubLatest   int64
	pubRestarts int

	jl *runtime.JobLoop // the job's one goroutine

	mu           sync.Mutex // after Controller.mu, held briefly (never while the driver steps); guards everything below
	attempt      int
	placement    control.Placement
	active       bool                           // the attempt is deployed and has not failed
	finished     map[string]bool                // hosts whose part of the attempt finished
	evSeq        map[string]uint64              // per host, the last subtask event of the attempt taken
	cmds         map[string]*wire.ReliableQueue // per host, the commands of the attempt
	spWait       chan string                    // a savepoint request waits for the savepoint's location
	stopping     bool                           // a stop with a savepoint was asked for in this attempt
	rescaleStop  bool                           // that stop is the adaptive scheduler's, to rescale the job (adaptive.go)
	awaitRestart bool                           // a task failure: the controller waits for the lifecycle to restart the job
	stopSP       string                         // the location of that stop's savepoint, once complete
	closed       bool
	adopted      bool // the current attempt was taken over from another controller term
	// The driver's outcome, published by the loop after each step.
	done     *control.JobDone
	savepath string
}

// newDistJob makes the controller side of job id, spread over hosts from
// attempt `attempt` on (called without c.mu: it opens the checkpoint store).
// resumed: an earlier controller term ran the job (it was loaded from the
// bucket); from is its latest restore point as recorded, and the store's
// latest completed checkpoint counts too when it is newer (the record may
// lag; retention may have removed the recorded one). With takeover,
// attempt runs already: the job's lifecycle takes it over (adopt sends
// nothing but a resync to its hosts), and the checkpoint ids skip those the
// previous leader may have triggered.
func (c *Controller) newDistJob(id string, spec wire.JobSpec, from string, attempt int, resumed bool, takeover *runtime.Takeover) (*distJob, error) {
	g, err := spec.Graph(func(a wire.Artifact) (string, error) { return "/" + a.Name, nil })
	if err != nil {
		return nil, err
	}
	dj := &distJob{c: c, id: id, g: g, log: c.log.With("job", id), tick: runtime.DefaultTick, finished: map[string]bool{}, term: c.leaderTerm()}
	// The job's lifecycle (control.Lifecycle) decides its restarts and
	// what each attempt restores; with checkpointing it runs the
	// coordinator too.
	var co *runtime.CheckpointOptions
	var fromRS *checkpoint.Restore
	if cs := spec.Checkpoint; cs != nil {
		ctx, cancel := context.WithTimeout(context.Background(), wire.DefaultRetry.Total)
		defer cancel()
		store, err := wire.OpenStoreRetry(ctx, c.nc, cs, id, c.log)
		if err != nil {
			return nil, err
		}
		dj.store, dj.ckpt = store, true
		co = runtime.NewCheckpointOptions(cs, discardLater{Store: store, c: c, log: dj.log})
		co.Tick, co.JobID = dj.tick, id
		if takeover != nil {
			co.SkipIDs = int64(max(cs.MaxConcurrent, 1))
		}
		co.OnComplete = func(md *checkpoint.Metadata) {
			// Called by the driver, in the loop.
			dj.mu.Lock()
			defer dj.mu.Unlock()
			if md.Kind == control.KindSavepoint && dj.stopping {
				dj.stopSP = md.Location
			}
			if md.Kind == control.KindSavepoint && dj.spWait != nil {
				select {
				case dj.spWait <- md.Location:
				default:
				}
			}
		}
		// The first attempt starts from the checkpoint the job was deployed
		// from, and checkpoint ids go on after it, so they never repeat
		// those of its earlier run (file sinks name their committed files by
		// checkpoint id).
		var latest *checkpoint.Metadata
		if resumed {
			if latest, err = store.Latest(ctx); err != nil && !errors.Is(err, checkpoint.ErrNoCheckpoint) {
				return nil, fmt.Errorf("cluster: job %s: the latest checkpoint in %s: %w", id, wire.StoreName(store), err)
			}
		}
		if from != "" {
			md, _, err := wire.ResolveIn(ctx, c.nc, from)
			switch {
			case err == nil:
				fromRS = &checkpoint.Restore{Metadata: md}
			case latest == nil:
				return nil, fmt.Errorf("cluster: job %s: the checkpoint it was deployed from: %w", id, err)
			default:
				dj.log.Info("the recorded restore point is gone; the latest checkpoint in the store is newer", "recorded", from, "latest", latest.Location)
			}
		}
		if latest != nil && (fromRS == nil || latest.ID > fromRS.Metadata.ID) {
			fromRS = &checkpoint.Restore{Metadata: latest}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), wire.DefaultRetry.Total)
	defer cancel()
	dj.d, err = runtime.NewJobDriver(ctx, g, co, fromRS, spec.Restart, attempt, takeover, uint64(time.Now().UnixNano()), dj.log, nil)
	if err != nil {
		return nil, err
	}
	dj.jl = runtime.NewJobLoop(dj.d, dj, dj.tick, c.done)
	dj.d.Step(nil, control.StartJob{}) // the loop has not started: its first StartAttempt sets restore
	dj.adopted = takeover != nil && !takeover.Start
	dj.sub, err = c.nc.Subscribe(wire.PrefixTask+"."+id+".*.events", dj.onEvent)
	if err != nil {
		return nil, fmt.Errorf("cluster: job %s: subscribe to subtask events: %w", id, err)
	}
	_ = dj.sub.SetPendingLimits(-1, -1)
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		dj.jl.Run()
	}()
	return dj, nil
}

// post queues f for the job's loop (runtime.JobLoop); false when the loop
// has ended. It never blocks (callers may hold the controller's mutex).
func (dj *distJob) post(f func()) bool { return dj.jl.Post(f) }

// Tick steps the driver every tick, also between attempts: restart delays
// are ticks (runtime.Executor).
func (dj *distJob) Tick() {
	dj.mu.Lock()
	on := !dj.closed
	dj.mu.Unlock()
	if on {
		dj.step(control.Tick{})
	}
}

// step feeds ev to the driver (in the loop) and publishes its outcome.
func (dj *distJob) step(ev control.Event) {
	dj.d.Step(dj.target(), ev)
	dj.checkRunning()
	done, sp := dj.d.Done(), dj.d.Savepoint()
	dj.mu.Lock()
	dj.done, dj.savepath = done, sp
	attempt := dj.attempt
	dj.mu.Unlock()
	if st := dj.d.State(); dj.ckpt && !dj.running && (st == control.JobRunning || st == control.JobFinishing) {
		// The coordinator sees every subtask running: so is the job.
		dj.running = true
		go dj.c.distRunning(dj.id, attempt)
	}
	if done != nil {
		go dj.c.maybeEndDist(dj.id)
	}
	lc := dj.d.Lifecycle()
	if l := lc.Latest(); (l != nil && l.ID != dj.pubLatest) || lc.Restarts() != dj.pubRestarts {
		var latest *control.RestorePoint
		if l != nil {
			p := *l
			latest, dj.pubLatest = &p, l.ID
		}
		rs := lc.RestartState()
		dj.pubRestarts = rs.Restarts
		go dj.c.lifecycleState(dj, latest, rs)
	}
}

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
	if j.restarts == nil || rs.Restarts >= j.restarts.Restarts {
		j.restarts, changed = &rs, true
	}
	if changed {
		c.saveLocked(j)
	}
}

// discardLater is the checkpoint store of a job's driver in the controller:
// the driver discards the state of aborted checkpoints while it is stepped,
// which failover and close do under Controller.mu, so Discard runs on a
// goroutine instead (no store IO under the controller's mutex; the driver
// ignores its errors anyway).
type discardLater struct {
	checkpoint.Store
	c   *Controller
	log *slog.Logger
}

func (s discardLater) Discard(_ context.Context, kind control.CheckpointKind, id int64, stateRef string) error {
	s.c.wg.Add(1)
	go func() {
		defer s.c.wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), s.c.opts.RequestTimeout)
		defer cancel()
		if err := s.Store.Discard(ctx, kind, id, stateRef); err != nil {
			s.log.Debug("state of an aborted checkpoint not discarded", "kind", kind, "id", id, "state", stateRef, "err", err)
		}
	}()
	return nil
}

// distTarget sends the driver's commands of one attempt to its hosts.
type distTarget struct {
	dj        *distJob
	attempt   int
	placement control.Placement
}

// The job's lifecycle's own actions, in the loop (runtime.Executor; the
// first StartAttempt comes in newDistJob, before the loop starts). The
// controller places and assigns attempts and cancels them on their hosts;
// the lifecycle says what an attempt restores, when a failed job restarts,
// and when it gives up.

// CancelAttempt: the lifecycle failed the attempt itself (the coordinator's
// decision: too many failed checkpoints, a stop's savepoint aborted), or
// answers a failure the controller reported (nothing to do then). The
// controller cancels it on its hosts and waits for the restart.
func (dj *distJob) CancelAttempt(x control.CancelAttempt) {
	dj.mu.Lock()
	own := dj.active
	if own {
		dj.active, dj.awaitRestart = false, true
		dj.stopCommands()
	}
	attempt := dj.attempt
	dj.mu.Unlock()
	if own {
		dj.failoverSpans(x.Reason)
		go dj.c.distFailed(dj.id, attempt, x.Reason)
	}
}

// StartAttempt records what the next attempt restores; after a task
// failure it tells the controller to place it.
func (dj *distJob) StartAttempt(x control.StartAttempt) {
	dj.restore = ""
	if x.Restore != nil {
		dj.restore = x.Restore.Location
	}
	dj.mu.Lock()
	awaited := dj.awaitRestart
	dj.awaitRestart = false
	dj.mu.Unlock()
	if awaited {
		telemetry.GlobalMetrics().Restart(context.Background(), dj.id, dj.g.Name)
		go dj.c.lifecycleRestart(dj)
	}
}

// StopFailed: distSavepoint notices on the job's state.
func (dj *distJob) StopFailed(control.StopFailed) {}

// JobEnded: when the restart strategy gives up, the job fails.
func (dj *distJob) JobEnded(x control.JobEnded) {
	if x.State == control.JobFailed {
		go dj.c.lifecycleGaveUp(dj, x.Reason)
	}
}

// Command queues c for the host of subtask id (called by the driver, in the
// loop): sent as a request, again until the host answers (ReliableQueue).
func (t distTarget) Command(id control.SubtaskID, c runtime.Command) bool {
	h := t.placement.Host(id.Index)
	if h == "" {
		return false
	}
	dj := t.dj
	dj.mu.Lock()
	defer dj.mu.Unlock()
	if dj.attempt != t.attempt || !dj.active {
		return true // the attempt is over: its commands go nowhere
	}
	q := dj.cmdQueue(h)
	err := q.Send(func(seq uint64) ([]byte, error) {
		return json.Marshal(wire.TaskCommand{Subtask: id, Command: c, Seq: seq, Term: dj.term})
	})
	if err != nil {
		dj.log.Warn("command not sent", "host", h, "subtask", id, "err", err)
	}
	return true
}

// cmdQueue is the command queue of the current attempt to host h (dj.mu
// held).
func (dj *distJob) cmdQueue(h string) *wire.ReliableQueue {
	q := dj.cmds[h]
	if q == nil {
		q = wire.NewReliableQueue(dj.c.nc, wire.TaskCommandSubject(dj.id, dj.attempt, h), dj.log)
		dj.cmds[h] = q
	}
	return q
}

// adopt takes over attempt, which runs on placement p (a new leader): the
// attempt is recorded as deployed, and its hosts are asked to report their
// subtasks' lifecycle again, for the coordinator.
func (dj *distJob) adopt(attempt int, p control.Placement) {
	dj.post(func() {
		dj.deploy(attempt, p)
		dj.mu.Lock()
		defer dj.mu.Unlock()
		if !dj.ckpt {
			return
		}
		for _, h := range p.Hosts() {
			err := dj.cmdQueue(h).Send(func(seq uint64) ([]byte, error) {
				return json.Marshal(wire.TaskCommand{Seq: seq, Term: dj.term, Resync: true})
			})
			if err != nil {
				dj.log.Warn("resync not sent", "host", h, "err", err)
			}
		}
	})
}

// halt stops the job's messages at once (the controller stopped or was
// deposed): no more events taken, no more commands sent. The job runs on;
// the next leader adopts it.
func (dj *distJob) halt() {
	_ = dj.sub.Unsubscribe()
	dj.mu.Lock()
	dj.stopCommands()
	dj.mu.Unlock()
	telemetry.GlobalMetrics().EndJob(dj.id, dj.g.Name) // the next leader reports the job
}

// stopCommands ends the command queues of the attempt (dj.mu held).
func (dj *distJob) stopCommands() {
	for _, q := range dj.cmds {
		q.Stop()
	}
	dj.cmds = map[string]*wire.ReliableQueue{}
}

func (t distTarget) Fail(err error) {
	go t.dj.c.distFailed(t.dj.id, t.attempt, err.Error())
}

// target is the current attempt's target; nil when no attempt is active.
func (dj *distJob) target() runtime.Target {
	dj.mu.Lock()
	defer dj.mu.Unlock()
	if !dj.active {
		return nil
	}
	return distTarget{dj: dj, attempt: dj.attempt, placement: dj.placement}
}

func (dj *distJob) onEvent(m *nats.Msg) {
	toks := strings.Split(m.Subject, ".")
	if len(toks) != 6 {
		return
	}
	attempt, err := strconv.Atoi(toks[4])
	if err != nil {
		return
	}
	var te wire.TaskEvent
	if err := json.Unmarshal(m.Data, &te); err != nil {
		dj.log.Warn("bad subtask event", "host", te.Host, "err", err)
		wire.Respond(m, wire.Reply{Error: "cluster: bad subtask event: " + err.Error()})
		return
	}
	defer wire.Respond(m, wire.Reply{}) // taken, or of an attempt that is over: do not send it again
	ev, err := te.Event()
	if err != nil {
		dj.log.Warn("bad subtask event", "host", te.Host, "err", err)
		return
	}
	dj.post(func() {
		dj.mu.Lock()
		if attempt != dj.attempt || !dj.active || !dj.ckpt || dj.closed {
			dj.mu.Unlock()
			return // a straggler of an earlier attempt
		}
		if te.Seq != 0 {
			if te.Seq <= dj.evSeq[te.Host] {
				dj.mu.Unlock()
				return // sent again after a lost answer: already taken
			}
			dj.evSeq[te.Host] = te.Seq
		}
		dj.mu.Unlock()
		dj.step(ev)
	})
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

// deploy records the new attempt (in the loop) and returns the checkpoint
// location it restores from.
func (dj *distJob) deploy(attempt int, p control.Placement) string {
	dj.mu.Lock()
	if attempt != dj.attempt {
		dj.adopted = false
	}
	dj.attempt, dj.placement, dj.active = attempt, p, true
	dj.stopping, dj.rescaleStop = false, false // stopSP stays: a failed stop's error names it
	dj.finished = map[string]bool{}
	dj.evSeq = map[string]uint64{}
	dj.stopCommands()
	dj.mu.Unlock()
	dj.running = false
	dj.startAttemptSpan(dj.restore)
	return dj.restore
}

// failover ends the current attempt in the driver (a TaskFailed unless the
// coordinator already fails over) and picks the checkpoint the next attempt
// restores from: every persist of the failed attempt is over by then.
// subtask is the subtask that failed, host the host where the attempt
// failed, when known (see blame).
//
// Called with c.mu held: the attempt's commands stop at once, the driver
// hears of it in the loop (before the next attempt's deploy, which is
// queued after it).
func (dj *distJob) failover(reason, host string, subtask *control.SubtaskID, lost bool, class control.FailureClass) {
	dj.mu.Lock()
	if !dj.active {
		dj.mu.Unlock()
		return
	}
	dj.active = false
	dj.stopCommands()
	attempt := dj.attempt
	dj.awaitRestart = !lost // the controller waits for the lifecycle's StartAttempt
	dj.mu.Unlock()
	dj.post(func() {
		defer dj.failoverSpans(reason) // after the driver aborted the attempt's checkpoints
		lc := dj.d.Lifecycle()
		id, why := dj.blame(reason, host, subtask)
		dj.log.Info("attempt failed over", "attempt", attempt, "subtask", id.String(), "host", host, "reason", why, "lost", lost)
		if lost {
			dj.step(control.AttemptLost{Attempt: lc.Attempt(), Reason: why})
		} else {
			dj.step(control.AttemptFailed{Attempt: lc.Attempt(), Subtask: id, Reason: why, Class: class})
		}
	})
}

// blame is the subtask the coordinator hears failed (its TaskFailed needs
// one) and the reason it is told: the subtask that failed when known; else
// one the attempt ran on the failed host, with a reason that says the host
// failed, not that subtask; else (no host known either) the first subtask,
// saying no subtask is known to have failed.
func (dj *distJob) blame(reason, host string, subtask *control.SubtaskID) (control.SubtaskID, string) {
	all := control.Subtasks(dj.g)
	if subtask != nil {
		for _, id := range all {
			if id == *subtask {
				return id, reason
			}
		}
	}
	if host != "" {
		for _, id := range all {
			if dj.placement.Host(id.Index) == host {
				return id, fmt.Sprintf("its host %s failed (the subtask itself did not fail): %s", host, reason)
			}
		}
	}
	return all[0], "the attempt failed, no failed subtask known: " + reason
}

// close ends the job's loop (after what is queued and the driver's final
// event) and its subscription (c.mu held).
func (dj *distJob) close(final control.Event) {
	dj.mu.Lock()
	if dj.closed {
		dj.mu.Unlock()
		return
	}
	dj.active = false
	dj.stopCommands()
	dj.mu.Unlock()
	dj.post(func() {
		if final != nil && !dj.d.Lifecycle().Ended() {
			dj.d.Step(nil, final)
		}
		dj.endSpans(final)
		telemetry.GlobalMetrics().EndJob(dj.id, dj.g.Name) // the job's series end with it
	})
	dj.mu.Lock()
	dj.closed = true
	dj.mu.Unlock()
	dj.jl.Close() // once its queue is empty
	_ = dj.sub.Unsubscribe()
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

// lifecycleRestart: the job's lifecycle restarts the job after a task
// failure (its restart strategy's delay has passed): the attempt is placed.
func (c *Controller) lifecycleRestart(dj *distJob) {
	now := time.Now()
	c.mu.Lock()
	j := c.jobOfLocked(dj)
	if j == nil || wire.TerminalJobState(j.state) || j.canceling {
		c.mu.Unlock()
		return
	}
	if !j.awaitingRestart {
		// The failure has not reached failLocked yet (the lifecycle decided
		// it): failLocked restarts at once.
		j.restartReady = true
		c.mu.Unlock()
		return
	}
	j.awaitingRestart = false
	j.restartAt = now
	c.log.Info("job restarting", "job", j.id, "attempt", j.attempt)
	effects := c.scheduleLocked(now)
	c.mu.Unlock()
	c.run(effects)
}

// lifecycleGaveUp: the job's restart strategy gives up.
func (c *Controller) lifecycleGaveUp(dj *distJob, reason string) {
	now := time.Now()
	c.mu.Lock()
	j := c.jobOfLocked(dj)
	if j == nil || wire.TerminalJobState(j.state) {
		c.mu.Unlock()
		return
	}
	c.endLocked(j, now, wire.JobFailed, reason)
	effects := c.scheduleLocked(now)
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
