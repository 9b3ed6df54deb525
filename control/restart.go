package control

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
)

// RestartKind names a restart strategy.
type RestartKind string

const (
	RestartNone             RestartKind = "none"
	RestartFixedDelay       RestartKind = "fixed-delay"
	RestartFailureRate      RestartKind = "failure-rate"
	RestartExponentialDelay RestartKind = "exponential-delay"
)

// RestartConfig is a restart strategy; delays and intervals in ticks.
// Fields that do not belong to Kind are ignored.
type RestartConfig struct {
	Kind RestartKind
	// fixed-delay: at most Attempts restarts, Delay ticks before each.
	Attempts int
	Delay    int64
	// failure-rate: the job fails when more than MaxFailures failures fall
	// within FailureIntervalTicks (failures at ticks now-FailureIntervalTicks
	// through now, the failure at now included); Delay before each restart.
	MaxFailures          int
	FailureIntervalTicks int64
	// exponential-delay: the first restart waits InitialDelay, each next one
	// Multiplier times more, at most MaxDelay, each randomized by +-Jitter (a
	// fraction 0..1); after the job ran ResetTicks without failing the delay
	// goes back to InitialDelay (and the attempt count to 0). Attempts > 0
	// bounds the restarts since the last reset (0: unlimited).
	InitialDelay int64
	MaxDelay     int64
	Multiplier   float64
	Jitter       float64
	ResetTicks   int64
}

// Validate reports the first setting of c that is out of range, as
// "control: restart strategy KIND: FIELD must be ..., got X".
func (c RestartConfig) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("control: restart strategy %s: %s", c.Kind, fmt.Sprintf(format, args...))
	}
	switch c.Kind {
	case RestartNone:
	case RestartFixedDelay:
		if c.Attempts < 0 {
			return bad("attempts must be >= 0, got %d", c.Attempts)
		}
		if c.Delay < 0 {
			return bad("delay must be >= 0, got %d", c.Delay)
		}
	case RestartFailureRate:
		if c.MaxFailures < 1 {
			return bad("max failures must be >= 1, got %d", c.MaxFailures)
		}
		if c.FailureIntervalTicks < 1 {
			return bad("failure interval must be >= 1 tick, got %d", c.FailureIntervalTicks)
		}
		if c.Delay < 0 {
			return bad("delay must be >= 0, got %d", c.Delay)
		}
	case RestartExponentialDelay:
		switch {
		case c.InitialDelay < 0:
			return bad("initial delay must be >= 0, got %d", c.InitialDelay)
		case c.MaxDelay < c.InitialDelay:
			return bad("max delay must be >= the initial delay %d, got %d", c.InitialDelay, c.MaxDelay)
		case !(c.Multiplier >= 1) || math.IsInf(c.Multiplier, 1):
			return bad("multiplier must be >= 1, got %s", restartFloat(c.Multiplier))
		case !(c.Jitter >= 0 && c.Jitter <= 1):
			return bad("jitter must be between 0 and 1, got %s", restartFloat(c.Jitter))
		case c.ResetTicks < 1:
			return bad("reset must be >= 1 tick, got %d", c.ResetTicks)
		case c.Attempts < 0:
			return bad("attempts must be >= 0 (0: unlimited), got %d", c.Attempts)
		}
	default:
		return fmt.Errorf("control: restart strategy %q: unknown kind (want %s, %s, %s or %s)",
			string(c.Kind), RestartNone, RestartFixedDelay, RestartFailureRate, RestartExponentialDelay)
	}
	return nil
}

// String is the kind and its parameters on one line, for logs and scripts:
//
//	none
//	fixed-delay attempts=3 delay=10
//	failure-rate max-failures=1 interval=600 delay=10
//	exponential-delay initial=10 max=600 multiplier=1.5 jitter=0.1 reset=36000 [attempts=5]
//
// attempts of exponential-delay is shown only when it bounds the restarts.
func (c RestartConfig) String() string {
	switch c.Kind {
	case RestartNone:
		return string(c.Kind)
	case RestartFixedDelay:
		return fmt.Sprintf("%s attempts=%d delay=%d", c.Kind, c.Attempts, c.Delay)
	case RestartFailureRate:
		return fmt.Sprintf("%s max-failures=%d interval=%d delay=%d", c.Kind, c.MaxFailures, c.FailureIntervalTicks, c.Delay)
	case RestartExponentialDelay:
		s := fmt.Sprintf("%s initial=%d max=%d multiplier=%s jitter=%s reset=%d", c.Kind,
			c.InitialDelay, c.MaxDelay, restartFloat(c.Multiplier), restartFloat(c.Jitter), c.ResetTicks)
		if c.Attempts > 0 {
			s += fmt.Sprintf(" attempts=%d", c.Attempts)
		}
		return s
	}
	return fmt.Sprintf("%q", string(c.Kind))
}

func restartFloat(x float64) string { return strconv.FormatFloat(x, 'g', -1, 64) }

// RestartTracker applies a RestartConfig to one job's failures. Like the
// Coordinator it is pure: the caller tells it when an attempt runs and when
// it fails, in ticks, and waits the delay it returns. Ticks passed to it
// should not decrease; a smaller tick is taken as the latest one seen.
// Once it gives up it stays given up: every later Failed returns ok=false
// with the same reason.
type RestartTracker struct {
	cfg RestartConfig
	rng *rand.Rand // jitter; nil without

	now      int64 // latest tick seen
	restarts int   // granted in total

	// exponential-delay
	running bool  // the current attempt reported Running
	since   int64 // ... at this tick
	streak  int   // restarts granted since the last reset
	base    float64

	// failure-rate: failure ticks within the interval, oldest first; at most
	// MaxFailures+1 long.
	failures []int64

	gaveUp string // why it gave up; "" while it grants restarts

	// lost: restarts after attempts lost to causes outside the job
	// (Lifecycle.lost counts them; the strategy does not).
	lost int
}

