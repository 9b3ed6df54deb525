package jobfile

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/streamd/streamd/control"
)

const restartOps = `operators:
  - uid: gen
    source: {type: generator, count: 5}
  - uid: out
    sink: {type: discard}
    inputs: [gen]
`

func TestRestartSettings(t *testing.T) {
	const ck = "checkpoint: {interval: 1s}\n"
	exp := DefaultRestart(RestartExponentialDelay)
	for _, tt := range []struct {
		name, sections string
		want           RestartSettings
	}{
		{"no checkpoint: none", "", RestartSettings{Strategy: RestartNone}},
		{"checkpoint: exponential-delay", ck, RestartSettings{Strategy: RestartExponentialDelay, InitialDelay: time.Second,
			MaxDelay: time.Minute, Multiplier: 1.5, Jitter: 0.1, ResetAfter: time.Hour}},
		{"checkpoint and none", ck + "restart: {strategy: none}\n", RestartSettings{Strategy: RestartNone}},
		{"fixed-delay defaults", "restart: {strategy: fixed-delay}\n", RestartSettings{Strategy: RestartFixedDelay, Attempts: 3, Delay: time.Second}},
		{"fixed-delay", ck + "restart: {strategy: fixed-delay, attempts: 5, delay: 0}\n", RestartSettings{Strategy: RestartFixedDelay, Attempts: 5}},
		{"failure-rate defaults", "restart: {strategy: failure-rate}\n", RestartSettings{Strategy: RestartFailureRate,
			MaxFailures: 1, FailureInterval: time.Minute, Delay: time.Second}},
		{"failure-rate", `restart:
  strategy: failure-rate
  max_failures: 3
  failure_interval: 5m
  delay: 10s
`, RestartSettings{Strategy: RestartFailureRate, MaxFailures: 3, FailureInterval: 5 * time.Minute, Delay: 10 * time.Second}},
		{"exponential-delay defaults", "restart: {strategy: exponential-delay}\n", exp},
		{"exponential-delay", `restart:
  strategy: exponential-delay
  initial_delay: 500ms
  max_delay: 5m
  multiplier: 2
  jitter: 0
  reset_after: 30m
  attempts: 10
`, RestartSettings{Strategy: RestartExponentialDelay, InitialDelay: 500 * time.Millisecond, MaxDelay: 5 * time.Minute,
			Multiplier: 2, ResetAfter: 30 * time.Minute, Attempts: 10}},
		{"the default strategy's fields without strategy", ck + "restart: {attempts: 4, multiplier: 3}\n", func() RestartSettings {
			r := exp
			r.Attempts, r.Multiplier = 4, 3
			return r
		}()},
	} {
		t.Run(tt.name, func(t *testing.T) {
			job, err := ParseJob([]byte("name: j\n"+tt.sections+restartOps), t.TempDir(), Options{})
			if err != nil {
				t.Fatal(err)
			}
			if job.Restart != tt.want {
				t.Errorf("restart %+v\nwant    %+v", job.Restart, tt.want)
			}
			// Whatever the parser accepts, control accepts.
			for _, tick := range []time.Duration{time.Nanosecond, 100 * time.Millisecond, time.Hour} {
				if err := job.Restart.Control(tick).Validate(); err != nil {
					t.Errorf("Control(%v): %v", tick, err)
				}
			}
		})
	}
}

