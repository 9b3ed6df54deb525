package telemetry

import (
	"context"
	"math"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/instrumentation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/streamd/streamd/control"
)

// Metric names (OpenTelemetry; the Prometheus exporter turns dots into
// underscores and appends the unit and _total, see docs/observability.md).
const (
	MetricRecordsIn           = "streamd.records.in"
	MetricRecordsOut          = "streamd.records.out"
	MetricBatchLatency        = "streamd.batch.latency"
	MetricBackPressure        = "streamd.backpressure.time"
	MetricCheckpointDuration  = "streamd.checkpoint.duration"
	MetricCheckpointSize      = "streamd.checkpoint.size"
	MetricAlignmentTime       = "streamd.checkpoint.alignment.time"
	MetricRestarts            = "streamd.restarts"
	MetricFinalCheckpointWait = "streamd.final_checkpoint.wait"
	MetricWatermark           = "streamd.watermark" // a subtask's current input watermark (ms)
	MetricOutputWatermark     = "streamd.watermark.output"
	MetricWatermarkLag        = "streamd.watermark.lag"  // wall clock minus that watermark when it advanced
	MetricBusyTime            = "streamd.task.busy.time" // time in the operator's calls
	MetricIdleTime            = "streamd.task.idle.time" // time waiting for input
	MetricSourceLag           = "streamd.source.lag"     // messages a source subtask has yet to read
	// MetricDeadLetters counts the records an operator with on_error skip
	// or dead_letter took out of the stream, by streamd.on_error.
	MetricDeadLetters = "streamd.dead_letters"
	// MetricSideOutputDropped counts the records a wasm operator emitted
	// (emit_to) to a side output no edge reads, by attribute output.
	MetricSideOutputDropped = "streamd.side_output.dropped"
	// Job-level totals of an operator's records over all its subtasks
	// and attempts (the per-subtask counters start at 0 in every attempt).
	MetricOperatorRecordsIn   = "streamd.operator.records.in"
	MetricOperatorRecordsOut  = "streamd.operator.records.out"
	MetricCheckpointsFailed   = "streamd.checkpoints.failed"
	MetricCheckpointsDeclined = "streamd.checkpoints.declined"
	MetricLastCheckpointID    = "streamd.checkpoint.last.id"
	MetricLastCheckpointTime  = "streamd.checkpoint.last.time" // when it completed (unix seconds): its age is now minus this
	MetricLastCheckpointDur   = "streamd.checkpoint.last.duration"
	MetricLastCheckpointSize  = "streamd.checkpoint.last.size"
)

// SubtaskLabels name one operator subtask on its metrics.
type SubtaskLabels struct {
	JobID, Job string // the deployed job's id ("" -> Job), the job's name
	Attempt    int
	Host       string // "" when not on a host (streamd run): no label
	Operator   string
	Subtask    int
}

func (l SubtaskLabels) set() attribute.Set {
	kv := append(JobAttrs(l.JobID, l.Job), Attempt(l.Attempt), Operator(l.Operator), Subtask(l.Subtask))
	if l.Host != "" {
		kv = append(kv, Host(l.Host))
	}
	return attribute.NewSet(kv...)
}

var (
	latencyBuckets  = []float64{1e-5, 5e-5, 1e-4, 5e-4, 1e-3, 5e-3, 0.01, 0.05, 0.1, 0.5, 1, 5}
	durationBuckets = []float64{0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300}
	sizeBuckets     = []float64{1 << 10, 16 << 10, 256 << 10, 1 << 20, 16 << 20, 256 << 20, 1 << 30, 16 << 30}
)

