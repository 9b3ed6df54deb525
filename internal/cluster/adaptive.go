package cluster

// Adaptive scheduling, as Flink's adaptive scheduler: a job declares a
// parallelism per operator and may set a minimum (min_parallelism; none:
// 1). When fewer slots are free than the job needs (a host lost for good, a
// cluster smaller than the job), it runs on the slots there are
// (control.AdaptiveSlots: every operator at min(declared, slots), none below
// its minimum) once they have been free for ControllerOptions.SlotWait,
// instead of waiting; with fewer than its minimum it waits and says why.
// When more slots are free again for SlotWait (and RescaleInterval has passed
// since its last rescale), a running job is stopped with a savepoint and
// started at the larger parallelism from it.
//
// Either way the job's controller side (distJob: its lifecycle, on a graph
// of one parallelism) is made anew for the new parallelism, restored from
// the job's latest checkpoint or that savepoint, key groups redistributed
// as for deploy --from, with the restart strategy's state carried over:
// restarts and their delays stay the lifecycle's (control.Lifecycle); the
// controller only picks the parallelism it can place. Each rescale is
// logged (a job event: streamd logs), traced (a `rescale` span, the
// restore's parent) and kept in the job's status (JobStatus.Rescales).

import (
	"context"
	"fmt"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"

	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/internal/cluster/wire"
	"github.com/streamd/streamd/internal/connector"
	"github.com/streamd/streamd/internal/runtime"
	"github.com/streamd/streamd/internal/telemetry"
)

// Defaults of the adaptive scheduler's options (ControllerOptions).
const (
	DefaultSlotWait        = 5 * time.Second
	DefaultRescaleInterval = 30 * time.Second
)

// maxRescales is how many rescales a job's status keeps.
const maxRescales = 10

// rescaleUp is a scale-up in progress: the job is being stopped with a
// savepoint (maybeEndDist starts it at To when it stopped).
type rescaleUp struct {
	From, To int
	Reason   string
	Targets  map[string]int // the autoscaler's parallelism per operator (autoscale.go); nil: the adaptive scheduler's
}

// bounds is each operator's declared (or autoscaled: wantOf) and least
// parallelism. A source whose
// position does not restore at another parallelism (connector.
// SourceRescales: every built-in type does, a registered one without
// RescalePositions not) keeps its declared one.
func (j *ctlJob) bounds() []control.Bounds { return j.boundsOf(j.wantOf) }

// boundsOf is bounds with each operator's parallelism as par says.
func (j *ctlJob) boundsOf(par func(wire.VertexSpec) int) []control.Bounds {
	out := make([]control.Bounds, len(j.spec.Vertices))
	for i, v := range j.spec.Vertices {
		out[i] = control.Bounds{Declared: par(v), Min: v.MinParallelism}
		if fixedSource(v) {
			out[i].Min = out[i].Declared
		}
	}
	return out
}

// fixedSource reports whether v is a source that keeps its parallelism.
func fixedSource(v wire.VertexSpec) bool {
	return v.Source != nil && !connector.SourceRescales(v.Source.Type)
}

// fixedSources names j's sources that keep their parallelism, with it.
func (j *ctlJob) fixedSources() string {
	var out []string
	for _, v := range j.spec.Vertices {
		if fixedSource(v) {
			out = append(out, fmt.Sprintf("%s %d", v.UID, j.declaredOf(v)))
		}
	}
	return strings.Join(out, ", ")
}

// declaredOf is operator v's declared parallelism.
func (j *ctlJob) declaredOf(v wire.VertexSpec) int {
	if p, ok := j.declared[v.UID]; ok {
		return p
	}
	return v.Parallelism
}

// declaredSpec is j's spec at its declared parallelism.
func (j *ctlJob) declaredSpec() wire.JobSpec {
	if j.declared == nil {
		return j.spec
	}
	s := j.spec
	s.Vertices = make([]wire.VertexSpec, len(j.spec.Vertices))
	for i, v := range j.spec.Vertices {
		v.Parallelism = j.declaredOf(v)
		s.Vertices[i] = v
	}
	return s
}

// scaleLocked makes j's spec the declared one at `slots` slots (each
// operator at min(declared, slots); declared or as the autoscaler chose:
// wantOf).
func (j *ctlJob) scaleLocked(slots int) {
	decl := j.declaredSpec()
	scaled := make([]wire.VertexSpec, len(decl.Vertices))
	same := true
	for i, v := range decl.Vertices {
		v.Parallelism = control.ScaledParallelism(control.Bounds{Declared: j.wantOf(v), Min: v.MinParallelism}, slots)
		same = same && v.Parallelism == decl.Vertices[i].Parallelism
		scaled[i] = v
	}
	j.spec, j.declared, j.slots = decl, nil, slots
	if same {
		return
	}
	j.declared = map[string]int{}
	for _, v := range decl.Vertices {
		j.declared[v.UID] = v.Parallelism
	}
	j.spec.Vertices = scaled
}

