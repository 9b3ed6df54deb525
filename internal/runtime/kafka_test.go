package runtime

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/internal/checkpoint"
	"github.com/streamd/streamd/internal/connector/kafka"
	"github.com/streamd/streamd/internal/connector/kafka/kafkatest"
	"github.com/streamd/streamd/internal/jobfile"
	"github.com/streamd/streamd/internal/telemetry"
	"github.com/streamd/streamd/internal/testwasm"
)

// TestKafkaSourceLagAndGroupCommit runs a kafka source (4 partitions, 2
// subtasks) into a held-up operator, with checkpoints: while held, each
// source subtask's lag (streamd.source.lag, Stats) is > 0; released, the
// lag goes to 0; and once a checkpoint completes after the end of the
// input, the consumer group's committed offsets are that checkpoint's
// source positions (the runtime calls NotifyCheckpointComplete on the
// source with what the checkpoint stored).
func TestKafkaSourceLagAndGroupCommit(t *testing.T) {
	c := kafkatest.Start(t)
	c.CreateTopic(t, "in", 4)
	const n = 4000
	recs := make([]*kgo.Record, n)
	for i := range recs {
		recs[i] = &kgo.Record{Topic: "in", Partition: int32(i % 4), Value: fmt.Appendf(nil, "v%d", i)}
	}
	c.Produce(t, "in", recs...)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	dir := t.TempDir()
	job, err := jobfile.ParseJob(fmt.Appendf(nil, `
name: kafka-lag
checkpoint: {interval: 50ms, dir: chk}
operators:
  - uid: in
    parallelism: 2
    source: {type: kafka, brokers: [%s], topics: [in], group: lag-test, discovery_interval: 100ms}
  - uid: slow
    wasm: %s
    inputs: [{from: in, partition: rebalance}]
  - uid: out
    sink: {type: discard}
    inputs: [slow]
`, c.Brokers[0], testwasm.Path(t, "examples/wasm/uppercase/uppercase.wasm")), dir, jobfile.Options{Filename: "kafka-lag.yaml"})
	if err != nil {
		t.Fatal(err)
	}
	// The wasm operator gives way to a native one held until open closes.
	open := make(chan struct{})
	for _, v := range job.Graph.Vertices {
		if v.UID == "slow" {
			v.Spec = NativeFactory(func(SubtaskInfo) NativeOperator { return &gated{open: open} })
		}
	}
	store := openStore(t, job.Checkpoint.Dir)
	m := telemetry.NewMetrics()
	reader := sdkmetric.NewManualReader(sdkmetric.WithProducer(m))
	_ = sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	done := make(chan error, 1)
	go func() {
		_, err := Run(ctx, job.Graph, Options{Engine: cachedEngine(t), BatchSize: 16, ChannelCapacity: 2, Metrics: m,
			Checkpoint: &CheckpointOptions{Store: store, Interval: job.Checkpoint.Interval, Tick: 10 * time.Millisecond}})
		done <- err
	}()
	lags := func() map[int64]int64 { return sourceLags(t, ctx, reader, "in") }
	waitUntil := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not in 60s", what)
			}
			select {
			case err := <-done:
				t.Fatalf("job ended before %s: %v", what, err)
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
	var held map[int64]int64
	waitUntil("both source subtasks lag > 0 while held", func() bool {
		held = lags()
		return len(held) == 2 && held[0] > 0 && held[1] > 0
	})
	close(open)
	waitUntil("both lags 0 once released", func() bool {
		l := lags()
		return len(l) == 2 && l[0] == 0 && l[1] == 0
	})

	// The group's offsets reach the end of every partition, and they are
	// the positions of the newest completed checkpoint.
	adm := kadm.NewClient(c.Client(t))
	group := func() map[kafka.Partition]int64 {
		r, err := adm.FetchOffsets(ctx, "lag-test")
		if err != nil {
			return nil
		}
		out := map[kafka.Partition]int64{}
		r.Each(func(o kadm.OffsetResponse) {
			if o.Err == nil && o.At >= 0 {
				out[kafka.Partition{Topic: o.Topic, Partition: o.Partition}] = o.At
			}
		})
		return out
	}
	end := map[kafka.Partition]int64{}
	for p := range int32(4) {
		end[kafka.Partition{Topic: "in", Partition: p}] = n / 4
	}
	waitUntil("the group's offsets at the end of the input", func() bool { return maps.Equal(group(), end) })
	var positions map[kafka.Partition]int64
	waitUntil("a checkpoint holding the end of the input", func() bool {
		md, err := store.Latest(ctx)
		if err != nil {
			return false
		}
		rs, err := checkpoint.LoadRestoreFrom(ctx, store, md, job.Graph)
		if err != nil {
			t.Fatal(err)
		}
		positions = map[kafka.Partition]int64{}
		for i := range 2 {
			sr := rs.Subtasks[control.SubtaskID{Operator: "in", Index: i}]
			if sr == nil {
				t.Fatalf("checkpoint %d has no state of in/%d", md.ID, i)
			}
			pos, err := kafka.DecodePosition(sr.SourcePosition)
			if err != nil {
				t.Fatal(err)
			}
			maps.Copy(positions, pos)
		}
		return maps.Equal(positions, end)
	})
	if g := group(); !maps.Equal(g, positions) {
		t.Fatalf("group offsets %v, checkpoint positions %v", g, positions)
	}
	t.Logf("lag held %v, then 0; group offsets = checkpoint positions %v", held, positions)
	cancel()
	<-done
}

