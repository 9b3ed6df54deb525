package runtime

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/dataplane"
	"github.com/streamd/streamd/host"
	"github.com/streamd/streamd/internal/checkpoint"
	"github.com/streamd/streamd/internal/jobfile"
	"github.com/streamd/streamd/internal/telemetry"
)

// runner is one Run: the job's lifecycle (control.Lifecycle, with its
// coordinator when the job checkpoints) on a JobLoop, and the in-process
// Executor of its attempts: Run's goroutine is the job's loop, the only one
// to step the lifecycle; the subtasks' events, their ends and the user's
// requests are posted to it. The controller of internal/cluster drives a
// deployed job the same way, with hosts as its Executor.
type runner struct {
	g       *control.JobGraph
	opts    Options
	log     *slog.Logger
	start   time.Time
	stats   []*opStats
	modules map[string]*host.Module
	// stateCache is the pebble block cache the run's subtasks share (nil:
	// the memory backend); made by loadModules, released by closeModules.
	stateCache *host.StateCache
	stdout     sync.Mutex
	nats       natsConns
	obs        runObs // job, restore and failover spans (observe.go)
	cur        *job   // the current attempt, nil between attempts; guarded by Driver.mu for Stats
	last       *job   // the latest attempt that ended, for Stats; guarded by Driver.mu

	// Of the job's loop (loop).
	ctx          context.Context
	tick         time.Duration
	ended        *control.JobEnded     // the lifecycle ended the job
	pendingStart *control.StartAttempt // waits for the attempt before to end
	lastErr      error                 // of the latest failed attempt
	fatalErr     error                 // ends the job without a restart
	stopFailed   chan<- error          // the stop request's Failed
	terminate    bool                  // a stop that must end the job was asked for
	jl           *JobLoop              // the job's loop
	canceled     bool                  // ctx ended: the job was canceled
	failures     []AttemptFailure      // failed attempts, for Stats; guarded by Driver.mu

	Driver // the checkpoint coordinator's driver (coord nil without checkpointing)
}

// Driver carries out a control.Coordinator's actions: it steps the
// coordinator with an event and performs the resulting actions in order,
// sending the subtasks' commands to a Target: the subtasks of an attempt in
// this process (Run, *job), or on other hosts (internal/cluster, whose
// controller drives a job spread over hosts with it). The caller serializes
// Step; the fields Stats reads are guarded by mu.
type Driver struct {
	g     *control.JobGraph
	co    *CheckpointOptions
	log   *slog.Logger
	coord *control.Coordinator // read only: stepped through lc when lc is set
	// lc, when set (Run), is what events go to: the job's lifecycle around
	// coord; its own actions go to onLifecycle. Without it (a job spread over
	// hosts, driven by internal/cluster) events go to coord.
	lc          *control.Lifecycle
	onLifecycle func(control.Action)
	store       checkpoint.Store
	queued      []control.Event // events to Step once the current actions are done
	lastMD      *checkpoint.Metadata
	base        int64 // the newest completed checkpoint of this store (Barrier.Base)
	restarts    int
	count       int // completed checkpoints
	jobDone     *control.JobDone
	savepath    string
	mu          sync.Mutex // guards the fields Stats reads: restarts, count, lastMD, savepath
	obs         driverObs  // checkpoint and stop-with-savepoint spans, checkpoint metrics (observe.go)

	spWaiters []chan<- SavepointResult // savepoint requests waiting for their savepoint

	// Checkpoints declined because an operator with union list state is
	// partially finished: per operator, those of the current run of
	// declines (logged once at its start and once at its end) and the total
	// (Stats; guarded by mu).
	unionRun   map[string]int
	unionTotal map[string]int
}

// unionDeclined counts a checkpoint aborted for the union list state of a
// partially finished operator; the first of a run is logged at info.
func (d *Driver) unionDeclined(x control.AbortCheckpoint) {
	if d.unionRun == nil {
		d.unionRun, d.unionTotal = map[string]int{}, map[string]int{}
	}
	if d.unionRun[x.Operator] == 0 {
		d.log.Info("checkpoints are declined while an operator with union list state is partially finished; subtasks waiting for their final checkpoint wait until all its subtasks finish",
			"operator", x.Operator, "checkpoint", x.ID, "detail", x.Detail)
	}
	d.unionRun[x.Operator]++
	d.mu.Lock()
	d.unionTotal[x.Operator]++
	d.mu.Unlock()
}

