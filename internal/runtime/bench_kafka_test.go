package runtime

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/streamd/streamd/host"
	"github.com/streamd/streamd/internal/connector/kafka/kafkatest"
	"github.com/streamd/streamd/internal/jobfile"
	"github.com/streamd/streamd/internal/testwasm"
)

// BenchmarkKafkaPipelineVsRaw moves the same records (4 partitions,
// 100-byte values) from a topic to another on one in-process Kafka (kfake),
// in turn in every op:
//
//   - raw: franz-go's own loop (kafkatest.CopyLoop): a consumer and an
//     idempotent producer producing what it polled;
//   - eos: a job, kafka source -> Rust uppercase (wasm) -> kafka sink
//     exactly once, checkpoints every 200 ms;
//   - alo: the same job with the sink at least once.
//
// Each one's time runs from its start until a read_committed consumer,
// reading its output topic while it runs, has seen every record: the raw
// loop pays for that reader as the jobs do. The module is compiled once
// before the rounds (a job's time is its records', not wazero's
// compiler's). It reports records/s of each and eos-%-of-raw and
// eos-%-of-alo (issue 25: >= 50 and >= 70).
func BenchmarkKafkaPipelineVsRaw(b *testing.B) {
	// Enough records that the wait for the last checkpoint's commit (up
	// to an interval, plus the commit) is a small part of a job's time.
	const n = 300_000
	c := kafkatest.Start(b)
	eng := cachedEngine(b)
	upper := testwasm.Path(b, "examples/wasm/uppercase-rust/uppercase_rust.wasm")
	// Held open, the engine keeps the compiled module for every job's load.
	mod, err := eng.LoadFile(context.Background(), upper)
	if err != nil {
		b.Fatal(err)
	}
	defer mod.Close(context.Background())
	value := make([]byte, 100)
	for i := range value {
		value[i] = 'a' + byte(i%26)
	}
	var raw, eos, alo time.Duration
	for iter := 0; b.Loop(); iter++ {
		in := "in" + strconv.Itoa(iter)
		c.BenchInput(b, in, []string{"raw", "eos", "alo"}, n, value)

		start := time.Now()
		c.CopyLoopRead(b, in, "raw"+in, n)
		raw += time.Since(start)
		eos += kafkaUpperJob(b, c, eng, upper, in, "eos"+in, "exactly_once", n)
		alo += kafkaUpperJob(b, c, eng, upper, in, "alo"+in, "at_least_once", n)
	}
	rate := func(d time.Duration) float64 { return float64(n*b.N) / d.Seconds() }
	b.ReportMetric(rate(raw), "raw-rec/s")
	b.ReportMetric(rate(eos), "eos-rec/s")
	b.ReportMetric(rate(alo), "alo-rec/s")
	b.ReportMetric(100*rate(eos)/rate(raw), "eos-%-of-raw")
	b.ReportMetric(100*rate(alo)/rate(raw), "alo-%-of-raw")
	b.ReportMetric(100*rate(eos)/rate(alo), "eos-%-of-alo")
	b.ReportMetric(0, "ns/op")
}

// kafkaUpperJob runs kafka topic in -> uppercase -> kafka topic out with
// the sink's delivery until out has n records a read_committed consumer
// sees, then cancels it; it returns the time from its start until then.
func kafkaUpperJob(b *testing.B, c *kafkatest.Cluster, eng *host.Engine, upper, in, out, delivery string, n int) time.Duration {
	b.Helper()
	dir := b.TempDir()
	job, err := jobfile.ParseJob(fmt.Appendf(nil, `
name: kafka-upper-%s
checkpoint: {interval: 200ms, dir: chk}
operators:
  - uid: in
    source: {type: kafka, brokers: [%s], topics: [%s]}
  - uid: upper
    wasm: %s
    inputs: [in]
  - uid: out
    sink: {type: kafka, brokers: [%s], topic: %s, delivery: %s}
    inputs: [upper]
`, out, c.Brokers[0], in, upper, c.Brokers[0], out, delivery), dir, jobfile.Options{Filename: "kafka-upper.yaml"})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	start := time.Now()
	go func() {
		_, err := Run(ctx, job.Graph, Options{Engine: eng,
			Checkpoint: &CheckpointOptions{Store: openStore(b, job.Checkpoint.Dir), Interval: job.Checkpoint.Interval}})
		done <- err
	}()
	c.CountCommitted(b, out, n, 5*time.Minute)
	d := time.Since(start)
	cancel()
	if err := <-done; err != nil && ctx.Err() == nil {
		b.Fatal(err)
	}
	return d
}
