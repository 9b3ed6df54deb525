// Package webapi is streamd's REST/JSON API and web console (docs/rest.md):
// an http.Handler over a Backend, which is a controller (a client.Client on
// the controller's NATS connection, so the API sees exactly what `streamd
// status` sees) or the single job of `streamd run` (Local). The console's
// HTML, JavaScript and CSS are embedded in the binary; it polls the API.
//
// The API follows the shape of Flink's REST API: /jobs, /jobs/{id},
// /jobs/{id}/plan, /jobs/{id}/checkpoints, /jobs/{id}/exceptions, and
// POST /jobs/{id}/stop, /jobs/{id}/savepoints, /jobs/{id}/cancel (PATCH
// /jobs/{id} cancels too). Its field names are streamd's (snake_case, the
// words of `streamd status --json`). Errors are {"errors": [message]} with
// 400 (bad body), 404 (no such job), 405, 409 (the job is in the wrong
// state) or 500.
package webapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/streamd/streamd/internal/cluster/wire"
	"github.com/streamd/streamd/internal/connector"
	"github.com/streamd/streamd/internal/telemetry"
)

// Backend is what the API serves. *client.Client is one; Local is the
// other. An error may be an *Error to choose its HTTP status; any other
// error of a job request is classified by the job's state (see Handler).
type Backend interface {
	List(ctx context.Context, all bool) ([]wire.JobStatus, error)
	Status(ctx context.Context, jobID string) (*wire.JobStatus, error)
	Cancel(ctx context.Context, jobID string) (*wire.JobStatus, error)
	Savepoint(ctx context.Context, jobID, dir string) (string, error)
	Stop(ctx context.Context, jobID, dir string, drain bool) (string, error)
}

// Error is an API error with its HTTP status.
type Error struct {
	Status int
	Msg    string
}

func (e *Error) Error() string { return e.Msg }

func errorf(status int, format string, args ...any) *Error {
	return &Error{Status: status, Msg: fmt.Sprintf(format, args...)}
}

// Options configure the handler.
type Options struct {
	// Mode is "controller" or "run" (shown by GET /config and the console).
	Mode string
	// TracingUIURL is tracing.ui_url, the Jaeger UI the console links
	// traces to; "" for no links.
	TracingUIURL string
	// Service is the tracing service name of the process whose spans the
	// links search (e.g. streamd-controller).
	Service string
	// Version is streamd's version (GET /config).
	Version string
	// Traces keeps the recent checkpoint traces of this process (GET
	// /jobs/{id}/checkpoints/{cid}/trace, the checkpoint counts); nil:
	// none.
	Traces *telemetry.Recorder
}

// maxBody bounds a request body.
const maxBody = 1 << 20

// New returns the API and console handler over b.
func New(b Backend, opts Options) http.Handler {
	h := &handler{b: b, opts: opts}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /config", h.config)
	mux.HandleFunc("GET /connectors", h.connectors)
	mux.HandleFunc("GET /jobs", h.jobs)
	mux.HandleFunc("GET /jobs/overview", h.jobs)
	mux.HandleFunc("GET /jobs/{id}", h.view(func(st *wire.JobStatus) any { return detail(st) }))
	mux.HandleFunc("GET /jobs/{id}/plan", h.view(plan))
	mux.HandleFunc("GET /jobs/{id}/checkpoints", h.view(h.checkpoints))
	mux.HandleFunc("GET /jobs/{id}/checkpoints/{cid}/trace", h.trace)
	mux.HandleFunc("GET /jobs/{id}/exceptions", h.view(exceptions))
	mux.HandleFunc("GET /jobs/{id}/versions", h.view(versions))
	mux.HandleFunc("GET /jobs/{id}/logs", h.logs)
	mux.HandleFunc("GET /hosts", h.hosts)
	mux.HandleFunc("POST /jobs/{id}/stop", h.stop)
	mux.HandleFunc("POST /jobs/{id}/savepoints", h.savepoint)
	mux.HandleFunc("POST /jobs/{id}/cancel", h.cancel)
	mux.HandleFunc("PATCH /jobs/{id}", h.cancel)
	mux.Handle("GET /", consoleHandler())
	return &errorMux{mux}
}