// unionDeclinesEnd ends the runs of union-state declines: a checkpoint
// completed (or the job ended) after them.
func (d *Driver) unionDeclinesEnd(why string) {
	for op, n := range d.unionRun {
		d.log.Info("union-state declines ended", "operator", op, "declined", n, "because", why)
	}
	clear(d.unionRun)
}

// UnionDeclines is, per operator, how many checkpoints were declined because
// it has union list state and was partially finished.
func (d *Driver) UnionDeclines() map[string]int {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.unionTotal) == 0 {
		return nil
	}
	out := make(map[string]int, len(d.unionTotal))
	for op, n := range d.unionTotal {
		out[op] = n
	}
	return out
}

// Target is where a Driver's commands go: the subtasks of the current
// attempt. Command queues c for subtask id without blocking and reports
// false when that subtask has exited (a trigger then fails); Fail cancels
// the attempt (control.FailJob). Neither may call back into the Driver.
type Target interface {
	Command(id control.SubtaskID, c Command) bool
	Fail(err error)
}

// noTarget is the Target while no attempt runs.
type noTarget struct{}

func (noTarget) Command(control.SubtaskID, Command) bool { return false }
func (noTarget) Fail(error)                              {}

func (r *runner) closeModules() {
	for _, m := range r.modules {
		_ = m.Close(context.Background())
	}
	r.stateCache.Release() // open pebble instances hold their own references
	r.stateCache = nil
}

// startProgress calls Options.Progress every ProgressInterval until the
// returned function is called; that function returns once the calls stopped.
func (r *runner) startProgress() (stop func()) {
	if r.opts.Progress == nil {
		return func() {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(ProgressInterval)
		defer tick.Stop()
		for {
			select {
			case <-tick.C:
				r.opts.Progress(r.snapshot())
			case <-done:
				return
			}
		}
	}()
	return func() { close(done); wg.Wait() }
}

func (r *runner) snapshot() Stats {
	s := Stats{Elapsed: time.Since(r.start), Operators: make([]OperatorStats, len(r.g.Vertices))}
	for i, v := range r.g.Vertices {
		s.Operators[i] = OperatorStats{UID: v.UID, Parallelism: v.Parallelism,
			RecordsIn: r.stats[i].in.Load(), RecordsOut: r.stats[i].out.Load(), MaxSnapshotPause: time.Duration(r.stats[i].pause.Load()),
			MaxRestore:  time.Duration(r.stats[i].restore.Load()),
			DeadLetters: r.stats[i].dead.Load(), SideOutputDropped: r.stats[i].sideDropped.Load()}
	}
	r.mu.Lock()
	s.Restarts, s.Checkpoints, s.Savepoint = r.restarts, r.count, r.savepath
	if r.lastMD != nil {
		s.LastCheckpoint = r.lastMD.Location
	}
	s.Recent = append([]CheckpointStats(nil), r.Driver.obs.history...)
	s.Failures = append([]AttemptFailure(nil), r.failures...)
	cur := r.cur
	if cur == nil {
		cur = r.last
	}
	for i, v := range r.g.Vertices {
		s.Operators[i].UnionDeclines = r.unionTotal[v.UID]
	}
	r.mu.Unlock()
	subtaskStates(&s, r.g, cur)
	return s
}

// loadModules loads each wasm module once, before anything runs.
func (r *runner) loadModules(ctx context.Context) error {
	if err := host.CheckBackend(r.opts.State.Backend); err != nil {
		return fmt.Errorf("runtime: job %q: state: %w", r.g.Name, err)
	}
	if r.opts.State.Backend == host.BackendPebble && r.stateCache == nil {
		r.stateCache = host.NewStateCache(int64(cmp.Or(r.opts.State.CacheMiB, host.DefaultStateCacheMiB)) << 20)
	}
	for _, v := range r.g.Vertices {
		ws, ok := v.Spec.(*jobfile.WasmSpec)
		if !ok || r.modules[ws.Path] != nil {
			continue
		}
		if r.opts.Engine == nil {
			return fmt.Errorf("runtime: job %q operator %q: a wasm operator needs Options.Engine", r.g.Name, v.UID)
		}
		m, err := r.opts.Engine.LoadFile(ctx, ws.Path)
		if err != nil {
			return fmt.Errorf("runtime: job %q operator %q: %w", r.g.Name, v.UID, err)
		}
		r.modules[ws.Path] = m
	}
	return nil
}

func ticks(d, tick time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + tick - 1) / tick)
}

// newCoordinator makes the coordinator from the checkpoint options.
func (r *runner) newCoordinator(ctx context.Context) error {
	return r.Driver.init(ctx, r.g, r.opts.Checkpoint, r.opts.Restore, r.log)
}