// Metrics are streamd's per-job and per-subtask metric series. A nil
// *Metrics (metrics off) is valid: every method does nothing.
//
// The series are not OpenTelemetry instruments, whose series live as long
// as the MeterProvider: Metrics is an sdkmetric.Producer, given to the
// reader (the Prometheus exporter, WithProducer), that reports at each
// collection the series of the subtasks and jobs that still run. A
// subtask's series go when OperatorMetrics.Close is called (its attempt
// ended: the job finished, failed or was canceled, or a failover replaced
// the attempt), a job's when EndJob is; either is reported once more, with
// its final values, at the next collection, so a scrape between the last
// update and the end loses nothing; after that the series are gone.
type Metrics struct {
	mu       sync.Mutex
	subtasks map[*OperatorMetrics]struct{}
	jobs     map[jobKey]*jobMetrics
	// ended are the series removed since the last collection: reported
	// once more.
	endedSubtasks []*OperatorMetrics
	endedJobs     []*jobMetrics
	// ops are the job-level totals of each operator: the records of its
	// ended subtasks (live ones are added at collection).
	ops      map[opKey]*opTotals
	endedOps map[opKey]*opTotals
}

type opKey struct {
	job jobKey
	op  string
}

// opTotals are the records of an operator's ended subtasks.
type opTotals struct {
	attrs   attribute.Set
	start   time.Time
	in, out int64
}

var _ sdkmetric.Producer = (*Metrics)(nil)

type jobKey struct{ id, name string }

// NewMetrics returns an empty set of series. Give it to the reader that
// exports them (sdkmetric.WithProducer, the Prometheus exporter's
// WithProducer).
func NewMetrics() *Metrics {
	return &Metrics{subtasks: map[*OperatorMetrics]struct{}{}, jobs: map[jobKey]*jobMetrics{}, ops: map[opKey]*opTotals{}, endedOps: map[opKey]*opTotals{}}
}

// Operator returns the live handle of one operator subtask, its series
// exported until Close. Nil Metrics: a handle that counts for Stats but
// exports nothing.
func (m *Metrics) Operator(l SubtaskLabels) *OperatorMetrics {
	o := NewOperatorMetrics(l)
	m.Register(o)
	return o
}

// Register exports o's series (nil m: nothing) until o.Close.
func (m *Metrics) Register(o *OperatorMetrics) {
	if m == nil || o == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if o.m != nil {
		return
	}
	o.m = m
	if _, ok := m.ops[o.key]; !ok {
		m.ops[o.key] = &opTotals{attrs: attribute.NewSet(append(JobAttrs(o.key.job.id, o.key.job.name), Operator(o.key.op))...), start: time.Now()}
	}
	o.batch = newHistogram(latencyBuckets)
	o.align = newHistogram(durationBuckets)
	o.finalWait = newHistogram(durationBuckets)
	o.exported.Store(true)
	m.subtasks[o] = struct{}{}
}

// Subtasks is how many subtasks' series are exported now (ended ones not
// yet reported once more included).
func (m *Metrics) Subtasks() int {
	if m == nil {
		return 0
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.subtasks) + len(m.endedSubtasks)
}

// job returns job (id, name)'s series, made on first use (m.mu held).
func (m *Metrics) job(id, name string) *jobMetrics {
	if id == "" {
		id = name
	}
	k := jobKey{id, name}
	j := m.jobs[k]
	if j == nil {
		j = &jobMetrics{attrs: attribute.NewSet(JobAttrs(id, name)...), start: time.Now(),
			dur: newHistogram(durationBuckets), size: newHistogram(sizeBuckets), failed: map[string]int64{}}
		for _, r := range control.AbortReasons { // exported at 0 from the start
			j.failed[string(r)] = 0
		}
		m.jobs[k] = j
	}
	return j
}

// StartJob makes the job-level series of job (id, name), so its counters
// (restarts, checkpoints failed by each reason, declined) are exported from
// 0 before their first increment.
func (m *Metrics) StartJob(id, name string) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.job(id, name)
}

