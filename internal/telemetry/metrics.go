package telemetry

import (
	"context"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
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
	MetricWatermark           = "streamd.watermark"      // a subtask's current input watermark (ms)
	MetricWatermarkLag        = "streamd.watermark.lag"  // wall clock minus that watermark when it advanced
	MetricBusyTime            = "streamd.task.busy.time" // time in the operator's calls
	MetricIdleTime            = "streamd.task.idle.time" // time waiting for input
	MetricCheckpointsFailed   = "streamd.checkpoints.failed"
	MetricCheckpointsDeclined = "streamd.checkpoints.declined"
	MetricLastCheckpointID    = "streamd.checkpoint.last.id"
	MetricLastCheckpointTime  = "streamd.checkpoint.last.time" // when it completed (unix seconds): its age is now minus this
	MetricLastCheckpointDur   = "streamd.checkpoint.last.duration"
	MetricLastCheckpointSize  = "streamd.checkpoint.last.size"
	// MetricDeadLetters counts the records an operator with on_error skip
	// or dead_letter took out of the stream, by streamd.on_error.
	MetricDeadLetters = "streamd.dead_letters"
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

// Metrics holds streamd's instruments. A nil *Metrics (metrics off) is valid:
// every method does nothing.
type Metrics struct {
	RecordsIn           metric.Int64Counter     // records into an operator subtask
	RecordsOut          metric.Int64Counter     // records it emitted
	BatchLatency        metric.Float64Histogram // seconds per batch (one guest process call)
	BackPressure        metric.Float64Counter   // seconds a subtask waited for room downstream
	CheckpointDuration  metric.Float64Histogram // seconds from trigger to completion (coordinator)
	CheckpointSize      metric.Int64Histogram   // bytes of a completed checkpoint (coordinator)
	AlignmentTime       metric.Float64Histogram // seconds of barrier alignment per subtask
	Restarts            metric.Int64Counter     // job restarts (failovers)
	FinalCheckpointWait metric.Float64Histogram // seconds a finished subtask waited for the final checkpoint
	Watermark           metric.Int64Gauge       // a subtask's input watermark, ms
	WatermarkLag        metric.Float64Gauge     // seconds between the wall clock and that watermark
	BusyTime            metric.Float64Counter   // seconds in the operator's calls
	IdleTime            metric.Float64Counter   // seconds waiting for input
	CheckpointsFailed   metric.Int64Counter     // checkpoints aborted, by reason
	CheckpointsDeclined metric.Int64Counter     // subtasks' declines
	LastCheckpointID    metric.Int64Gauge
	LastCheckpointTime  metric.Float64Gauge
	LastCheckpointDur   metric.Float64Gauge
	LastCheckpointSize  metric.Int64Gauge
	DeadLetters         metric.Int64Counter // records skipped or sent to a dead-letter sink
}

// NewMetrics makes the instruments from mp's meter.
func NewMetrics(mp metric.MeterProvider) (*Metrics, error) {
	m := mp.Meter(ScopeName)
	var (
		x    Metrics
		errs [20]error
	)
	x.RecordsIn, errs[0] = m.Int64Counter(MetricRecordsIn, metric.WithUnit("{record}"),
		metric.WithDescription("Records received by an operator subtask."))
	x.RecordsOut, errs[1] = m.Int64Counter(MetricRecordsOut, metric.WithUnit("{record}"),
		metric.WithDescription("Records emitted by an operator subtask."))
	x.BatchLatency, errs[2] = m.Float64Histogram(MetricBatchLatency, metric.WithUnit("s"),
		metric.WithDescription("Time an operator subtask took for one batch."),
		metric.WithExplicitBucketBoundaries(latencyBuckets...))
	x.BackPressure, errs[3] = m.Float64Counter(MetricBackPressure, metric.WithUnit("s"),
		metric.WithDescription("Time an operator subtask was blocked sending downstream."))
	x.CheckpointDuration, errs[4] = m.Float64Histogram(MetricCheckpointDuration, metric.WithUnit("s"),
		metric.WithDescription("Time from a checkpoint's trigger to its completion."),
		metric.WithExplicitBucketBoundaries(durationBuckets...))
	x.CheckpointSize, errs[5] = m.Int64Histogram(MetricCheckpointSize, metric.WithUnit("By"),
		metric.WithDescription("State size of a completed checkpoint."),
		metric.WithExplicitBucketBoundaries(sizeBuckets...))
	x.AlignmentTime, errs[6] = m.Float64Histogram(MetricAlignmentTime, metric.WithUnit("s"),
		metric.WithDescription("Time a subtask spent aligning checkpoint barriers."),
		metric.WithExplicitBucketBoundaries(durationBuckets...))
	x.Restarts, errs[7] = m.Int64Counter(MetricRestarts, metric.WithUnit("{restart}"),
		metric.WithDescription("Job restarts after a failure."))
	x.FinalCheckpointWait, errs[8] = m.Float64Histogram(MetricFinalCheckpointWait, metric.WithUnit("s"),
		metric.WithDescription("Time a finished subtask waited for the final checkpoint."),
		metric.WithExplicitBucketBoundaries(durationBuckets...))
	x.Watermark, errs[9] = m.Int64Gauge(MetricWatermark, metric.WithUnit("ms"),
		metric.WithDescription("A subtask's current input watermark (the minimum over its channels), in event-time milliseconds."))
	x.WatermarkLag, errs[10] = m.Float64Gauge(MetricWatermarkLag, metric.WithUnit("s"),
		metric.WithDescription("Wall clock minus a subtask's input watermark when it last advanced (for event time in epoch milliseconds)."))
	x.BusyTime, errs[11] = m.Float64Counter(MetricBusyTime, metric.WithUnit("s"),
		metric.WithDescription("Time a subtask spent in its operator's calls (busy); per second: the busy fraction."))
	x.IdleTime, errs[12] = m.Float64Counter(MetricIdleTime, metric.WithUnit("s"),
		metric.WithDescription("Time a subtask waited for input (idle)."))
	x.CheckpointsFailed, errs[13] = m.Int64Counter(MetricCheckpointsFailed, metric.WithUnit("{checkpoint}"),
		metric.WithDescription("Checkpoints aborted, by reason."))
	x.CheckpointsDeclined, errs[14] = m.Int64Counter(MetricCheckpointsDeclined, metric.WithUnit("{decline}"),
		metric.WithDescription("Checkpoints declined by a subtask."))
	x.LastCheckpointID, errs[15] = m.Int64Gauge(MetricLastCheckpointID, metric.WithDescription("Id of the latest completed checkpoint or savepoint."))
	x.LastCheckpointTime, errs[16] = m.Float64Gauge(MetricLastCheckpointTime, metric.WithUnit("s"),
		metric.WithDescription("When the latest checkpoint completed, in unix seconds (its age: now minus this)."))
	x.LastCheckpointDur, errs[17] = m.Float64Gauge(MetricLastCheckpointDur, metric.WithUnit("s"),
		metric.WithDescription("Trigger to completion of the latest checkpoint."))
	x.LastCheckpointSize, errs[18] = m.Int64Gauge(MetricLastCheckpointSize, metric.WithUnit("By"),
		metric.WithDescription("State size of the latest checkpoint."))
	x.DeadLetters, errs[19] = m.Int64Counter(MetricDeadLetters, metric.WithUnit("{record}"),
		metric.WithDescription("Records that made an operator's guest fail or that it rejected, skipped or sent to its dead-letter sink."))
	for _, err := range errs {
		if err != nil {
			return nil, fmt.Errorf("telemetry: instruments: %w", err)
		}
	}
	return &x, nil
}

// Operator returns the handle of one operator subtask, its attributes
// computed once. Nil Metrics: a nil handle, whose methods do nothing.
func (m *Metrics) Operator(l SubtaskLabels) *OperatorMetrics {
	if m == nil {
		return nil
	}
	opt := metric.WithAttributeSet(l.set())
	return &OperatorMetrics{m: m, add: []metric.AddOption{opt}, rec: []metric.RecordOption{opt}}
}

// Checkpoint records a completed checkpoint id of job (id, name): its
// duration from trigger to completion and its state size in bytes, also as
// the latest checkpoint's gauges.
func (m *Metrics) Checkpoint(ctx context.Context, jobID, job string, id int64, d time.Duration, bytes int64) {
	if m == nil {
		return
	}
	opt := metric.WithAttributes(JobAttrs(jobID, job)...)
	m.CheckpointDuration.Record(ctx, d.Seconds(), opt)
	m.CheckpointSize.Record(ctx, bytes, opt)
	m.LastCheckpointID.Record(ctx, id, opt)
	m.LastCheckpointTime.Record(ctx, float64(time.Now().UnixMilli())/1000, opt)
	m.LastCheckpointDur.Record(ctx, d.Seconds(), opt)
	m.LastCheckpointSize.Record(ctx, bytes, opt)
}

// CheckpointFailed counts an aborted checkpoint of job, by reason.
func (m *Metrics) CheckpointFailed(ctx context.Context, jobID, job, reason string) {
	if m == nil {
		return
	}
	m.CheckpointsFailed.Add(ctx, 1, metric.WithAttributes(append(JobAttrs(jobID, job), attribute.String("streamd.reason", reason))...))
}

// CheckpointDeclined counts a subtask's decline of a checkpoint of job.
func (m *Metrics) CheckpointDeclined(ctx context.Context, jobID, job string) {
	if m == nil {
		return
	}
	m.CheckpointsDeclined.Add(ctx, 1, metric.WithAttributes(JobAttrs(jobID, job)...))
}

// Restart counts one restart (failover) of job.
func (m *Metrics) Restart(ctx context.Context, jobID, job string) {
	if m == nil {
		return
	}
	m.Restarts.Add(ctx, 1, metric.WithAttributes(JobAttrs(jobID, job)...))
}

// OperatorMetrics records the metrics of one operator subtask. A nil
// *OperatorMetrics does nothing. It is safe for concurrent use.
type OperatorMetrics struct {
	m   *Metrics
	add []metric.AddOption // built once: passing them does not allocate
	rec []metric.RecordOption
}

// Batch records one batch: in records in, out records emitted, d spent.
func (o *OperatorMetrics) Batch(ctx context.Context, in, out int, d time.Duration) {
	if o == nil {
		return
	}
	o.m.RecordsIn.Add(ctx, int64(in), o.add...)
	if out > 0 {
		o.m.RecordsOut.Add(ctx, int64(out), o.add...)
	}
	o.m.BatchLatency.Record(ctx, d.Seconds(), o.rec...)
}

// DeadLetter counts one record taken out of the stream by on_error mode
// (skip or dead_letter).
func (o *OperatorMetrics) DeadLetter(ctx context.Context, mode string) {
	if o == nil {
		return
	}
	o.m.DeadLetters.Add(ctx, 1, append([]metric.AddOption{metric.WithAttributes(attribute.String("streamd.on_error", mode))}, o.add...)...)
}

// RecordsOut counts records emitted outside a batch (timers, end of input, finish).
func (o *OperatorMetrics) RecordsOut(ctx context.Context, n int) {
	if o == nil || n == 0 {
		return
	}
	o.m.RecordsOut.Add(ctx, int64(n), o.add...)
}

// BackPressure adds d, time spent blocked on a full downstream channel.
func (o *OperatorMetrics) BackPressure(ctx context.Context, d time.Duration) {
	if o == nil {
		return
	}
	o.m.BackPressure.Add(ctx, d.Seconds(), o.add...)
}

// Alignment records the barrier alignment time of one checkpoint.
func (o *OperatorMetrics) Alignment(ctx context.Context, d time.Duration) {
	if o == nil {
		return
	}
	o.m.AlignmentTime.Record(ctx, d.Seconds(), o.rec...)
}

// Watermark records the subtask's input watermark ts (event-time ms) and its
// lag behind the wall clock.
func (o *OperatorMetrics) Watermark(ctx context.Context, ts int64) {
	if o == nil {
		return
	}
	o.m.Watermark.Record(ctx, ts, o.rec...)
	if lag := time.Since(time.UnixMilli(ts)); ts > 0 && lag > -24*time.Hour && lag < 10*365*24*time.Hour {
		o.m.WatermarkLag.Record(ctx, lag.Seconds(), o.rec...)
	}
}

// Busy adds d spent in the operator's calls; Idle d spent waiting for input.
func (o *OperatorMetrics) Busy(ctx context.Context, d time.Duration) {
	if o != nil {
		o.m.BusyTime.Add(ctx, d.Seconds(), o.add...)
	}
}

func (o *OperatorMetrics) Idle(ctx context.Context, d time.Duration) {
	if o != nil {
		o.m.IdleTime.Add(ctx, d.Seconds(), o.add...)
	}
}

// FinalCheckpointWait records how long the finished subtask waited for the final checkpoint.
func (o *OperatorMetrics) FinalCheckpointWait(ctx context.Context, d time.Duration) {
	if o == nil {
		return
	}
	o.m.FinalCheckpointWait.Record(ctx, d.Seconds(), o.rec...)
}