// errorMux answers the mux's own 404 and 405 with JSON errors.
type errorMux struct{ mux *http.ServeMux }

func (m *errorMux) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if _, pattern := m.mux.Handler(r); pattern == "" {
		// The mux found nothing: let it set Allow on a 405, then answer JSON.
		rec := &statusRecorder{header: http.Header{}}
		m.mux.ServeHTTP(rec, r)
		allow := rec.header.Get("Allow")
		if allow != "" {
			w.Header().Set("Allow", allow)
		}
		if rec.status == http.StatusMethodNotAllowed {
			writeError(w, errorf(http.StatusMethodNotAllowed, "%s %s: method not allowed (allowed: %s)", r.Method, r.URL.Path, allow))
			return
		}
		writeError(w, errorf(http.StatusNotFound, "%s %s: no such resource (see docs/rest.md)", r.Method, r.URL.Path))
		return
	}
	m.mux.ServeHTTP(w, r)
}

// statusRecorder keeps the status and headers of the mux's own error reply.
type statusRecorder struct {
	header http.Header
	status int
}

func (s *statusRecorder) Header() http.Header         { return s.header }
func (s *statusRecorder) Write(b []byte) (int, error) { return len(b), nil }
func (s *statusRecorder) WriteHeader(code int)        { s.status = code }