// NewDriver returns the driver of a new coordinator for g with the
// checkpoint options co (co.Store is required); restore, if set, is the
// checkpoint the job starts from (checkpoint ids continue after it).
func NewDriver(ctx context.Context, g *control.JobGraph, co *CheckpointOptions, restore *checkpoint.Restore, log *slog.Logger) (*Driver, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	d := &Driver{}
	if err := d.init(ctx, g, co, restore, log); err != nil {
		return nil, err
	}
	return d, nil
}

// JobDriverConfig is what NewJobDriver needs besides the job's graph.
type JobDriverConfig struct {
	// Checkpoint, if set, turns checkpointing on (its Store is required).
	Checkpoint *CheckpointOptions
	// From is the checkpoint the job was deployed from; nil: none.
	From    *checkpoint.Restore
	Restart jobfile.RestartSettings
	// FirstAttempt is the number of the job's first attempt here.
	FirstAttempt int
	// Takeover, if set, takes attempt FirstAttempt over, which runs
	// already (control.LifecycleConfig.Adopt), or carries the restart
	// state of the job's lifecycle before (Takeover.Start).
	Takeover *Takeover
	// MaxLost bounds the restarts after lost attempts
	// (control.LifecycleConfig.MaxLost); 0: no bound.
	MaxLost int
	// Seed makes the restart jitter deterministic.
	Seed uint64
	Log  *slog.Logger
	// OnLifecycle gets the lifecycle's own actions (StartAttempt,
	// CancelAttempt, StopFailed, JobEnded) while Step carries them out; it
	// must not call back into the driver.
	OnLifecycle func(control.Action)
}

// NewJobDriver returns the driver of a job's lifecycle (control.Lifecycle)
// for a job whose attempts run elsewhere (internal/cluster: the controller
// drives deployed jobs with it): the lifecycle decides restarts, failovers
// and what each attempt restores. The job is started (its first
// StartAttempt) by Step(t, control.StartJob{}); with cfg.Takeover set (not
// Start), that start takes over attempt cfg.FirstAttempt, which runs
// already.
func NewJobDriver(ctx context.Context, g *control.JobGraph, cfg JobDriverConfig) (*Driver, error) {
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	d := &Driver{g: g, log: log, onLifecycle: cfg.OnLifecycle}
	tick := DefaultTick
	lcfg := control.LifecycleConfig{FirstAttempt: cfg.FirstAttempt, Seed: cfg.Seed, MaxLost: cfg.MaxLost}
	if t := cfg.Takeover; t != nil {
		lcfg.Adopt, lcfg.Restarts = !t.Start, t.Restarts
	}
	if co := cfg.Checkpoint; co != nil {
		cc, err := d.config(ctx, g, co, cfg.From, log)
		if err != nil {
			return nil, err
		}
		lcfg.Checkpoint, tick = &cc, co.Tick
	}
	lcfg.Restart = cfg.Restart.Control(tick)
	if cfg.From != nil {
		md := cfg.From.Metadata
		lcfg.From = &control.RestorePoint{ID: md.ID, Kind: md.Kind, Location: md.Location}
	}
	lc, err := control.NewLifecycle(g, lcfg)
	if err != nil {
		return nil, fmt.Errorf("runtime: job %q: %w", g.Name, err)
	}
	d.lc, d.coord = lc, lc.Coordinator()
	return d, nil
}

// Takeover makes NewJobDriver take over a running attempt: a controller
// adopts a job another controller (or its own earlier run) started.
type Takeover struct {
	// Restarts is the restart strategy's state the job had; nil: none.
	Restarts *control.RestartState
	// Start: no attempt runs (the controller rescaled the job, on a new
	// graph): StartJob deploys attempt firstAttempt as usual; only Restarts
	// carries over.
	Start bool
}

// Lifecycle is the job's lifecycle (nil for a driver of a bare coordinator).
func (d *Driver) Lifecycle() *control.Lifecycle { return d.lc }

func (d *Driver) init(ctx context.Context, g *control.JobGraph, co *CheckpointOptions, restore *checkpoint.Restore, log *slog.Logger) error {
	cfg, err := d.config(ctx, g, co, restore, log)
	if err != nil {
		return err
	}
	d.coord, err = control.NewCoordinator(g, cfg)
	return err
}

