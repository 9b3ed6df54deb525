package control

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

func TestRestartConfigValidate(t *testing.T) {
	exp := RestartConfig{Kind: RestartExponentialDelay, InitialDelay: 10, MaxDelay: 600, Multiplier: 1.5, Jitter: 0.1, ResetTicks: 36000}
	with := func(f func(*RestartConfig)) RestartConfig { c := exp; f(&c); return c }
	for _, tc := range []struct {
		cfg  RestartConfig
		want string // "" = valid
	}{
		{RestartConfig{Kind: RestartNone}, ""},
		{RestartConfig{Kind: RestartFixedDelay, Attempts: 3, Delay: 10}, ""},
		{RestartConfig{Kind: RestartFixedDelay}, ""},
		{RestartConfig{Kind: RestartFixedDelay, Attempts: -1}, "control: restart strategy fixed-delay: attempts must be >= 0, got -1"},
		{RestartConfig{Kind: RestartFixedDelay, Delay: -5}, "control: restart strategy fixed-delay: delay must be >= 0, got -5"},
		{RestartConfig{Kind: RestartFailureRate, MaxFailures: 1, FailureIntervalTicks: 600, Delay: 10}, ""},
		{RestartConfig{Kind: RestartFailureRate, FailureIntervalTicks: 600}, "control: restart strategy failure-rate: max failures must be >= 1, got 0"},
		{RestartConfig{Kind: RestartFailureRate, MaxFailures: 1}, "control: restart strategy failure-rate: failure interval must be >= 1 tick, got 0"},
		{RestartConfig{Kind: RestartFailureRate, MaxFailures: 1, FailureIntervalTicks: 1, Delay: -1}, "control: restart strategy failure-rate: delay must be >= 0, got -1"},
		{exp, ""},
		{with(func(c *RestartConfig) { c.Jitter, c.Multiplier, c.InitialDelay, c.MaxDelay = 0, 1, 0, 0 }), ""},
		{with(func(c *RestartConfig) { c.Multiplier = 0.5 }), "control: restart strategy exponential-delay: multiplier must be >= 1, got 0.5"},
		{with(func(c *RestartConfig) { c.Multiplier = math.NaN() }), "control: restart strategy exponential-delay: multiplier must be >= 1, got NaN"},
		{with(func(c *RestartConfig) { c.Multiplier = math.Inf(1) }), "control: restart strategy exponential-delay: multiplier must be >= 1, got +Inf"},
		{with(func(c *RestartConfig) { c.Jitter = 1.5 }), "control: restart strategy exponential-delay: jitter must be between 0 and 1, got 1.5"},
		{with(func(c *RestartConfig) { c.Jitter = -0.1 }), "control: restart strategy exponential-delay: jitter must be between 0 and 1, got -0.1"},
		{with(func(c *RestartConfig) { c.InitialDelay = -1 }), "control: restart strategy exponential-delay: initial delay must be >= 0, got -1"},
		{with(func(c *RestartConfig) { c.MaxDelay = 5 }), "control: restart strategy exponential-delay: max delay must be >= the initial delay 10, got 5"},
		{with(func(c *RestartConfig) { c.ResetTicks = 0 }), "control: restart strategy exponential-delay: reset must be >= 1 tick, got 0"},
		{with(func(c *RestartConfig) { c.Attempts = -2 }), "control: restart strategy exponential-delay: attempts must be >= 0 (0: unlimited), got -2"},
		{RestartConfig{}, `control: restart strategy "": unknown kind (want none, fixed-delay, failure-rate or exponential-delay)`},
		{RestartConfig{Kind: "forever"}, `control: restart strategy "forever": unknown kind (want none, fixed-delay, failure-rate or exponential-delay)`},
	} {
		err := tc.cfg.Validate()
		got := ""
		if err != nil {
			got = err.Error()
		}
		if got != tc.want {
			t.Errorf("%+v: Validate() = %q, want %q", tc.cfg, got, tc.want)
		}
		if _, err := NewRestartTracker(tc.cfg, 1); (err == nil) != (tc.want == "") {
			t.Errorf("%+v: NewRestartTracker error %v, want %q", tc.cfg, err, tc.want)
		}
	}
}