func TestRestartInvalid(t *testing.T) {
	for _, tt := range []struct {
		name, sections string
		errs           []string
	}{
		{"unknown strategy", "restart: {strategy: forever, multiplier: 2}\n", []string{
			`line 2: restart.strategy: unknown strategy "forever" (want none, fixed-delay, failure-rate or exponential-delay)`}},
		{"unknown field", "restart: {strategy: fixed-delay, retries: 2}\n", []string{`line 2: restart.retries: unknown field`}},
		{"not a mapping", "restart: fixed-delay\n", []string{`line 2: restart: want a mapping like {strategy: fixed-delay, attempts: 3, delay: 1s}`}},
		{"another strategy's fields", `restart:
  strategy: fixed-delay
  max_failures: 2
  jitter: 0.5
`, []string{
			`line 4: restart.max_failures: only for strategy failure-rate`,
			`line 5: restart.jitter: only for strategy exponential-delay`,
		}},
		{"none takes no fields", "restart: {strategy: none, attempts: 3, delay: 1s}\n", []string{
			`line 2: restart.attempts: only for strategy fixed-delay or exponential-delay`,
			`line 2: restart.delay: only for strategy fixed-delay or failure-rate`,
		}},
		{"the default without checkpoint", "restart: {delay: 1s}\n", []string{
			`line 2: restart.delay: only for strategy fixed-delay or failure-rate (the strategy is none, the default without a checkpoint section)`}},
		{"the default with checkpoint", "checkpoint: {interval: 1s}\nrestart:\n  delay: 1s\n", []string{
			`line 4: restart.delay: only for strategy fixed-delay or failure-rate (the strategy is exponential-delay, the default with a checkpoint section)`}},
		{"fixed-delay values", "restart: {strategy: fixed-delay, attempts: -1, delay: -1s}\n", []string{
			`line 2: restart.attempts: must be at least 0, got -1`,
			`line 2: restart.delay: must not be negative, got -1s`,
		}},
		{"failure-rate values", "restart: {strategy: failure-rate, max_failures: 0, failure_interval: 0, delay: soon}\n", []string{
			`line 2: restart.max_failures: must be at least 1, got 0`,
			`line 2: restart.failure_interval: must be positive, got 0s`,
			`line 2: restart.delay: want a duration like 500ms, 5s or 1m, got "soon"`,
		}},
		{"exponential-delay values", `restart:
  strategy: exponential-delay
  initial_delay: -1s
  multiplier: 0.5
  jitter: 1.5
  reset_after: 0
  attempts: -3
`, []string{
			`line 4: restart.initial_delay: must not be negative, got -1s`,
			`line 5: restart.multiplier: must be at least 1, got 0.5`,
			`line 6: restart.jitter: must be between 0 and 1 (a fraction of the delay), got 1.5`,
			`line 7: restart.reset_after: must be positive, got 0s`,
			`line 8: restart.attempts: must be at least 0 (0: unlimited), got -3`,
		}},
		{"exponential-delay types", "restart: {strategy: exponential-delay, multiplier: fast, jitter: [1], attempts: 1.5, max_delay: 5}\n", []string{
			`line 2: restart.multiplier: want a number, got "fast"`,
			`line 2: restart.jitter: want a number, got a list`,
			`line 2: restart.attempts: want an integer, got "1.5"`,
			`line 2: restart.max_delay: want a duration like 500ms, 5s or 1m, got "5"`,
		}},
		{"infinite multiplier", "restart: {strategy: exponential-delay, multiplier: .inf}\n", []string{
			`line 2: restart.multiplier: must be at least 1, got .inf`}},
		{"max below initial", "restart: {strategy: exponential-delay, initial_delay: 2m}\n", []string{
			`line 2: restart.initial_delay: max_delay 1m0s is below initial_delay 2m0s`}},
		{"max below initial, both given", "restart:\n  strategy: exponential-delay\n  initial_delay: 2s\n  max_delay: 1s\n", []string{
			`line 5: restart.max_delay: max_delay 1s is below initial_delay 2s`}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseJob([]byte("name: j\n"+tt.sections+restartOps), t.TempDir(), Options{})
			if err == nil {
				t.Fatalf("no error, want %q", tt.errs)
			}
			for _, e := range tt.errs {
				if !strings.Contains(err.Error(), e) {
					t.Errorf("error %q\nlacks %q", err, e)
				}
			}
			if n, want := strings.Count(err.Error(), "\n")+1, len(tt.errs); n != want {
				t.Errorf("%d problems, want %d:\n%s", n, want, err)
			}
		})
	}
}

