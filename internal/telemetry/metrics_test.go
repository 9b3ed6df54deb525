package telemetry_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/streamd/streamd/internal/telemetry"
)

func TestPrometheusEndpoint(t *testing.T) {
	ctx := context.Background()
	tel, err := telemetry.New(ctx, telemetry.Config{PrometheusAddr: "127.0.0.1:0", ServiceName: "streamd-host-a"})
	if err != nil {
		t.Fatal(err)
	}
	defer tel.Shutdown(ctx)
	m := tel.Metrics()
	op := m.Operator(telemetry.SubtaskLabels{JobID: "wc-1", Job: "wc", Attempt: 2, Host: "h1", Operator: "count", Subtask: 1})
	op.Batch(ctx, 1000, 990, 2*time.Millisecond)
	op.Batch(ctx, 500, 0, time.Millisecond)
	op.RecordsOut(ctx, 10)
	op.BackPressure(ctx, 1500*time.Millisecond)
	op.Alignment(ctx, 20*time.Millisecond)
	op.FinalCheckpointWait(ctx, 300*time.Millisecond)
	op.Watermark(ctx, time.Now().Add(-3*time.Second).UnixMilli())
	op.OutputWatermark(ctx, 12345, false)
	op.SourceLag(func() (int64, bool) { return 42, true })
	op.Busy(ctx, 700*time.Millisecond)
	op.Idle(ctx, 300*time.Millisecond)
	m.Checkpoint(ctx, "wc-1", "wc", 7, 250*time.Millisecond, 4096)
	m.CheckpointFailed(ctx, "wc-1", "wc", "timeout")
	m.CheckpointDeclined(ctx, "wc-1", "wc")
	m.Restart(ctx, "wc-1", "wc")

	resp, err := http.Get("http://" + tel.MetricsAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	text := string(body)
	sel := `streamd_attempt="2",streamd_host="h1",streamd_job="wc",streamd_job_id="wc-1",streamd_job_name="wc",streamd_operator="count",streamd_subtask="1"`
	job := `streamd_job="wc",streamd_job_id="wc-1",streamd_job_name="wc"`
	for _, want := range []string{
		`streamd_records_in_total{` + sel + `} 1500`,
		`streamd_records_out_total{` + sel + `} 1000`,
		`streamd_batch_latency_seconds_count{` + sel + `} 2`,
		`streamd_backpressure_time_seconds_total{` + sel + `} 1.5`,
		`streamd_checkpoint_alignment_time_seconds_count{` + sel + `} 1`,
		`streamd_final_checkpoint_wait_seconds_sum{` + sel + `} 0.3`,
		`streamd_checkpoint_duration_seconds_sum{` + job + `} 0.25`,
		`streamd_checkpoint_size_bytes_sum{` + job + `} 4096`,
		`streamd_restarts_total{` + job + `} 1`,
		`streamd_checkpoint_last_id{` + job + `} 7`,
		`streamd_checkpoint_last_duration_seconds{` + job + `} 0.25`,
		`streamd_checkpoint_last_size_bytes{` + job + `} 4096`,
		`streamd_checkpoint_last_time_seconds{` + job + `} 1.`,
		`streamd_checkpoints_failed_total{` + job + `,streamd_reason="timeout"} 1`,
		`streamd_checkpoints_declined_total{` + job + `} 1`,
		`streamd_watermark_milliseconds{` + sel + `} 1`,
		`streamd_watermark_lag_seconds{` + sel + `} 3`,
		`streamd_watermark_output_milliseconds{` + sel + `} 12345`,
		`streamd_source_lag{` + sel + `} 42`,
		`streamd_task_busy_time_seconds_total{` + sel + `} 0.7`,
		`streamd_task_idle_time_seconds_total{` + sel + `} 0.3`,
		`target_info{`, `service_name="streamd-host-a"`,
		`go_goroutines `,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if t.Failed() {
		t.Logf("/metrics:\n%s", grepStreamd(text))
	}
	if err := tel.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := http.Get("http://" + tel.MetricsAddr() + "/metrics"); err == nil {
		t.Error("endpoint still serving after Shutdown")
	}
}

func grepStreamd(s string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, "streamd") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

func TestMetricsOff(t *testing.T) {
	tel, err := telemetry.New(context.Background(), telemetry.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if tel.Metrics() != nil || tel.MetricsAddr() != "" {
		t.Fatal("metrics on without metrics.listen")
	}
	op := tel.Metrics().Operator(telemetry.SubtaskLabels{Job: "j", Operator: "o"}) // nil handle
	ctx := context.Background()
	allocs := testing.AllocsPerRun(100, func() {
		op.Batch(ctx, 10, 10, time.Millisecond)
		op.BackPressure(ctx, time.Millisecond)
		tel.Metrics().Checkpoint(ctx, "", "j", 1, time.Second, 1)
	})
	if allocs != 0 {
		t.Errorf("metrics off: %v allocations", allocs)
	}
}

// With metrics on, recording a batch does not allocate (the attributes of an
// operator subtask are computed once).
func TestBatchDoesNotAllocate(t *testing.T) {
	tel, err := telemetry.New(context.Background(), telemetry.Config{PrometheusAddr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer tel.Shutdown(context.Background())
	op := tel.Metrics().Operator(telemetry.SubtaskLabels{Job: "j", Operator: "o"})
	ctx := context.Background()
	op.Batch(ctx, 1, 1, time.Millisecond)
	op.Busy(ctx, time.Millisecond)
	op.Idle(ctx, time.Millisecond)
	if allocs := testing.AllocsPerRun(100, func() {
		op.Batch(ctx, 10, 10, time.Millisecond)
		op.Busy(ctx, time.Millisecond)
		op.Idle(ctx, time.Millisecond)
	}); allocs != 0 {
		t.Errorf("Batch: %v allocations", allocs)
	}
}

// TestEndedSeriesRemoved: a closed subtask's and an ended job's series are
// scraped once more with their final values, then are gone; the series of
// a subtask and a job that still run stay.
func TestEndedSeriesRemoved(t *testing.T) {
	ctx := context.Background()
	tel, err := telemetry.New(ctx, telemetry.Config{PrometheusAddr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer tel.Shutdown(ctx)
	m := tel.Metrics()
	ended := m.Operator(telemetry.SubtaskLabels{JobID: "a-1", Job: "a", Operator: "src"})
	running := m.Operator(telemetry.SubtaskLabels{JobID: "b-1", Job: "b", Operator: "src"})
	ended.Batch(ctx, 5, 5, time.Millisecond)
	running.Batch(ctx, 7, 7, time.Millisecond)
	m.Checkpoint(ctx, "a-1", "a", 3, time.Millisecond, 10)
	m.Checkpoint(ctx, "b-1", "b", 4, time.Millisecond, 10)
	scrape := func() string {
		_, text := get(t, "http://"+tel.MetricsAddr()+"/metrics")
		return text
	}
	ended.Batch(ctx, 1, 1, time.Millisecond) // after the last scrape: the final value is scraped once
	ended.Close()
	m.EndJob("a-1", "a")
	first, second := scrape(), scrape()
	for _, want := range []string{`streamd_records_in_total{streamd_attempt="0",streamd_job="a",streamd_job_id="a-1",streamd_job_name="a",streamd_operator="src",streamd_subtask="0"} 6`,
		`streamd_checkpoint_last_id{streamd_job="a",streamd_job_id="a-1",streamd_job_name="a"} 3`} {
		if !strings.Contains(first, want) {
			t.Errorf("first scrape after the end lacks the final %q", want)
		}
	}
	if strings.Contains(second, `streamd_job_id="a-1"`) {
		t.Errorf("second scrape after the end still has job a-1's series:\n%s", grepStreamd(second))
	}
	for _, want := range []string{`streamd_records_in_total{streamd_attempt="0",streamd_job="b",streamd_job_id="b-1",streamd_job_name="b",streamd_operator="src",streamd_subtask="0"} 7`,
		`streamd_checkpoint_last_id{streamd_job="b",streamd_job_id="b-1",streamd_job_name="b"} 4`} {
		if !strings.Contains(second, want) {
			t.Errorf("running job's series went: no %q in\n%s", want, grepStreamd(second))
		}
	}
	if n := m.Subtasks(); n != 1 {
		t.Errorf("%d subtasks exported, want 1", n)
	}
}

// TestCountersFromZeroAndJobTotals: the counters a user alerts on exist
// before their first increment (failed checkpoints by every reason, dead
// letters of an operator with on_error), and an operator's records are
// also counted over all subtasks and attempts: the per-attempt series start
// at 0 after a restart, the job-level total goes on.
func TestCountersFromZeroAndJobTotals(t *testing.T) {
	ctx := context.Background()
	tel, err := telemetry.New(ctx, telemetry.Config{PrometheusAddr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer tel.Shutdown(ctx)
	m := tel.Metrics()
	scrape := func() string {
		_, text := get(t, "http://"+tel.MetricsAddr()+"/metrics")
		return text
	}
	job := `streamd_job="j",streamd_job_id="j-1",streamd_job_name="j"`
	a0s0 := m.Operator(telemetry.SubtaskLabels{JobID: "j-1", Job: "j", Attempt: 0, Operator: "parse", Subtask: 0})
	a0s1 := m.Operator(telemetry.SubtaskLabels{JobID: "j-1", Job: "j", Attempt: 0, Operator: "parse", Subtask: 1})
	a0s0.OnError("dead_letter")
	m.Restart(ctx, "j-1", "j")
	a0s0.Batch(ctx, 10, 9, time.Millisecond)
	a0s1.Batch(ctx, 5, 5, time.Millisecond)
	text := scrape()
	for _, want := range []string{
		`streamd_checkpoints_failed_total{` + job + `,streamd_reason="timeout"} 0`,
		`streamd_checkpoints_failed_total{` + job + `,streamd_reason="declined"} 0`,
		`streamd_dead_letters_total{streamd_attempt="0",` + job + `,streamd_on_error="dead_letter",streamd_operator="parse",streamd_subtask="0"} 0`,
		`streamd_operator_records_in_total{` + job + `,streamd_operator="parse"} 15`,
		`streamd_operator_records_out_total{` + job + `,streamd_operator="parse"} 14`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if strings.Contains(text, `streamd_dead_letters_total{streamd_attempt="0",`+job+`,streamd_on_error="dead_letter",streamd_operator="parse",streamd_subtask="1"}`) {
		t.Errorf("a subtask without on_error exports dead letters")
	}
	// A failover: attempt 0 ends, attempt 1 starts from 0; the totals go on.
	a0s0.Close()
	a0s1.Close()
	a1s0 := m.Operator(telemetry.SubtaskLabels{JobID: "j-1", Job: "j", Attempt: 1, Operator: "parse", Subtask: 0})
	a1s0.Batch(ctx, 4, 4, time.Millisecond)
	text = scrape()
	for _, want := range []string{
		`streamd_records_in_total{streamd_attempt="1",` + job + `,streamd_operator="parse",streamd_subtask="0"} 4`,
		`streamd_operator_records_in_total{` + job + `,streamd_operator="parse"} 19`,
		`streamd_operator_records_out_total{` + job + `,streamd_operator="parse"} 18`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("after the failover, /metrics lacks %q", want)
		}
	}
	// The job ends: its totals are reported once more, then go.
	a1s0.Batch(ctx, 1, 1, time.Millisecond)
	a1s0.Close()
	m.EndJob("j-1", "j")
	if text = scrape(); !strings.Contains(text, `streamd_operator_records_in_total{`+job+`,streamd_operator="parse"} 20`) {
		t.Errorf("the scrape after the end lacks the final total:\n%s", grepStreamd(text))
	}
	if text = scrape(); strings.Contains(text, "streamd_operator_records_in_total") {
		t.Errorf("the totals of an ended job are still exported:\n%s", grepStreamd(text))
	}
	if t.Failed() {
		t.Logf("/metrics:\n%s", grepStreamd(text))
	}
}