type handler struct {
	b    Backend
	opts Options
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// ErrorBody is every error reply, as in Flink: {"errors": ["..."]}.
type ErrorBody struct {
	Errors []string `json:"errors"`
}

func writeError(w http.ResponseWriter, err error) {
	writeJSON(w, httpStatus(err), ErrorBody{Errors: []string{err.Error()}})
}

// httpStatus is the HTTP status of err: an *Error's own, else that of the
// code a controller answered with (wire.ErrNotFound and the others),
// else 500.
func httpStatus(err error) int {
	var e *Error
	switch {
	case errors.As(err, &e):
		return e.Status
	case errors.Is(err, wire.ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, wire.ErrConflict):
		return http.StatusConflict
	case errors.Is(err, wire.ErrBadRequest):
		return http.StatusBadRequest
	case errors.Is(err, wire.ErrUnavailable):
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError
}

// Config is GET /config.
type Config struct {
	Mode         string `json:"mode"`
	Version      string `json:"version,omitempty"`
	TracingUIURL string `json:"tracing_ui_url,omitempty"`
	Service      string `json:"service,omitempty"`
	RefreshMS    int    `json:"refresh_interval_ms"`
}

func (h *handler) config(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, Config{Mode: h.opts.Mode, Version: h.opts.Version,
		TracingUIURL: strings.TrimRight(h.opts.TracingUIURL, "/"), Service: h.opts.Service, RefreshMS: 1000})
}

// ConnectorsReply is GET /connectors: the source and sink types of the
// connector registry, with their fields (what docs/connectors.md shows).
type ConnectorsReply struct {
	Sources []connector.Info `json:"sources"`
	Sinks   []connector.Info `json:"sinks"`
}

func (h *handler) connectors(w http.ResponseWriter, _ *http.Request) {
	var r ConnectorsReply
	r.Sources, r.Sinks = connector.Catalog()
	writeJSON(w, http.StatusOK, r)
}

// JobsReply is GET /jobs.
type JobsReply struct {
	Jobs []JobOverview `json:"jobs"`
}

// JobOverview is one job in GET /jobs.
type JobOverview struct {
	ID        string     `json:"id"`
	Name      string     `json:"name"`
	State     string     `json:"state"`
	Attempt   int        `json:"attempt"`
	StartTime time.Time  `json:"start_time"`
	EndTime   *time.Time `json:"end_time,omitempty"`
	// DurationMS is from start to end, or to now for a job not ended.
	DurationMS int64          `json:"duration_ms"`
	Tasks      map[string]int `json:"tasks"` // subtasks by state
	Hosts      []string       `json:"hosts,omitempty"`
}

func overview(st *wire.JobStatus, now time.Time) JobOverview {
	o := JobOverview{ID: st.ID, Name: st.Name, State: st.State, Attempt: st.Attempt, StartTime: st.Created,
		EndTime: st.Ended, Tasks: map[string]int{}, Hosts: st.Hosts}
	end := now
	if st.Ended != nil {
		end = *st.Ended
	}
	o.DurationMS = end.Sub(st.Created).Milliseconds()
	for _, op := range st.Operators {
		for _, s := range op.Subtasks {
			o.Tasks[s.State]++
		}
	}
	return o
}

func (h *handler) jobs(w http.ResponseWriter, r *http.Request) {
	all := r.URL.Query().Get("all")
	jobs, err := h.b.List(r.Context(), all == "true" || all == "1")
	if err != nil {
		writeError(w, err)
		return
	}
	out := JobsReply{Jobs: []JobOverview{}}
	now := time.Now()
	for i := range jobs {
		out.Jobs = append(out.Jobs, overview(&jobs[i], now))
	}
	writeJSON(w, http.StatusOK, out)
}

// lookup returns the job the path names, or answers 404 (or the backend's
// error) itself and returns nil.
func (h *handler) lookup(w http.ResponseWriter, r *http.Request) *wire.JobStatus {
	id := r.PathValue("id")
	st, err := h.b.Status(r.Context(), id)
	if err == nil && st != nil {
		return st
	}
	// A controller's error carries its code (wire.ErrNotFound ...):
	// writeError maps it to the HTTP status.
	if err == nil {
		err = errorf(http.StatusNotFound, "no job %q", id)
	}
	writeError(w, err)
	return nil
}

// JobDetail is GET /jobs/{id}.
type JobDetail struct {
	JobOverview
	Reason         string `json:"reason,omitempty"`
	ReasonSummary  string `json:"reason_summary,omitempty"` // the reason in a user's words (Explain), when known
	Savepoint      string `json:"savepoint,omitempty"`
	CheckpointMode string `json:"checkpoint_mode,omitempty"`
	// Parallelism is the parallelism the job runs at (its slots),
	// DeclaredParallelism the one it declares, MinParallelism the least it
	// runs at; Rescales the adaptive scheduler's latest rescales
	// (docs/job-file.md "Adaptive scheduling").
	Parallelism         int                  `json:"parallelism"`
	DeclaredParallelism int                  `json:"declared_parallelism"`
	MinParallelism      int                  `json:"min_parallelism"`
	Rescales            []wire.RescaleStatus `json:"rescales,omitempty"`
	// Autoscaler is the job's autoscaler: its settings, what it waits for
	// and its latest decisions (docs/job-file.md "Autoscaling"); nil: off.
	Autoscaler *wire.AutoscalerStatus `json:"autoscaler,omitempty"`
	Vertices   []Vertex               `json:"vertices"`
	Now        int64                  `json:"now"` // the server's time, Unix ms: rates are per its clock
}

// Vertex is one operator of a job.
type Vertex struct {
	ID            string         `json:"id"`
	Kind          string         `json:"kind,omitempty"`
	Parallelism   int            `json:"parallelism"`
	Declared      int            `json:"declared_parallelism"` // its parallelism in the job file
	State         string         `json:"state"`                // the state most of its subtasks are in
	RecordsIn     int64          `json:"records_in"`
	RecordsOut    int64          `json:"records_out"`
	UnionDeclines int            `json:"union_declines,omitempty"`
	Connector     string         `json:"connector,omitempty"` // a source's or sink's description (connector registry)
	Tasks         map[string]int `json:"tasks"`               // subtasks by state
	Subtasks      []Subtask      `json:"subtasks"`
}

// Subtask is one subtask of a vertex.
type Subtask struct {
	Subtask int    `json:"subtask"`
	Host    string `json:"host,omitempty"`
	State   string `json:"state"`
	// The subtask's counters as its host reported them last (absent
	// before): its input watermark and the watermark it last sent
	// downstream (output), in event-time ms (absent before the first; a
	// source has only an output one, a sink only an input one), the
	// milliseconds so far it was
	// back-pressured (blocked sending downstream), busy (in its operator's
	// calls) and idle (waiting for input), and a nats or kafka
	// source's lag (what it has yet to read). The console turns the times into
	// milliseconds per second between two polls, as Flink's
	// backPressuredTimeMsPerSecond, busyTimeMsPerSecond, idleTimeMsPerSecond.
	Watermark       *int64 `json:"watermark,omitempty"`
	OutputWatermark *int64 `json:"output_watermark,omitempty"`
	BackPressuredMS *int64 `json:"backpressured_ms,omitempty"`
	BusyMS          *int64 `json:"busy_ms,omitempty"`
	IdleMS          *int64 `json:"idle_ms,omitempty"`
	SourceLag       *int64 `json:"source_lag,omitempty"`
}

// subtask is the API's view of s.
func subtask(s wire.SubtaskStatus) Subtask {
	out := Subtask{Subtask: s.Index, Host: s.Host, State: s.State}
	if l := s.Live; l != nil {
		ms := func(d time.Duration) *int64 { v := d.Milliseconds(); return &v }
		out.BackPressuredMS, out.BusyMS, out.IdleMS = ms(l.BackPressure), ms(l.Busy), ms(l.Idle)
		if l.HasWatermark {
			out.Watermark = &l.Watermark
		}
		if l.HasOutputWatermark {
			out.OutputWatermark = &l.OutputWatermark
		}
		if l.HasSourceLag {
			out.SourceLag = &l.SourceLag
		}
	}
	return out
}

func detail(st *wire.JobStatus) JobDetail {
	now := time.Now()
	d := JobDetail{JobOverview: overview(st, now), Reason: st.Reason, ReasonSummary: Explain(st.Reason, st.Attempt), Savepoint: st.Savepoint,
		CheckpointMode: st.CheckpointMode, Parallelism: st.Parallelism, DeclaredParallelism: st.DeclaredParallelism, MinParallelism: st.MinParallelism,
		Rescales: st.Rescales, Autoscaler: st.Autoscaler, Vertices: []Vertex{}, Now: now.UnixMilli()}
	for _, op := range st.Operators {
		v := Vertex{ID: op.UID, Kind: op.Kind, Parallelism: op.Parallelism, Declared: op.DeclaredParallelism, RecordsIn: op.RecordsIn, RecordsOut: op.RecordsOut,
			UnionDeclines: op.UnionDeclines, Connector: op.Connector, Tasks: map[string]int{}, Subtasks: []Subtask{}}
		for _, s := range op.Subtasks {
			v.Subtasks = append(v.Subtasks, subtask(s))
			v.Tasks[s.State]++
		}
		for state, n := range v.Tasks {
			if n > v.Tasks[v.State] || n == v.Tasks[v.State] && state < v.State {
				v.State = state
			}
		}
		d.Vertices = append(d.Vertices, v)
	}
	return d
}

// view answers GET of a job's resource: what of makes of its status.
func (h *handler) view(of func(*wire.JobStatus) any) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if st := h.lookup(w, r); st != nil {
			writeJSON(w, http.StatusOK, of(st))
		}
	}
}

