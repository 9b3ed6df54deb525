package kafka

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/internal/connector"
	"github.com/streamd/streamd/internal/connector/kafka/kafkatest"
)

// BenchmarkSourceToSink moves the same records (4 partitions, 100-byte
// values) from a topic to another on one kfake broker three ways, and
// reports records/s of each and their ratios:
//
//   - raw: franz-go's own loop (kafkatest.CopyLoop), a consumer polling
//     and an idempotent producer producing what it polled, flushed at the
//     end;
//   - eos: Source -> Sink (exactly once), a checkpoint (PreCommit, then
//     Commit as when it completes) every 10,000 records;
//   - alo: Source -> AtLeastOnceSink, Flush at every such checkpoint.
//
// go test -run '^$' -bench SourceToSink -benchtime 3x ./internal/connector/kafka/
func BenchmarkSourceToSink(b *testing.B) {
	const n, every = 100_000, 10_000
	c := kafkatest.Start(b)
	ctx := context.Background()
	value := make([]byte, 100)
	var raw, eos, alo time.Duration
	for iter := 0; b.Loop(); iter++ {
		in := "in" + strconv.Itoa(iter)
		c.BenchInput(b, in, []string{"raw", "eos", "alo"}, n, value)

		start := time.Now()
		c.CopyLoop(b, in, "raw"+in, n)
		raw += time.Since(start)

		cfg := sinkConfig(c, "eos"+in)
		cfg.Job = "bench" + in
		sink, err := NewSink(ctx, cfg, 0, 1)
		if err != nil {
			b.Fatal(err)
		}
		start = time.Now()
		pipe(b, c, in, sink, n, every)
		eos += time.Since(start)

		cfg = sinkConfig(c, "alo"+in)
		cfg.Delivery = AtLeastOnce
		asink, err := NewAtLeastOnceSink(ctx, cfg, 0, 1)
		if err != nil {
			b.Fatal(err)
		}
		start = time.Now()
		pipe(b, c, in, asink, n, every)
		alo += time.Since(start)
	}
	rate := func(d time.Duration) float64 { return float64(n*b.N) / d.Seconds() }
	b.ReportMetric(rate(raw), "raw-rec/s")
	b.ReportMetric(rate(eos), "eos-rec/s")
	b.ReportMetric(rate(alo), "alo-rec/s")
	b.ReportMetric(rate(eos)/rate(raw), "eos/raw")
	b.ReportMetric(rate(alo)/rate(raw), "alo/raw")
	b.ReportMetric(rate(eos)/rate(alo), "eos/alo")
	b.ReportMetric(0, "ns/op")
}

// pipe reads n records of in with a Source and writes them to sink, with a
// checkpoint every every records and one at the end.
func pipe(b *testing.B, c *kafkatest.Cluster, in string, sink connector.Sink, n, every int) {
	ctx := context.Background()
	src, err := NewSource(ctx, srcConfig(c, in), 0, 1, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer src.Close()
	defer sink.Close()
	buf := make([]abi.Record, 1024)
	var id int64
	checkpoint := func() {
		id++
		if tp, ok := sink.(connector.TwoPhaseSink); ok {
			if _, err := tp.PreCommit(id); err != nil {
				b.Fatal(err)
			}
			_ = src.Position()
			if err := tp.Commit(id); err != nil {
				b.Fatal(err)
			}
		} else if err := sink.Flush(); err != nil {
			b.Fatal(err)
		}
	}
	for got, since := 0, 0; got < n; {
		k, err := src.Read(ctx, buf)
		if err != nil {
			b.Fatal(err)
		}
		if err := sink.Write(buf[:k]); err != nil {
			b.Fatal(err)
		}
		got, since = got+k, since+k
		if since >= every {
			checkpoint()
			since = 0
		}
	}
	checkpoint()
}