// totalFree is the free slots of alive hosts.
func totalFree(free []control.HostSlots) int {
	n := 0
	for _, h := range free {
		n += max(h.Free, 0)
	}
	return n
}

// adaptLocked runs j, which waits to be placed, on another parallelism when
// the free slots call for it: at once on more slots than it runs on (up to
// its declared parallelism), on fewer once at least its minimum have been
// free for SlotWait. It reports whether it rescaled j (whose controller side
// is then made anew), else what j waits for ("" : nothing of its own).
func (c *Controller) adaptLocked(j *ctlJob, now time.Time, free []control.HostSlots) (bool, string) {
	if j.noRescale != "" {
		return false, ""
	}
	total := totalFree(free)
	slots, declared, least := control.AdaptiveSlots(j.bounds(), total)
	switch {
	case slots == 0:
		j.slotWait = time.Time{}
		why := fmt.Sprintf("it runs on no fewer than %d slot(s) (its min_parallelism", least)
		if fs := j.fixedSources(); fs != "" {
			why += ", and sources that keep their parallelism: " + fs
		}
		return false, why + fmt.Sprintf("; declared %d)", declared)
	case slots == j.slots:
		j.slotWait = time.Time{}
		return false, ""
	case slots > j.slots:
		c.rescaleLocked(j, now, slots, fmt.Sprintf("%d slot(s) free for a job declared at %d", total, declared))
		return true, ""
	}
	if j.slotWait.IsZero() {
		j.slotWait = now
	}
	if wait := c.opts.SlotWait - now.Sub(j.slotWait); wait > 0 {
		return false, fmt.Sprintf("runs at parallelism %d in %s unless more slots are free", slots, wait.Round(100*time.Millisecond))
	}
	c.rescaleLocked(j, now, slots, fmt.Sprintf("only %d slot(s) free for %s, declared %d, min %d", total, c.opts.SlotWait, declared, least))
	return true, ""
}

// rescaleLocked makes j, which is not placed, run on `to` slots: its spec is
// scaled, its controller side (if any) closed, and the next schedule makes a
// new one, restored from the job's latest checkpoint or savepoint.
func (c *Controller) rescaleLocked(j *ctlJob, now time.Time, to int, reason string) {
	from := j.slots
	if j.dist != nil {
		j.dist.close(nil) // its lifecycle is on the old graph; the new one carries its restart state
		j.dist = nil
	}
	j.scaleLocked(to)
	j.carryRestarts, j.resumed = true, true
	j.slotWait, j.moreSince, j.rescaledAt = time.Time{}, time.Time{}, now
	r := wire.RescaleStatus{Time: now, From: from, To: to, Reason: reason, Attempt: j.attempt}
	if j.latest != nil && j.latest.Kind == control.KindSavepoint {
		r.Restore = j.latest.Location
	}
	j.rescales = append(j.rescales, r)
	if n := len(j.rescales); n > maxRescales {
		j.rescales = j.rescales[n-maxRescales:]
	}
	if j.rescaleSpan != nil {
		telemetry.EndSpan(j.rescaleSpan, fmt.Errorf("rescaled again to %d before it ran", to))
	}
	j.rescaleCtx, j.rescaleSpan = telemetry.StartRoot(context.Background(), telemetry.SpanRescale, telemetry.Job(j.id), telemetry.AttrJobID.String(j.id),
		telemetry.AttrJobName.String(j.spec.Name), telemetry.Attempt(j.attempt), attribute.Int("streamd.parallelism.from", from),
		attribute.Int("streamd.parallelism.to", to), attribute.String("streamd.reason", reason))
	c.log.Info("job rescaled", "job", j.id, "from", from, "to", to, "declared", j.declaredSlots(), "attempt", j.attempt, "reason", reason)
	j.reason = fmt.Sprintf("rescaling from parallelism %d to %d: %s", from, to, reason)
	j.updated = now
	c.changedLocked(j)
}

// rescaleTrace hands j's rescale span to its new controller side dj: the
// restore of its first attempt is the span's child, and the span ends when
// every subtask of that attempt runs (as a failover's does).
func (j *ctlJob) rescaleTrace(dj *distJob) {
	ctx, span := j.rescaleCtx, j.rescaleSpan
	if span == nil {
		return
	}
	j.rescaleCtx, j.rescaleSpan = nil, nil
	dj.post(func() {
		dj.obs.failCtx = ctx
		dj.obs.pending = append(dj.obs.pending, span)
	})
}

// declaredSlots is the slots j needs at its declared parallelism.
func (j *ctlJob) declaredSlots() int {
	_, declared, _ := control.AdaptiveSlots(j.bounds(), 0)
	return declared
}

