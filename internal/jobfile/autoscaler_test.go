package jobfile

import (
	"strings"
	"testing"
	"time"
)

// autoscalerOps is a job's operators gen and out (restart_test.go's).
const autoscalerOps = restartOps

func TestAutoscalerSection(t *testing.T) {
	const ck = "checkpoint: {interval: 1s}\n"
	job, err := ParseJob([]byte("name: j\n"+autoscalerOps), t.TempDir(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if job.Autoscaler != nil {
		t.Fatalf("no section: %+v, want nil (off)", job.Autoscaler)
	}
	job, err = ParseJob([]byte("name: j\n"+ck+`autoscaler:
  enabled: true
  max_parallelism: 8
  operators: {out: {max_parallelism: 1}}
  target_utilization: 0.6
  utilization_boundary: 0.2
  metrics_window: 10s
  stabilization: 5s
  cooldown: 20s
  catch_up: 1m
  max_scale_down: 0.25
`+autoscalerOps), t.TempDir(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	a := job.Autoscaler
	want := AutoscalerSettings{Enabled: true, MaxParallelism: 8, Operators: map[string]int{"out": 1}, TargetUtilization: 0.6, UtilizationBoundary: 0.2,
		MetricsWindow: 10 * time.Second, Stabilization: 5 * time.Second, Cooldown: 20 * time.Second, CatchUp: time.Minute, MaxScaleDown: 0.25}
	if a == nil || a.String() != want.String() || a.Operators["out"] != 1 {
		t.Fatalf("got %+v, want %+v", a, want)
	}
	if got := a.MaxOf("out", 128); got != 1 {
		t.Errorf("MaxOf(out) %d, want 1", got)
	}
	if got := a.MaxOf("gen", 128); got != 8 {
		t.Errorf("MaxOf(gen) %d, want 8", got)
	}
	job, err = ParseJob([]byte("name: j\nautoscaler: {max_parallelism: 2}\n"+autoscalerOps), t.TempDir(), Options{})
	if err != nil || job.Autoscaler == nil || job.Autoscaler.Enabled || job.Autoscaler.Cooldown != DefaultAutoscaler().Cooldown {
		t.Fatalf("a section without enabled: %+v (%v), want off with the defaults", job.Autoscaler, err)
	}
}

func TestAutoscalerSectionErrors(t *testing.T) {
	const ck = "checkpoint: {interval: 1s}\n"
	for _, tt := range []struct{ section, want string }{
		{"autoscaler: {enabled: true}\n", `line 2: autoscaler.enabled: autoscaling needs a checkpoint section`},
		{ck + "autoscaler: {enabeld: true}\n", `line 3: autoscaler.enabeld: unknown field (did you mean "enabled"?)`},
		{ck + "autoscaler: true\n", `line 3: autoscaler: want a mapping`},
		{ck + "autoscaler: {target_utilization: 1.5}\n", `autoscaler.target_utilization: must be 0 < x <= 1, got 1.5`},
		{ck + "autoscaler: {max_scale_down: 1}\n", `autoscaler.max_scale_down: must be 0 < x < 1, got 1`},
		{ck + "autoscaler: {utilization_boundary: 0.7}\n", `leaves no utilization low enough to scale down`},
		{ck + "autoscaler: {cooldown: -1s}\n", `autoscaler.cooldown: must not be negative, got -1s`},
		{ck + "autoscaler: {metrics_window: 0}\n", `autoscaler.metrics_window: must be at least 1ms, got 0s`},
		{ck + "autoscaler: {catch_up: soon}\n", `autoscaler.catch_up: want a duration`},
		{ck + "autoscaler: {max_parallelism: 0}\n", `autoscaler.max_parallelism: must be at least 1, got 0`},
		{ck + "autoscaler: {operators: {ot: {max_parallelism: 1}}}\n", `autoscaler.operators.ot: no operator "ot" (did you mean "out"?)`},
		{ck + "autoscaler: {operators: {out: {max_parallelism: 0}}}\n", `autoscaler.operators.out.max_parallelism: must be between its min_parallelism 1 and its max_parallelism 128, got 0`},
		{ck + "autoscaler: {operators: {out: {max: 1}}}\n", `autoscaler.operators.out.max: unknown field`},
	} {
		_, err := ParseJob([]byte("name: j\n"+tt.section+autoscalerOps), t.TempDir(), Options{Filename: "j.yaml"})
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%q: error %v, want it to say %q", tt.section, err, tt.want)
		}
	}
}