// config sets up the driver for g with the checkpoint options co and returns
// the coordinator's configuration: the one conversion of checkpoint options
// (durations) to the coordinator's (ticks).
func (d *Driver) config(ctx context.Context, g *control.JobGraph, co *CheckpointOptions, restore *checkpoint.Restore, log *slog.Logger) (control.Config, error) {
	d.g, d.co, d.log = g, co, log
	if co.Store == nil {
		return control.Config{}, fmt.Errorf("runtime: job %q: checkpointing needs a checkpoint store", g.Name)
	}
	if co.Tick <= 0 {
		co.Tick = DefaultTick
	}
	if co.MaxConcurrent <= 0 {
		co.MaxConcurrent = 1
	}
	tolerable := DefaultTolerableFailures
	if co.TolerableFailures != nil {
		tolerable = *co.TolerableFailures
	}
	first, err := co.Store.NextID(ctx)
	if err != nil {
		return control.Config{}, fmt.Errorf("runtime: job %q: %w", g.Name, err)
	}
	if restore != nil {
		first = max(first, restore.Metadata.ID+1)
	}
	first += co.SkipIDs
	d.store = co.Store
	if restore != nil && restore.Metadata.Kind == control.KindCheckpoint && checkpoint.InStore(co.Store, restore.Metadata) {
		d.base = restore.Metadata.ID // its shared files are this store's
	}
	return control.Config{
		IntervalTicks:              ticks(co.Interval, co.Tick),
		TimeoutTicks:               ticks(co.Timeout, co.Tick),
		MinPauseTicks:              ticks(co.MinPause, co.Tick),
		MaxConcurrent:              co.MaxConcurrent,
		TolerableFailures:          tolerable,
		FinalCheckpointImmediately: !co.DelayFinalCheckpoint,
		FirstID:                    first,
	}, nil
}

func (r *runner) run(ctx context.Context) (stats Stats, err error) {
	ctx = r.startJob(ctx)
	defer func() { r.endJob(err) }()
	if err := r.loadModules(ctx); err != nil {
		return r.snapshot(), err
	}
	restore := r.opts.Restore
	if restore != nil {
		if err := control.CheckRestore(r.g, restore.Finished); err != nil {
			return r.snapshot(), fmt.Errorf("runtime: restore from %s %d: %w", restore.Metadata.Kind, restore.Metadata.ID, err)
		}
	}
	if err := r.initLifecycle(ctx); err != nil {
		return r.snapshot(), err
	}
	if r.opts.Checkpoint != nil {
		r.Driver.Observe(ctx, r.opts.TracerProvider, r.opts.Metrics)
	} else if r.lc.Coordinator() == nil && r.opts.Restart.Strategy != "" && r.opts.Restart.Strategy != jobfile.RestartNone {
		r.log.Info("checkpointing is off: after a failure the job restarts from the beginning, so its output is complete but not exactly-once across failures")
	}

	stopProgress := r.startProgress()
	err = r.loop(ctx)
	stopProgress()
	stats = r.snapshot()
	if r.opts.Progress != nil {
		r.opts.Progress(stats)
	}
	if err == nil {
		r.log.Debug("job finished", "elapsed", stats.Elapsed)
	}
	return stats, err
}

// initLifecycle makes the job's lifecycle (control.Lifecycle) and, with
// checkpointing, its coordinator, from the options.
func (r *runner) initLifecycle(ctx context.Context) error {
	r.tick = DefaultTick
	lcfg := control.LifecycleConfig{FirstAttempt: r.opts.Attempt, Seed: uint64(time.Now().UnixNano())}
	if co := r.opts.Checkpoint; co != nil {
		cfg, err := r.Driver.config(ctx, r.g, co, r.opts.Restore, r.log)
		if err != nil {
			return err
		}
		lcfg.Checkpoint = &cfg
		r.tick = co.Tick
	} else {
		r.Driver.g, r.Driver.log = r.g, r.log
	}
	lcfg.Restart = r.opts.Restart.Control(r.tick)
	if rs := r.opts.Restore; rs != nil {
		md := rs.Metadata
		lcfg.From = &control.RestorePoint{ID: md.ID, Kind: md.Kind, Location: md.Location}
	}
	lc, err := control.NewLifecycle(r.g, lcfg)
	if err != nil {
		return fmt.Errorf("runtime: job %q: %w", r.g.Name, err)
	}
	r.lc, r.coord = lc, lc.Coordinator()
	return nil
}

// loop runs the job on its JobLoop, with the runner as the in-process
// Executor, until the job has ended and its last attempt with it.
func (r *runner) loop(ctx context.Context) error {
	r.ctx = ctx
	r.jl = NewJobLoop(&r.Driver, r, r.tick, nil)
	done := make(chan struct{})
	go r.requests(ctx, done)
	r.jl.Post(func() { r.step(control.StartJob{}) })
	r.jl.Run()
	close(done)
	return r.result(ctx, r.canceled)
}