// EndJob removes the job-level series of job (id, name): it finished,
// failed, was canceled or stopped (reported once more at the next
// collection).
func (m *Metrics) EndJob(id, name string) {
	if m == nil {
		return
	}
	if id == "" {
		id = name
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if j := m.jobs[jobKey{id, name}]; j != nil {
		delete(m.jobs, jobKey{id, name})
		m.endedJobs = append(m.endedJobs, j)
	}
	for k, t := range m.ops {
		if k.job == (jobKey{id, name}) {
			delete(m.ops, k)
			m.endedOps[k] = t
		}
	}
}

// Checkpoint records a completed checkpoint id of job (id, name): its
// duration from trigger to completion and its state size in bytes, also as
// the latest checkpoint's gauges.
func (m *Metrics) Checkpoint(_ context.Context, jobID, job string, id int64, d time.Duration, bytes int64) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	j := m.job(jobID, job)
	j.dur.record(d.Seconds())
	j.size.record(float64(bytes))
	j.last = true
	j.lastID, j.lastTime, j.lastDur, j.lastSize = id, float64(time.Now().UnixMilli())/1000, d.Seconds(), bytes
}

// CheckpointFailed counts an aborted checkpoint of job, by reason.
func (m *Metrics) CheckpointFailed(_ context.Context, jobID, job, reason string) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.job(jobID, job).failed[reason]++
}

// CheckpointDeclined counts a subtask's decline of a checkpoint of job.
func (m *Metrics) CheckpointDeclined(_ context.Context, jobID, job string) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.job(jobID, job).declined++
}

// Restart counts one restart (failover) of job.
func (m *Metrics) Restart(_ context.Context, jobID, job string) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.job(jobID, job).restarts++
}

// jobMetrics are one job's series (guarded by Metrics.mu).
type jobMetrics struct {
	attrs     attribute.Set
	start     time.Time
	dur, size *histogram
	last      bool // a checkpoint completed: the last.* gauges have values
	lastID    int64
	lastTime  float64
	lastDur   float64
	lastSize  int64
	failed    map[string]int64
	declined  int64
	restarts  int64
}

// OperatorMetrics are the live counters of one operator subtask. The
// runtime keeps one per subtask whether metrics are on or not (its Stats,
// the REST API and console read them: Live); registered with a Metrics,
// they are exported too, and histograms are recorded. A nil
// *OperatorMetrics does nothing. It is safe for concurrent use.
type OperatorMetrics struct {
	attrs    attribute.Set
	key      opKey // the job and operator (job-level totals)
	start    time.Time
	m        *Metrics    // set by Register (under its mu)
	exported atomic.Bool // registered: record the histograms

	in, out                  atomic.Int64
	backPressure, busy, idle atomic.Int64 // nanoseconds
	watermark                atomic.Int64 // math.MinInt64: none yet
	outWatermark             atomic.Int64 // math.MinInt64: none yet
	watermarkLag             atomic.Int64 // nanoseconds, when it advanced
	hasLag                   atomic.Bool
	sourceLag                atomic.Pointer[func() (int64, bool)]
	deadSkip, deadLetter     atomic.Int64           // records taken out by on_error skip, dead_letter
	onError                  atomic.Pointer[string] // the operator's on_error mode: its counter is exported from 0
	sideDropped              sync.Map               // side-output name -> *atomic.Int64: records dropped (unread output)

	batch, align, finalWait *histogram // nil until registered
}

// NewOperatorMetrics returns the counters of the subtask l names,
// exported by no Metrics yet (Metrics.Register).
func NewOperatorMetrics(l SubtaskLabels) *OperatorMetrics {
	id := l.JobID
	if id == "" {
		id = l.Job
	}
	o := &OperatorMetrics{attrs: l.set(), start: time.Now(), key: opKey{jobKey{id, l.Job}, l.Operator}}
	o.watermark.Store(math.MinInt64)
	o.outWatermark.Store(math.MinInt64)
	return o
}

// Close ends the subtask's series: they are reported once more, then no
// more. The counters stay readable (Live).
func (o *OperatorMetrics) Close() {
	if o == nil || !o.exported.Load() {
		return
	}
	m := o.m
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.subtasks[o]; ok {
		delete(m.subtasks, o)
		m.endedSubtasks = append(m.endedSubtasks, o)
		t := m.ops[o.key]
		if t == nil {
			t = m.endedOps[o.key]
		}
		if t != nil {
			t.in += o.in.Load()
			t.out += o.out.Load()
		}
	}
}