// PlanReply is GET /jobs/{id}/plan, as Flink's: {"plan": {...}}.
type PlanReply struct {
	Plan Plan `json:"plan"`
}

// Plan is a job's graph.
type Plan struct {
	JobID string     `json:"jid"`
	Name  string     `json:"name"`
	Nodes []PlanNode `json:"nodes"`
	Edges []PlanEdge `json:"edges"`
}

// PlanNode is one operator of the plan.
type PlanNode struct {
	ID          string      `json:"id"`
	Kind        string      `json:"kind,omitempty"`
	Parallelism int         `json:"parallelism"`
	Inputs      []PlanInput `json:"inputs,omitempty"`
}

// PlanInput is one input of a node, as Flink names it.
type PlanInput struct {
	Num          int    `json:"num"`           // input index
	ID           string `json:"id"`            // upstream node
	ShipStrategy string `json:"ship_strategy"` // forward, rebalance, hash or broadcast
	// Exchange is pointwise (forward) or all_to_all.
	Exchange string `json:"exchange"`
}

// PlanEdge is one edge, from upstream to downstream.
type PlanEdge struct {
	From         string `json:"from"`
	To           string `json:"to"`
	Partitioning string `json:"partitioning"`
	Input        int    `json:"input"`
}

func plan(st *wire.JobStatus) any {
	p := Plan{JobID: st.ID, Name: st.Name, Nodes: []PlanNode{}, Edges: []PlanEdge{}}
	for _, op := range st.Operators {
		n := PlanNode{ID: op.UID, Kind: op.Kind, Parallelism: op.Parallelism}
		for _, e := range op.Inputs {
			ex := "all_to_all"
			if e.Partitioning == "forward" {
				ex = "pointwise"
			}
			n.Inputs = append(n.Inputs, PlanInput{Num: e.Input, ID: e.From, ShipStrategy: e.Partitioning, Exchange: ex})
			p.Edges = append(p.Edges, PlanEdge{From: e.From, To: op.UID, Partitioning: e.Partitioning, Input: e.Input})
		}
		p.Nodes = append(p.Nodes, n)
	}
	return PlanReply{Plan: p}
}

