package main

import (
	"time"

	"github.com/streamd/streamd/internal/jobfile"
)

// Configuration keys of the default restart strategy: the strategy of job
// files without a restart section (docs/configuration.md).
const (
	keyRestartStrategy        = "restart.strategy"
	keyRestartAttempts        = "restart.attempts"
	keyRestartDelay           = "restart.delay"
	keyRestartMaxFailures     = "restart.max_failures"
	keyRestartFailureInterval = "restart.failure_interval"
	keyRestartInitialDelay    = "restart.initial_delay"
	keyRestartMaxDelay        = "restart.max_delay"
	keyRestartMultiplier      = "restart.multiplier"
	keyRestartJitter          = "restart.jitter"
	keyRestartResetAfter      = "restart.reset_after"
)

var restartKeys = []string{keyRestartStrategy, keyRestartAttempts, keyRestartDelay, keyRestartMaxFailures, keyRestartFailureInterval,
	keyRestartInitialDelay, keyRestartMaxDelay, keyRestartMultiplier, keyRestartJitter, keyRestartResetAfter}

func init() { knownKeys = append(knownKeys, restartKeys...) }

// restartDefault is the configured restart strategy of job files without a
// restart section, nil when the configuration sets none (the job file's
// built-in defaults apply). The fields the configuration does not set
// keep the strategy's defaults.
func (c *cli) restartDefault() (*jobfile.RestartSettings, error) {
	if !c.v.IsSet(keyRestartStrategy) {
		for _, k := range restartKeys[1:] {
			if c.v.IsSet(k) {
				return nil, usagef("%s needs %s (one of none, fixed-delay, failure-rate, exponential-delay)", k, keyRestartStrategy)
			}
		}
		return nil, nil
	}
	strategy := c.v.GetString(keyRestartStrategy)
	known := false
	for _, s := range jobfile.RestartStrategies {
		known = known || s == strategy
	}
	if !known {
		return nil, usagef("%s: unknown strategy %q (want none, fixed-delay, failure-rate or exponential-delay)", keyRestartStrategy, strategy)
	}
	r := jobfile.DefaultRestart(strategy)
	durations := map[string]*time.Duration{keyRestartDelay: &r.Delay, keyRestartFailureInterval: &r.FailureInterval,
		keyRestartInitialDelay: &r.InitialDelay, keyRestartMaxDelay: &r.MaxDelay, keyRestartResetAfter: &r.ResetAfter}
	for k, dst := range durations {
		if c.v.IsSet(k) {
			d, err := c.duration(k)
			if err != nil {
				return nil, err
			}
			*dst = d
		}
	}
	ints := map[string]*int{keyRestartAttempts: &r.Attempts, keyRestartMaxFailures: &r.MaxFailures}
	for k, dst := range ints {
		if c.v.IsSet(k) {
			*dst = c.v.GetInt(k)
		}
	}
	floats := map[string]*float64{keyRestartMultiplier: &r.Multiplier, keyRestartJitter: &r.Jitter}
	for k, dst := range floats {
		if c.v.IsSet(k) {
			*dst = c.v.GetFloat64(k)
		}
	}
	if err := r.Control(time.Millisecond).Validate(); err != nil {
		return nil, usagef("restart.* configuration: %v", err)
	}
	return &r, nil
}
