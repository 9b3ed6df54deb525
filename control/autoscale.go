package control

// Autoscaling on backlog (pure), as the Flink Kubernetes operator's job
// autoscaler (JobVertexScaler, after Kalavri et al., "Three steps is all
// you need", OSDI 2018): per operator, from the metrics of a window,
//
//	busy ratio      = busy time / (window x parallelism)
//	true rate       = records processed / window / busy ratio
//	                  (what the operator would process if never idle)
//	input rate      = a source: records read + lag growth, per second
//	                  (what arrives); else the upstream target rates times
//	                  their output ratios (records out / records processed)
//	target rate     = input rate + lag / catch-up duration (a source's
//	                  backlog, read within CatchUp; downstream inherits it)
//	utilization     = target rate / true rate, at least the busy ratio
//	                  (records queued in its channels are in no lag)
//	new parallelism = ceil(parallelism x utilization / target utilization)
//
// The operator is rescaled only when its utilization is outside
// [TargetUtilization - Boundary, TargetUtilization + Boundary], within its
// bounds (and the slots the job may have), and a scale-down at most by
// MaxScaleDown of its parallelism at a time; one that processed nothing
// while records were due keeps its parallelism (no evidence: a stall, or
// counters not reported anew). Against flapping: no metrics
// are collected for Stabilization after the job (re)started, none decided
// before a whole MetricsWindow was seen, and no rescale within Cooldown of
// the last one. Time is what the caller says it is (no clock here).

import (
	"fmt"
	"math"
	"strings"
	"time"
)

// AutoscaleConfig are the autoscaler's settings (the job file's autoscaler
// section).
type AutoscaleConfig struct {
	TargetUtilization float64       // the busy ratio aimed at (0 < x <= 1)
	Boundary          float64       // no rescale while utilization is within target +- boundary
	MetricsWindow     time.Duration // the span of metrics a decision is made on
	Stabilization     time.Duration // after a (re)start: no metrics taken
	Cooldown          time.Duration // the least time between two rescales
	CatchUp           time.Duration // a source's backlog is to be read within it
	MaxScaleDown      float64       // a scale-down removes at most this fraction of the parallelism (0 < x < 1)
}

// Defaults of AutoscaleConfig.
const (
	DefaultTargetUtilization = 0.7
	DefaultUtilBoundary      = 0.3
	DefaultMetricsWindow     = 30 * time.Second
	DefaultStabilization     = 30 * time.Second
	DefaultCooldown          = time.Minute
	DefaultCatchUp           = 2 * time.Minute
	DefaultMaxScaleDown      = 0.5
)

// minBusy is the busy ratio below which an operator counts as idle: its
// true rate is unbounded (it needs its minimum parallelism).
const minBusy = 1e-3

// AutoscaleOp is one operator as the autoscaler sees it: its inputs (uids
// of upstream operators), whether it is a source, and the parallelism it
// may have (Min 0 means 1).
type AutoscaleOp struct {
	UID      string
	Inputs   []string
	Source   bool
	Min, Max int
}

// OpSample is one operator's counters at one time, summed over its
// subtasks; they only grow while the attempt runs.
type OpSample struct {
	Parallelism int
	RecordsIn   int64         // records processed (a source: none)
	RecordsOut  int64         // records emitted
	Busy        time.Duration // time in the operator's calls
	Lag         int64         // a source's backlog (HasLag: it knows one)
	HasLag      bool
}

// AutoscaleSample is every operator's counters at Time, in the order of
// the autoscaler's ops.
type AutoscaleSample struct {
	Time time.Time
	Ops  []OpSample
}

// ScaleChange is one operator's new parallelism and why.
type ScaleChange struct {
	UID      string
	From, To int
	Reason   string
}

// AutoscaleDecision is the outcome of one Step: the operators to rescale
// (none: Hold says why not).
type AutoscaleDecision struct {
	Changes []ScaleChange
	Hold    string
}

// OpEval is what the autoscaler computed for one operator over its window.
type OpEval struct {
	BusyRatio, TrueRate, InputRate, TargetRate, Utilization float64
	Lag                                                     int64 // the backlog of the sources upstream (of a source: its own)
	Want                                                    int   // its parallelism as the formula has it, within its bounds
	Stalled                                                 bool  // it processed nothing while records were due: kept as it is
}

// Autoscaler is the autoscaling machine of one job. Start it (and again at
// every restart: the counters begin again) and Step it with samples.
type Autoscaler struct {
	cfg         AutoscaleConfig
	ops         []AutoscaleOp
	index       map[string]int
	started     time.Time // the current attempt's start
	lastRescale time.Time // the zero time: none
	window      []AutoscaleSample
}

// NewAutoscaler returns the autoscaler of a job whose operators are ops, in
// topological order.
func NewAutoscaler(cfg AutoscaleConfig, ops []AutoscaleOp) *Autoscaler {
	a := &Autoscaler{cfg: cfg, ops: ops, index: map[string]int{}}
	for i, o := range ops {
		a.index[o.UID] = i
	}
	return a
}