// CheckpointsReply is GET /jobs/{id}/checkpoints.
type CheckpointsReply struct {
	// Mode is aligned, unaligned or "aligned, unaligned after D"; "" when
	// the job does not checkpoint.
	Mode   string             `json:"mode,omitempty"`
	Latest *CheckpointSummary `json:"latest,omitempty"` // the latest completed
	// History are the latest completed checkpoints and savepoints (at most
	// ten), newest first.
	History []CheckpointSummary `json:"history"`
	// Counts are the checkpoints (and savepoints) completed, failed and
	// in progress since this process started; absent when it keeps no
	// traces (Options.Traces).
	Counts *telemetry.CheckpointCounts `json:"counts,omitempty"`
	// Failed are the latest failed checkpoints, newest first, with why.
	Failed []telemetry.CheckpointFailure `json:"failed"`
	// Traced are the ids of the checkpoints whose trace is kept (GET
	// /jobs/{id}/checkpoints/{cid}/trace), newest first.
	Traced []int64 `json:"traced"`
}

// CheckpointSummary is one completed checkpoint or savepoint.
type CheckpointSummary struct {
	ID          int64     `json:"id"`
	Kind        string    `json:"kind"` // checkpoint or savepoint
	Status      string    `json:"status"`
	IsSavepoint bool      `json:"is_savepoint"`
	CompletedAt time.Time `json:"completed_at"`
	DurationMS  float64   `json:"duration_ms"` // trigger to durable metadata
	StateSize   int64     `json:"state_size"`  // bytes
	// InFlightBytes is the channel state of an unaligned checkpoint.
	InFlightBytes int64  `json:"inflight_bytes"`
	Unaligned     bool   `json:"unaligned"`
	ExternalPath  string `json:"external_path,omitempty"`
	// FinishedSubtasks and FinishedOperators: the subtasks that had
	// finished at the checkpoint, and the operators all of whose subtasks
	// had (FLIP-147).
	FinishedSubtasks  int      `json:"finished_subtasks"`
	FinishedOperators []string `json:"finished_operators"`
	// IncrementalSize is what an incremental checkpoint wrote (state_size:
	// its whole state); 0 for a full checkpoint or a savepoint.
	IncrementalSize int64 `json:"incremental_size"`
}

