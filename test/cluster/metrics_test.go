package cluster_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/streamd/streamd/internal/cluster"
	"github.com/streamd/streamd/internal/jobfile"
	"github.com/streamd/streamd/internal/telemetry"
	"github.com/streamd/streamd/internal/testwasm"
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
	wasm := testwasm.Path(t, "examples/wasm/uppercase/uppercase.wasm")
	job := func(name string, count, rate int) string {
		path := filepath.Join(t.TempDir(), name+".yaml")
		src := fmt.Sprintf(`name: %s
parallelism: 2
checkpoint: {interval: 50ms, storage: jetstream}
operators:
  - uid: gen
    source: {type: generator, count: %d, rate: %d}
  - uid: upper
    wasm: %s
    inputs: [{from: gen}]
  - uid: out
    sink: {type: discard}
    inputs: [{from: upper}]
`, name, count, rate, wasm)
		if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		return deploy(t, tc, path, jobfile.Options{})
	}
	subtask := []string{"streamd_records_in_total", "streamd_task_busy_time_seconds_total", "streamd_backpressure_time_seconds_total"}
	controller := []string{"streamd_checkpoint_last_id", "streamd_checkpoint_duration_seconds_count"}
	both := append(subtask, controller...)

	running := job("running", 0, 200) // unbounded
	short := job("short", 1500, 1000) // about 1.5 s at p=2
	waitSeries(running, true, both...)
	waitSeries(short, true, both...)
	tc.waitJob(short, "finished", state(cluster.JobFinished))
	text := waitSeries(short, false, both...)
	for _, m := range both {
		if !series(text, running, m) {
			t.Errorf("running job %s lost its series %s when job %s finished:\n%s", running, m, short, grepJob(text, running))
		}
	}
	if _, err := tc.client.Cancel(ctx, running); err != nil {
		t.Fatal(err)
	}
	tc.waitJob(running, "canceled", state(cluster.JobCanceled))
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