// Start says the job (re)started at now, at the parallelism it runs at: the
// window begins anew after the stabilization interval.
func (a *Autoscaler) Start(now time.Time) {
	a.started, a.window = now, nil
}

// Rescaled says the job is being rescaled at now (the cooldown begins).
func (a *Autoscaler) Rescaled(now time.Time) {
	a.lastRescale, a.window = now, nil
}

// LastRescale is when the job was rescaled last (zero: never).
func (a *Autoscaler) LastRescale() time.Time { return a.lastRescale }

// Step takes sample s and decides: capacity is the most slots the job may
// run on (0: no limit), which bounds every operator's parallelism.
func (a *Autoscaler) Step(s AutoscaleSample, capacity int) AutoscaleDecision {
	if len(s.Ops) != len(a.ops) {
		return AutoscaleDecision{Hold: fmt.Sprintf("a sample of %d operators for a job of %d", len(s.Ops), len(a.ops))}
	}
	if a.started.IsZero() {
		a.started = s.Time
	}
	if left := a.cfg.Stabilization - s.Time.Sub(a.started); left > 0 {
		return AutoscaleDecision{Hold: fmt.Sprintf("stabilizing after the (re)start: %s left", left.Round(100*time.Millisecond))}
	}
	if n := len(a.window); n > 0 && !a.grows(a.window[n-1], s) {
		a.window = nil // the counters began again (a subtask restarted): a new window
	}
	a.window = append(a.window, s)
	// Keep the latest sample at least a window old, and all after it.
	for len(a.window) > 2 && s.Time.Sub(a.window[1].Time) >= a.cfg.MetricsWindow {
		a.window = a.window[1:]
	}
	first := a.window[0]
	if span := s.Time.Sub(first.Time); span < a.cfg.MetricsWindow || span <= 0 {
		return AutoscaleDecision{Hold: fmt.Sprintf("collecting metrics: %s of a %s window", span.Round(100*time.Millisecond), a.cfg.MetricsWindow)}
	}
	evals := a.Evaluate(first, s, capacity)
	var d AutoscaleDecision
	for i, o := range a.ops {
		e, cur := evals[i], s.Ops[i].Parallelism
		if e.Want == cur {
			continue
		}
		d.Changes = append(d.Changes, ScaleChange{UID: o.UID, From: cur, To: e.Want, Reason: a.reason(o, e, cur, capacity)})
	}
	if len(d.Changes) == 0 {
		d.Hold = "every operator within its utilization bounds"
		for i, e := range evals {
			if e.Stalled {
				d.Hold = fmt.Sprintf("%s processed nothing while records were due: no evidence of its capacity", a.ops[i].UID)
				break
			}
		}
		return d
	}
	if !a.lastRescale.IsZero() {
		if left := a.cfg.Cooldown - s.Time.Sub(a.lastRescale); left > 0 {
			var what []string
			for _, c := range d.Changes {
				what = append(what, fmt.Sprintf("%s %d->%d", c.UID, c.From, c.To))
			}
			return AutoscaleDecision{Hold: fmt.Sprintf("cooldown: %s left before %s", left.Round(100*time.Millisecond), strings.Join(what, ", "))}
		}
	}
	return d
}

// grows reports whether every counter of b is at least a's (the same
// attempt, later) and the parallelism did not change.
func (a *Autoscaler) grows(x, y AutoscaleSample) bool {
	if !y.Time.After(x.Time) {
		return false
	}
	for i := range x.Ops {
		p, q := x.Ops[i], y.Ops[i]
		if q.Parallelism != p.Parallelism || q.RecordsIn < p.RecordsIn || q.RecordsOut < p.RecordsOut || q.Busy < p.Busy {
			return false
		}
	}
	return true
}