func TestRestartConfigString(t *testing.T) {
	for _, tc := range []struct {
		cfg  RestartConfig
		want string
	}{
		{RestartConfig{Kind: RestartNone, Attempts: 3}, "none"},
		{RestartConfig{Kind: RestartFixedDelay, Attempts: 3, Delay: 10}, "fixed-delay attempts=3 delay=10"},
		{RestartConfig{Kind: RestartFailureRate, MaxFailures: 1, FailureIntervalTicks: 600, Delay: 10}, "failure-rate max-failures=1 interval=600 delay=10"},
		{RestartConfig{Kind: RestartExponentialDelay, InitialDelay: 10, MaxDelay: 600, Multiplier: 1.5, Jitter: 0.1, ResetTicks: 36000},
			"exponential-delay initial=10 max=600 multiplier=1.5 jitter=0.1 reset=36000"},
		{RestartConfig{Kind: RestartExponentialDelay, InitialDelay: 1, MaxDelay: 8, Multiplier: 2, ResetTicks: 100, Attempts: 5},
			"exponential-delay initial=1 max=8 multiplier=2 jitter=0 reset=100 attempts=5"},
		{RestartConfig{Kind: "forever"}, `"forever"`},
	} {
		if got := tc.cfg.String(); got != tc.want {
			t.Errorf("String() = %q, want %q", got, tc.want)
		}
	}
}

// restartStep is one event for a tracker: Running at run, or Failed at fail
// with the expected answer.
type restartStep struct {
	run, fail int64
	failed    bool // a Failed step (fail may be 0)
	delay     int64
	ok        bool
	why       string
}

func rsRun(at int64) restartStep { return restartStep{run: at} }
func rsFail(at, delay int64) restartStep {
	return restartStep{fail: at, failed: true, delay: delay, ok: true}
}
func rsGiveUp(at int64, why string) restartStep {
	return restartStep{fail: at, failed: true, why: why}
}

