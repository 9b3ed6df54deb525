package cluster

// Autoscaling on backlog (the job file's autoscaler section; off by
// default): for a running job with checkpoints, each report of its hosts'
// counters (HostEvent.Stats: records in and out, busy time and source lag
// per subtask) is a sample for the job's control.Autoscaler, which decides
// a parallelism per operator (the Flink Kubernetes operator's formula, with
// stabilization, metrics window and cooldown). A decision to rescale stops
// the job with a savepoint and starts it from it with every operator at its
// new parallelism, as the adaptive scheduler's scale-up does (adaptive.go:
// rescaleUp with Targets); the operators' parallelism the autoscaler chose
// then stands in for the declared one there (wantOf), so a lost host still
// runs the job on fewer slots and scales it back to the autoscaler's when
// slots return. Every decision is logged (a job event), traced (an
// `autoscale` span) and kept in the job's status (JobStatus.Autoscaler).
//
// The operators' parallelism the autoscaler chose, its latest decisions and
// the time of its last rescale (the cooldown) are kept in the job's record
// (autoscaleRecord): a new leader goes on from them, its metrics window
// beginning anew.

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/internal/cluster/wire"
	"github.com/streamd/streamd/internal/runtime"
	"github.com/streamd/streamd/internal/telemetry"
)

// maxAutoscaleDecisions is how many decisions a job's status keeps.
const maxAutoscaleDecisions = 20

// autoscaleJob is a job's autoscaler in the controller (guarded by c.mu).
type autoscaleJob struct {
	a       *control.Autoscaler // nil: not made yet (a job loaded from its record)
	uids    []string            // the operators it was made for, in spec order
	attempt int                 // the attempt it samples
	targets map[string]int      // each operator's parallelism as it decided (nil: as declared)
	hold    string
	decided []wire.AutoscaleDecisionStatus
	last    time.Time // its last rescale
	// base is the attempt's start as its hosts' elapsed time places it
	// (zero: not known yet); at the time of the latest sample.
	base, at time.Time
}

// autoscaleRecord is a job's autoscaler in the job's record (ha.go).
type autoscaleRecord struct {
	Targets     map[string]int                 `json:"targets,omitempty"`
	Decisions   []wire.AutoscaleDecisionStatus `json:"decisions,omitempty"`
	LastRescale time.Time                      `json:"last_rescale,omitzero"`
}

// autoscaleRecord is j's autoscaler for its record (nil: none).
func (j *ctlJob) autoscaleRecord() *autoscaleRecord {
	if j.auto == nil {
		return nil
	}
	return &autoscaleRecord{Targets: j.auto.targets, Decisions: slices.Clone(j.auto.decided), LastRescale: j.auto.last}
}

// autoscaleFromRecord is the autoscaler of a job loaded from its record.
func autoscaleFromRecord(r *autoscaleRecord) *autoscaleJob {
	if r == nil {
		return nil
	}
	return &autoscaleJob{targets: r.Targets, decided: r.Decisions, last: r.LastRescale, attempt: -1}
}

// wantOf is the parallelism operator v is to run at: the autoscaler's
// choice, else its declared one.
func (j *ctlJob) wantOf(v wire.VertexSpec) int {
	if j.auto != nil {
		if p, ok := j.auto.targets[v.UID]; ok {
			return p
		}
	}
	return j.declaredOf(v)
}

// declaredBounds is j.bounds() at the declared parallelism (the
// autoscaler's choice aside), as status shows it.
func (j *ctlJob) declaredBounds() []control.Bounds { return j.boundsOf(j.declaredOf) }