// SubtaskLive are a subtask's counters now.
type SubtaskLive struct {
	// Watermark is the input watermark in event-time ms, OutputWatermark
	// the one it last sent downstream (a source's, or an operator's); the
	// Has fields are false before the first.
	Watermark          int64 `json:"wm,omitempty"`
	HasWatermark       bool  `json:"has_wm,omitempty"`
	OutputWatermark    int64 `json:"out_wm,omitempty"`
	HasOutputWatermark bool  `json:"has_out_wm,omitempty"`
	// BackPressure, Busy and Idle are the time so far blocked sending
	// downstream, in the operator's calls and waiting for input.
	BackPressure time.Duration `json:"bp,omitempty"`
	Busy         time.Duration `json:"busy,omitempty"`
	Idle         time.Duration `json:"idle,omitempty"`
	// SourceLag is what a source subtask has yet to read (a nats source:
	// messages; a kafka source: offsets); HasSourceLag false for other
	// subtasks and before it knows.
	SourceLag    int64 `json:"lag,omitempty"`
	HasSourceLag bool  `json:"has_lag,omitempty"`
}

// Live returns the counters now (the zero value for nil).
func (o *OperatorMetrics) Live() SubtaskLive {
	if o == nil {
		return SubtaskLive{}
	}
	s := SubtaskLive{BackPressure: time.Duration(o.backPressure.Load()), Busy: time.Duration(o.busy.Load()),
		Idle: time.Duration(o.idle.Load())}
	if wm := o.watermark.Load(); wm != math.MinInt64 {
		s.Watermark, s.HasWatermark = wm, true
	}
	if wm := o.outWatermark.Load(); wm != math.MinInt64 {
		s.OutputWatermark, s.HasOutputWatermark = wm, true
	}
	if f := o.sourceLag.Load(); f != nil {
		s.SourceLag, s.HasSourceLag = (*f)()
	}
	return s
}

// SourceLag sets how the subtask's source lag is read (at each collection
// and Live; it must be safe for concurrent use): f returns what the source
// has yet to read and whether it knows.
func (o *OperatorMetrics) SourceLag(f func() (int64, bool)) {
	if o != nil && f != nil {
		o.sourceLag.Store(&f)
	}
}

// Batch records one batch: in records in, out records emitted, d spent.
func (o *OperatorMetrics) Batch(_ context.Context, in, out int, d time.Duration) {
	if o == nil {
		return
	}
	o.in.Add(int64(in))
	if out > 0 {
		o.out.Add(int64(out))
	}
	if o.exported.Load() {
		o.batch.record(d.Seconds())
	}
}

// RecordsOut counts records emitted outside a batch (timers, end of input, finish).
func (o *OperatorMetrics) RecordsOut(_ context.Context, n int) {
	if o == nil || n == 0 {
		return
	}
	o.out.Add(int64(n))
}

// BackPressure adds d, time spent blocked on a full downstream channel.
func (o *OperatorMetrics) BackPressure(_ context.Context, d time.Duration) {
	if o != nil {
		o.backPressure.Add(int64(d))
	}
}

// Alignment records the barrier alignment time of one checkpoint.
func (o *OperatorMetrics) Alignment(_ context.Context, d time.Duration) {
	if o != nil && o.exported.Load() {
		o.align.record(d.Seconds())
	}
}

// Watermark records the subtask's input watermark ts (event-time ms) and its
// lag behind the wall clock.
func (o *OperatorMetrics) Watermark(_ context.Context, ts int64) {
	if o == nil {
		return
	}
	o.watermark.Store(ts)
	o.lag(ts)
}

