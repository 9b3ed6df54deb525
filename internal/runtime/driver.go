package runtime

import (
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

// runner is one Run: the attempts of a job and, with checkpointing, the
// driver around the checkpoint coordinator (control.Coordinator). The
// driver is the goroutine of Run: it feeds the coordinator ticks from a real
// ticker and the subtasks' events, and carries out its actions in order.
type runner struct {
	g       *control.JobGraph
	opts    Options
	log     *slog.Logger
	start   time.Time
	stats   []*opStats
	modules map[string]*host.Module
	stdout  sync.Mutex
	nats    natsConns
	obs     runObs // job, restore and failover spans (observe.go)
	cur     *job   // the current attempt, for Stats; guarded by Driver.mu

	Driver // the checkpoint coordinator's driver (coord nil without checkpointing)
}

// Driver carries out a control.Coordinator's actions: it steps the
// coordinator with an event and performs the resulting actions in order,
// sending the subtasks' commands to a Target: the subtasks of an attempt in
// this process (Run, *job), or on other hosts (internal/cluster, whose
// controller drives a job spread over hosts with it). The caller serializes
// Step; the fields Stats reads are guarded by mu.
type Driver struct {
	g        *control.JobGraph
	co       *CheckpointOptions
	log      *slog.Logger
	coord    *control.Coordinator
	store    checkpoint.Store
	queued   []control.Event // events to Step once the current actions are done
	lastMD   *checkpoint.Metadata
	restarts int
	count    int // completed checkpoints
	jobDone  *control.JobDone
	savepath string
	mu       sync.Mutex // guards the fields Stats reads: restarts, count, lastMD, savepath
	obs      driverObs  // checkpoint and stop-with-savepoint spans, checkpoint metrics (observe.go)

	spWaiters []chan<- SavepointResult // savepoint requests waiting for their savepoint
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
			RecordsIn: r.stats[i].in.Load(), RecordsOut: r.stats[i].out.Load()}
	}
	r.mu.Lock()
	s.Restarts, s.Checkpoints, s.Savepoint = r.restarts, r.count, r.savepath
	if r.lastMD != nil {
		s.LastCheckpoint = r.lastMD.Location
	}
	s.Recent = append([]CheckpointStats(nil), r.Driver.obs.history...)
	cur := r.cur
	r.mu.Unlock()
	subtaskStates(&s, r.g, cur)
	return s
}

