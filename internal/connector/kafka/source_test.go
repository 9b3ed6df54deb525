package kafka

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/internal/connector/kafka/kafkatest"
	"github.com/twmb/franz-go/pkg/kgo"
)

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func srcConfig(c *kafkatest.Cluster, topics ...string) SourceConfig {
	return SourceConfig{Client: ClientConfig{Brokers: c.Brokers}, Topics: topics, DiscoveryInterval: -1}
}

// produceN produces n records "k<i>"/"v<i>" with timestamp base+i to
// topic, round robin over its partitions.
func produceN(t testing.TB, c *kafkatest.Cluster, topic string, partitions int32, from, n int, base int64) {
	t.Helper()
	recs := make([]*kgo.Record, 0, n)
	for i := from; i < from+n; i++ {
		recs = append(recs, &kgo.Record{
			Topic: topic, Partition: int32(i) % partitions,
			Key: []byte("k" + strconv.Itoa(i)), Value: []byte("v" + strconv.Itoa(i)),
			Timestamp: time.UnixMilli(base + int64(i)),
		})
	}
	c.Produce(t, topic, recs...)
}

// readN reads exactly n records from src (with a generous deadline),
// copying them.
func readN(t testing.TB, src *Source, n int) []abi.Record {
	t.Helper()
	ctx := testCtx(t)
	var out []abi.Record
	buf := make([]abi.Record, 64)
	for len(out) < n {
		k, err := src.Read(ctx, buf[:min(len(buf), n-len(out))])
		if err != nil {
			t.Fatalf("read after %d of %d records: %v", len(out), n, err)
		}
		for _, r := range buf[:k] {
			out = append(out, abi.Record{Key: slices.Clone(r.Key), Value: slices.Clone(r.Value), Timestamp: r.Timestamp, Headers: slices.Clone(r.Headers)})
		}
	}
	return out
}

func values(recs []abi.Record) []string {
	var out []string
	for _, r := range recs {
		out = append(out, string(r.Value))
	}
	slices.Sort(out)
	return out
}

func wantValues(from, n int) []string {
	var out []string
	for i := from; i < from+n; i++ {
		out = append(out, "v"+strconv.Itoa(i))
	}
	slices.Sort(out)
	return out
}

func TestAssignmentCoversEveryPartitionOnce(t *testing.T) {
	for p := 1; p <= 8; p++ {
		count := make([]int, p)
		for _, topic := range []string{"a", "orders", "x.y-z"} {
			for part := int32(0); part < 12; part++ {
				i := SubtaskFor(Partition{topic, part}, p)
				if i < 0 || i >= p {
					t.Fatalf("SubtaskFor(%s/%d, %d) = %d", topic, part, p, i)
				}
				if i != SubtaskFor(Partition{topic, part}, p) {
					t.Fatal("not deterministic")
				}
				count[i]++
			}
		}
		// 12 partitions of each topic round robin: at most 3 topics' worth
		// of imbalance.
		if slices.Max(count)-slices.Min(count) > 3 {
			t.Errorf("parallelism %d: unbalanced %v", p, count)
		}
	}
}

func TestRedistributePositions(t *testing.T) {
	all := map[Partition]int64{}
	old := make([]map[Partition]int64, 2)
	for i := range old {
		old[i] = map[Partition]int64{}
	}
	for part := int32(0); part < 7; part++ {
		p := Partition{"t", part}
		all[p] = int64(100 + part)
		old[SubtaskFor(p, 2)][p] = all[p]
	}
	enc := [][]byte{EncodePosition(old[0]), EncodePosition(old[1])}
	for _, np := range []int{1, 2, 3, 5} {
		got, err := RedistributePositions(enc, np)
		if err != nil {
			t.Fatal(err)
		}
		merged := map[Partition]int64{}
		for i, b := range got {
			m, err := DecodePosition(b)
			if err != nil {
				t.Fatal(err)
			}
			for p, off := range m {
				if SubtaskFor(p, np) != i {
					t.Errorf("parallelism %d: %s went to subtask %d", np, p, i)
				}
				merged[p] = off
			}
		}
		if fmt.Sprint(merged) != fmt.Sprint(all) {
			t.Errorf("parallelism %d: %v, want %v", np, merged, all)
		}
	}
	if _, err := RedistributePositions([][]byte{enc[0], enc[0]}, 2); err == nil {
		t.Error("a partition in two positions is accepted")
	}
	if _, err := DecodePosition([]byte{9}); err == nil {
		t.Error("garbage decodes")
	}
}