// OutputWatermark records the watermark ts the subtask sent downstream;
// a source's (source) is also the one its watermark lag is of.
func (o *OperatorMetrics) OutputWatermark(_ context.Context, ts int64, source bool) {
	if o == nil {
		return
	}
	o.outWatermark.Store(ts)
	if source {
		o.lag(ts)
	}
}

// lag records the wall clock minus watermark ts, for ts in epoch ms.
func (o *OperatorMetrics) lag(ts int64) {
	if lag := time.Since(time.UnixMilli(ts)); ts > 0 && lag > -24*time.Hour && lag < 10*365*24*time.Hour {
		o.watermarkLag.Store(int64(lag))
		o.hasLag.Store(true)
	}
}

// Busy adds d spent in the operator's calls; Idle d spent waiting for input.
func (o *OperatorMetrics) Busy(_ context.Context, d time.Duration) {
	if o != nil {
		o.busy.Add(int64(d))
	}
}

// BackPressured is the back-pressured time so far (for BusySince).
func (o *OperatorMetrics) BackPressured() time.Duration {
	if o == nil {
		return 0
	}
	return time.Duration(o.backPressure.Load())
}

// BusySince adds the time since start as busy, less the back-pressure
// since then (bp: BackPressured at start): blocked sending downstream is
// back-pressured, not busy, as in Flink.
func (o *OperatorMetrics) BusySince(ctx context.Context, start time.Time, bp time.Duration) {
	if o != nil {
		o.Busy(ctx, max(0, time.Since(start)-(o.BackPressured()-bp)))
	}
}

func (o *OperatorMetrics) Idle(_ context.Context, d time.Duration) {
	if o != nil {
		o.idle.Add(int64(d))
	}
}

// FinalCheckpointWait records how long the finished subtask waited for the final checkpoint.
func (o *OperatorMetrics) FinalCheckpointWait(_ context.Context, d time.Duration) {
	if o != nil && o.exported.Load() {
		o.finalWait.record(d.Seconds())
	}
}

// histogram is an explicit-bucket histogram, cumulative.
type histogram struct {
	mu     sync.Mutex
	bounds []float64
	counts []uint64 // len(bounds)+1: (-inf, b0], (b0, b1], ..., (bn, +inf)
	n      uint64
	sum    float64
	min    float64
	max    float64
}

func newHistogram(bounds []float64) *histogram {
	return &histogram{bounds: bounds, counts: make([]uint64, len(bounds)+1)}
}

func (h *histogram) record(v float64) {
	i := sort.SearchFloat64s(h.bounds, v) // the first bound >= v
	h.mu.Lock()
	h.counts[i]++
	if h.n == 0 || v < h.min {
		h.min = v
	}
	if h.n == 0 || v > h.max {
		h.max = v
	}
	h.n++
	h.sum += v
	h.mu.Unlock()
}

func (h *histogram) point(attrs attribute.Set, start, now time.Time) metricdata.HistogramDataPoint[float64] {
	h.mu.Lock()
	defer h.mu.Unlock()
	p := metricdata.HistogramDataPoint[float64]{Attributes: attrs, StartTime: start, Time: now, Count: h.n,
		Bounds: h.bounds, BucketCounts: slices.Clone(h.counts), Sum: h.sum}
	if h.n > 0 {
		p.Min, p.Max = metricdata.NewExtrema(h.min), metricdata.NewExtrema(h.max)
	}
	return p
}

