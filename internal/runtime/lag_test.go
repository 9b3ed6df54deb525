package runtime

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/internal/jobfile"
	"github.com/streamd/streamd/internal/natsutil"
	"github.com/streamd/streamd/internal/telemetry"
)

// gated is a native map that processes nothing until open is closed: a
// job as slow as the test wants.
type gated struct {
	upper
	open <-chan struct{}
}

func (g *gated) Process(ctx context.Context, input int, recs []abi.Record, emit Emitter) error {
	select {
	case <-g.open:
	case <-ctx.Done():
		return ctx.Err()
	}
	return g.upper.Process(ctx, input, recs, emit)
}

// TestSourceLagMetric: N messages are in the stream before the job starts;
// while the job is held up its nats source subtasks report a lag > 0
// (streamd.source.lag and Stats), which reaches 0 once it read everything.
func TestSourceLagMetric(t *testing.T) {
	srv, js := jetStreamServer(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "IN", Subjects: []string{"in.>"}}); err != nil {
		t.Fatal(err)
	}
	const n = 3000
	publishValues(t, js, n)
	m := telemetry.NewMetrics()
	reader := sdkmetric.NewManualReader(sdkmetric.WithProducer(m))
	_ = sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	open := make(chan struct{})
	const p = 2
	g := graph(t,
		src("in", p, &jobfile.SourceSpec{Type: "nats", URL: srv.URL(), Stream: "IN"}),
		op("slow", 1, NativeFactory(func(SubtaskInfo) NativeOperator { return &gated{open: open} }), in("in", control.Rebalance)),
		sink("out", 1, &jobfile.SinkSpec{Type: "discard"}, in("slow", control.Forward)),
	)
	progress := make(chan Stats, 1)
	done := make(chan error, 1)
	go func() {
		_, err := Run(ctx, g, Options{Engine: cachedEngine(t), BatchSize: 16, ChannelCapacity: 2, Metrics: m,
			NATS: natsutil.ConnectOptions{URLs: []string{srv.URL()}},
			Progress: func(s Stats) {
				select {
				case progress <- s:
				default:
				}
			}})
		done <- err
	}()
	lags := func() map[int64]int64 { return sourceLags(t, ctx, reader, "in") }
	wait := func(what string, cond func(map[int64]int64) bool) map[int64]int64 {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			l := lags()
			if len(l) == p && cond(l) {
				return l
			}
			if time.Now().After(deadline) {
				t.Fatalf("source lags %v: %s not reached in 20s", l, what)
			}
			select {
			case err := <-done:
				t.Fatalf("job ended: %v", err)
			case <-time.After(5 * time.Millisecond):
			}
		}
	}
	// Held up, each source subtask (each reads the whole stream) has at
	// most its buffers read: most of the stream is its lag.
	held := wait("every subtask's lag > 0", func(l map[int64]int64) bool { return l[0] > 0 && l[1] > 0 })
	// Stats (the REST API's source) tell it too (Progress: once a second).
	for deadline := time.After(10 * time.Second); ; {
		var st Stats
		select {
		case st = <-progress:
		case <-deadline:
			t.Fatal("no progress with the source's lag in 10s")
		}
		if live := st.Operators[0].Live; len(live) == p && live[0].HasSourceLag && live[1].HasSourceLag {
			if live[0].SourceLag <= 0 || live[1].SourceLag <= 0 {
				t.Errorf("Stats of the held up source: %+v, want lags > 0", live)
			}
			break
		}
	}
	close(open)
	wait("every subtask's lag 0", func(l map[int64]int64) bool { return l[0] == 0 && l[1] == 0 })
	t.Logf("lag held up %v, then 0", held)
	cancel()
	<-done
}

// sourceLags reads the lag gauges of the source subtasks of operator op
// from reader: subtask -> lag.
func sourceLags(t *testing.T, ctx context.Context, reader *sdkmetric.ManualReader, op string) map[int64]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	out := map[int64]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, x := range sm.Metrics {
			if x.Name != telemetry.MetricSourceLag {
				continue
			}
			for _, dp := range x.Data.(metricdata.Gauge[int64]).DataPoints {
				o, _ := dp.Attributes.Value(telemetry.AttrOperator)
				sub, _ := dp.Attributes.Value(telemetry.AttrSubtask)
				if o.AsString() != op {
					t.Fatalf("source lag of operator %q", o.AsString())
				}
				out[sub.AsInt64()] = dp.Value
			}
		}
	}
	return out
}