// autoscaleLocked steps j's autoscaler with the counters its hosts just
// reported, and starts the rescale it decides.
func (c *Controller) autoscaleLocked(j *ctlJob, now time.Time) []effect {
	as := j.spec.Autoscaler
	if as == nil || !as.Enabled || j.state != wire.JobRunning || j.placement == nil || j.dist == nil || !j.dist.ckpt ||
		j.rescale != nil || j.upgrading || j.upgrade != nil || j.canceling || j.noRescale != "" || len(j.stats) == 0 {
		return nil
	}
	uids := make([]string, len(j.spec.Vertices))
	for i, v := range j.spec.Vertices {
		uids[i] = v.UID
	}
	aj := j.auto
	if aj == nil || aj.a == nil || !slices.Equal(aj.uids, uids) { // first, from the record, or after an upgrade
		ops := make([]control.AutoscaleOp, len(j.spec.Vertices))
		for i, v := range j.spec.Vertices {
			ops[i] = control.AutoscaleOp{UID: v.UID, Source: v.Source != nil, Min: max(v.MinParallelism, 1), Max: as.MaxOf(v.UID, v.MaxParallelism)}
			if fixedSource(v) {
				ops[i].Min, ops[i].Max = v.Parallelism, v.Parallelism
			}
			for _, e := range v.Inputs {
				ops[i].Inputs = append(ops[i].Inputs, e.From)
			}
		}
		aj = &autoscaleJob{a: control.NewAutoscaler(as.Control(), ops), uids: uids, attempt: -1}
		if old := j.auto; old != nil {
			aj.decided, aj.last = old.decided, old.last
			if old.a == nil { // from the record: the same job version
				aj.targets = old.targets
			}
		}
		if !aj.last.IsZero() {
			aj.a.Rescaled(aj.last) // the cooldown holds across leaders
		}
		j.auto = aj
	}
	if aj.attempt != j.attempt {
		aj.attempt, aj.base, aj.at = j.attempt, time.Time{}, time.Time{}
		aj.a.Start(now)
	}
	// A sample is timed by the hosts' clock (the attempt's elapsed time
	// they report with the counters), not by when it arrived: reports that
	// arrive late or bunched on a loaded machine would otherwise look like
	// more busy time than the span between them holds.
	at := now
	if d, err := time.ParseDuration(j.elapsed); err == nil && d > 0 {
		if aj.base.IsZero() {
			aj.base = now.Add(-d)
		}
		at = aj.base.Add(d)
	}
	if !at.After(aj.at) {
		return nil // no later than the last (another host's report): its counters count at the next
	}
	aj.at = at
	capacity := j.slots + totalFree(c.freeSlotsLocked())
	d := aj.a.Step(autoscaleSample(j.spec.Vertices, j.stats, at), capacity)
	if len(d.Changes) == 0 {
		if kind, _, _ := strings.Cut(d.Hold, ":"); !strings.HasPrefix(aj.hold, kind) {
			c.log.Debug("autoscaler holds", "job", j.id, "why", d.Hold) // once per kind of hold, not per report
		}
		aj.hold = d.Hold
		return nil
	}
	aj.a.Rescaled(now)
	aj.last = now
	targets := map[string]int{}
	for _, v := range j.spec.Vertices {
		targets[v.UID] = v.Parallelism
	}
	var what []string
	_, span := telemetry.StartRoot(context.Background(), telemetry.SpanAutoscale, telemetry.Job(j.id), telemetry.AttrJobID.String(j.id),
		telemetry.AttrJobName.String(j.spec.Name), telemetry.Attempt(j.attempt))
	for _, ch := range d.Changes {
		targets[ch.UID] = ch.To
		what = append(what, fmt.Sprintf("%s %d->%d", ch.UID, ch.From, ch.To))
		aj.decided = append(aj.decided, wire.AutoscaleDecisionStatus{Time: now, Operator: ch.UID, From: ch.From, To: ch.To, Reason: ch.Reason, Outcome: "rescaling"})
		c.log.Info("autoscaler: rescaling an operator", "job", j.id, "operator", ch.UID, "from", ch.From, "to", ch.To, "reason", ch.Reason)
		span.AddEvent("rescale", trace.WithAttributes(telemetry.Operator(ch.UID), attribute.Int("streamd.parallelism.from", ch.From),
			attribute.Int("streamd.parallelism.to", ch.To), attribute.String("streamd.reason", ch.Reason)))
	}
	if n := len(aj.decided); n > maxAutoscaleDecisions {
		aj.decided = slices.Clone(aj.decided[n-maxAutoscaleDecisions:])
	}
	slots, _, _ := control.AdaptiveSlots(targetBounds(j, targets), capacity)
	span.SetAttributes(attribute.String("streamd.autoscale", strings.Join(what, ", ")), attribute.Int("streamd.parallelism.from", j.slots),
		attribute.Int("streamd.parallelism.to", slots))
	r := &rescaleUp{From: j.slots, To: slots, Reason: "autoscaler: " + strings.Join(what, ", "), Targets: targets}
	j.rescale = r
	aj.hold = ""
	c.changedLocked(j) // the decision in the job's record
	return []effect{func() {
		_, err := c.distSavepoint(j.id, wire.HostVerbStop, "", false, true)
		c.mu.Lock()
		defer c.mu.Unlock()
		outcome := "rescaled"
		if j.rescale == r { // it did not stop for the rescale
			j.rescale = nil
			outcome = fmt.Sprintf("not rescaled: the stop with a savepoint failed: %v", err)
			c.log.Warn("autoscaler: rescale not done", "job", j.id, "rescale", r.Reason, "err", err)
			telemetry.EndSpan(span, fmt.Errorf("the stop with a savepoint failed: %w", err))
		} else {
			telemetry.EndSpan(span, nil)
		}
		for i := range j.auto.decided {
			if d := &j.auto.decided[i]; d.Time.Equal(now) && d.Outcome == "rescaling" {
				d.Outcome = outcome
			}
		}
		c.changedLocked(j)
	}}
}