// Produce reports the series of the subtasks and jobs that run, and once
// more those ended since the last call (sdkmetric.Producer).
func (m *Metrics) Produce(context.Context) ([]metricdata.ScopeMetrics, error) {
	m.mu.Lock()
	subs := make([]*OperatorMetrics, 0, len(m.subtasks)+len(m.endedSubtasks))
	for o := range m.subtasks {
		subs = append(subs, o)
	}
	subs = append(subs, m.endedSubtasks...)
	m.endedSubtasks = nil
	now := time.Now()
	c := newCollection()
	for _, j := range m.jobs {
		c.job(j, now)
	}
	for _, j := range m.endedJobs {
		c.job(j, now)
	}
	m.endedJobs = nil
	type total struct {
		t       *opTotals
		in, out int64
	}
	totals := map[opKey]*total{}
	for k, t := range m.ops {
		totals[k] = &total{t: t, in: t.in, out: t.out}
	}
	for k, t := range m.endedOps {
		totals[k] = &total{t: t, in: t.in, out: t.out}
	}
	clear(m.endedOps)
	for o := range m.subtasks {
		if t := totals[o.key]; t != nil {
			t.in += o.in.Load()
			t.out += o.out.Load()
		}
	}
	m.mu.Unlock()
	for _, t := range totals {
		c.sumI(MetricOperatorRecordsIn, t.t.attrs, t.t.start, now, t.in)
		c.sumI(MetricOperatorRecordsOut, t.t.attrs, t.t.start, now, t.out)
	}
	for _, o := range subs {
		c.subtask(o, now)
	}
	return []metricdata.ScopeMetrics{{Scope: instrumentation.Scope{Name: ScopeName}, Metrics: c.metrics()}}, nil
}

// collection builds the metricdata of one Produce.
type collection struct {
	sumsI  map[string]*metricdata.Sum[int64]
	sumsF  map[string]*metricdata.Sum[float64]
	gaugeI map[string]*metricdata.Gauge[int64]
	gaugeF map[string]*metricdata.Gauge[float64]
	hists  map[string]*metricdata.Histogram[float64]
}

func newCollection() *collection {
	return &collection{sumsI: map[string]*metricdata.Sum[int64]{}, sumsF: map[string]*metricdata.Sum[float64]{},
		gaugeI: map[string]*metricdata.Gauge[int64]{}, gaugeF: map[string]*metricdata.Gauge[float64]{},
		hists: map[string]*metricdata.Histogram[float64]{}}
}

func (c *collection) sumI(name string, attrs attribute.Set, start, now time.Time, v int64) {
	addSum(c.sumsI, name, attrs, start, now, v)
}

func (c *collection) sumF(name string, attrs attribute.Set, start, now time.Time, v float64) {
	addSum(c.sumsF, name, attrs, start, now, v)
}

func (c *collection) gI(name string, attrs attribute.Set, now time.Time, v int64) {
	addGauge(c.gaugeI, name, attrs, now, v)
}

func (c *collection) gF(name string, attrs attribute.Set, now time.Time, v float64) {
	addGauge(c.gaugeF, name, attrs, now, v)
}

// addSum adds a point of a cumulative monotonic sum (a counter).
func addSum[N int64 | float64](sums map[string]*metricdata.Sum[N], name string, attrs attribute.Set, start, now time.Time, v N) {
	s := sums[name]
	if s == nil {
		s = &metricdata.Sum[N]{Temporality: metricdata.CumulativeTemporality, IsMonotonic: true}
		sums[name] = s
	}
	s.DataPoints = append(s.DataPoints, metricdata.DataPoint[N]{Attributes: attrs, StartTime: start, Time: now, Value: v})
}

// addGauge adds a point of a gauge.
func addGauge[N int64 | float64](gauges map[string]*metricdata.Gauge[N], name string, attrs attribute.Set, now time.Time, v N) {
	g := gauges[name]
	if g == nil {
		g = &metricdata.Gauge[N]{}
		gauges[name] = g
	}
	g.DataPoints = append(g.DataPoints, metricdata.DataPoint[N]{Attributes: attrs, Time: now, Value: v})
}

func (c *collection) hist(name string, p metricdata.HistogramDataPoint[float64]) {
	h := c.hists[name]
	if h == nil {
		h = &metricdata.Histogram[float64]{Temporality: metricdata.CumulativeTemporality}
		c.hists[name] = h
	}
	h.DataPoints = append(h.DataPoints, p)
}