// TestKafkaHeadersThroughGuests: Kafka record headers (repeated names and
// empty values, in order) go through a job of kafka source (2 subtasks) ->
// Go uppercase (2, rebalanced) -> Rust uppercase -> exactly-once kafka
// sink, with unaligned checkpoints: every output record holds its input's
// headers, and the records without headers stay without.
func TestKafkaHeadersThroughGuests(t *testing.T) {
	c := kafkatest.Start(t)
	c.CreateTopic(t, "in", 2)
	c.CreateTopic(t, "out", 3)
	const n = 3000
	want := map[string][]kgo.RecordHeader{}
	recs := make([]*kgo.Record, n)
	for i := range recs {
		r := &kgo.Record{Topic: "in", Partition: int32(i % 2), Key: fmt.Appendf(nil, "k%d", i%10), Value: fmt.Appendf(nil, "v%d", i)}
		if i%4 != 0 {
			r.Headers = []kgo.RecordHeader{{Key: "trace", Value: fmt.Appendf(nil, "t%d", i)}, {Key: "empty"}, {Key: "trace", Value: []byte("again")}}
		}
		want[strings.ToUpper(string(r.Value))] = r.Headers
		recs[i] = r
	}
	c.Produce(t, "in", recs...)
	dir := t.TempDir()
	job, err := jobfile.ParseJob(fmt.Appendf(nil, `
name: kafka-headers
checkpoint: {interval: 50ms, dir: chk, mode: unaligned}
operators:
  - uid: in
    parallelism: 2
    source: {type: kafka, brokers: [%s], topics: [in]}
  - uid: go-upper
    parallelism: 2
    wasm: %s
    inputs: [{from: in, partition: rebalance}]
  - uid: rust-upper
    wasm: %s
    inputs: [{from: go-upper, partition: rebalance}]
  - uid: out
    sink: {type: kafka, brokers: [%s], topic: out}
    inputs: [rust-upper]
`, c.Brokers[0], testwasm.Path(t, "examples/wasm/uppercase/uppercase.wasm"), testwasm.Path(t, "examples/wasm/uppercase-rust/uppercase_rust.wasm"), c.Brokers[0]),
		dir, jobfile.Options{Filename: "kafka-headers.yaml"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := Run(ctx, job.Graph, Options{Engine: cachedEngine(t), BatchSize: 64, Checkpoint: &CheckpointOptions{
			Store: openStore(t, job.Checkpoint.Dir), Interval: job.Checkpoint.Interval, Mode: control.AlignUnaligned, Tick: 10 * time.Millisecond}})
		done <- err
	}()
	c.CountCommitted(t, "out", n, 2*time.Minute)
	cancel()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	got := c.ReadCommitted(t, "out")
	if len(got) != n {
		t.Fatalf("out holds %d records, want %d", len(got), n)
	}
	for _, r := range got {
		w, ok := want[string(r.Value)]
		if !ok {
			t.Fatalf("unexpected output record %q", r.Value)
		}
		if fmt.Sprint(r.Headers) != fmt.Sprint(w) {
			t.Fatalf("record %q has headers %v, want %v", r.Value, r.Headers, w)
		}
	}
}
