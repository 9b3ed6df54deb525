package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/streamd/streamd/internal/telemetry"
	"github.com/streamd/streamd/internal/testlog"
	"github.com/streamd/streamd/internal/webapi"
)

var consoleURL = regexp.MustCompile(`url=(http://127\.0\.0\.1:\d+)/#/jobs/(\S+)`)

// startRun runs `streamd run` on a job file in this process and returns the
// API's base URL, the job's id, and the exit status once it ends.
func startRun(t *testing.T, job string, args ...string) (base, id string, stderr *testlog.Buffer, exit <-chan int) {
	t.Helper()
	dir := t.TempDir()
	t.Chdir(dir)
	must(t, os.WriteFile(filepath.Join(dir, "job.yaml"), []byte(job), 0o644))
	stderr = &testlog.Buffer{}
	c := newCLI(strings.NewReader(""), io.Discard, stderr)
	done := make(chan int, 1)
	go func() {
		done <- c.execute(context.Background(), append([]string{"run", "--progress", "off", "job.yaml"}, args...))
	}()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if m := consoleURL.FindStringSubmatch(stderr.String()); m != nil {
			return m[1], m[2], stderr, done
		}
		select {
		case code := <-done:
			t.Fatalf("streamd run ended (exit %d) before serving its console: %s", code, stderr)
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("streamd run printed no console URL in 20s: %s", stderr)
		}
	}
}

func request(t *testing.T, method, url, body string, out any) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	must(t, err)
	resp, err := http.DefaultClient.Do(req)
	must(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	must(t, err)
	if out != nil && resp.StatusCode < 300 {
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s %s: %v in %s", method, url, err, b)
		}
	}
	return resp.StatusCode, string(b)
}

const foreverRunJob = `name: forever
checkpoint:
  dir: checkpoints
  interval: 100ms
operators:
  - uid: gen
    source: {type: generator, rate: 1000}
  - uid: out
    sink: {type: discard}
    inputs: [gen]
`