func TestConfigValidate(t *testing.T) {
	bad := SourceConfig{Client: ClientConfig{Brokers: []string{"nohost"}, SASLMechanism: "GSSAPI"},
		Topics: []string{"bad topic"}, TopicRegex: "(", Start: "yesterday", Isolation: "dirty"}
	err := bad.Validate()
	for _, want := range []string{"brokers[0]", "sasl: unknown mechanism", "topics and topic_regex", "topics[0]", "topic_regex:", "start: unknown position", "isolation: unknown"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() = %v, want it to mention %q", err, want)
		}
	}
	sink := SinkConfig{Client: ClientConfig{Brokers: []string{"h:1"}}, Topic: "out"}
	if err := sink.Validate(); err == nil || !strings.Contains(err.Error(), "job and operator") {
		t.Errorf("exactly-once sink without job: %v", err)
	}
	sink.Delivery = AtLeastOnce
	if err := sink.Validate(); err != nil {
		t.Errorf("at-least-once sink: %v", err)
	}
}

// TestSourceSplitsAndRestore reads a 4-partition topic with 2 subtasks,
// stops half way, restores at parallelism 3 from the redistributed
// positions and checks that every record is read exactly once.
func TestSourceSplitsAndRestore(t *testing.T) {
	c := kafkatest.Start(t)
	c.CreateTopic(t, "in", 4)
	produceN(t, c, "in", 4, 0, 400, 1_000)
	ctx := testCtx(t)

	var got []abi.Record
	var positions [][]byte
	for i := range 2 {
		src, err := NewSource(ctx, srcConfig(c, "in"), i, 2, nil)
		if err != nil {
			t.Fatal(err)
		}
		if n := len(src.Partitions()); n != 2 {
			t.Errorf("subtask %d reads %d partitions, want 2", i, n)
		}
		recs := readN(t, src, 100)
		for _, r := range recs {
			if string(r.Key) != "k"+string(r.Value[1:]) {
				t.Fatalf("record %q has key %q", r.Value, r.Key)
			}
			n, _ := strconv.Atoi(string(r.Value[1:]))
			if r.Timestamp != 1_000+int64(n) {
				t.Fatalf("record %q has timestamp %d", r.Value, r.Timestamp)
			}
		}
		got = append(got, recs...)
		positions = append(positions, src.Position())
		src.Close()
	}
	produceN(t, c, "in", 4, 400, 200, 1_000)
	newPos, err := RedistributePositions(positions, 3)
	if err != nil {
		t.Fatal(err)
	}
	// Each new subtask reads its partitions to their end: 600 in all.
	var srcs []*Source
	for i := range 3 {
		src, err := NewSource(ctx, srcConfig(c, "in"), i, 3, newPos[i])
		if err != nil {
			t.Fatal(err)
		}
		defer src.Close()
		srcs = append(srcs, src)
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, src := range srcs {
		wg.Go(func() {
			for {
				src.refreshEnds(ctx)
				if lag, ok := src.Lag(); ok && lag == 0 {
					return
				}
				buf := make([]abi.Record, 64)
				rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				n, err := src.Read(rctx, buf)
				cancel()
				if err != nil {
					continue // no record within the slice: look at the lag again
				}
				mu.Lock()
				for _, r := range buf[:n] {
					got = append(got, abi.Record{Value: slices.Clone(r.Value)})
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if g, w := values(got), wantValues(0, 600); !slices.Equal(g, w) {
		t.Fatalf("read %d records (%d distinct expected); first differences: %v", len(g), len(w), firstDiff(g, w))
	}
}

func firstDiff(g, w []string) string {
	for i := range min(len(g), len(w)) {
		if g[i] != w[i] {
			return fmt.Sprintf("at %d: %q vs %q", i, g[i], w[i])
		}
	}
	return fmt.Sprintf("lengths %d vs %d", len(g), len(w))
}

func TestSourceStartPositions(t *testing.T) {
	c := kafkatest.Start(t)
	c.CreateTopic(t, "in", 2)
	produceN(t, c, "in", 2, 0, 10, 1_000) // timestamps 1000..1009
	ctx := testCtx(t)
	open := func(cfg SourceConfig, pos []byte) *Source {
		t.Helper()
		src, err := NewSource(ctx, cfg, 0, 1, pos)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { src.Close() })
		return src
	}

	earliest := open(srcConfig(c, "in"), nil)
	latestCfg := srcConfig(c, "in")
	latestCfg.Start = StartLatest
	latest := open(latestCfg, nil)
	tsCfg := srcConfig(c, "in")
	tsCfg.Start, tsCfg.StartTimestamp = StartTimestamp, time.UnixMilli(1_006)
	byTime := open(tsCfg, nil)

	produceN(t, c, "in", 2, 10, 4, 1_000)
	if g, w := values(readN(t, earliest, 14)), wantValues(0, 14); !slices.Equal(g, w) {
		t.Errorf("earliest: %v", g)
	}
	if g, w := values(readN(t, latest, 4)), wantValues(10, 4); !slices.Equal(g, w) {
		t.Errorf("latest: %v", g)
	}
	if g, w := values(readN(t, byTime, 8)), wantValues(6, 8); !slices.Equal(g, w) {
		t.Errorf("timestamp: %v", g)
	}

	// Group offsets: a source commits its checkpointed position on
	// notifyCheckpointComplete; a new source with start group begins there.
	gcfg := srcConfig(c, "in")
	gcfg.Group, gcfg.Start = "new-group", StartGroup
	if g := values(readN(t, open(gcfg, nil), 14)); !slices.Equal(g, wantValues(0, 14)) {
		t.Errorf("group start of a group without offsets: %v", g)
	}
	gcfg = srcConfig(c, "in")
	gcfg.Group = "monitor"
	first := open(gcfg, nil)
	readN(t, first, 5)
	pos := first.Position()
	if err := first.NotifyCheckpointComplete(1, pos); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(time.Minute); ; {
		n, err := first.GroupCommits()
		if err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no group commit within a minute")
		}
		time.Sleep(10 * time.Millisecond)
	}
	gcfg.Start = StartGroup
	fromGroup := open(gcfg, nil)
	want, _ := DecodePosition(pos)
	if got, _ := DecodePosition(fromGroup.Position()); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("group start at %v, want the committed %v", got, want)
	}
}

// TestSourceReadCommitted: records of an aborted transaction are skipped,
// those of a committed one read, and open ones wait.
func TestSourceReadCommitted(t *testing.T) {
	c := kafkatest.Start(t)
	c.CreateTopic(t, "in", 1)
	ctx := testCtx(t)
	txn := c.Client(t, kgo.TransactionalID("test-producer"), kgo.DefaultProduceTopic("in"))
	write := func(commit kgo.TransactionEndTry, vals ...string) {
		t.Helper()
		if err := txn.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		for _, v := range vals {
			if err := txn.ProduceSync(ctx, &kgo.Record{Value: []byte(v)}).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
		if err := txn.EndTransaction(ctx, commit); err != nil {
			t.Fatal(err)
		}
	}
	write(kgo.TryCommit, "v0", "v1")
	write(kgo.TryAbort, "aborted0", "aborted1")
	write(kgo.TryCommit, "v2")

	src, err := NewSource(ctx, srcConfig(c, "in"), 0, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	if g := values(readN(t, src, 3)); !slices.Equal(g, wantValues(0, 3)) {
		t.Errorf("read_committed read %v", g)
	}

	cfg := srcConfig(c, "in")
	cfg.Isolation = ReadUncommitted
	dirty, err := NewSource(ctx, cfg, 0, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer dirty.Close()
	if g := values(readN(t, dirty, 5)); !slices.Contains(g, "aborted0") {
		t.Errorf("read_uncommitted read %v, want the aborted records too", g)
	}
}

// TestSourceDiscoversPartitions: partitions added while the source runs
// are read from their start by the subtask they are assigned to.
func TestSourceDiscoversPartitions(t *testing.T) {
	c := kafkatest.Start(t)
	c.CreateTopic(t, "in", 1)
	ctx := testCtx(t)
	var srcs []*Source
	for i := range 2 {
		src, err := NewSource(ctx, srcConfig(c, "in"), i, 2, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer src.Close()
		srcs = append(srcs, src)
	}
	c.AddPartitions(t, "in", 3)
	produceN(t, c, "in", 4, 0, 40, 1_000)
	total := 0
	var got []abi.Record
	// The clients cache metadata for a second: look until all are found.
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
		n := 0
		for _, src := range srcs {
			if err := src.Discover(ctx); err != nil {
				t.Fatal(err)
			}
			n += len(src.Partitions())
		}
		if n == 4 || time.Now().After(deadline) {
			break
		}
	}
	for _, src := range srcs {
		n := 0
		for _, p := range src.Partitions() {
			if SubtaskFor(p, 2) != slices.Index(srcs, src) {
				t.Errorf("%s on the wrong subtask", p)
			}
			n++
		}
		total += n
		got = append(got, readN(t, src, n*10)...)
	}
	if total != 4 {
		t.Errorf("%d partitions assigned, want 4", total)
	}
	if g := values(got); !slices.Equal(g, wantValues(0, 40)) {
		t.Errorf("read %v", g)
	}
}

// TestSourceRegex: a regex picks topics by whole name.
func TestSourceRegex(t *testing.T) {
	c := kafkatest.Start(t)
	c.CreateTopic(t, "orders-eu", 1)
	c.CreateTopic(t, "orders-us", 1)
	c.CreateTopic(t, "orders-eu-dlq", 1)
	cfg := SourceConfig{Client: ClientConfig{Brokers: c.Brokers}, TopicRegex: `orders-(eu|us)`, DiscoveryInterval: -1}
	src, err := NewSource(testCtx(t), cfg, 0, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	var names []string
	for _, p := range src.Partitions() {
		names = append(names, p.Topic)
	}
	slices.Sort(names)
	if !slices.Equal(names, []string{"orders-eu", "orders-us"}) {
		t.Errorf("regex picked %v", names)
	}
}

// TestSourceWatermarks: per-partition watermarks, the minimum over the
// partitions that are not idle, never going back.
func TestSourceWatermarks(t *testing.T) {
	c := kafkatest.Start(t)
	c.CreateTopic(t, "in", 2)
	now := time.Unix(1_000_000, 0)
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	cfg := srcConfig(c, "in")
	cfg.WatermarkLag = 5 * time.Millisecond
	cfg.PartitionIdleTimeout = time.Minute
	src, err := newSource(testCtx(t), cfg, 0, 1, nil, clock)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	if wm := src.Watermark(); wm != abi.MinWatermark {
		t.Fatalf("watermark before any record: %d", wm)
	}
	// Partition 0 only: partition 1 holds the watermark back.
	c.Produce(t, "in", &kgo.Record{Partition: 0, Value: []byte("a"), Timestamp: time.UnixMilli(100)})
	readN(t, src, 1)
	if wm := src.Watermark(); wm != abi.MinWatermark {
		t.Errorf("watermark with an empty partition not idle: %d", wm)
	}
	// Both idle: it stays.
	advance(2 * time.Minute)
	if wm := src.Watermark(); wm != abi.MinWatermark {
		t.Errorf("watermark with both partitions idle: %d", wm)
	}
	// Partition 0 active again, partition 1 still idle: partition 0 alone decides.
	c.Produce(t, "in", &kgo.Record{Partition: 0, Value: []byte("b"), Timestamp: time.UnixMilli(150)})
	readN(t, src, 1)
	if wm := src.Watermark(); wm != 145 {
		t.Errorf("watermark with partition 1 idle: %d, want 145", wm)
	}
	c.Produce(t, "in", &kgo.Record{Partition: 1, Value: []byte("c"), Timestamp: time.UnixMilli(300)})
	readN(t, src, 1)
	c.Produce(t, "in", &kgo.Record{Partition: 0, Value: []byte("d"), Timestamp: time.UnixMilli(200)})
	if r := readN(t, src, 1); string(r[0].Value) != "d" {
		t.Errorf("read %q", r[0].Value)
	}
	if wm := src.Watermark(); wm != 195 {
		t.Errorf("watermark of partitions at 200 and 300: %d, want 195", wm)
	}
	// A late record does not move it back.
	c.Produce(t, "in", &kgo.Record{Partition: 0, Value: []byte("e"), Timestamp: time.UnixMilli(50)})
	readN(t, src, 1)
	if wm := src.Watermark(); wm != 195 {
		t.Errorf("watermark after a late record: %d, want 195", wm)
	}
}

func TestSourceLag(t *testing.T) {
	c := kafkatest.Start(t)
	c.CreateTopic(t, "in", 2)
	produceN(t, c, "in", 2, 0, 20, 1_000)
	src, err := NewSource(testCtx(t), srcConfig(c, "in"), 0, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	src.refreshEnds(testCtx(t))
	if lag, ok := src.Lag(); !ok || lag != 20 {
		t.Errorf("lag before reading: %d %v, want 20", lag, ok)
	}
	readN(t, src, 15)
	src.refreshEnds(testCtx(t))
	if lag, ok := src.Lag(); !ok || lag != 5 {
		t.Errorf("lag after 15 of 20: %d %v, want 5", lag, ok)
	}
}

func TestSourceMissingTopic(t *testing.T) {
	c := kafkatest.Start(t)
	_, err := NewSource(testCtx(t), srcConfig(c, "nope"), 0, 1, nil)
	if err == nil || !strings.Contains(err.Error(), `topic "nope"`) {
		t.Errorf("missing topic: %v", err)
	}
}