// loadModules loads each wasm module once, before anything runs.
func (r *runner) loadModules(ctx context.Context) error {
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

func (d *Driver) init(ctx context.Context, g *control.JobGraph, co *CheckpointOptions, restore *checkpoint.Restore, log *slog.Logger) error {
	d.g, d.co, d.log = g, co, log
	if co.Store == nil {
		return fmt.Errorf("runtime: job %q: checkpointing needs a checkpoint store", g.Name)
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
		return fmt.Errorf("runtime: job %q: %w", g.Name, err)
	}
	if restore != nil {
		first = max(first, restore.Metadata.ID+1)
	}
	cfg := control.Config{
		IntervalTicks:              ticks(co.Interval, co.Tick),
		TimeoutTicks:               ticks(co.Timeout, co.Tick),
		MinPauseTicks:              ticks(co.MinPause, co.Tick),
		MaxConcurrent:              co.MaxConcurrent,
		TolerableFailures:          tolerable,
		FinalCheckpointImmediately: !co.DelayFinalCheckpoint,
		FirstID:                    first,
	}
	d.coord, err = control.NewCoordinator(g, cfg)
	d.store = co.Store
	return err
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
	if r.opts.Checkpoint != nil {
		if err := r.newCoordinator(ctx); err != nil {
			return r.snapshot(), err
		}
		r.Driver.Observe(ctx, r.opts.TracerProvider, r.opts.Metrics)
	} else if r.opts.Restart.Attempts > 0 {
		r.log.Info("checkpointing is off: after a failure the job restarts from the beginning, so its output is complete but not exactly-once across failures")
	}

	stopProgress := r.startProgress()
	if restore != nil {
		r.startRestore(nil, restore)
	}
	err = r.attempts(ctx, restore)
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

// attempts runs the job, restarting it after failures under the strategy.
func (r *runner) attempts(ctx context.Context, restore *checkpoint.Restore) error {
	for attempt := r.opts.Attempt; ; attempt++ {
		j := &job{
			g: r.g, opts: r.opts, log: r.log, stats: r.stats, modules: r.modules, stdout: &r.stdout, nats: &r.nats,
			start: r.start, attempt: attempt, restore: restore, store: r.store,
			byID: map[control.SubtaskID]*task{}, done: make(chan struct{}),
		}
		if err := j.build(); err != nil {
			return err
		}
		err := r.drive(ctx, j)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
			return ctx.Err()
		}
		if attempt-r.opts.Attempt >= r.opts.Restart.Attempts {
			if r.coord != nil {
				r.step(nil, control.RestartsExhausted{Reason: err.Error()})
			}
			if r.opts.Restart.Attempts > 0 {
				return fmt.Errorf("runtime: job %q failed after %d restarts: %w", r.g.Name, r.opts.Restart.Attempts, err)
			}
			return err
		}
		r.mu.Lock()
		r.restarts++
		r.mu.Unlock()
		if m := r.opts.Metrics; m != nil {
			m.Restart(ctx, r.g.Name)
		} else {
			telemetry.GlobalMetrics().Restart(ctx, r.g.Name)
		}
		r.endPending(err)
		if r.coord != nil {
			r.EndSpans("the attempt failed")
		}
		fctx := r.startPending(nil, telemetry.SpanFailover, telemetry.Attempt(attempt+1))
		telemetry.RecordError(trace.SpanFromContext(fctx), err)
		from := "the beginning"
		if r.lastMD != nil {
			from = fmt.Sprintf("%s %d", r.lastMD.Kind, r.lastMD.ID)
		} else if restore != nil {
			from = fmt.Sprintf("%s %d", restore.Metadata.Kind, restore.Metadata.ID)
		}
		r.log.Warn("job failed, restarting", "attempt", attempt+1, "from", from, "delay", r.opts.Restart.Delay, "err", err)
		if r.opts.Restart.Delay > 0 {
			t := time.NewTimer(r.opts.Restart.Delay)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return ctx.Err()
			}
		}
		if r.lastMD != nil && (restore == nil || restore.Metadata.ID != r.lastMD.ID) {
			rs, err := checkpoint.LoadRestoreFrom(ctx, r.store, r.lastMD, r.g)
			if err != nil {
				return fmt.Errorf("runtime: job %q: restart from %s %d: %w", r.g.Name, r.lastMD.Kind, r.lastMD.ID, err)
			}
			restore = rs
		}
		if restore != nil {
			r.startRestore(fctx, restore)
		}
	}
}

// drive starts the subtasks of j and drives them until they all ended: nil
// when the job finished or stopped, else the failure.
func (r *runner) drive(ctx context.Context, j *job) error {
	runCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
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
	go func() { wg.Wait(); close(j.done) }()

	if r.coord == nil {
		r.endPending(nil) // nothing reports running without a coordinator
		select {
		case <-j.done:
		case <-ctx.Done():
			<-j.done
		}
		return j.result(ctx)
	}

	ticker := time.NewTicker(r.opts.Checkpoint.Tick)
	defer ticker.Stop()
	stop := r.opts.Stop
	var pendingStop *StopRequest // a stop that came before the job was running
	for {
		select {
		case req := <-r.opts.Savepoint:
			r.Driver.RequestSavepoint(j, req.Result)
		case ev := <-j.events:
			r.step(j, ev)
		case <-ticker.C:
			r.step(j, control.Tick{})
			if pendingStop != nil && r.canStop() {
				r.step(j, control.StopWithSavepoint{Drain: pendingStop.Drain})
				pendingStop = nil
			}
		case req := <-stop:
			stop = nil
			r.log.Info("stopping with a savepoint", "drain", req.Drain)
			if !r.canStop() {
				pendingStop = &req // once every subtask runs
				continue
			}
			r.step(j, control.StopWithSavepoint{Drain: req.Drain})
		case <-j.done:
			for {
				select {
				case ev := <-j.events:
					r.step(j, ev)
					continue
				default:
				}
				break
			}
			err := j.result(ctx)
			if err == nil && r.jobDone == nil {
				err = fmt.Errorf("runtime: job %q: every subtask ended but the checkpoint coordinator has not finished the job (state %s)", r.g.Name, r.coord.State())
			}
			if err != nil && !errors.Is(err, ctx.Err()) && r.coord.State() != control.JobRestarting {
				r.step(j, control.TaskFailed{Subtask: j.failed, Reason: err.Error()})
			}
			if err != nil && ctx.Err() != nil {
				r.step(nil, control.Cancel{})
			}
			return err
		}
	}
}