// requests hands the user's stop and savepoint requests and the context's
// end to the loop, until done.
func (r *runner) requests(ctx context.Context, done <-chan struct{}) {
	ctxDone := ctx.Done()
	for {
		select {
		case req := <-r.opts.Stop:
			r.jl.Post(func() {
				r.log.Info("stopping with a savepoint", "drain", req.Drain)
				r.stopFailed = req.Failed
				r.terminate = r.terminate || req.Terminate
				if err := r.Driver.Step(r.target(), control.StopWithSavepoint{Drain: req.Drain, Terminate: req.Terminate}); err != nil {
					r.tellStopFailed(fmt.Errorf("runtime: job %q: no stop with a savepoint: %w", r.g.Name, err))
					if req.Terminate {
						r.step(control.Cancel{}) // it must end the job all the same
					}
				}
			})
		case req := <-r.opts.Savepoint:
			if !r.jl.Post(func() { r.Driver.RequestSavepoint(r.target(), req.Result) }) {
				req.Result <- SavepointResult{Err: fmt.Errorf("runtime: job %q has ended: no savepoint", r.g.Name)}
			}
		case <-ctxDone:
			ctxDone = nil // once: then the loop waits for the attempt to end
			r.jl.Post(func() {
				r.canceled = true
				r.step(control.Cancel{})
			})
		case <-done:
			return
		}
	}
}

// Tick steps the lifecycle with a tick (Executor).
func (r *runner) Tick() { r.step(control.Tick{}) }

// target is where the driver's commands go: the current attempt.
func (r *runner) target() Target {
	if r.cur == nil || r.cur.attempt != r.lc.Attempt() {
		return noTarget{}
	}
	return r.cur
}

// step feeds ev to the lifecycle and carries out the resulting actions.
func (r *runner) step(ev control.Event) {
	r.Driver.Step(r.target(), ev)
	r.checkRunning()
}

// stepFrom steps an event of attempt j's subtasks, unless j is no longer
// the lifecycle's attempt.
func (r *runner) stepFrom(j *job, ev control.Event) {
	if j.attempt == r.lc.Attempt() && r.lc.Executing() {
		r.step(ev)
	}
}

// attemptDone: every subtask of attempt j has returned.
func (r *runner) attemptDone(j *job) {
	j.closeRemote()
	r.mu.Lock()
	r.cur, r.last = nil, j
	r.mu.Unlock()
	if j.err != nil {
		if r.lastErr == nil || !errors.Is(j.err, r.lastErr) {
			r.lastErr = j.err
		}
		r.step(control.AttemptFailed{Attempt: j.attempt, Subtask: j.failed, Reason: j.err.Error(), Class: FailureClass(j.err)})
	} else {
		r.step(control.AttemptEnded{Attempt: j.attempt})
	}
	if r.pendingStart != nil && r.ended == nil {
		a := *r.pendingStart
		r.pendingStart = nil
		r.startAttempt(a)
	}
	if r.ended != nil && r.cur == nil {
		r.jl.Close()
	}
}

// StartAttempt starts attempt a once the attempt before has ended
// (Executor).
func (r *runner) StartAttempt(a control.StartAttempt) {
	if r.cur != nil {
		// The attempt before has not ended yet (the coordinator failed
		// it): attempts never overlap.
		r.pendingStart = &a
		return
	}
	r.startAttempt(a)
}

// CancelAttempt cancels the subtasks of attempt x (Executor).
func (r *runner) CancelAttempt(x control.CancelAttempt) {
	err := x.Err
	if err == nil {
		err = errors.New(x.Reason)
	}
	err = fmt.Errorf("runtime: job %q: %w", r.g.Name, err)
	if j := r.cur; j != nil && j.attempt == x.Attempt {
		j.fail(control.SubtaskID{}, err)
	}
	if x.Err != nil {
		r.lastErr = err // the coordinator failed the attempt: its error is the cause
	}
}

// StopFailed tells the stop's requester (Executor).
func (r *runner) StopFailed(x control.StopFailed) {
	what := fmt.Sprintf("its savepoint %d was not written", x.SavepointID)
	if x.Savepoint != nil {
		what = fmt.Sprintf("its savepoint %s (id %d) was written, but the job failed before it stopped", x.Savepoint.Location, x.SavepointID)
	}
	next := "the job restarts as its restart strategy says"
	if r.terminate {
		next = "the job is canceled"
	}
	err := fmt.Errorf("runtime: job %q: stop-with-savepoint failed: %s: %s; %s", r.g.Name, what, x.Reason, next)
	r.log.Error("stop-with-savepoint failed", "savepoint", x.SavepointID, "err", err)
	r.tellStopFailed(err)
}