func (h *handler) checkpoints(st *wire.JobStatus) any {
	out := CheckpointsReply{Mode: st.CheckpointMode, History: []CheckpointSummary{}, Failed: []telemetry.CheckpointFailure{}, Traced: []int64{}}
	if h.opts.Traces != nil {
		counts, failed, traced := h.opts.Traces.Checkpoints(st.ID, st.Name)
		if wire.TerminalJobState(st.State) {
			counts.InProgress = 0 // a checkpoint pending when the job ended never ends
		}
		out.Counts = &counts
		out.Failed = append(out.Failed, failed...)
		out.Traced = append(out.Traced, traced...)
	}
	for i := len(st.Checkpoints) - 1; i >= 0; i-- {
		c := st.Checkpoints[i]
		s := CheckpointSummary{ID: c.ID, Kind: c.Kind, Status: "completed", IsSavepoint: c.Kind == "savepoint",
			CompletedAt: c.Time, DurationMS: float64(c.Duration.Microseconds()) / 1000, StateSize: c.Size,
			InFlightBytes: c.InFlight, Unaligned: c.InFlight > 0, ExternalPath: c.Location,
			FinishedSubtasks: c.FinishedSubtasks, FinishedOperators: c.FinishedOperators, IncrementalSize: c.Incremental}
		if s.FinishedOperators == nil {
			s.FinishedOperators = []string{}
		}
		out.History = append(out.History, s)
	}
	if len(out.History) > 0 {
		out.Latest = &out.History[0]
	}
	return out
}

// ExceptionsReply is GET /jobs/{id}/exceptions.
type ExceptionsReply struct {
	// RootException is why the job failed (or, while it restarts, what it
	// waits for); "" for a job that has not failed. RootSummary says it in
	// a user's words when a rule knows it (see Explain).
	RootException string `json:"root_exception,omitempty"`
	RootSummary   string `json:"root_summary,omitempty"`
	// Entries are the attempts that ended with a reason, newest first.
	Entries []ExceptionEntry `json:"entries"`
}

// ExceptionEntry is one attempt that failed (or ended with a reason).
type ExceptionEntry struct {
	Attempt   int      `json:"attempt"`
	State     string   `json:"state"`
	Hosts     []string `json:"hosts,omitempty"`
	Exception string   `json:"exception"` // the cause: the guest's message and wasm stack for a trap
	// Summary says the cause in a user's words ("the process running
	// attempt 1 on host h1 died ..."); "" when no rule knows it.
	Summary string `json:"summary,omitempty"`
}

func exceptions(st *wire.JobStatus) any {
	out := ExceptionsReply{Entries: []ExceptionEntry{}}
	if st.State == wire.JobFailed || st.State == wire.JobRestarting {
		out.RootException = st.Reason
		out.RootSummary = Explain(st.Reason, st.Attempt)
	}
	for i := len(st.Attempts) - 1; i >= 0; i-- {
		a := st.Attempts[i]
		if a.Reason == "" {
			continue
		}
		out.Entries = append(out.Entries, ExceptionEntry{Attempt: a.Attempt, State: a.State, Hosts: a.Hosts, Exception: a.Reason,
			Summary: Explain(a.Reason, a.Attempt)})
	}
	return out
}

