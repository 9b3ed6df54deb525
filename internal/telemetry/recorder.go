package telemetry

import (
	"context"
	"slices"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// Recorder is a span processor that keeps the traces of the recent
// checkpoints of each job in memory, bounded, for the web console's trace
// view (GET /jobs/{id}/checkpoints/{cid}/trace), and counts each job's
// checkpoints completed, failed and in progress. It needs no trace backend:
// with tracing off, New gives the process a provider that samples only the
// checkpoint traces, for the recorder alone (Config.Recorder).
//
// A trace is the checkpoint span (the coordinator's root), its subtask and
// persist spans, and the task.* and guest.* spans of the subtasks that run
// in the same process (the others are exported by their hosts only).
type Recorder struct {
	mu     sync.Mutex
	traces map[trace.TraceID]*recTrace
	jobs   map[string]*recJob // by "id:<job id>" and "name:<job name>"
	order  []*recJob          // oldest first, for eviction
	fifo   []trace.TraceID    // every kept trace, oldest first
	spans  int                // spans kept in all traces
}

// Bounds of a Recorder.
const (
	// RecorderTraces is how many checkpoint traces it keeps per job.
	RecorderTraces = 20
	// RecorderSpans is how many spans it keeps per trace.
	RecorderSpans = 2000
	// RecorderTotalSpans is how many spans it keeps in all: past it the
	// oldest traces go, whatever their job.
	RecorderTotalSpans = 50000
	// RecorderJobs is how many jobs it keeps.
	RecorderJobs = 100
	// RecorderFailures is how many failed checkpoints it keeps per job.
	RecorderFailures = 10
)

// RecordedSpan is one span of a recorded trace.
type RecordedSpan struct {
	SpanID   string            `json:"span_id"`
	ParentID string            `json:"parent_id,omitempty"`
	Name     string            `json:"name"`
	Start    time.Time         `json:"start"`
	End      time.Time         `json:"end"`
	Error    string            `json:"error,omitempty"` // the status description of a span that failed
	Attrs    map[string]string `json:"attributes,omitempty"`
	Service  string            `json:"service,omitempty"`
}

// CheckpointCounts are a job's checkpoints (and savepoints) seen by the
// recorder since the process started.
type CheckpointCounts struct {
	Completed  int `json:"completed"`
	Failed     int `json:"failed"`
	InProgress int `json:"in_progress"`
}

// CheckpointFailure is one failed (aborted) checkpoint.
type CheckpointFailure struct {
	ID     int64     `json:"id"`
	Kind   string    `json:"kind,omitempty"`
	Time   time.Time `json:"time"`
	Reason string    `json:"reason"`
}

type recTrace struct {
	job   *recJob
	id    int64
	spans []RecordedSpan
	done  bool
}

type recJob struct {
	keys     []string
	counts   CheckpointCounts
	failures []CheckpointFailure // newest last
	traces   []trace.TraceID     // oldest first
	byID     map[int64]trace.TraceID
}

// NewRecorder returns an empty recorder.
func NewRecorder() *Recorder {
	return &Recorder{traces: map[trace.TraceID]*recTrace{}, jobs: map[string]*recJob{}}
}

var _ sdktrace.SpanProcessor = (*Recorder)(nil)

func attrMap(kvs []attribute.KeyValue) map[string]string {
	if len(kvs) == 0 {
		return nil
	}
	m := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		m[string(kv.Key)] = kv.Value.Emit()
	}
	return m
}