// JobEnded ends the loop once no attempt runs (Executor).
func (r *runner) JobEnded(x control.JobEnded) {
	r.ended = &x
	if r.cur == nil {
		r.jl.Close()
	}
}

// tellStopFailed tells the stop's requester that it failed.
func (r *runner) tellStopFailed(err error) {
	if r.stopFailed != nil {
		select {
		case r.stopFailed <- err:
		default:
		}
	}
}

// startAttempt builds and starts the subtasks of attempt a.
func (r *runner) startAttempt(a control.StartAttempt) {
	ctx := r.ctx
	first := a.Attempt == r.opts.Attempt
	restore := r.opts.Restore
	if !first {
		r.mu.Lock()
		r.restarts++
		r.failures = appendFailure(r.failures, a.Attempt-1, r.lastErr)
		r.mu.Unlock()
		if m := r.opts.Metrics; m != nil {
			m.Restart(ctx, r.opts.JobID, r.g.Name)
		} else {
			telemetry.GlobalMetrics().Restart(ctx, r.opts.JobID, r.g.Name)
		}
		r.endPending(r.lastErr)
		if r.coord != nil {
			r.EndSpans("the attempt failed")
		}
		fctx := r.startPending(nil, telemetry.SpanFailover, telemetry.Attempt(a.Attempt))
		telemetry.RecordError(trace.SpanFromContext(fctx), r.lastErr)
		r.log.Warn("job failed, restarting", "attempt", a.Attempt, "from", a.Restore.String(), "err", r.lastErr)
		restore = nil
		if a.Restore != nil {
			switch md := r.Latest(); {
			case r.opts.Restore != nil && a.Restore.ID == r.opts.Restore.Metadata.ID:
				restore = r.opts.Restore
			case md != nil && md.ID == a.Restore.ID:
				rs, err := checkpoint.LoadRestoreFrom(ctx, r.store, md, r.g)
				if err != nil {
					r.fatal(fmt.Errorf("runtime: job %q: restart from %s %d: %w", r.g.Name, md.Kind, md.ID, err))
					return
				}
				restore = rs
			default:
				r.fatal(fmt.Errorf("runtime: job %q: restart from %s: not found", r.g.Name, a.Restore))
				return
			}
		}
		if restore != nil {
			r.startRestore(fctx, restore)
		}
	} else if restore != nil {
		r.startRestore(nil, restore)
	}
	j := r.newJob(a.Attempt, restore)
	if err := j.build(); err != nil {
		j.endMetrics()
		r.fatal(err)
		return
	}
	runCtx, cancel := context.WithCancelCause(ctx)
	j.cancel = cancel
	j.events = make(chan control.Event, 4*len(j.tasks)+64)
	r.mu.Lock()
	r.cur = j
	r.mu.Unlock()
	var wg sync.WaitGroup
	for _, t := range j.tasks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := t.run(runCtx); err != nil {
				j.fail(t.id, err)
			}
		}()
	}
	go func() { wg.Wait(); j.endMetrics(); cancel(nil); close(j.done) }()
	go r.forward(j)
	if r.coord == nil {
		r.endPending(nil) // nothing reports running without a coordinator
	}
}

// forward posts attempt j's subtask events to the loop in order, then its end.
func (r *runner) forward(j *job) {
	for {
		select {
		case ev := <-j.events:
			r.jl.Post(func() { r.stepFrom(j, ev) })
		case <-j.done:
			for {
				select {
				case ev := <-j.events:
					r.jl.Post(func() { r.stepFrom(j, ev) })
					continue
				default:
				}
				break
			}
			r.jl.Post(func() { r.attemptDone(j) })
			return
		}
	}
}

// fatal ends the job with err: something no restart can mend (a build
// error, a checkpoint that cannot be read).
func (r *runner) fatal(err error) {
	r.lastErr = err
	r.fatalErr = err
	_ = r.lc.Step(control.Cancel{})
	r.Driver.perform(r.target())
}

