package webapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel"

	"github.com/streamd/streamd/host"
	"github.com/streamd/streamd/internal/cluster"
	"github.com/streamd/streamd/internal/cluster/agent"
	"github.com/streamd/streamd/internal/cluster/client"
	"github.com/streamd/streamd/internal/cluster/wire"
	"github.com/streamd/streamd/internal/jobfile"
	"github.com/streamd/streamd/internal/natstest"
	"github.com/streamd/streamd/internal/telemetry"
	"github.com/streamd/streamd/internal/testwasm"
	"github.com/streamd/streamd/internal/webapi"
)

const hb = 50 * time.Millisecond

// testCluster is a real one: an embedded NATS server, a controller and a
// host in this process, and the API over a client.Client, as streamd
// controller --http serves it.
type testCluster struct {
	t      *testing.T
	client *client.Client
	url    string // the API's base URL
}

func newCluster(t *testing.T, opts webapi.Options) *testCluster {
	t.Helper()
	srv := natstest.Server(t)
	// Connected first: the connection closes after the controller stopped.
	nc := natstest.Connect(t, srv.URL())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- cluster.RunController(ctx, nc, cluster.ControllerOptions{
			Logger: slog.New(slog.DiscardHandler), HeartbeatInterval: hb, LostAfter: 20})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("controller: %v", err)
		}
	})
	eng, err := host.NewEngine(context.Background(), host.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close(context.Background()) })
	// The host publishes the job logs, as streamd host does.
	logs := wire.NewLogPublisher(natstest.Connect(t, srv.URL()), wire.LogStreamConfig{}, nil)
	t.Cleanup(logs.Close)
	h, err := agent.StartHost(natstest.Connect(t, srv.URL()), agent.HostOptions{ID: "h1", Slots: 4, DataDir: t.TempDir(),
		HeartbeatInterval: hb, Executor: &agent.LocalExecutor{Engine: eng, Logs: logs}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	client, err := client.NewClient(natstest.Connect(t, srv.URL()))
	if err != nil {
		t.Fatal(err)
	}
	opts.Mode = "controller"
	if opts.Traces == nil {
		opts.Traces = installRecorder(t)
	}
	api := httptest.NewServer(webapi.New(client, opts))
	t.Cleanup(api.Close)
	return &testCluster{t: t, client: client, url: api.URL}
}

// installRecorder installs a tracer provider that keeps the checkpoint
// traces in a recorder, as streamd controller does without a trace backend;
// the controller and the host of the test share it (one process).
func installRecorder(t *testing.T) *telemetry.Recorder {
	t.Helper()
	rec := telemetry.NewRecorder()
	tel, err := telemetry.New(context.Background(), telemetry.Config{ServiceName: "streamd-test", Recorder: rec})
	if err != nil {
		t.Fatal(err)
	}
	prev := otel.GetTracerProvider()
	tel.Install()
	t.Cleanup(func() {
		otel.SetTracerProvider(prev)
		_ = tel.Shutdown(context.Background())
	})
	return rec
}

// foreverJob writes a checkpointing job whose generator never ends:
// gen -rebalance-> upper (parallelism 2) -hash-> out.
func foreverJob(t *testing.T, name string) string {
	t.Helper()
	dir := t.TempDir()
	wasm, err := os.ReadFile(testwasm.Path(t, "examples/wasm/uppercase/uppercase.wasm"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "uppercase.wasm"), wasm, 0o644); err != nil {
		t.Fatal(err)
	}
	job := fmt.Sprintf(`name: %s
checkpoint:
  dir: %s
  interval: 200ms
operators:
  - uid: gen
    source: {type: generator, rate: 500, ts_step: 1}
  - uid: upper
    wasm: uppercase.wasm
    parallelism: 2
    inputs: [{from: gen, partition: rebalance}]
  - uid: out
    sink: {type: discard}
    inputs: [{from: upper, partition: hash}]
`, name, filepath.Join(dir, "checkpoints"))
	path := filepath.Join(dir, "job.yaml")
	if err := os.WriteFile(path, []byte(job), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func (tc *testCluster) deploy(path string) string {
	tc.t.Helper()
	job, err := jobfile.LoadJob(path, jobfile.Options{})
	if err != nil {
		tc.t.Fatal(err)
	}
	id, err := tc.client.Deploy(context.Background(), job, path)
	if err != nil {
		tc.t.Fatal(err)
	}
	return id
}

// call sends a request and decodes the JSON reply into out (nil: not);
// it returns the status code and the body.
func call(t *testing.T, method, url, body string, out any) (int, string) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("%s %s: Content-Type %q, want application/json", method, url, ct)
	}
	if out != nil && resp.StatusCode < 300 {
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s %s: %v in %s", method, url, err, b)
		}
	}
	return resp.StatusCode, string(b)
}