func TestRestartTracker(t *testing.T) {
	fixed := RestartConfig{Kind: RestartFixedDelay, Attempts: 3, Delay: 10}
	rate := RestartConfig{Kind: RestartFailureRate, MaxFailures: 3, FailureIntervalTicks: 600, Delay: 10}
	exp := RestartConfig{Kind: RestartExponentialDelay, InitialDelay: 10, MaxDelay: 100, Multiplier: 2, ResetTicks: 1000}
	expN := exp
	expN.Attempts = 2
	for _, tc := range []struct {
		name     string
		cfg      RestartConfig
		steps    []restartStep
		restarts int
	}{
		{"none gives up at once", RestartConfig{Kind: RestartNone}, []restartStep{
			rsRun(0), rsGiveUp(5, "the job has no restart strategy"), rsGiveUp(6, "the job has no restart strategy"),
		}, 0},
		{"fixed-delay: three restarts then the limit", fixed, []restartStep{
			rsRun(0), rsFail(5, 10), rsRun(20), rsFail(1e6, 10), rsFail(1e6+1, 10),
			rsGiveUp(1e6+50, "3 restarts, the limit of fixed-delay"),
			rsGiveUp(1e7, "3 restarts, the limit of fixed-delay"), // stays given up
		}, 3},
		{"fixed-delay: zero attempts", RestartConfig{Kind: RestartFixedDelay}, []restartStep{
			rsGiveUp(1, "0 restarts, the limit of fixed-delay"),
		}, 0},
		{"fixed-delay: one attempt is singular", RestartConfig{Kind: RestartFixedDelay, Attempts: 1, Delay: 0}, []restartStep{
			rsFail(1, 0), rsGiveUp(2, "1 restart, the limit of fixed-delay"),
		}, 1},
		{"failure-rate: the fourth failure within the interval", rate, []restartStep{
			rsFail(0, 10), rsFail(100, 10), rsFail(200, 10),
			rsGiveUp(600, "4 failures within 600 ticks, more than failure-rate's 3"), // 0 is still within: 600-0 <= 600
		}, 3},
		{"failure-rate: old failures leave the window", rate, []restartStep{
			rsFail(0, 10), rsFail(100, 10), rsFail(200, 10), rsFail(601, 10), rsFail(701, 10), rsFail(801, 10),
			rsFail(1402, 10), rsFail(1402, 10), rsFail(1403, 10),
			rsGiveUp(1404, "4 failures within 600 ticks, more than failure-rate's 3"),
		}, 9},
		{"failure-rate: one failure per interval", RestartConfig{Kind: RestartFailureRate, MaxFailures: 1, FailureIntervalTicks: 10, Delay: 1}, []restartStep{
			rsFail(0, 1), rsFail(11, 1), rsFail(22, 1), rsGiveUp(32, "2 failures within 10 ticks, more than failure-rate's 1"),
		}, 3},
		{"exponential-delay: grows to the max", exp, []restartStep{
			rsRun(0), rsFail(10, 10), rsFail(20, 20), rsFail(40, 40), rsFail(80, 80), rsFail(160, 100), rsFail(260, 100),
		}, 6},
		{"exponential-delay: a stable run resets", exp, []restartStep{
			rsRun(0), rsFail(10, 10), rsRun(20), rsFail(30, 20), rsRun(50), rsFail(1049, 40), // 999 ticks: not stable
			rsRun(1100), rsFail(2100, 10), // 1000 ticks: stable
			rsFail(2110, 20),
		}, 5},
		{"exponential-delay: failing before running does not reset", exp, []restartStep{
			rsRun(0), rsFail(10, 10), rsFail(5000, 20), rsFail(9000, 40),
		}, 3},
		{"exponential-delay: Running twice keeps the first tick", exp, []restartStep{
			rsRun(0), rsFail(10, 10), rsRun(20), rsRun(500), rsFail(1020, 10),
		}, 2},
		{"exponential-delay: attempts bound restarts since the reset", expN, []restartStep{
			rsRun(0), rsFail(10, 10), rsFail(20, 20),
			rsGiveUp(30, "2 restarts without a stable run of 1000 ticks, the limit of exponential-delay"),
		}, 2},
		{"exponential-delay: a reset renews the attempts", expN, []restartStep{
			rsRun(0), rsFail(10, 10), rsFail(20, 20), rsRun(40), rsFail(1040, 10), rsFail(1050, 20),
			rsGiveUp(1060, "2 restarts without a stable run of 1000 ticks, the limit of exponential-delay"),
		}, 4},
		{"exponential-delay: zero initial delay stays zero", RestartConfig{Kind: RestartExponentialDelay, Multiplier: 2, ResetTicks: 1}, []restartStep{
			rsFail(1, 0), rsFail(2, 0), rsFail(3, 0),
		}, 3},
		{"a decreasing tick counts as the latest one", rate, []restartStep{
			rsFail(1000, 10), rsFail(10, 10), rsFail(20, 10), rsGiveUp(30, "4 failures within 600 ticks, more than failure-rate's 3"),
		}, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := NewRestartTracker(tc.cfg, 7)
			if err != nil {
				t.Fatal(err)
			}
			for i, s := range tc.steps {
				if !s.failed {
					r.Running(s.run)
					continue
				}
				delay, ok, why := r.Failed(s.fail)
				if delay != s.delay || ok != s.ok || why != s.why {
					t.Fatalf("step %d: Failed(%d) = %d, %v, %q; want %d, %v, %q", i, s.fail, delay, ok, why, s.delay, s.ok, s.why)
				}
			}
			if got := r.Restarts(); got != tc.restarts {
				t.Errorf("Restarts() = %d, want %d", got, tc.restarts)
			}
		})
	}
}

// TestRestartFailureRateProperty checks failure-rate against a brute-force
// count of the failures within the interval before each failure.
func TestRestartFailureRateProperty(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 4))
	for iter := 0; iter < 2000; iter++ {
		cfg := RestartConfig{Kind: RestartFailureRate, MaxFailures: 1 + rng.IntN(5),
			FailureIntervalTicks: 1 + rng.Int64N(50), Delay: rng.Int64N(5)}
		r, err := NewRestartTracker(cfg, 0)
		if err != nil {
			t.Fatal(err)
		}
		var times []int64
		now := int64(0)
		given := false
		for k := 0; k < 30; k++ {
			now += rng.Int64N(3*cfg.FailureIntervalTicks/int64(cfg.MaxFailures)/2 + 1)
			if rng.IntN(4) == 0 {
				r.Running(now) // has no effect on failure-rate
			}
			times = append(times, now)
			within := 0
			for _, t0 := range times {
				if now-t0 <= cfg.FailureIntervalTicks {
					within++
				}
			}
			if within > cfg.MaxFailures {
				given = true
			}
			delay, ok, why := r.Failed(now)
			if ok == given {
				t.Fatalf("%v, failures at %v: Failed = %d, %v, %q; want ok=%v (%d within the interval)", cfg, times, delay, ok, why, !given, within)
			}
			if ok && delay != cfg.Delay {
				t.Fatalf("%v: delay %d, want %d", cfg, delay, cfg.Delay)
			}
			if !ok && !strings.Contains(why, "more than failure-rate's") {
				t.Fatalf("%v: why %q", cfg, why)
			}
		}
	}
}