// decode reads a JSON body into v; an empty body leaves v as it is.
func decode(r *http.Request, v any) error {
	dec := json.NewDecoder(io.LimitReader(r.Body, maxBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil && !errors.Is(err, io.EOF) {
		return errorf(http.StatusBadRequest, "%s %s: bad request body: %v", r.Method, r.URL.Path, err)
	}
	if dec.More() {
		return errorf(http.StatusBadRequest, "%s %s: bad request body: more than one JSON value", r.Method, r.URL.Path)
	}
	return nil
}

// StopRequest is the body of POST /jobs/{id}/stop (Flink's names).
type StopRequest struct {
	Drain           bool   `json:"drain"`
	TargetDirectory string `json:"targetDirectory"`
}

// SavepointRequest is the body of POST /jobs/{id}/savepoints.
type SavepointRequest struct {
	TargetDirectory string `json:"targetDirectory"`
}

// SavepointReply answers a stop or a savepoint: where the savepoint is.
type SavepointReply struct {
	Status   string `json:"status"` // completed
	Location string `json:"location"`
	State    string `json:"state,omitempty"` // the job's state afterwards
}

// running: a stop or savepoint needs a job running (or finishing).
func running(st *wire.JobStatus) bool {
	return st.State == wire.JobRunning || st.State == wire.JobFinishing
}

// refused classifies the error of an action on job id: an *Error as it
// is; else 409 when the job is (now) in a state the action does not
// apply to, 500 otherwise.
func (h *handler) refused(ctx context.Context, id string, err error, applies func(*wire.JobStatus) bool) error {
	var e *Error
	if errors.As(err, &e) || httpStatus(err) != http.StatusInternalServerError {
		return err
	}
	// A controller without error codes: the job's state tells.
	if st, serr := h.b.Status(ctx, id); serr == nil && st != nil && !applies(st) {
		return &Error{Status: http.StatusConflict, Msg: err.Error()}
	}
	return err
}

func (h *handler) stop(w http.ResponseWriter, r *http.Request) {
	var req StopRequest
	if err := decode(r, &req); err != nil {
		writeError(w, err)
		return
	}
	h.savepointAction(w, r, "stop", func(ctx context.Context, id string) (string, error) {
		return h.b.Stop(ctx, id, req.TargetDirectory, req.Drain)
	})
}

func (h *handler) savepoint(w http.ResponseWriter, r *http.Request) {
	var req SavepointRequest
	if err := decode(r, &req); err != nil {
		writeError(w, err)
		return
	}
	h.savepointAction(w, r, "savepoint", func(ctx context.Context, id string) (string, error) {
		return h.b.Savepoint(ctx, id, req.TargetDirectory)
	})
}

// savepointAction runs a stop or savepoint of a running job.
func (h *handler) savepointAction(w http.ResponseWriter, r *http.Request, verb string, act func(context.Context, string) (string, error)) {
	st := h.lookup(w, r)
	if st == nil {
		return
	}
	if !running(st) {
		writeError(w, errorf(http.StatusConflict, "%s job %s: the job is %s, not running", verb, st.ID, st.State))
		return
	}
	path, err := act(r.Context(), st.ID)
	if err != nil {
		writeError(w, h.refused(r.Context(), st.ID, err, running))
		return
	}
	out := SavepointReply{Status: "completed", Location: path}
	if now, err := h.b.Status(r.Context(), st.ID); err == nil && now != nil {
		out.State = now.State
	}
	writeJSON(w, http.StatusOK, out)
}

func (h *handler) cancel(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodPatch {
		// Flink: PATCH /jobs/{id}?mode=cancel; cancel is the only mode.
		if m := r.URL.Query().Get("mode"); m != "" && m != "cancel" {
			writeError(w, errorf(http.StatusBadRequest, "PATCH %s: mode %q: want cancel", r.URL.Path, m))
			return
		}
	}
	st := h.lookup(w, r)
	if st == nil {
		return
	}
	live := func(st *wire.JobStatus) bool { return !wire.TerminalJobState(st.State) }
	if !live(st) {
		writeError(w, errorf(http.StatusConflict, "cancel job %s: the job is already %s", st.ID, st.State))
		return
	}
	after, err := h.b.Cancel(r.Context(), st.ID)
	if err != nil {
		writeError(w, h.refused(r.Context(), st.ID, err, live))
		return
	}
	if after == nil {
		after = st
	}
	writeJSON(w, http.StatusOK, detail(after))
}