// wantError checks an error reply: its status and that its message says want.
func wantError(t *testing.T, method, url, body string, status int, want string) {
	t.Helper()
	code, b := call(t, method, url, body, nil)
	var e webapi.ErrorBody
	if err := json.Unmarshal([]byte(b), &e); err != nil || len(e.Errors) != 1 {
		t.Fatalf("%s %s: error body %q: want {\"errors\": [message]}", method, url, b)
	}
	if code != status || !strings.Contains(e.Errors[0], want) {
		t.Errorf("%s %s: %d %q, want %d and a message with %q", method, url, code, e.Errors[0], status, want)
	}
}

// waitFor polls GET url into out until cond holds (30s at most).
func waitFor[T any](t *testing.T, url, what string, cond func(*T) bool) *T {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var v T
		code, body := call(t, http.MethodGet, url, "", &v)
		if code == http.StatusOK && cond(&v) {
			return &v
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET %s: %s not reached in 30s; last reply %d %s", url, what, code, body)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestJobLifecycle(t *testing.T) {
	tc := newCluster(t, webapi.Options{})
	id := tc.deploy(foreverJob(t, "forever"))
	base := tc.url + "/jobs/" + id

	job := waitFor(t, base, "running", func(j *webapi.JobDetail) bool {
		if j.State != wire.JobRunning || len(j.Vertices) != 3 {
			return false
		}
		for _, v := range j.Vertices {
			for _, s := range v.Subtasks {
				if s.State != wire.SubtaskRunning {
					return false
				}
			}
		}
		return j.Vertices[2].RecordsIn > 0
	})
	if job.ID != id || job.Name != "forever" || job.CheckpointMode != "aligned" {
		t.Errorf("job %+v", job.JobOverview)
	}
	if v := job.Vertices[1]; v.ID != "upper" || v.Kind != "operator" || v.Parallelism != 2 || len(v.Subtasks) != 2 ||
		v.Subtasks[1].Host != "h1" || v.Tasks[wire.SubtaskRunning] != 2 || v.State != wire.SubtaskRunning {
		t.Errorf("vertex upper: %+v", v)
	}
	if job.Tasks[wire.SubtaskRunning] != 4 {
		t.Errorf("tasks %v: want 4 running", job.Tasks)
	}
	// Each subtask's counters, as its host reports them: the watermark
	// (the generator's timestamps, ts_step 1), back-pressured, busy and
	// idle milliseconds; no source lag (not a nats source).
	job = waitFor(t, base, "watermarks", func(j *webapi.JobDetail) bool {
		for i, v := range j.Vertices {
			for _, s := range v.Subtasks {
				in, out := s.Watermark != nil && *s.Watermark > 0, s.OutputWatermark != nil && *s.OutputWatermark > 0
				if in != (i > 0) || out != (i < 2) { // the source has no input, the sink no output
					return false
				}
			}
		}
		return true
	})
	for _, v := range job.Vertices {
		for _, s := range v.Subtasks {
			if s.BackPressuredMS == nil || s.BusyMS == nil || s.IdleMS == nil || s.SourceLag != nil {
				t.Errorf("%s[%d]: back-pressured %v, busy %v, idle %v ms, source lag %v: want times and no lag", v.ID, s.Subtask, s.BackPressuredMS, s.BusyMS, s.IdleMS, s.SourceLag)
			}
		}
	}
	if s := job.Vertices[2].Subtasks[0]; *s.IdleMS == 0 {
		t.Errorf("the sink of a job at 500 records/s was never idle: %+v", s)
	}

	var jobs webapi.JobsReply
	if code, b := call(t, http.MethodGet, tc.url+"/jobs", "", &jobs); code != 200 || len(jobs.Jobs) != 1 || jobs.Jobs[0].ID != id {
		t.Fatalf("GET /jobs: %d %s", code, b)
	}

	var plan webapi.PlanReply
	call(t, http.MethodGet, base+"/plan", "", &plan)
	wantEdges := []webapi.PlanEdge{{From: "gen", To: "upper", Partitioning: "rebalance"}, {From: "upper", To: "out", Partitioning: "hash"}}
	if fmt.Sprint(plan.Plan.Edges) != fmt.Sprint(wantEdges) || len(plan.Plan.Nodes) != 3 || plan.Plan.Nodes[0].Kind != "source" ||
		plan.Plan.Nodes[2].Inputs[0].ShipStrategy != "hash" || plan.Plan.Nodes[2].Inputs[0].Exchange != "all_to_all" {
		t.Errorf("plan %+v", plan.Plan)
	}

	cps := waitFor(t, base+"/checkpoints", "a completed checkpoint", func(c *webapi.CheckpointsReply) bool { return len(c.History) > 0 })
	if c := cps.History[0]; c.Status != "completed" || c.Kind != "checkpoint" || c.DurationMS <= 0 || c.StateSize <= 0 ||
		!strings.Contains(c.ExternalPath, "chk-") || cps.Latest == nil || cps.Latest.ID != c.ID || cps.Mode != "aligned" {
		t.Errorf("checkpoints %+v", cps)
	}
	var ex webapi.ExceptionsReply
	if call(t, http.MethodGet, base+"/exceptions", "", &ex); ex.RootException != "" || len(ex.Entries) != 0 {
		t.Errorf("exceptions of a healthy job: %+v", ex)
	}

	// Bad requests are refused with what was wrong.
	wantError(t, http.MethodGet, tc.url+"/jobs/nope", "", 404, `no job "nope"`)
	wantError(t, http.MethodPost, tc.url+"/jobs/nope/stop", "", 404, `no job "nope"`)
	wantError(t, http.MethodPost, base+"/stop", `{"drian": true}`, 400, `unknown field "drian"`)
	wantError(t, http.MethodPost, base+"/savepoints", `{"targetDirectory": 7}`, 400, "bad request body")
	wantError(t, http.MethodPatch, base+"?mode=stop", "", 400, `mode "stop": want cancel`)
	wantError(t, http.MethodDelete, base, "", 405, "method not allowed")
	wantError(t, http.MethodGet, tc.url+"/jobs/"+id+"/vertices", "", 404, "no such resource")

	// A savepoint; the job goes on.
	spDir := t.TempDir()
	var sp webapi.SavepointReply
	if code, b := call(t, http.MethodPost, base+"/savepoints", `{"targetDirectory": "`+spDir+`"}`, &sp); code != 200 ||
		!strings.HasPrefix(sp.Location, spDir) || sp.State != wire.JobRunning {
		t.Fatalf("savepoint: %d %s", code, b)
	}
	if _, err := os.Stat(filepath.Join(sp.Location, "_metadata")); err != nil {
		t.Errorf("savepoint %s: %v", sp.Location, err)
	}

	// Stop with a savepoint: the job is stopped, and the savepoint listed.
	if code, b := call(t, http.MethodPost, base+"/stop", `{"drain": false}`, &sp); code != 200 || sp.Location == "" || sp.State != wire.JobStopped {
		t.Fatalf("stop: %d %s", code, b)
	}
	call(t, http.MethodGet, base, "", &job)
	if job.State != wire.JobStopped || job.Savepoint != sp.Location || job.EndTime == nil {
		t.Errorf("after stop: state %s savepoint %q (want %q) end %v", job.State, job.Savepoint, sp.Location, job.EndTime)
	}
	call(t, http.MethodGet, base+"/checkpoints", "", cps)
	if l := cps.Latest; l == nil || !l.IsSavepoint || l.ExternalPath != sp.Location {
		t.Errorf("latest checkpoint after the stop: %+v, want the savepoint %s", l, sp.Location)
	}

	// A stopped job takes no more stops, savepoints or cancels.
	wantError(t, http.MethodPost, base+"/stop", "", 409, "stopped, not running")
	wantError(t, http.MethodPost, base+"/savepoints", "", 409, "stopped, not running")
	wantError(t, http.MethodPost, base+"/cancel", "", 409, "already stopped")
}

func TestCancel(t *testing.T) {
	tc := newCluster(t, webapi.Options{})
	id := tc.deploy(foreverJob(t, "forever"))
	base := tc.url + "/jobs/" + id
	waitFor(t, base, "running", func(j *webapi.JobDetail) bool { return j.State == wire.JobRunning })
	var job webapi.JobDetail
	if code, b := call(t, http.MethodPatch, base+"?mode=cancel", "", &job); code != 200 || job.State != wire.JobCanceled {
		t.Fatalf("PATCH cancel: %d %s", code, b)
	}
	wantError(t, http.MethodPost, base+"/cancel", "", 409, "already canceled")
}

func TestExceptions(t *testing.T) {
	tc := newCluster(t, webapi.Options{})
	dir := t.TempDir()
	path := testwasm.FailingJob(t, dir)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// One restart, then the job fails: two attempts, each with its cause.
	b = append(b, []byte("restart: {strategy: fixed-delay, delay: 10ms, attempts: 1}\n")...)
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	id := tc.deploy(path)
	base := tc.url + "/jobs/" + id
	failed := waitFor(t, base, "failed", func(j *webapi.JobDetail) bool { return j.State == wire.JobFailed })
	if !strings.HasPrefix(failed.ReasonSummary, "The module of operator boom (subtask 0) failed in process during attempt 1: ") {
		t.Errorf("reason_summary %q: want the module's failure in words", failed.ReasonSummary)
	}
	var ex webapi.ExceptionsReply
	call(t, http.MethodGet, base+"/exceptions", "", &ex)
	if !strings.Contains(ex.RootException, "conformance panic") || len(ex.Entries) == 0 {
		t.Fatalf("exceptions: %+v", ex)
	}
	for _, e := range ex.Entries {
		if !strings.Contains(e.Exception, "conformance panic") || e.State != wire.JobFailed {
			t.Errorf("entry %+v: want the guest's panic message", e)
		}
		// In words, with the raw text kept beside.
		if !strings.HasPrefix(e.Summary, "The module of operator ") || !strings.Contains(e.Summary, "attempt "+strconv.Itoa(e.Attempt)) {
			t.Errorf("entry %d: summary %q: want the module's crash in words", e.Attempt, e.Summary)
		}
	}
	wantError(t, http.MethodPost, base+"/stop", "", 409, "failed, not running")
}

func TestConfigAndConsole(t *testing.T) {
	tc := newCluster(t, webapi.Options{TracingUIURL: "http://127.0.0.1:16686/", Service: "streamd-controller", Version: "v9"})
	var cfg webapi.Config
	call(t, http.MethodGet, tc.url+"/config", "", &cfg)
	if cfg.Mode != "controller" || cfg.TracingUIURL != "http://127.0.0.1:16686" || cfg.Service != "streamd-controller" || cfg.Version != "v9" {
		t.Errorf("config %+v", cfg)
	}
	for path, want := range map[string]string{"/": "<title>streamd console</title>", "/app.js": "function renderJob", "/style.css": "svg rect.subtask"} {
		resp, err := http.Get(tc.url + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !bytes.Contains(b, []byte(want)) {
			t.Errorf("GET %s: %d, want the console's file with %q", path, resp.StatusCode, want)
		}
		if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'self'") {
			t.Errorf("GET %s: CSP %q: the console loads nothing from elsewhere", path, csp)
		}
	}
	wantError(t, http.MethodGet, tc.url+"/nothing.js", "", 404, "no such resource")
}

// TestConnectorsFromRegistry: GET /connectors lists the connector
// registry's types with their fields (no job needed).
func TestConnectorsFromRegistry(t *testing.T) {
	rec := httptest.NewRecorder()
	webapi.New(nil, webapi.Options{Mode: "run"}).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/connectors", nil))
	var r webapi.ConnectorsReply
	if err := json.Unmarshal(rec.Body.Bytes(), &r); rec.Code != 200 || err != nil {
		t.Fatalf("GET /connectors: %d %v\n%s", rec.Code, err, rec.Body)
	}
	if len(r.Sources) < 3 || r.Sources[2].Type != "nats" || !r.Sources[2].UsesNATS || len(r.Sinks) < 4 || r.Sinks[0].Type != "file" || !r.Sinks[0].DeadLetters {
		t.Fatalf("connectors %+v", r)
	}
	found := false
	for _, f := range r.Sources[2].Fields {
		if f.Name == "stream" && f.Required && f.Type == "string" {
			found = true
		}
	}
	if !found {
		t.Errorf("nats source fields %+v: want a required stream", r.Sources[2].Fields)
	}
}