func (c *collection) job(j *jobMetrics, now time.Time) {
	c.hist(MetricCheckpointDuration, j.dur.point(j.attrs, j.start, now))
	c.hist(MetricCheckpointSize, j.size.point(j.attrs, j.start, now))
	if j.last {
		c.gI(MetricLastCheckpointID, j.attrs, now, j.lastID)
		c.gF(MetricLastCheckpointTime, j.attrs, now, j.lastTime)
		c.gF(MetricLastCheckpointDur, j.attrs, now, j.lastDur)
		c.gI(MetricLastCheckpointSize, j.attrs, now, j.lastSize)
	}
	for reason, n := range j.failed {
		kv := append(j.attrs.ToSlice(), attribute.String("streamd.reason", reason))
		c.sumI(MetricCheckpointsFailed, attribute.NewSet(kv...), j.start, now, n)
	}
	c.sumI(MetricCheckpointsDeclined, j.attrs, j.start, now, j.declined)
	c.sumI(MetricRestarts, j.attrs, j.start, now, j.restarts)
}

func (c *collection) subtask(o *OperatorMetrics, now time.Time) {
	a, start := o.attrs, o.start
	c.sumI(MetricRecordsIn, a, start, now, o.in.Load())
	c.sumI(MetricRecordsOut, a, start, now, o.out.Load())
	c.sumF(MetricBackPressure, a, start, now, time.Duration(o.backPressure.Load()).Seconds())
	c.sumF(MetricBusyTime, a, start, now, time.Duration(o.busy.Load()).Seconds())
	c.sumF(MetricIdleTime, a, start, now, time.Duration(o.idle.Load()).Seconds())
	c.hist(MetricBatchLatency, o.batch.point(a, start, now))
	c.hist(MetricAlignmentTime, o.align.point(a, start, now))
	c.hist(MetricFinalCheckpointWait, o.finalWait.point(a, start, now))
	if wm := o.watermark.Load(); wm != math.MinInt64 {
		c.gI(MetricWatermark, a, now, wm)
	}
	if wm := o.outWatermark.Load(); wm != math.MinInt64 {
		c.gI(MetricOutputWatermark, a, now, wm)
	}
	if o.hasLag.Load() {
		c.gF(MetricWatermarkLag, a, now, time.Duration(o.watermarkLag.Load()).Seconds())
	}
	if f := o.sourceLag.Load(); f != nil {
		if n, ok := (*f)(); ok {
			c.gI(MetricSourceLag, a, now, n)
		}
	}
	for _, d := range []struct {
		mode string
		n    int64
	}{{"skip", o.deadSkip.Load()}, {"dead_letter", o.deadLetter.Load()}} {
		if mode := o.onError.Load(); d.n > 0 || (mode != nil && *mode == d.mode) {
			c.sumI(MetricDeadLetters, attribute.NewSet(append(a.ToSlice(), attribute.String("streamd.on_error", d.mode))...), start, now, d.n)
		}
	}
	o.sideDropped.Range(func(k, v any) bool {
		c.sumI(MetricSideOutputDropped, attribute.NewSet(append(a.ToSlice(), attribute.String("output", k.(string)))...), start, now, v.(*atomic.Int64).Load())
		return true
	})
}

// SideOutputDropped counts n records emitted to the side output no edge
// reads.
func (o *OperatorMetrics) SideOutputDropped(output string, n int) {
	if o == nil {
		return
	}
	c, ok := o.sideDropped.Load(output)
	if !ok {
		c, _ = o.sideDropped.LoadOrStore(output, new(atomic.Int64))
	}
	c.(*atomic.Int64).Add(int64(n))
}

// SideOutputDroppedCount is how many records SideOutputDropped counted for output.
func (o *OperatorMetrics) SideOutputDroppedCount(output string) int64 {
	if o == nil {
		return 0
	}
	if c, ok := o.sideDropped.Load(output); ok {
		return c.(*atomic.Int64).Load()
	}
	return 0
}

// OnError says that the operator takes failing records out with on_error
// mode (skip or dead_letter): its dead-letter counter is exported from 0.
func (o *OperatorMetrics) OnError(mode string) {
	if o != nil {
		o.onError.Store(&mode)
	}
}

