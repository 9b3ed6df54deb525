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
// Controller.mu: what it tells the controller goes through goroutines of
// the controller's wait group (goTracked), which Close waits for.

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

	"github.com/nats-io/nats.go"

	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/internal/checkpoint"
	"github.com/streamd/streamd/internal/cluster/wire"
	"github.com/streamd/streamd/internal/runtime"
	"github.com/streamd/streamd/internal/telemetry"
)

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
	pubLost     int

	jl *runtime.JobLoop // the job's one goroutine

	mu          sync.Mutex // after Controller.mu, held briefly (never while the driver steps); guards everything below
	attempt     int
	placement   control.Placement
	active      bool                           // the attempt is deployed and has not failed
	finished    map[string]bool                // hosts whose part of the attempt finished
	evSeq       map[string]uint64              // per host, the last subtask event of the attempt taken
	cmds        map[string]*wire.ReliableQueue // per host, the commands of the attempt
	spWait      chan string                    // a savepoint request waits for the savepoint's location
	stopping    bool                           // a stop with a savepoint was asked for in this attempt
	rescaleStop bool                           // that stop is the adaptive scheduler's, to rescale the job (adaptive.go)
	started     int                            // the attempt the lifecycle started last (StartAttempt): the scheduler places no later one
	stopSP      string                         // the location of that stop's savepoint, once complete
	closed      bool
	adopted     bool // the current attempt was taken over from another controller term
	// adoptPending: the adopt of that attempt is not posted yet; failures
	// of it reported meanwhile wait in heldFails (failover).
	adoptPending bool
	heldFails    []func()
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
	dj := &distJob{c: c, id: id, g: g, log: c.log.With("job", id), tick: runtime.DefaultTick, finished: map[string]bool{}, term: c.leaderTerm(),
		started: attempt}
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
	dj.d, err = runtime.NewJobDriver(ctx, g, runtime.JobDriverConfig{Checkpoint: co, From: fromRS, Restart: spec.Restart, FirstAttempt: attempt,
		Takeover: takeover, MaxLost: c.opts.MaxFailovers, Seed: uint64(time.Now().UnixNano()), Log: dj.log})
	if err != nil {
		return nil, err
	}
	dj.jl = runtime.NewJobLoop(dj.d, dj, dj.tick, c.done)
	dj.d.Step(nil, control.StartJob{}) // the loop has not started: its first StartAttempt sets restore
	dj.adopted = takeover != nil && !takeover.Start
	if dj.adopted {
		dj.attempt, dj.adoptPending = attempt, true // deployed by adopt, once the new leader posts it
	}
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
		dj.c.goTracked(func() { dj.c.distRunning(dj.id, attempt) })
	}
	if done != nil {
		dj.c.goTracked(func() { dj.c.maybeEndDist(dj.id) })
	}
	lc := dj.d.Lifecycle()
	if rs, l := lc.RestartState(), lc.Latest(); (l != nil && l.ID != dj.pubLatest) || rs.Restarts != dj.pubRestarts || rs.Lost != dj.pubLost {
		var latest *control.RestorePoint
		if l != nil {
			p := *l
			latest, dj.pubLatest = &p, l.ID
		}
		dj.pubRestarts, dj.pubLost = rs.Restarts, rs.Lost
		dj.c.goTracked(func() { dj.c.lifecycleState(dj, latest, rs) })
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
	s.c.goTracked(func() {
		ctx, cancel := context.WithTimeout(context.Background(), s.c.opts.RequestTimeout)
		defer cancel()
		if err := s.Store.Discard(ctx, kind, id, stateRef); err != nil {
			s.log.Debug("state of an aborted checkpoint not discarded", "kind", kind, "id", id, "state", stateRef, "err", err)
		}
	})
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
		dj.endAttemptLocked()
	}
	attempt := dj.attempt
	dj.mu.Unlock()
	if own {
		dj.failoverSpans(x.Reason)
		dj.c.goTracked(func() { dj.c.distFailed(dj.id, attempt, x.Reason) })
	}
}

