package control

import (
	"math"
	"strings"
	"testing"
	"time"
)

// A pipeline src -> slow -> out as the autoscaler sees it: the slow stage
// may run at 1..4, the source and the sink at 1.
var autoOps = []AutoscaleOp{
	{UID: "src", Source: true, Min: 1, Max: 1},
	{UID: "slow", Inputs: []string{"src"}, Min: 1, Max: 4},
	{UID: "out", Inputs: []string{"slow"}, Min: 1, Max: 1},
}

var autoCfg = AutoscaleConfig{TargetUtilization: 0.7, Boundary: 0.3, MetricsWindow: 10 * time.Second,
	Stabilization: 5 * time.Second, Cooldown: 30 * time.Second, CatchUp: 20 * time.Second, MaxScaleDown: 0.5}

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// load is a steady state of the pipeline: the source reads `read` records/s
// while its backlog changes by `lagRate`/s from `lag`; the slow stage runs at
// `par` subtasks, each busy `busy` of the time; the sink is nearly idle.
type load struct {
	read, lagRate float64
	lag           int64
	par           int
	busy          float64
	noLag         bool
}

// sample is the counters of l after d of running.
func (l load) sample(d time.Duration) AutoscaleSample {
	s := d.Seconds()
	n := int64(l.read * s)
	sec := func(f float64) time.Duration { return time.Duration(f * float64(time.Second)) }
	src := OpSample{Parallelism: 1, RecordsOut: n, Busy: sec(0.05 * s), Lag: l.lag + int64(l.lagRate*s), HasLag: !l.noLag}
	return AutoscaleSample{Time: t0.Add(d), Ops: []OpSample{
		src,
		{Parallelism: l.par, RecordsIn: n, RecordsOut: n, Busy: sec(l.busy * s * float64(l.par))},
		{Parallelism: 1, RecordsIn: n, Busy: sec(0.01 * s)},
	}}
}

// run steps a new autoscaler with samples of l every second from 0 to d
// (started at 0) and returns the last decision.
func run(cfg AutoscaleConfig, l load, d time.Duration, capacity int) AutoscaleDecision {
	a := NewAutoscaler(cfg, autoOps)
	a.Start(t0)
	var dec AutoscaleDecision
	for at := time.Duration(0); at <= d; at += time.Second {
		dec = a.Step(l.sample(at), capacity)
	}
	return dec
}

func TestAutoscaleDecisions(t *testing.T) {
	for _, tt := range []struct {
		name     string
		l        load
		d        time.Duration
		capacity int
		want     map[string]int // the changes; nil: none
		hold     string         // in Hold, when no change
		reason   string         // in the slow stage's reason
	}{
		{name: "stabilizing", l: load{read: 100, lagRate: 500, par: 1, busy: 1}, d: 3 * time.Second, hold: "stabilizing"},
		{name: "collecting a window", l: load{read: 100, lagRate: 500, par: 1, busy: 1}, d: 12 * time.Second, hold: "collecting metrics"},
		// 100/s read, the backlog grows 200/s: 300/s arrive; the slow stage
		// processes 100/s fully busy: utilization 3, at 0.7 that is 5 -> max 4.
		{name: "lag growing: up to its max", l: load{read: 100, lagRate: 200, par: 1, busy: 1}, d: 20 * time.Second,
			want: map[string]int{"slow": 4}, reason: "at its max 4"},
		{name: "lag growing: capped by slots", l: load{read: 100, lagRate: 200, par: 1, busy: 1}, d: 20 * time.Second, capacity: 2,
			want: map[string]int{"slow": 2}, reason: "capped by the 2 slot(s)"},
		// No growth, but a backlog of 2000 to read within 20s: +100/s over
		// the 100/s read: utilization 2 -> ceil(2/0.7) = 3.
		{name: "standing backlog", l: load{read: 100, lag: 2000, par: 1, busy: 1}, d: 20 * time.Second,
			want: map[string]int{"slow": 3}, reason: "backlog 2000"},
		// Fully busy without any lag known (a generator): utilization 1,
		// within 0.7 +- 0.3.
		{name: "busy without lag: within bounds", l: load{read: 100, par: 1, busy: 1, noLag: true}, d: 20 * time.Second,
			hold: "within its utilization bounds"},
		{name: "at target", l: load{read: 100, par: 2, busy: 0.7}, d: 20 * time.Second, hold: "within"},
		// Load dropped: 4 subtasks 10% busy: utilization 0.1 -> 1, but a
		// scale-down halves at most: 2.
		{name: "load dropped: scale-down limited", l: load{read: 40, par: 4, busy: 0.1}, d: 20 * time.Second,
			want: map[string]int{"slow": 2}, reason: "scale down"},
		{name: "load dropped: at its min", l: load{read: 10, par: 2, busy: 0.05}, d: 20 * time.Second,
			want: map[string]int{"slow": 1}, reason: "at its min 1"},
		// Nothing arrives, nothing busy: the minimum.
		{name: "idle source", l: load{par: 4}, d: 20 * time.Second, want: map[string]int{"slow": 2}, reason: "idle"},
		// A backlog but nothing processed, nothing busy (a stall, or no
		// new counters): no evidence, no change.
		{name: "stalled with a backlog", l: load{lag: 5000, par: 4}, d: 20 * time.Second, hold: "processed nothing while records were due"},
		// Little arrives, but the stage is busy on what is queued in its
		// channels: no scale-down.
		{name: "busy on queued records", l: load{read: 10, par: 4, busy: 0.9}, d: 20 * time.Second, hold: "within"},
		{name: "no records, no lag at minimum", l: load{par: 1, noLag: true}, d: 20 * time.Second, hold: "within"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dec := run(autoCfg, tt.l, tt.d, tt.capacity)
			got := map[string]int{}
			for _, c := range dec.Changes {
				got[c.UID] = c.To
				if c.UID == "slow" && tt.reason != "" && !strings.Contains(c.Reason, tt.reason) {
					t.Errorf("reason %q, want it to say %q", c.Reason, tt.reason)
				}
				t.Logf("%s %d -> %d: %s", c.UID, c.From, c.To, c.Reason)
			}
			if len(got) != len(tt.want) {
				t.Fatalf("changes %v (hold %q), want %v", got, dec.Hold, tt.want)
			}
			for uid, p := range tt.want {
				if got[uid] != p {
					t.Fatalf("changes %v, want %v", got, tt.want)
				}
			}
			if tt.want == nil && !strings.Contains(dec.Hold, tt.hold) {
				t.Fatalf("hold %q, want it to say %q", dec.Hold, tt.hold)
			}
		})
	}
}