func TestRestartControl(t *testing.T) {
	const tick = 100 * time.Millisecond
	for _, tt := range []struct {
		in   RestartSettings
		want control.RestartConfig
	}{
		{RestartSettings{}, control.RestartConfig{Kind: control.RestartNone}},
		{RestartSettings{Strategy: RestartNone}, control.RestartConfig{Kind: control.RestartNone}},
		{DefaultRestart(RestartFixedDelay), control.RestartConfig{Kind: control.RestartFixedDelay, Attempts: 3, Delay: 10}},
		{RestartSettings{Strategy: RestartFixedDelay, Attempts: 1, Delay: 101 * time.Millisecond},
			control.RestartConfig{Kind: control.RestartFixedDelay, Attempts: 1, Delay: 2}}, // rounded up
		{RestartSettings{Strategy: RestartFixedDelay, Attempts: 1, Delay: time.Nanosecond},
			control.RestartConfig{Kind: control.RestartFixedDelay, Attempts: 1, Delay: 1}},
		{DefaultRestart(RestartFailureRate), control.RestartConfig{Kind: control.RestartFailureRate, MaxFailures: 1, FailureIntervalTicks: 600, Delay: 10}},
		{DefaultRestart(RestartExponentialDelay), control.RestartConfig{Kind: control.RestartExponentialDelay,
			InitialDelay: 10, MaxDelay: 600, Multiplier: 1.5, Jitter: 0.1, ResetTicks: 36000}},
		{RestartSettings{Strategy: RestartExponentialDelay, InitialDelay: 150 * time.Millisecond, MaxDelay: math.MaxInt64,
			Multiplier: 2, ResetAfter: time.Second, Attempts: 4},
			control.RestartConfig{Kind: control.RestartExponentialDelay, InitialDelay: 2, MaxDelay: math.MaxInt64/int64(tick) + 1,
				Multiplier: 2, ResetTicks: 10, Attempts: 4}},
	} {
		if got := tt.in.Control(tick); got != tt.want {
			t.Errorf("%+v.Control(%v) = %+v, want %+v", tt.in, tick, got, tt.want)
		}
	}
	if got := DefaultRestart(RestartExponentialDelay).Control(tick).String(); got != "exponential-delay initial=10 max=600 multiplier=1.5 jitter=0.1 reset=36000" {
		t.Errorf("the default in ticks: %s", got)
	}
}

func TestRestartSettingsString(t *testing.T) {
	for _, tt := range []struct {
		in   RestartSettings
		want string
	}{
		{RestartSettings{}, "none"},
		{DefaultRestart(RestartNone), "none"},
		{DefaultRestart(RestartFixedDelay), "fixed-delay, 3 attempts, delay 1s"},
		{RestartSettings{Strategy: RestartFixedDelay, Attempts: 1}, "fixed-delay, 1 attempt, delay 0s"},
		{DefaultRestart(RestartFailureRate), "failure-rate, fails after more than 1 failure within 1m0s, delay 1s"},
		{DefaultRestart(RestartExponentialDelay), "exponential-delay, initial delay 1s, max delay 1m0s, multiplier 1.5, jitter 0.1, reset after 1h0m0s, unlimited attempts"},
		{RestartSettings{Strategy: RestartExponentialDelay, InitialDelay: time.Second, MaxDelay: time.Second, Multiplier: 1, ResetAfter: time.Minute, Attempts: 2},
			"exponential-delay, initial delay 1s, max delay 1s, multiplier 1, jitter 0, reset after 1m0s, 2 attempts between resets"},
	} {
		if got := tt.in.String(); got != tt.want {
			t.Errorf("%+v: %q, want %q", tt.in, got, tt.want)
		}
	}
}