// StartAttempt records what the next attempt restores and that the
// lifecycle started it: after a failure, the controller places it now
// (lifecycleRestart; the first attempt comes in newDistJob).
func (dj *distJob) StartAttempt(x control.StartAttempt) {
	dj.restore = ""
	if x.Restore != nil {
		dj.restore = x.Restore.Location
	}
	dj.mu.Lock()
	restart := x.Attempt > dj.started
	dj.started = max(dj.started, x.Attempt)
	dj.mu.Unlock()
	if restart {
		telemetry.GlobalMetrics().Restart(context.Background(), dj.id, dj.g.Name)
		dj.c.goTracked(func() { dj.c.lifecycleRestart(dj) })
	}
}

// startedAttempt is the attempt the job's lifecycle started last.
func (dj *distJob) startedAttempt() int {
	dj.mu.Lock()
	defer dj.mu.Unlock()
	return dj.started
}

// StopFailed: distSavepoint notices on the job's state.
func (dj *distJob) StopFailed(control.StopFailed) {}

// JobEnded: when the restart strategy gives up, the job fails.
func (dj *distJob) JobEnded(x control.JobEnded) {
	if x.State == control.JobFailed {
		attempt := dj.d.Lifecycle().Attempt()
		dj.c.goTracked(func() { dj.c.lifecycleGaveUp(dj, attempt, x.Reason) })
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
		defer func() {
			dj.mu.Lock()
			held := dj.heldFails
			dj.adoptPending, dj.heldFails = false, nil
			dj.mu.Unlock()
			for _, f := range held {
				f() // the attempt is deployed: its failure goes to the lifecycle now
			}
		}()
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
	t.dj.c.goTracked(func() { t.dj.c.distFailed(t.dj.id, t.attempt, err.Error()) })
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
// queued after it). attempt is the controller's failed attempt: when its
// deploy is still queued in the loop (a new leader's adopt, posted after
// the job's events were subscribed to), the failure is taken there, after
// it, instead of being dropped (then the controller would wait for a
// restart the lifecycle never heard it must decide).
func (dj *distJob) failover(attempt int, reason, host string, subtask *control.SubtaskID, kind failKind, class control.FailureClass) {
	dj.mu.Lock()
	if dj.adoptPending && !dj.active && dj.attempt == attempt {
		// A new leader has not posted the adopt of the attempt yet: the
		// failure waits for it (else the lifecycle would never hear it,
		// and nobody would restart the job).
		dj.heldFails = append(dj.heldFails, func() { dj.failover(attempt, reason, host, subtask, kind, class) })
		dj.mu.Unlock()
		return
	}
	now := dj.active && dj.attempt == attempt
	if now {
		dj.endAttemptLocked()
	}
	dj.mu.Unlock()
	dj.post(func() {
		if !now {
			dj.mu.Lock()
			later := dj.active && dj.attempt == attempt
			if later {
				dj.endAttemptLocked()
			}
			dj.mu.Unlock()
			if !later {
				return // over already (the lifecycle canceled it, or a later attempt runs)
			}
		}
		defer dj.failoverSpans(reason) // after the driver aborted the attempt's checkpoints
		lc := dj.d.Lifecycle()
		id, why := dj.blame(reason, host, subtask)
		dj.log.Info("attempt failed over", "attempt", attempt, "subtask", id.String(), "host", host, "reason", why, "lost", kind != failTask)
		if kind == failTask {
			dj.step(control.AttemptFailed{Attempt: lc.Attempt(), Subtask: id, Reason: why, Class: class})
		} else {
			dj.step(control.AttemptLost{Attempt: lc.Attempt(), Reason: why, Busy: kind == failBusy})
		}
	})
}

// endAttemptLocked ends the current attempt's commands; the controller
// waits for the lifecycle's StartAttempt (dj.mu held).
func (dj *distJob) endAttemptLocked() {
	dj.active = false
	dj.stopCommands()
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
