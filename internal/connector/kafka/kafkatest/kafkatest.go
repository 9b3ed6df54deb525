// Package kafkatest starts an in-process Kafka cluster (franz-go's kfake)
// for tests, with helpers to create topics, produce, and read what a
// read_committed consumer sees. The kafka connector's tests and the
// end-to-end tests share it.
package kafkatest

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Cluster is an in-process Kafka cluster, closed when the test ends.
type Cluster struct {
	*kfake.Cluster
	Brokers []string
	// ClientOpts are added to every client of the helpers (SASL and TLS
	// options of a cluster started with them).
	ClientOpts []kgo.Opt
}

// Start starts a one-broker cluster (more with kfake.NumBrokers) and
// closes it when tb ends.
func Start(tb testing.TB, opts ...kfake.Opt) *Cluster {
	tb.Helper()
	c, err := kfake.NewCluster(append([]kfake.Opt{kfake.NumBrokers(1)}, opts...)...)
	if err != nil {
		tb.Fatalf("kafkatest: start kfake: %v", err)
	}
	tb.Cleanup(c.Close)
	return &Cluster{Cluster: c, Brokers: c.ListenAddrs()}
}

// Client is a franz-go client of the cluster, closed when tb ends.
func (c *Cluster) Client(tb testing.TB, opts ...kgo.Opt) *kgo.Client {
	tb.Helper()
	all := append([]kgo.Opt{kgo.SeedBrokers(c.Brokers...)}, c.ClientOpts...)
	cl, err := kgo.NewClient(append(all, opts...)...)
	if err != nil {
		tb.Fatalf("kafkatest: client: %v", err)
	}
	tb.Cleanup(cl.Close)
	return cl
}

func ctx(tb testing.TB) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	tb.Cleanup(cancel)
	return c
}

// CreateTopic creates topic with partitions partitions.
func (c *Cluster) CreateTopic(tb testing.TB, topic string, partitions int32) {
	tb.Helper()
	adm := kadm.NewClient(c.Client(tb))
	r, err := adm.CreateTopic(ctx(tb), partitions, 1, nil, topic)
	if err == nil {
		err = r.Err
	}
	if err != nil {
		tb.Fatalf("kafkatest: create topic %s: %v", topic, err)
	}
}

// AddPartitions adds n partitions to topic.
func (c *Cluster) AddPartitions(tb testing.TB, topic string, n int) {
	tb.Helper()
	adm := kadm.NewClient(c.Client(tb))
	r, err := adm.CreatePartitions(ctx(tb), n, topic)
	if err == nil {
		err = r.Error()
	}
	if err != nil {
		tb.Fatalf("kafkatest: add %d partitions to %s: %v", n, topic, err)
	}
}

// Produce produces recs, each to its Partition (of its Topic, or topic),
// and waits for them.
func (c *Cluster) Produce(tb testing.TB, topic string, recs ...*kgo.Record) {
	tb.Helper()
	cl := c.Client(tb, kgo.DefaultProduceTopic(topic), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err := cl.ProduceSync(ctx(tb), recs...).FirstErr(); err != nil {
		tb.Fatalf("kafkatest: produce to %s: %v", topic, err)
	}
}

// sentinelHeader marks the records ReadCommitted appends to know where
// the end is; ReadCommitted leaves them out.
const sentinelHeader = "kafkatest-sentinel"

// ReadCommitted returns every record of topic that a read_committed
// consumer sees, in partition then offset order. To know where the end is
// it appends a sentinel record to every partition and reads up to it
// (sentinels are left out of the result, and of later calls; what a sink
// writes after them is left for a later call): call it on a topic that
// only sinks and tests read. A transaction open when it appends its
// sentinel holds it back until that transaction ends.
func (c *Cluster) ReadCommitted(tb testing.TB, topic string) []*kgo.Record {
	tb.Helper()
	ctx := ctx(tb)
	adm := kadm.NewClient(c.Client(tb))
	tds, err := adm.ListTopics(ctx, topic)
	if err == nil {
		err = tds.Error()
	}
	if err != nil {
		tb.Fatalf("kafkatest: partitions of %s: %v", topic, err)
	}
	pcl := c.Client(tb, kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.DefaultProduceTopic(topic))
	parts := map[int32]kgo.Offset{}
	// The offset of this call's sentinel per partition: records a sink
	// appends after it (the topic may be written while it reads) are not
	// waited for.
	mine := map[int32]int64{}
	for _, pd := range tds[topic].Partitions {
		parts[pd.Partition] = kgo.NewOffset().AtStart()
		r := &kgo.Record{Partition: pd.Partition, Headers: []kgo.RecordHeader{{Key: sentinelHeader}}}
		if err := pcl.ProduceSync(ctx, r).FirstErr(); err != nil {
			tb.Fatalf("kafkatest: sentinel to %s/%d: %v", topic, pd.Partition, err)
		}
		mine[pd.Partition] = r.Offset
	}
	sentinels := map[int32]bool{} // partitions read up to this call's sentinel
	isSentinel := func(r *kgo.Record) bool {
		return len(r.Headers) == 1 && r.Headers[0].Key == sentinelHeader
	}
	cl := c.Client(tb, kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: parts}))
	byPart := map[int32][]*kgo.Record{}
	for len(sentinels) < len(parts) {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			tb.Fatalf("kafkatest: read %s: %v (%d of %d partitions read to the end)", topic, ctx.Err(), len(sentinels), len(parts))
		}
		fs.EachError(func(t string, p int32, err error) { tb.Fatalf("kafkatest: read %s/%d: %v", t, p, err) })
		fs.EachRecord(func(r *kgo.Record) {
			switch {
			case sentinels[r.Partition]: // after this call's sentinel
			case isSentinel(r):
				if r.Offset >= mine[r.Partition] {
					sentinels[r.Partition] = true
				}
			default:
				byPart[r.Partition] = append(byPart[r.Partition], r)
			}
		})
	}
	var out []*kgo.Record
	for p := int32(0); int(p) < len(parts); p++ {
		out = append(out, byPart[p]...)
	}
	return out
}