// NewRestartTracker validates cfg; seed makes the jitter deterministic
// (math/rand/v2 PCG seeded with seed and 0).
func NewRestartTracker(cfg RestartConfig, seed uint64) (*RestartTracker, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	r := &RestartTracker{cfg: cfg, base: float64(cfg.InitialDelay), now: math.MinInt64}
	if cfg.Kind == RestartExponentialDelay && cfg.Jitter > 0 {
		r.rng = rand.New(rand.NewPCG(seed, 0))
	}
	return r, nil
}

// Config is the strategy the tracker applies.
func (r *RestartTracker) Config() RestartConfig { return r.cfg }

func (r *RestartTracker) advance(now int64) int64 {
	if now > r.now {
		r.now = now
	}
	return r.now
}

// Running: an attempt has been running since tick now (all its subtasks
// deployed); used for the reset after a stable run. Calls after the first
// for the same attempt (before the next Failed) change nothing.
func (r *RestartTracker) Running(now int64) {
	now = r.advance(now)
	if !r.running {
		r.running, r.since = true, now
	}
}

// Failed: the current attempt failed at tick now. It returns the delay in
// ticks before the next attempt, or ok=false and why it gives up ("3
// restarts, the limit of fixed-delay", "4 failures within 600 ticks, more
// than failure-rate's 3", "the job has no restart strategy").
func (r *RestartTracker) Failed(now int64) (delay int64, ok bool, why string) {
	now = r.advance(now)
	ranSince, ran := r.since, r.running
	r.running = false
	if r.gaveUp != "" {
		return 0, false, r.gaveUp
	}
	c := r.cfg
	switch c.Kind {
	case RestartFixedDelay:
		if r.restarts >= c.Attempts {
			return r.giveUp(fmt.Sprintf("%s, the limit of %s", restartPlural(c.Attempts, "restart"), c.Kind))
		}
		delay = c.Delay
	case RestartFailureRate:
		keep := r.failures[:0]
		for _, t := range r.failures {
			if now-t <= c.FailureIntervalTicks {
				keep = append(keep, t)
			}
		}
		r.failures = append(keep, now)
		if n := len(r.failures); n > c.MaxFailures {
			return r.giveUp(fmt.Sprintf("%s within %d ticks, more than %s's %d", restartPlural(n, "failure"), c.FailureIntervalTicks, c.Kind, c.MaxFailures))
		}
		delay = c.Delay
	case RestartExponentialDelay:
		if ran && now-ranSince >= c.ResetTicks {
			r.streak, r.base = 0, float64(c.InitialDelay)
		}
		if c.Attempts > 0 && r.streak >= c.Attempts {
			return r.giveUp(fmt.Sprintf("%s without a stable run of %d ticks, the limit of %s", restartPlural(c.Attempts, "restart"), c.ResetTicks, c.Kind))
		}
		delay = r.jittered(r.base)
		r.streak++
		r.base = math.Min(r.base*c.Multiplier, float64(c.MaxDelay))
	default: // RestartNone
		return r.giveUp("the job has no restart strategy")
	}
	r.restarts++
	return delay, true, ""
}

// jittered is base randomized by +-Jitter, rounded down, so never above
// base*(1+Jitter) nor below 0.
func (r *RestartTracker) jittered(base float64) int64 {
	d := base
	if r.rng != nil {
		d += base * r.cfg.Jitter * (2*r.rng.Float64() - 1)
	}
	switch {
	case d <= 0:
		return 0
	case d >= math.MaxInt64:
		return math.MaxInt64
	}
	return int64(d)
}

func (r *RestartTracker) giveUp(why string) (int64, bool, string) {
	r.gaveUp = why
	return 0, false, why
}

// RestartState is what a RestartTracker has counted, in a form that outlives
// its clock: failures are given as ticks before the tick State was read.
type RestartState struct {
	Restarts    int     `json:"restarts"`
	Streak      int     `json:"streak,omitempty"`       // exponential-delay: restarts since the last reset
	Base        float64 `json:"base,omitempty"`         // exponential-delay: the next delay before jitter, ticks
	FailuresAgo []int64 `json:"failures_ago,omitempty"` // failure-rate: ticks before now, oldest first
	GaveUp      string  `json:"gave_up,omitempty"`
	// Lost counts the restarts after lost attempts (LifecycleConfig.MaxLost).
	Lost int `json:"lost,omitempty"`
}

// State is what r has counted, relative to the latest tick it saw.
func (r *RestartTracker) State() RestartState {
	st := RestartState{Restarts: r.restarts, Streak: r.streak, Base: r.base, GaveUp: r.gaveUp, Lost: r.lost}
	for _, t := range r.failures {
		st.FailuresAgo = append(st.FailuresAgo, r.now-t)
	}
	return st
}

// restore takes st over, before r has seen any tick: its failures become
// ticks before 0.
func (r *RestartTracker) restore(st RestartState) {
	r.restarts, r.streak, r.gaveUp, r.lost = st.Restarts, st.Streak, st.GaveUp, st.Lost
	if st.Base > 0 {
		r.base = st.Base
	}
	r.failures = r.failures[:0]
	for _, ago := range st.FailuresAgo {
		r.failures = append(r.failures, -ago)
	}
}

// Restarts is the number of restarts granted so far.
func (r *RestartTracker) Restarts() int { return r.restarts }

func restartPlural(n int, word string) string {
	if n == 1 {
		return "1 " + word
	}
	return fmt.Sprintf("%d %ss", n, word)
}