// canStop reports whether the coordinator can take a stop-with-savepoint now.
func (r *runner) canStop() bool {
	st := r.coord.State()
	return st == control.JobRunning || st == control.JobFinishing
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

// step feeds ev to the coordinator and carries out the resulting actions.
// j is nil when no attempt runs.
func (r *runner) step(j *job, ev control.Event) {
	if j == nil {
		r.Driver.Step(nil, ev)
		return
	}
	r.Driver.Step(j, ev)
	r.checkRunning()
}

// Step feeds ev to the coordinator and carries out the resulting actions,
// sending commands to t (nil when no attempt runs).
func (d *Driver) Step(t Target, ev control.Event) {
	if t == nil {
		t = noTarget{}
	}
	d.queued = append(d.queued, ev)
	if len(d.queued) > 1 {
		return // a step in progress takes it
	}
	d.observeEvent(ev)
	for len(d.queued) > 0 {
		ev := d.queued[0]
		if err := d.coord.Step(ev); err != nil {
			if _, ok := ev.(control.TriggerSavepoint); ok {
				d.answerSavepoints("", fmt.Errorf("runtime: job %q: no savepoint: %w", d.g.Name, err))
			}
			level := slog.LevelDebug
			if _, ok := ev.(control.StopWithSavepoint); ok {
				level = slog.LevelWarn
			}
			d.log.Log(context.Background(), level, "checkpoint coordinator refused an event", "event", ev.String(), "err", err)
		}
		d.perform(t)
		d.queued = d.queued[1:]
	}
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
	for d.coord.HasReady() {
		acts := d.coord.Ready()
		d.coord.Advance()
		for _, a := range acts {
			d.act(t, a)
		}
	}
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
			b := dataplane.Barrier{ID: x.ID, Kind: kind, IsSync: x.Sync, Trace: tr}
			if !t.Command(id, Command{Kind: CommandTrigger, ID: x.ID, Barrier: b}) {
				d.later(control.TriggerFailed{CheckpointID: x.ID, Subtask: id, Reason: "the subtask has finished"})
			}
		}
	case control.StopSources:
		for _, id := range x.Tasks {
			t.Command(id, Command{Kind: CommandStop, ID: x.SavepointID, Drain: x.Drain})
		}
	case control.PersistMetadata:
		md, err := checkpoint.NewMetadata(d.g, x, time.Now())
		if err == nil {
			err = d.store.Commit(ctx, md)
		}
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
		d.log.Debug("checkpoint complete", "id", x.ID, "kind", x.Kind, "size", x.Size, "location", md.Location)
		if d.co.OnComplete != nil {
			d.co.OnComplete(md)
		}
		if md.Kind == control.KindSavepoint {
			d.answerSavepoints(md.Location, nil)
		}
		d.later(control.Persisted{CheckpointID: x.ID})
	case control.NotifyComplete:
		tr := d.notifyTrace(x.ID)
		for _, id := range x.Tasks {
			t.Command(id, Command{Kind: CommandNotify, ID: x.ID, Trace: tr})
		}
	case control.AbortCheckpoint:
		d.log.Debug("checkpoint aborted", "id", x.ID, "reason", x.Reason, "detail", x.Detail)
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
	case control.JobDone:
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