// TestRestartExponentialDelayProperty runs random configurations through
// random runs and failures and checks the delays against a naive reference:
// the base delay is min(InitialDelay*Multiplier^k, MaxDelay) for the k-th
// restart since the last reset (a failure at least ResetTicks after the
// attempt's Running), the delay is within +-Jitter of it and never above
// MaxDelay*(1+Jitter), without jitter the delays grow monotonically between
// resets, and the same seed gives the same delays.
func TestRestartExponentialDelayProperty(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 9))
	for iter := 0; iter < 1000; iter++ {
		cfg := RestartConfig{Kind: RestartExponentialDelay, InitialDelay: rng.Int64N(50),
			Multiplier: 1 + 2*rng.Float64(), ResetTicks: 1 + rng.Int64N(500), Attempts: rng.IntN(4)}
		cfg.MaxDelay = cfg.InitialDelay + rng.Int64N(1000)
		if rng.IntN(2) == 0 {
			cfg.Jitter = rng.Float64()
		}
		seed := rng.Uint64()
		r, err := NewRestartTracker(cfg, seed)
		if err != nil {
			t.Fatal(err)
		}
		twin, _ := NewRestartTracker(cfg, seed)
		k, prev, now := 0, int64(-1), int64(0)
		running, since := false, int64(0)
		for step := 0; step < 40; step++ {
			now += rng.Int64N(2 * cfg.ResetTicks)
			if rng.IntN(2) == 0 {
				r.Running(now)
				twin.Running(now)
				if !running {
					running, since = true, now
				}
				now += rng.Int64N(2 * cfg.ResetTicks)
			}
			if running && now-since >= cfg.ResetTicks {
				k, prev = 0, -1
			}
			running = false
			delay, ok, why := r.Failed(now)
			if d2, ok2, why2 := twin.Failed(now); d2 != delay || ok2 != ok || why2 != why {
				t.Fatalf("%v seed %d: not deterministic: %d %v %q vs %d %v %q", cfg, seed, delay, ok, why, d2, ok2, why2)
			}
			if cfg.Attempts > 0 && k >= cfg.Attempts {
				if ok {
					t.Fatalf("%v: restart %d since the reset granted beyond attempts", cfg, k+1)
				}
				break
			}
			if !ok {
				t.Fatalf("%v: gave up after %d restarts since the reset: %s", cfg, k, why)
			}
			base := math.Min(float64(cfg.InitialDelay)*math.Pow(cfg.Multiplier, float64(k)), float64(cfg.MaxDelay))
			lo, hi := base*(1-cfg.Jitter)-1, base*(1+cfg.Jitter)+1e-6
			if float64(delay) < lo || float64(delay) > hi {
				t.Fatalf("%v: restart %d since the reset: delay %d outside [%g, %g]", cfg, k+1, delay, lo, hi)
			}
			if float64(delay) > float64(cfg.MaxDelay)*(1+cfg.Jitter) {
				t.Fatalf("%v: delay %d above MaxDelay*(1+Jitter)", cfg, delay)
			}
			if cfg.Jitter == 0 {
				if delay < prev {
					t.Fatalf("%v: delay %d after %d without a reset", cfg, delay, prev)
				}
				if k == 0 && delay != cfg.InitialDelay {
					t.Fatalf("%v: first delay after a reset %d, want %d", cfg, delay, cfg.InitialDelay)
				}
			}
			k, prev = k+1, delay
		}
	}
}

// TestRestartJitterSeeds checks that the seed drives the jitter: different
// seeds give different delays, and every delay is within the jitter.
func TestRestartJitterSeeds(t *testing.T) {
	cfg := RestartConfig{Kind: RestartExponentialDelay, InitialDelay: 1000, MaxDelay: 1000, Multiplier: 1, Jitter: 0.5, ResetTicks: 10}
	seen := map[int64]bool{}
	for seed := uint64(0); seed < 20; seed++ {
		r, _ := NewRestartTracker(cfg, seed)
		d, ok, _ := r.Failed(0)
		if !ok || d < 500 || d > 1500 {
			t.Fatalf("seed %d: delay %d ok %v, want 500..1500", seed, d, ok)
		}
		seen[d] = true
	}
	if len(seen) < 10 {
		t.Errorf("20 seeds gave only %d different delays", len(seen))
	}
}
