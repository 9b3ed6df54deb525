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
)

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
}

// NewMetrics makes the instruments from mp's meter.
func NewMetrics(mp metric.MeterProvider) (*Metrics, error) {
	m := mp.Meter(ScopeName)
	var (
		x    Metrics
		errs [9]error
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
	for _, err := range errs {
		if err != nil {
			return nil, fmt.Errorf("telemetry: instruments: %w", err)
		}
	}
	return &x, nil
}

// Operator returns the handle of one operator subtask, its attributes
// computed once. Nil Metrics: a nil handle, whose methods do nothing.
func (m *Metrics) Operator(job, operator string, subtask int) *OperatorMetrics {
	if m == nil {
		return nil
	}
	opt := metric.WithAttributeSet(attribute.NewSet(Job(job), Operator(operator), Subtask(subtask)))
	return &OperatorMetrics{m: m, add: []metric.AddOption{opt}, rec: []metric.RecordOption{opt}}
}

// Checkpoint records a completed checkpoint of job: its duration from
// trigger to completion and its state size in bytes.
func (m *Metrics) Checkpoint(ctx context.Context, job string, d time.Duration, bytes int64) {
	if m == nil {
		return
	}
	opt := metric.WithAttributes(Job(job))
	m.CheckpointDuration.Record(ctx, d.Seconds(), opt)
	m.CheckpointSize.Record(ctx, bytes, opt)
}

// Restart counts one restart (failover) of job.
func (m *Metrics) Restart(ctx context.Context, job string) {
	if m == nil {
		return
	}
	m.Restarts.Add(ctx, 1, metric.WithAttributes(Job(job)))
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

// FinalCheckpointWait records how long the finished subtask waited for the final checkpoint.
func (o *OperatorMetrics) FinalCheckpointWait(ctx context.Context, d time.Duration) {
	if o == nil {
		return
	}
	o.m.FinalCheckpointWait.Record(ctx, d.Seconds(), o.rec...)
}