// targetBounds is j's bounds with the operators at targets.
func targetBounds(j *ctlJob, targets map[string]int) []control.Bounds {
	out := j.bounds()
	for i, v := range j.spec.Vertices {
		if p, ok := targets[v.UID]; ok {
			out[i].Declared = p
			out[i].Min = min(out[i].Min, p)
		}
	}
	return out
}

// autoscaleSample is the autoscaler's sample of the operators of a job
// whose hosts reported stats: each operator's counters summed over its
// subtasks.
func autoscaleSample(vs []wire.VertexSpec, stats []runtime.OperatorStats, now time.Time) control.AutoscaleSample {
	by := map[string]runtime.OperatorStats{}
	for _, s := range stats {
		by[s.UID] = s
	}
	s := control.AutoscaleSample{Time: now, Ops: make([]control.OpSample, len(vs))}
	for i, v := range vs {
		st := by[v.UID]
		o := control.OpSample{Parallelism: v.Parallelism, RecordsIn: st.RecordsIn, RecordsOut: st.RecordsOut}
		for _, l := range st.Live {
			o.Busy += l.Busy
			if l.HasSourceLag {
				o.Lag += l.SourceLag
				o.HasLag = true
			}
		}
		s.Ops[i] = o
	}
	return s
}

// autoscaleStatus is j's autoscaler in its status (nil: off).
func (j *ctlJob) autoscaleStatus() *wire.AutoscalerStatus {
	as := j.spec.Autoscaler
	if as == nil || !as.Enabled {
		return nil
	}
	st := &wire.AutoscalerStatus{Settings: as.String()}
	if aj := j.auto; aj != nil {
		st.Hold, st.Decisions = aj.hold, slices.Clone(aj.decided)
		if len(aj.targets) > 0 {
			st.Targets = map[string]int{}
			for k, v := range aj.targets {
				st.Targets[k] = v
			}
		}
	}
	return st
}

// autoscaleTargets makes the operators' parallelism of rescale r (the
// autoscaler's) the one j is to run at.
func (j *ctlJob) autoscaleTargets(r *rescaleUp) {
	if r.Targets != nil && j.auto != nil {
		j.auto.targets = r.Targets
	}
}

// autoscaleNewVersion: j runs a new version (an upgrade), as declared: the
// autoscaler's parallelism is forgotten (its decisions and cooldown stay)
// and it decides anew on the new version's metrics.
func (j *ctlJob) autoscaleNewVersion() {
	if j.auto != nil {
		j.auto.targets, j.auto.a = nil, nil
	}
}
