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