// streamd run serves its one job: status, plan, checkpoints, a savepoint,
// and a stop with a savepoint that ends the run as Ctrl-C would.
func TestRunServesItsJob(t *testing.T) {
	base, id, stderr, exit := startRun(t, foreverRunJob)
	job := base + "/jobs/" + id
	deadline := time.Now().Add(20 * time.Second)
	var cps webapi.CheckpointsReply
	for len(cps.History) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no checkpoint listed in 20s: %s", stderr)
		}
		request(t, http.MethodGet, job+"/checkpoints", "", &cps)
		time.Sleep(20 * time.Millisecond)
	}
	// The run keeps its checkpoint traces for the console (tracing is off):
	// the checkpoint, both subtasks' parts and their snapshots (in process).
	for cps.Counts == nil || cps.Counts.Completed == 0 || len(cps.Traced) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no checkpoint counted and traced in 20s: %+v", cps)
		}
		request(t, http.MethodGet, job+"/checkpoints", "", &cps)
		time.Sleep(20 * time.Millisecond)
	}
	var tr webapi.TraceReply
	if code, b := request(t, http.MethodGet, fmt.Sprintf("%s/checkpoints/%d/trace", job, cps.Traced[0]), "", &tr); code != 200 ||
		len(tr.Subtasks) != 2 || !slices.ContainsFunc(tr.Spans, func(s telemetry.RecordedSpan) bool { return s.Name == telemetry.SpanTaskSnapshot }) {
		t.Errorf("trace of checkpoint %d: %d %s", cps.Traced[0], code, b)
	}
	var hosts webapi.HostsReply
	if code, b := request(t, http.MethodGet, base+"/hosts", "", &hosts); code != 200 || len(hosts.Hosts) != 1 || hosts.Hosts[0].ID != "local" {
		t.Errorf("GET /hosts: %d %s", code, b)
	}
	if code, b := request(t, http.MethodGet, job+"/logs", "", nil); code != 404 || !strings.Contains(b, "on its stderr") {
		t.Errorf("GET logs of a run: %d %s: want 404 saying where the lines are", code, b)
	}
	var d webapi.JobDetail
	if code, b := request(t, http.MethodGet, job, "", &d); code != 200 || d.State != "running" || d.Name != "forever" ||
		len(d.Vertices) != 2 || d.Vertices[0].Kind != "source" || d.Vertices[0].Subtasks[0].State != "running" {
		t.Fatalf("GET %s: %d %s", job, code, b)
	}
	var plan webapi.PlanReply
	request(t, http.MethodGet, job+"/plan", "", &plan)
	if len(plan.Plan.Edges) != 1 || plan.Plan.Edges[0].Partitioning != "forward" {
		t.Errorf("plan %+v", plan.Plan)
	}
	if code, b := request(t, http.MethodGet, base+"/jobs/other", "", nil); code != 404 || !strings.Contains(b, "this streamd run runs job "+id) {
		t.Errorf("unknown job: %d %s", code, b)
	}
	if code, b := request(t, http.MethodPost, job+"/stop", `{"targetDirectory": "/tmp"}`, nil); code != 400 || !strings.Contains(b, "checkpoint directory") {
		t.Errorf("stop with a target directory: %d %s", code, b)
	}
	var sp webapi.SavepointReply
	if code, b := request(t, http.MethodPost, job+"/savepoints", "", &sp); code != 200 || !strings.Contains(sp.Location, "savepoint-") || sp.State != "running" {
		t.Fatalf("savepoint: %d %s", code, b)
	}
	if code, b := request(t, http.MethodPost, job+"/stop", `{"drain": false}`, &sp); code != 200 || sp.State != "stopped" {
		t.Fatalf("stop: %d %s", code, b)
	}
	if code := <-exit; code != exitOK || !strings.Contains(stderr.String(), "stopped with savepoint "+sp.Location) {
		t.Errorf("exit %d, stderr: %s", code, stderr)
	}
}

// Cancel through the API ends the run as canceled; a job without a
// checkpoint section takes no savepoint.
func TestRunCancelThroughAPI(t *testing.T) {
	job := strings.Replace(foreverRunJob, "checkpoint:\n  dir: checkpoints\n  interval: 100ms\n", "", 1)
	base, id, stderr, exit := startRun(t, job)
	if code, b := request(t, http.MethodPost, base+"/jobs/"+id+"/savepoints", "", nil); code != 409 || !strings.Contains(b, "no checkpoint section") {
		t.Errorf("savepoint of a job without checkpoints: %d %s", code, b)
	}
	var d webapi.JobDetail
	if code, b := request(t, http.MethodPost, base+"/jobs/"+id+"/cancel", "", &d); code != 200 || d.State != "canceled" {
		t.Fatalf("cancel: %d %s", code, b)
	}
	if code := <-exit; code != exitCanceled || !strings.Contains(stderr.String(), "streamd: canceled") {
		t.Errorf("exit %d, stderr: %s", code, stderr)
	}
}

// --http off serves nothing; a busy address is a usage error naming the key.
func TestRunHTTPFlag(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	must(t, os.WriteFile("job.yaml", []byte("name: j\noperators:\n  - uid: gen\n    source: {type: generator, count: 3}\n  - uid: out\n    sink: {type: discard}\n    inputs: [gen]\n"), 0o644))
	if code, _, _, stderr := invoke(t, "run", "--progress", "off", "--http", "off", "job.yaml"); code != exitOK || strings.Contains(stderr, "REST API") {
		t.Errorf("--http off: exit %d: %s", code, stderr)
	}
	if code, _, _, stderr := invoke(t, "run", "--progress", "off", "--http", "256.0.0.1:1", "job.yaml"); code != exitUsage || !strings.Contains(stderr, "run.http: webapi: listen on 256.0.0.1:1") {
		t.Errorf("bad --http: exit %d: %s", code, stderr)
	}
}