// Evaluate computes every operator's figures between samples x and y.
func (a *Autoscaler) Evaluate(x, y AutoscaleSample, capacity int) []OpEval {
	dt := y.Time.Sub(x.Time).Seconds()
	out := make([]OpEval, len(a.ops))
	outTarget := make([]float64, len(a.ops)) // the rate of records each op is to emit
	for i, o := range a.ops {
		p, q := x.Ops[i], y.Ops[i]
		par := max(q.Parallelism, 1)
		e := &out[i]
		processed := float64(q.RecordsIn - p.RecordsIn)
		if o.Source {
			processed = float64(q.RecordsOut - p.RecordsOut)
		}
		e.BusyRatio = (q.Busy - p.Busy).Seconds() / (dt * float64(par))
		e.TrueRate = math.Inf(1)
		if e.BusyRatio >= minBusy {
			e.TrueRate = processed / dt / e.BusyRatio
		}
		if o.Source {
			e.InputRate = processed / dt
			if q.HasLag && p.HasLag {
				e.InputRate += float64(q.Lag-p.Lag) / dt // what arrived: read, and what the backlog grew by
			}
			e.InputRate = max(e.InputRate, 0)
			e.TargetRate = e.InputRate
			if q.HasLag && q.Lag > 0 {
				e.Lag = q.Lag
				e.TargetRate += float64(q.Lag) / a.cfg.CatchUp.Seconds()
			}
		} else {
			for _, in := range o.Inputs {
				if k, ok := a.index[in]; ok {
					e.InputRate += outTarget[k]
					e.Lag += out[k].Lag // the sources' backlog it has to take in too
				}
			}
			e.TargetRate = e.InputRate
		}
		ratio := 1.0 // records out per record processed
		if processed > 0 && !o.Source {
			ratio = float64(q.RecordsOut-p.RecordsOut) / processed
		}
		outTarget[i] = e.TargetRate * ratio
		switch {
		case e.TargetRate == 0:
			e.Utilization = 0
		case math.IsInf(e.TrueRate, 1):
			e.Utilization = 0 // idle with work coming: not measurable, nothing to add
		case e.TrueRate == 0:
			e.Utilization = math.Inf(1) // busy, and processed nothing
		default:
			e.Utilization = e.TargetRate / e.TrueRate
		}
		if !math.IsInf(e.Utilization, 1) {
			// At least as busy as it is: records queued in its input
			// channels count in no source's lag (at most 1: busy time
			// measured a little over the window is no cause to scale up).
			e.Utilization = max(e.Utilization, min(e.BusyRatio, 1))
		}
		e.Want = a.want(o, e.Utilization, par, capacity)
		if processed == 0 && e.TargetRate > 0 {
			e.Stalled = true // work coming, none done: no evidence of its capacity (a stall, or stale counters)
			e.Want = a.bound(o, par, par, capacity)
		}
	}
	return out
}

// want is the parallelism of operator o, running at par with utilization
// u: par while u is within the boundary, else the formula's, within o's
// bounds, the capacity and the scale-down limit.
func (a *Autoscaler) want(o AutoscaleOp, u float64, par, capacity int) int {
	lo, hi := a.cfg.TargetUtilization-a.cfg.Boundary, a.cfg.TargetUtilization+a.cfg.Boundary
	if u >= lo && u <= hi {
		return a.bound(o, par, par, capacity)
	}
	w := par
	switch {
	case math.IsInf(u, 1):
		w = math.MaxInt32
	default:
		w = int(math.Ceil(float64(par) * u / a.cfg.TargetUtilization))
	}
	if w < par {
		w = max(w, int(math.Ceil(float64(par)*(1-a.cfg.MaxScaleDown)))) // scale-down limited
	}
	return a.bound(o, w, par, capacity)
}

// bound is w within o's bounds and the capacity; an operator that runs
// above its capacity already is not scaled further up.
func (a *Autoscaler) bound(o AutoscaleOp, w, par, capacity int) int {
	hi := o.Max
	if hi <= 0 {
		hi = math.MaxInt32
	}
	if capacity > 0 {
		hi = min(hi, max(capacity, par))
	}
	return max(min(w, hi), max(o.Min, 1))
}

// reason says why operator o goes from cur to e.Want.
func (a *Autoscaler) reason(o AutoscaleOp, e OpEval, cur, capacity int) string {
	var b strings.Builder
	dir := "up"
	if e.Want < cur {
		dir = "down"
	}
	fmt.Fprintf(&b, "scale %s: utilization %s (target %.2f +- %.2f): target rate %.0f/s", dir, fmtUtil(e.Utilization),
		a.cfg.TargetUtilization, a.cfg.Boundary, e.TargetRate)
	if e.Lag > 0 {
		fmt.Fprintf(&b, " (backlog %d within %s)", e.Lag, a.cfg.CatchUp)
	}
	if math.IsInf(e.TrueRate, 1) {
		fmt.Fprintf(&b, ", idle (busy %.1f%%)", 100*e.BusyRatio)
	} else {
		fmt.Fprintf(&b, ", true rate %.0f/s at %d (busy %.0f%%)", e.TrueRate, cur, 100*e.BusyRatio)
	}
	switch {
	case e.Want == o.Max && o.Max > 0:
		fmt.Fprintf(&b, "; at its max %d", o.Max)
	case capacity > 0 && e.Want == capacity && e.Want > cur:
		fmt.Fprintf(&b, "; capped by the %d slot(s) the job may have", capacity)
	case e.Want == max(o.Min, 1) && e.Want < cur:
		fmt.Fprintf(&b, "; at its min %d", max(o.Min, 1))
	}
	return b.String()
}

func fmtUtil(u float64) string {
	if math.IsInf(u, 1) {
		return "unbounded"
	}
	return fmt.Sprintf("%.2f", u)
}