// OnStart registers the trace of a checkpoint span.
func (r *Recorder) OnStart(_ context.Context, s sdktrace.ReadWriteSpan) {
	if s.Name() != SpanCheckpoint {
		return
	}
	a := attrMap(s.Attributes())
	id, name := a[string(AttrJobID)], a[string(AttrJobName)]
	var cid int64
	for _, kv := range s.Attributes() {
		if kv.Key == AttrCheckpointID {
			cid = kv.Value.AsInt64()
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	j := r.job(id, name)
	j.counts.InProgress++
	tid := s.SpanContext().TraceID()
	if _, ok := r.traces[tid]; ok {
		return // a savepoint inside a stop's trace already kept
	}
	r.traces[tid] = &recTrace{job: j, id: cid}
	r.fifo = append(r.fifo, tid)
	j.byID[cid] = tid
	j.traces = append(j.traces, tid)
	for len(j.traces) > RecorderTraces {
		r.dropTrace(j.traces[0])
	}
}

// dropTrace forgets trace tid.
func (r *Recorder) dropTrace(tid trace.TraceID) {
	t := r.traces[tid]
	if t == nil {
		return
	}
	j := t.job
	if j.byID[t.id] == tid {
		delete(j.byID, t.id)
	}
	if i := slices.Index(j.traces, tid); i >= 0 {
		j.traces = slices.Delete(j.traces, i, i+1)
	}
	r.spans -= len(t.spans)
	delete(r.traces, tid)
}

// job returns the job of these keys, made (and the oldest evicted) if new.
func (r *Recorder) job(id, name string) *recJob {
	if j := r.jobs["id:"+id]; j != nil && id != "" {
		return j
	}
	j := &recJob{byID: map[int64]trace.TraceID{}}
	for _, k := range []string{"id:" + id, "name:" + name} {
		if k != "id:" && k != "name:" {
			j.keys = append(j.keys, k)
			r.jobs[k] = j
		}
	}
	r.order = append(r.order, j)
	for len(r.order) > RecorderJobs {
		old := r.order[0]
		r.order = r.order[1:]
		for _, k := range old.keys {
			if r.jobs[k] == old {
				delete(r.jobs, k)
			}
		}
		for _, tid := range slices.Clone(old.traces) {
			r.dropTrace(tid)
		}
	}
	return j
}

// OnEnd keeps a span of a recorded trace and counts an ended checkpoint.
func (r *Recorder) OnEnd(s sdktrace.ReadOnlySpan) {
	tid := s.SpanContext().TraceID()
	r.mu.Lock()
	defer r.mu.Unlock()
	t := r.traces[tid]
	if t == nil {
		return
	}
	rs := RecordedSpan{SpanID: s.SpanContext().SpanID().String(), Name: s.Name(), Start: s.StartTime(), End: s.EndTime(),
		Attrs: attrMap(s.Attributes())}
	if p := s.Parent(); p.IsValid() && p.TraceID() == tid {
		rs.ParentID = p.SpanID().String()
	}
	if st := s.Status(); st.Code == codes.Error {
		rs.Error = st.Description
		if rs.Error == "" {
			rs.Error = "error"
		}
	}
	if res := s.Resource(); res != nil {
		if v, ok := res.Set().Value("service.name"); ok {
			rs.Service = v.AsString()
		}
	}
	if len(t.spans) < RecorderSpans {
		t.spans = append(t.spans, rs)
		r.spans++
		for n := len(r.fifo); r.spans > RecorderTotalSpans && n > 0; n-- {
			old := r.fifo[0]
			r.fifo = r.fifo[1:]
			if old != tid {
				r.dropTrace(old)
			} else {
				r.fifo = append(r.fifo, tid) // the trace being recorded stays
			}
		}
	}
	if len(r.fifo) > 2*len(r.traces)+64 { // forget the ids of traces dropped by their job's bound
		r.fifo = slices.DeleteFunc(r.fifo, func(id trace.TraceID) bool { return r.traces[id] == nil })
	}
	if s.Name() != SpanCheckpoint {
		return
	}
	j := t.job
	if j.counts.InProgress > 0 {
		j.counts.InProgress--
	}
	if rs.Error == "" {
		j.counts.Completed++
		return
	}
	j.counts.Failed++
	var cid int64
	for _, kv := range s.Attributes() {
		if kv.Key == AttrCheckpointID {
			cid = kv.Value.AsInt64()
		}
	}
	j.failures = append(j.failures, CheckpointFailure{ID: cid, Kind: rs.Attrs[string(AttrCheckpointKind)], Time: rs.End, Reason: rs.Error})
	if n := len(j.failures); n > RecorderFailures {
		j.failures = slices.Delete(j.failures, 0, n-RecorderFailures)
	}
}

// lookup finds a job by its id, else by its name.
func (r *Recorder) lookup(id, name string) *recJob {
	if j := r.jobs["id:"+id]; j != nil && id != "" {
		return j
	}
	if name == "" {
		return nil
	}
	return r.jobs["name:"+name]
}

// Trace returns the spans kept of checkpoint cid of the job (found by id,
// else by name), by start time; false when it has none.
func (r *Recorder) Trace(id, name string, cid int64) ([]RecordedSpan, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	j := r.lookup(id, name)
	if j == nil {
		return nil, false
	}
	tid, ok := j.byID[cid]
	if !ok {
		return nil, false
	}
	spans := slices.Clone(r.traces[tid].spans)
	slices.SortStableFunc(spans, func(a, b RecordedSpan) int { return a.Start.Compare(b.Start) })
	return spans, true
}

// Checkpoints returns the job's checkpoint counts, its latest failed
// checkpoints (newest first) and the ids of the checkpoints whose traces
// are kept (newest first).
func (r *Recorder) Checkpoints(id, name string) (CheckpointCounts, []CheckpointFailure, []int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	j := r.lookup(id, name)
	if j == nil {
		return CheckpointCounts{}, nil, nil
	}
	fs := slices.Clone(j.failures)
	slices.Reverse(fs)
	var ids []int64
	for i := len(j.traces) - 1; i >= 0; i-- {
		if t := r.traces[j.traces[i]]; t != nil {
			ids = append(ids, t.id)
		}
	}
	return j.counts, fs, ids
}

// Shutdown and ForceFlush: nothing is buffered.
func (r *Recorder) Shutdown(context.Context) error   { return nil }
func (r *Recorder) ForceFlush(context.Context) error { return nil }

// recorderSampler samples the traces a Recorder keeps when tracing is off:
// a new checkpoint or stop-with-savepoint trace; the rest follows its
// parent (so the subtasks' spans of a sampled checkpoint are kept).
type recorderSampler struct{}

func (recorderSampler) ShouldSample(p sdktrace.SamplingParameters) sdktrace.SamplingResult {
	if p.Name == SpanCheckpoint || p.Name == SpanStopWithSavepoint {
		return sdktrace.SamplingResult{Decision: sdktrace.RecordAndSample, Tracestate: trace.SpanContextFromContext(p.ParentContext).TraceState()}
	}
	return sdktrace.SamplingResult{Decision: sdktrace.Drop, Tracestate: trace.SpanContextFromContext(p.ParentContext).TraceState()}
}

func (recorderSampler) Description() string { return "streamd checkpoint traces" }

// RecorderSampler is the sampler of a provider made for a Recorder alone.
func RecorderSampler() sdktrace.Sampler { return sdktrace.ParentBased(recorderSampler{}) }