// result is the outcome of the ended job.
func (r *runner) result(ctx context.Context, canceled bool) error {
	x := r.ended
	switch {
	case r.fatalErr != nil:
		return r.fatalErr
	case x.State == control.JobFinished || x.State == control.JobStopped:
		return nil
	case canceled:
		return ctx.Err()
	case x.State == control.JobCanceled:
		// A stop that had to end the job could not take its savepoint.
		return fmt.Errorf("runtime: job %q %s: %w", r.g.Name, x.Reason, context.Canceled)
	case x.State == control.JobFailed:
		err := r.lastErr
		if err == nil {
			err = errors.New(x.Reason)
		}
		switch n := r.lc.Restarts(); {
		case x.GaveUp != "" && n > 0:
			return fmt.Errorf("runtime: job %q failed after %d restarts (%s): %w", r.g.Name, n, x.GaveUp, err)
		case x.GaveUp != "":
			return fmt.Errorf("runtime: job %q failed (%s): %w", r.g.Name, x.GaveUp, err)
		case n > 0:
			return fmt.Errorf("runtime: job %q failed after %d restarts: %w", r.g.Name, n, err)
		}
		return err
	}
	return fmt.Errorf("runtime: job %q %s: %s", r.g.Name, x.State, x.Reason)
}

// fail records the first failure of an attempt and cancels the others.
func (j *job) fail(id control.SubtaskID, err error) {
	j.errOnce.Do(func() { j.failed, j.err = id, err })
	j.cancel(err)
}

