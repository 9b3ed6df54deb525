package cluster

import (
	"context"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/streamd/streamd/internal/cluster/agent"
	"github.com/streamd/streamd/internal/natstest"
)

// TestControllerGauges: the leading controller reports its hosts by state,
// their slots and its jobs by state.
func TestControllerGauges(t *testing.T) {
	srv := natstest.Server(t)
	reader := sdkmetric.NewManualReader()
	c, err := StartController(natstest.Connect(t, srv.URL()), ControllerOptions{ID: "c1", HeartbeatInterval: 50 * time.Millisecond,
		MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	h, err := agent.StartHost(natstest.Connect(t, srv.URL()), agent.HostOptions{ID: "h1", Slots: 3, DataDir: t.TempDir(), HeartbeatInterval: 50 * time.Millisecond, Executor: newSlowExecutor(0)})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	read := func() map[string]int64 {
		var rm metricdata.ResourceMetrics
		if err := reader.Collect(context.Background(), &rm); err != nil {
			t.Fatal(err)
		}
		got := map[string]int64{}
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				g, ok := m.Data.(metricdata.Gauge[int64])
				if !ok {
					continue
				}
				for _, p := range g.DataPoints {
					for _, kv := range p.Attributes.ToSlice() {
						if kv.Key == "streamd.state" || kv.Key == "streamd.kind" {
							got[m.Name+"/"+kv.Value.AsString()] = p.Value
						}
					}
				}
			}
		}
		return got
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := read()
		if got[MetricControllerHosts+"/alive"] == 1 && got[MetricControllerSlots+"/capacity"] == 3 && got[MetricControllerSlots+"/free"] == 3 {
			if got[MetricControllerJobs+"/running"] != 0 || got[MetricControllerHosts+"/lost"] != 0 {
				t.Fatalf("gauges %v: want no jobs and no lost host", got)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("gauges %v: want 1 alive host with 3 free slots", got)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