// TestAutoscaleCooldown: after a rescale no other is decided within the
// cooldown, however the metrics look; after it, one is. A restart (the
// rescale's) stabilizes and collects a window again.
func TestAutoscaleCooldown(t *testing.T) {
	a := NewAutoscaler(autoCfg, autoOps)
	a.Start(t0)
	hot := load{read: 100, lagRate: 200, par: 1, busy: 1}
	var at time.Duration
	step := func(l load) AutoscaleDecision {
		d := a.Step(l.sample(at), 0)
		at += time.Second
		return d
	}
	var d AutoscaleDecision
	for len(d.Changes) == 0 && at < time.Minute {
		d = step(hot)
	}
	if len(d.Changes) != 1 || d.Changes[0].To != 4 {
		t.Fatalf("decision %+v, want slow to 4", d)
	}
	first := at - time.Second
	a.Rescaled(t0.Add(first))
	a.Start(t0.Add(first))
	// The load is gone at once: a scale-down waits for the cooldown.
	cold := load{read: 10, par: 4, busy: 0.02}
	for d = (AutoscaleDecision{}); len(d.Changes) == 0 && at < 3*time.Minute; {
		d = step(cold)
		if len(d.Changes) == 0 && at-first > 16*time.Second && at-first < 30*time.Second && !strings.Contains(d.Hold, "cooldown") {
			t.Fatalf("at %s after the rescale: hold %q, want the cooldown", at-first, d.Hold)
		}
	}
	second := at - time.Second
	if len(d.Changes) != 1 || d.Changes[0].To != 2 {
		t.Fatalf("decision %+v, want slow to 2 (halved at most)", d)
	}
	if second-first < autoCfg.Cooldown {
		t.Fatalf("rescaled again %s after the first, within the cooldown %s", second-first, autoCfg.Cooldown)
	}
}

// TestAutoscaleCountersReset: counters that go back (a restarted subtask)
// start a new window instead of a negative rate.
func TestAutoscaleCountersReset(t *testing.T) {
	a := NewAutoscaler(autoCfg, autoOps)
	a.Start(t0)
	hot := load{read: 100, lagRate: 200, par: 1, busy: 1}
	for at := 5 * time.Second; at < 12*time.Second; at += time.Second {
		a.Step(hot.sample(at), 0)
	}
	s := hot.sample(time.Second) // counters as after 1s
	s.Time = t0.Add(13 * time.Second)
	if d := a.Step(s, 0); len(d.Changes) != 0 || !strings.Contains(d.Hold, "collecting") {
		t.Fatalf("after a reset: %+v, want collecting a new window", d)
	}
}

// TestAutoscaleFormula checks the figures of one evaluation by hand.
func TestAutoscaleFormula(t *testing.T) {
	a := NewAutoscaler(autoCfg, autoOps)
	l := load{read: 100, lagRate: 50, lag: 1000, par: 2, busy: 0.5}
	e := a.Evaluate(l.sample(0), l.sample(10*time.Second), 0)
	// source: 100 read + 50 lag growth = 150/s; backlog 1500 at the end
	// over 20s: +75/s: target 225/s.
	if got := e[0].TargetRate; math.Abs(got-225) > 1e-6 {
		t.Errorf("source target rate %v, want 225", got)
	}
	// slow: 100/s at busy 0.5: true rate 200/s; utilization 225/200.
	if got := e[1].TrueRate; math.Abs(got-200) > 1e-6 {
		t.Errorf("slow true rate %v, want 200", got)
	}
	if got := e[1].Utilization; math.Abs(got-1.125) > 1e-6 {
		t.Errorf("slow utilization %v, want 1.125", got)
	}
	if got := e[1].Want; got != 4 { // ceil(2 * 1.125 / 0.7) = ceil(3.21)
		t.Errorf("slow wants %d, want 4", got)
	}
}
