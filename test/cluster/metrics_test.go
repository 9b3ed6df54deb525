package cluster_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/streamd/streamd/internal/cluster/wire"
	"github.com/streamd/streamd/internal/jobfile"
	"github.com/streamd/streamd/internal/telemetry"
)

// TestMetricsOfEndedJobsRemoved: a job's series (its subtasks' on the hosts,
// its checkpoints' on the controller) are exported while it runs and are
// gone once it finished, or was canceled; a job still running keeps its
// series.
func TestMetricsOfEndedJobsRemoved(t *testing.T) {
	ctx := context.Background()
	tel, err := telemetry.New(ctx, telemetry.Config{PrometheusAddr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	tel.Install() // the controller and the hosts of this process record into it
	t.Cleanup(func() {
		_ = tel.Shutdown(ctx)
		off, _ := telemetry.New(ctx, telemetry.Config{})
		off.Install()
	})
	scrape := func() string {
		resp, err := http.Get("http://" + tel.MetricsAddr() + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	series := func(text, id, metric string) bool {
		for _, l := range strings.Split(text, "\n") {
			if strings.HasPrefix(l, metric+"{") && strings.Contains(l, `streamd_job_id="`+id+`"`) {
				return true
			}
		}
		return false
	}
	// waitSeries scrapes until every metric's series of job id are there
	// (want) or none is.
	waitSeries := func(id string, want bool, metrics ...string) string {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			text := scrape()
			all := true
			for _, m := range metrics {
				if series(text, id, m) != want {
					all = false
				}
			}
			if all {
				return text
			}
			if time.Now().After(deadline) {
				t.Fatalf("job %s: series of %v present=%v not reached in 30s:\n%s", id, metrics, want, grepJob(text, id))
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	tc := newCluster(t, 4)
	// slowJob's job, checkpointing: the controller has its series too.
	job := func(count, rate int) string {
		path := slowJob(t, count, rate, 2)
		src, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		src = bytes.Replace(src, []byte("operators:"), []byte("checkpoint: {interval: 50ms, storage: jetstream}\noperators:"), 1)
		if err := os.WriteFile(path, src, 0o644); err != nil {
			t.Fatal(err)
		}
		return deploy(t, tc, path, jobfile.Options{})
	}
	subtask := []string{"streamd_records_in_total", "streamd_task_busy_time_seconds_total", "streamd_backpressure_time_seconds_total"}
	controller := []string{"streamd_checkpoint_last_id", "streamd_checkpoint_duration_seconds_count"}
	both := append(subtask, controller...)

	running := job(0, 200)   // unbounded
	short := job(1500, 1000) // about 1.5 s
	waitSeries(running, true, both...)
	waitSeries(short, true, both...)
	tc.waitJob(short, "finished", state(wire.JobFinished))
	text := waitSeries(short, false, both...)
	for _, m := range both {
		if !series(text, running, m) {
			t.Errorf("running job %s lost its series %s when job %s finished:\n%s", running, m, short, grepJob(text, running))
		}
	}
	if _, err := tc.client.Cancel(ctx, running); err != nil {
		t.Fatal(err)
	}
	tc.waitJob(running, "canceled", state(wire.JobCanceled))
	waitSeries(running, false, both...)
}

func grepJob(text, id string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, id) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