// scaleUpLocked starts the scale-up of each running job that runs below its
// declared parallelism while more slots have been free for SlotWait, at
// most once per RescaleInterval: the job is stopped with a savepoint and
// started on the slots there are from it (rescaleStoppedLocked). Jobs
// without checkpoints are not (a restart would lose their progress).
func (c *Controller) scaleUpLocked(now time.Time) []effect {
	free := totalFree(c.freeSlotsLocked())
	var effects []effect
	for _, id := range c.order {
		j := c.jobs[id]
		if j.declared == nil || j.state != wire.JobRunning || j.placement == nil || j.dist == nil || !j.dist.ckpt || j.rescale != nil ||
			j.upgrading || j.upgrade != nil || j.canceling || j.noRescale != "" {
			j.moreSince = time.Time{}
			continue
		}
		slots, declared, _ := control.AdaptiveSlots(j.bounds(), free+j.slots)
		if slots <= j.slots {
			j.moreSince = time.Time{}
			continue
		}
		if j.moreSince.IsZero() {
			j.moreSince = now
			c.log.Info("more slots are free: the job scales up once they stay free", "job", j.id, "parallelism", j.slots, "possible", slots,
				"declared", declared, "wait", c.opts.SlotWait, "since_last_rescale", now.Sub(j.rescaledAt).Round(time.Millisecond))
		}
		if now.Sub(j.moreSince) < c.opts.SlotWait || now.Sub(j.rescaledAt) < c.opts.RescaleInterval {
			continue
		}
		free -= slots - j.slots // not offered to the next job
		r := &rescaleUp{From: j.slots, To: slots, Reason: fmt.Sprintf("%d more slot(s) free for %s, declared %d", slots-j.slots, c.opts.SlotWait, declared)}
		j.rescale = r
		c.log.Info("rescaling the job: stopping it with a savepoint", "job", j.id, "from", r.From, "to", r.To, "reason", r.Reason)
		effects = append(effects, func() {
			_, err := c.distSavepoint(j.id, wire.HostVerbStop, "", false, true)
			c.mu.Lock()
			defer c.mu.Unlock()
			if j.rescale == r { // it did not stop for the rescale
				j.rescale, j.rescaledAt = nil, time.Now() // tried again after RescaleInterval
				c.log.Warn("rescale not done: the stop with a savepoint failed", "job", j.id, "from", r.From, "to", r.To, "err", err)
			}
		})
	}
	return effects
}

// rescaleStoppedLocked: j stopped with savepoint sp (id) for its scale-up:
// it starts on the new parallelism from it.
func (c *Controller) rescaleStoppedLocked(j *ctlJob, now time.Time, sp string, id int64) {
	r := j.rescale
	j.rescale = nil
	j.autoscaleTargets(r)
	c.setAttemptState(j, wire.JobStopped, fmt.Sprintf("savepoint %s taken to rescale to parallelism %d", sp, r.To))
	j.latest = &control.RestorePoint{ID: id, Kind: control.KindSavepoint, Location: sp}
	j.placement = nil
	j.attempt++
	j.state = wire.JobRestarting
	j.subtaskState, j.stats, j.hostStats = wire.SubtaskScheduled, nil, nil
	j.restartAt = now
	c.rescaleLocked(j, now, r.To, r.Reason)
}

// rescaleTakeover is what a new controller side of j carries over from the
// one before a rescale: the restart strategy's state (nil: j was not
// rescaled).
func (j *ctlJob) rescaleTakeover() *runtime.Takeover {
	if !j.carryRestarts {
		return nil
	}
	return &runtime.Takeover{Restarts: j.restarts, Start: true}
}

// rescaleMisfit: the restore point of a rescaled job does not restore at
// the parallelism it was rescaled to.
type rescaleMisfit struct {
	slots int
	err   error
}

func (e *rescaleMisfit) Error() string {
	return fmt.Sprintf("its state does not restore at parallelism %d: %v", e.slots, e.err)
}

func (e *rescaleMisfit) Unwrap() error { return e.err }

// checkRescaled runs deploy --from's restore checks of spec, j's spec
// scaled to another parallelism, against the restore point from (outside
// c.mu): a *rescaleMisfit when it does not fit.
func (c *Controller) checkRescaled(j *ctlJob, spec wire.JobSpec, from string, scaled bool) error {
	if !scaled || from == "" || spec.Checkpoint == nil {
		return nil
	}
	g, err := spec.Graph(func(a wire.Artifact) (string, error) { return "/" + a.Name, nil })
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), c.opts.RequestTimeout)
		defer cancel()
		err = c.checkLatest(ctx, j, from, g)
	}
	if err != nil {
		return &rescaleMisfit{slots: spec.SlotsNeeded(), err: err}
	}
	return nil
}