// result is the outcome of an attempt whose subtasks all ended.
func (j *job) result(ctx context.Context) error {
	if j.err == nil {
		return nil
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return j.err
}

// Step feeds ev to the lifecycle (or the coordinator) and carries out the
// resulting actions, sending commands to t (nil when no attempt runs). It
// returns why ev was refused, if it was.
func (d *Driver) Step(t Target, ev control.Event) (refused error) {
	if t == nil {
		t = noTarget{}
	}
	d.queued = append(d.queued, ev)
	if len(d.queued) > 1 {
		return nil // a step in progress takes it
	}
	first := true
	for len(d.queued) > 0 {
		ev := d.queued[0]
		d.observeEvent(ev)
		var err error
		if d.lc != nil {
			err = d.lc.Step(ev)
		} else {
			err = d.coord.Step(ev)
		}
		if err != nil {
			if _, ok := ev.(control.TriggerSavepoint); ok {
				d.answerSavepoints("", fmt.Errorf("runtime: job %q: no savepoint: %w", d.g.Name, err))
			}
			level := slog.LevelDebug
			if _, ok := ev.(control.StopWithSavepoint); ok {
				level = slog.LevelWarn
			}
			d.log.Log(context.Background(), level, "checkpoint coordinator refused an event", "event", ev.String(), "err", err)
			if first {
				refused = err
			}
		}
		first = false
		d.perform(t)
		d.queued = d.queued[1:]
	}
	return refused
}

// RequestSavepoint triggers a savepoint of the running job; reply hears its
// location once its metadata is durable, or why there is none (the job is
// not running, the savepoint was aborted, the job failed or ended first).
// Requests that come while one is pending share its savepoint.
func (d *Driver) RequestSavepoint(t Target, reply chan<- SavepointResult) {
	if !d.CanStop() {
		reply <- SavepointResult{Err: fmt.Errorf("runtime: job %q is %s: no savepoint", d.g.Name, d.coord.State())}
		return
	}
	d.spWaiters = append(d.spWaiters, reply)
	if len(d.spWaiters) == 1 {
		d.Step(t, control.TriggerSavepoint{})
	}
}

// answerSavepoints tells every pending savepoint request the outcome.
func (d *Driver) answerSavepoints(location string, err error) {
	for _, w := range d.spWaiters {
		select {
		case w <- SavepointResult{Location: location, Err: err}:
		default:
		}
	}
	d.spWaiters = nil
}

// perform carries out the coordinator's actions in order.
func (d *Driver) perform(t Target) {
	for d.hasReady() {
		var acts []control.Action
		if d.lc != nil {
			acts = d.lc.Ready()
			d.lc.Advance()
		} else {
			acts = d.coord.Ready()
			d.coord.Advance()
		}
		for _, a := range acts {
			d.act(t, a)
		}
	}
}

func (d *Driver) hasReady() bool {
	if d.lc != nil {
		return d.lc.HasReady()
	}
	return d.coord.HasReady()
}

func (d *Driver) later(ev control.Event) { d.queued = append(d.queued, ev) }

func (d *Driver) act(t Target, a control.Action) {
	ctx := context.Background()
	switch x := a.(type) {
	case control.TriggerCheckpoint:
		d.log.Debug("checkpoint triggered", "id", x.ID, "kind", x.Kind, "tasks", len(x.Tasks))
		kind := dataplane.Checkpoint
		if x.Kind == control.KindSavepoint {
			kind = dataplane.Savepoint
		}
		tr := d.startCheckpoint(x)
		for _, id := range x.Tasks {
			b := dataplane.Barrier{ID: x.ID, Kind: kind, IsSync: x.Sync, Base: d.base, Trace: tr}
			if !t.Command(id, Command{Kind: CommandTrigger, ID: x.ID, Barrier: b}) {
				d.later(control.TriggerFailed{CheckpointID: x.ID, Subtask: id, Reason: "the subtask has finished"})
			}
		}
	case control.StopSources:
		for _, id := range x.Tasks {
			t.Command(id, Command{Kind: CommandStop, ID: x.SavepointID, Drain: x.Drain})
		}
	case control.PersistMetadata:
		span := d.startPersist(x.ID)
		md, err := checkpoint.NewMetadata(d.g, x, time.Now())
		if err == nil {
			md.JobID = d.co.JobID
			err = d.store.Commit(ctx, md)
		}
		d.endPersist(x.ID, span, err)
		d.checkpointPersisted(x, md, err)
		if err != nil {
			d.log.Warn("checkpoint could not be persisted", "id", x.ID, "err", err)
			d.later(control.PersistFailed{CheckpointID: x.ID, Reason: err.Error()})
			return
		}
		d.mu.Lock()
		d.lastMD = md
		d.count++
		d.mu.Unlock()
		if md.Kind == control.KindCheckpoint {
			d.base = md.ID
		}
		d.unionDeclinesEnd(fmt.Sprintf("%s %d completed", md.Kind, md.ID))
		d.log.Debug("checkpoint complete", "id", x.ID, "kind", x.Kind, "size", x.Size, "location", md.Location)
		if d.co.OnComplete != nil {
			d.co.OnComplete(md)
		}
		if md.Kind == control.KindSavepoint {
			d.answerSavepoints(md.Location, nil)
		}
		d.later(control.Persisted{CheckpointID: x.ID, Location: md.Location})
	case control.NotifyComplete:
		tr := d.notifyTrace(x.ID)
		for _, id := range x.Tasks {
			t.Command(id, Command{Kind: CommandNotify, ID: x.ID, Trace: tr})
		}
	case control.AbortCheckpoint:
		d.log.Debug("checkpoint aborted", "id", x.ID, "reason", x.Reason, "detail", x.Detail)
		if x.Reason == control.AbortUnionState {
			d.unionDeclined(x)
		}
		if x.Kind == control.KindSavepoint {
			d.log.Warn("savepoint aborted", "id", x.ID, "reason", x.Reason, "detail", x.Detail)
			d.answerSavepoints("", fmt.Errorf("runtime: job %q: savepoint %d aborted: %s %s", d.g.Name, x.ID, x.Reason, x.Detail))
		}
		d.checkpointAborted(x.ID, string(x.Reason))
		for _, id := range x.Tasks {
			t.Command(id, Command{Kind: CommandAbort, ID: x.ID})
		}
		for _, s := range x.Discard {
			_ = d.store.Discard(ctx, x.Kind, x.ID, s.StateRef)
		}
	case control.DiscardState:
		_ = d.store.Discard(ctx, control.KindCheckpoint, x.CheckpointID, x.StateRef)
	case control.FailJob:
		d.answerSavepoints("", fmt.Errorf("runtime: job %q failed before the savepoint completed: %w", d.g.Name, x.Err))
		t.Fail(fmt.Errorf("runtime: job %q: %w", d.g.Name, x.Err))
	case control.StartAttempt, control.CancelAttempt, control.StopFailed, control.JobEnded:
		if x, ok := a.(control.CancelAttempt); ok {
			d.answerSavepoints("", fmt.Errorf("runtime: job %q: the attempt ended before the savepoint completed: %s", d.g.Name, x.Reason))
		}
		if d.onLifecycle != nil {
			d.onLifecycle(a)
		}
	case control.JobDone:
		d.unionDeclinesEnd("the job is " + string(x.State))
		d.answerSavepoints("", fmt.Errorf("runtime: job %q is %s: no savepoint", d.g.Name, x.State))
		d.jobDone = &x
		if x.State == control.JobStopped && d.lastMD != nil {
			d.mu.Lock()
			d.savepath = d.lastMD.Location
			d.mu.Unlock()
			d.endStop(d.lastMD.Location, nil)
		}
	}
}
