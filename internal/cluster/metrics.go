package cluster

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/streamd/streamd/internal/cluster/wire"
	"github.com/streamd/streamd/internal/telemetry"
)

// Controller gauges (docs/observability.md): the hosts it knows by state,
// their slots (capacity and free, of the hosts that are alive) and the jobs
// by state. Only the leader reports jobs and slots: a standby's table is
// not the cluster's. Every series carries the controller's id.
const (
	MetricControllerHosts = "streamd.controller.hosts"
	MetricControllerSlots = "streamd.controller.slots"
	MetricControllerJobs  = "streamd.controller.jobs"
)

// registerMetrics registers the controller's gauges with mp (nil: the
// global provider); the registration ends with the controller.
func (c *Controller) registerMetrics(mp metric.MeterProvider) (metric.Registration, error) {
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	m := mp.Meter(telemetry.ScopeName)
	hosts, err1 := m.Int64ObservableGauge(MetricControllerHosts, metric.WithUnit("{host}"),
		metric.WithDescription("Hosts the leading controller knows, by state (alive, lost)."))
	slots, err2 := m.Int64ObservableGauge(MetricControllerSlots, metric.WithUnit("{slot}"),
		metric.WithDescription("Task slots of the hosts that are alive: capacity and free."))
	jobs, err3 := m.Int64ObservableGauge(MetricControllerJobs, metric.WithUnit("{job}"),
		metric.WithDescription("Jobs in the leading controller's table, by state."))
	for _, err := range []error{err1, err2, err3} {
		if err != nil {
			return nil, fmt.Errorf("cluster: controller metrics: %w", err)
		}
	}
	me := attribute.String("streamd.controller", c.id)
	return m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.term == 0 || c.closed {
			return nil // a standby: nothing of its own to say
		}
		alive, lost, unconfirmed, capacity := 0, 0, 0, 0
		for _, h := range c.hosts {
			switch {
			case h.lost:
				lost++
				continue
			case h.unconfirmed:
				unconfirmed++
				continue
			}
			alive++
			capacity += h.slots
		}
		free := 0
		for _, hs := range c.freeSlotsLocked() {
			free += hs.Free
		}
		o.ObserveInt64(hosts, int64(alive), metric.WithAttributes(me, attribute.String("streamd.state", "alive")))
		o.ObserveInt64(hosts, int64(lost), metric.WithAttributes(me, attribute.String("streamd.state", "lost")))
		o.ObserveInt64(hosts, int64(unconfirmed), metric.WithAttributes(me, attribute.String("streamd.state", "unconfirmed")))
		o.ObserveInt64(slots, int64(capacity), metric.WithAttributes(me, attribute.String("streamd.kind", "capacity")))
		o.ObserveInt64(slots, int64(free), metric.WithAttributes(me, attribute.String("streamd.kind", "free")))
		byState := map[string]int64{}
		for _, j := range c.jobs {
			byState[j.state]++
		}
		for _, st := range []string{wire.JobCreated, wire.JobRunning, wire.JobRestarting, wire.JobFinishing, wire.JobStopping, wire.JobFinished, wire.JobStopped, wire.JobFailed, wire.JobCanceled} {
			o.ObserveInt64(jobs, byState[st], metric.WithAttributes(me, attribute.String("streamd.state", st)))
		}
		return nil
	}, hosts, slots, jobs)
}