// DeadLetter counts one record taken out of the stream by on_error mode
// (skip or dead_letter).
func (o *OperatorMetrics) DeadLetter(_ context.Context, mode string) {
	if o == nil {
		return
	}
	if mode == "skip" {
		o.deadSkip.Add(1)
	} else {
		o.deadLetter.Add(1)
	}
}

// descriptions are each metric's unit and description.
var descriptions = map[string][2]string{
	MetricRecordsIn:           {"{record}", "Records received by an operator subtask."},
	MetricRecordsOut:          {"{record}", "Records emitted by an operator subtask."},
	MetricBatchLatency:        {"s", "Time an operator subtask took for one batch."},
	MetricBackPressure:        {"s", "Time an operator subtask was blocked sending downstream."},
	MetricCheckpointDuration:  {"s", "Time from a checkpoint's trigger to its completion."},
	MetricCheckpointSize:      {"By", "State size of a completed checkpoint."},
	MetricAlignmentTime:       {"s", "Time a subtask spent aligning checkpoint barriers."},
	MetricRestarts:            {"{restart}", "Job restarts after a failure."},
	MetricFinalCheckpointWait: {"s", "Time a finished subtask waited for the final checkpoint."},
	MetricWatermark:           {"ms", "A subtask's current input watermark (the minimum over its channels), in event-time milliseconds."},
	MetricWatermarkLag:        {"s", "Wall clock minus a subtask's input watermark (a source's: its output watermark) when it last advanced (for event time in epoch milliseconds)."},
	MetricOutputWatermark:     {"ms", "The watermark a subtask last sent downstream, in event-time milliseconds."},
	MetricBusyTime:            {"s", "Time a subtask spent in its operator's calls (busy); per second: the busy fraction."},
	MetricIdleTime:            {"s", "Time a subtask waited for input (idle)."},
	MetricDeadLetters:         {"{record}", "Records that made an operator's guest fail or that it rejected, skipped or sent to its dead-letter sink."},
	MetricSideOutputDropped:   {"{record}", "Records a wasm operator emitted to a side output that no edge reads (dropped), by output."},
	MetricOperatorRecordsIn:   {"{record}", "Records received by all subtasks of an operator, over all attempts of the job."},
	MetricOperatorRecordsOut:  {"{record}", "Records emitted by all subtasks of an operator, over all attempts of the job."},
	MetricSourceLag:           {"{message}", "What a source subtask has yet to read (a nats source: messages of its stream after its position; a kafka source: offsets before the end of its partitions)."},
	MetricCheckpointsFailed:   {"{checkpoint}", "Checkpoints aborted, by reason."},
	MetricCheckpointsDeclined: {"{decline}", "Checkpoints declined by a subtask."},
	MetricLastCheckpointID:    {"", "Id of the latest completed checkpoint or savepoint."},
	MetricLastCheckpointTime:  {"s", "When the latest checkpoint completed, in unix seconds (its age: now minus this)."},
	MetricLastCheckpointDur:   {"s", "Trigger to completion of the latest checkpoint."},
	MetricLastCheckpointSize:  {"By", "State size of the latest checkpoint."},
}

// metrics returns the collected series, by name.
func (c *collection) metrics() []metricdata.Metrics {
	var out []metricdata.Metrics
	add := func(name string, data metricdata.Aggregation) {
		d := descriptions[name]
		out = append(out, metricdata.Metrics{Name: name, Unit: d[0], Description: d[1], Data: data})
	}
	for n, s := range c.sumsI {
		add(n, *s)
	}
	for n, s := range c.sumsF {
		add(n, *s)
	}
	for n, g := range c.gaugeI {
		add(n, *g)
	}
	for n, g := range c.gaugeF {
		add(n, *g)
	}
	for n, h := range c.hists {
		add(n, *h)
	}
	slices.SortFunc(out, func(a, b metricdata.Metrics) int { return strings.Compare(a.Name, b.Name) })
	return out
}