// BenchInput sets up a round of a benchmark against CopyLoop: topic in
// (4 partitions) holding n records (keys k0..k999, value), and an empty
// topic out+in (4 partitions) for each of outs.
func (c *Cluster) BenchInput(tb testing.TB, in string, outs []string, n int, value []byte) {
	tb.Helper()
	c.CreateTopic(tb, in, 4)
	for _, out := range outs {
		c.CreateTopic(tb, out+in, 4)
	}
	recs := make([]*kgo.Record, n)
	for i := range recs {
		recs[i] = &kgo.Record{Topic: in, Partition: int32(i % 4), Key: []byte("k" + strconv.Itoa(i%1000)), Value: value}
	}
	c.Produce(tb, in, recs...)
}

// CopyLoop is franz-go's own consume-and-produce loop, the yardstick of
// the benchmarks: it reads n records of topic in (read_committed, from the
// start) and produces each, with its key, value and timestamp, to out with
// an idempotent producer, flushed at the end.
func (c *Cluster) CopyLoop(tb testing.TB, in, out string, n int) {
	tb.Helper()
	if err := c.copyLoop(ctx(tb), in, out, n); err != nil {
		tb.Fatal(err)
	}
}

// CopyLoopRead is CopyLoop while a read_committed consumer reads out
// (CountCommitted), until it has seen the n records: the yardstick of a
// pipeline timed until its output is read back.
func (c *Cluster) CopyLoopRead(tb testing.TB, in, out string, n int) {
	tb.Helper()
	done := make(chan error, 1)
	go func() { done <- c.copyLoop(ctx(tb), in, out, n) }()
	c.CountCommitted(tb, out, n, 5*time.Minute)
	if err := <-done; err != nil {
		tb.Fatal(err)
	}
}

func (c *Cluster) copyLoop(ctx context.Context, in, out string, n int) error {
	opts := append([]kgo.Opt{kgo.SeedBrokers(c.Brokers...)}, c.ClientOpts...)
	cl, err := kgo.NewClient(append(opts, kgo.ConsumeTopics(in), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.DefaultProduceTopic(out))...)
	if err != nil {
		return fmt.Errorf("kafkatest: client: %w", err)
	}
	defer cl.Close()
	var mu sync.Mutex
	var perr error
	for got := 0; got < n; {
		fs := cl.PollFetches(ctx)
		if err := fs.Err0(); err != nil {
			return fmt.Errorf("kafkatest: copy %s: %w", in, err)
		}
		fs.EachRecord(func(r *kgo.Record) {
			got++
			cl.Produce(ctx, &kgo.Record{Key: r.Key, Value: r.Value, Timestamp: r.Timestamp}, func(_ *kgo.Record, err error) {
				mu.Lock()
				defer mu.Unlock()
				if err != nil && perr == nil {
					perr = fmt.Errorf("kafkatest: copy to %s: %w", out, err)
				}
			})
		})
	}
	if err := cl.Flush(ctx); err != nil {
		return fmt.Errorf("kafkatest: copy to %s: %w", out, err)
	}
	mu.Lock()
	defer mu.Unlock()
	return perr
}

// CountCommitted waits until a read_committed consumer of topic has seen n
// records (from the start) and returns when it has; it fails tb after
// timeout.
func (c *Cluster) CountCommitted(tb testing.TB, topic string, n int, timeout time.Duration) {
	tb.Helper()
	cl := c.Client(tb, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	defer cl.Close()
	cctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	for got := 0; got < n; {
		fs := cl.PollFetches(cctx)
		if cctx.Err() != nil {
			tb.Fatalf("kafkatest: %d of %d records in %s after %s", got, n, topic, timeout)
		}
		if err := fs.Err0(); err != nil {
			tb.Fatalf("kafkatest: read %s: %v", topic, err)
		}
		got += fs.NumRecords()
	}
}

// KeyedInput is the input of a keyed running count: n records of topic,
// record i with key "key-<i mod keys>" (in partition (i mod keys) mod
// partitions) and value "v-<i>"; want is what a running count per key
// emits for them, "key-k=c" for the c-th record of key k, sorted.
func KeyedInput(topic string, n, keys int, partitions int32) (recs []*kgo.Record, want []string) {
	per := map[int]int{}
	for i := range n {
		k := i % keys
		recs = append(recs, &kgo.Record{Topic: topic, Partition: int32(k) % partitions, Key: fmt.Appendf(nil, "key-%d", k), Value: fmt.Appendf(nil, "v-%d", i)})
		per[k]++
		want = append(want, fmt.Sprintf("key-%d=%d", k, per[k]))
	}
	slices.Sort(want)
	return recs, want
}

// Diff counts the values of want missing from got and those in it more
// than once.
func Diff(got, want []string) (lost, twice int) {
	count := map[string]int{}
	for _, g := range got {
		count[g]++
	}
	for _, w := range want {
		switch count[w] {
		case 0:
			lost++
		case 1:
		default:
			twice++
		}
	}
	return lost, twice
}
