package kafka

import (
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/internal/connector/kafka/kafkatest"
)

// headersOf is the Kafka headers of a header block, as "name=value" in order.
func headersOf(h []byte) []string {
	var out []string
	abi.EachHeader(h, func(n, v []byte) bool { out = append(out, string(n)+"="+string(v)); return true })
	return out
}

func kafkaHeadersOf(hs []kgo.RecordHeader) []string {
	var out []string
	for _, h := range hs {
		out = append(out, h.Key+"="+string(h.Value))
	}
	return out
}

// TestHeadersEndToEnd: a Kafka record's headers (repeated names and empty
// values included, in order) come out of the source in the record, and
// both sinks write a record's headers as its Kafka headers: the
// exactly-once one from its live transaction, from a restored state, and
// the at-least-once one.
func TestHeadersEndToEnd(t *testing.T) {
	c := kafkatest.Start(t)
	c.CreateTopic(t, "in", 2)
	var in []*kgo.Record
	for i := range 40 {
		r := &kgo.Record{Topic: "in", Partition: int32(i % 2), Key: []byte("k" + strconv.Itoa(i)), Value: []byte("v" + strconv.Itoa(i)),
			Timestamp: time.UnixMilli(1_000 + int64(i))}
		if i%3 != 0 {
			r.Headers = []kgo.RecordHeader{{Key: "trace", Value: []byte("t" + strconv.Itoa(i))}, {Key: "empty"}, {Key: "trace", Value: []byte("again")}}
		}
		in = append(in, r)
	}
	c.Produce(t, "in", in...)
	src, err := NewSource(testCtx(t), srcConfig(c, "in"), 0, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	recs := readN(t, src, len(in))
	want := map[string][]string{}
	for _, r := range in {
		want[string(r.Value)] = kafkaHeadersOf(r.Headers)
	}
	for _, r := range recs {
		if got := headersOf(r.Headers); !slices.Equal(got, want[string(r.Value)]) {
			t.Fatalf("source record %q has headers %q, want %q", r.Value, got, want[string(r.Value)])
		}
	}

	check := func(topic string) {
		t.Helper()
		got := c.ReadCommitted(t, topic)
		if len(got) != len(in) {
			t.Fatalf("%s holds %d records, want %d", topic, len(got), len(in))
		}
		for _, r := range got {
			if h := kafkaHeadersOf(r.Headers); !slices.Equal(h, want[string(r.Value)]) {
				t.Fatalf("%s: record %q has headers %q, want %q", topic, r.Value, h, want[string(r.Value)])
			}
		}
	}
	// Exactly once, live: written, then committed.
	c.CreateTopic(t, "live", 2)
	s := openSink(t, c, "live", 0, 1)
	if err := s.Write(recs); err != nil {
		t.Fatal(err)
	}
	state, err := s.PreCommit(1)
	if err != nil {
		t.Fatal(err)
	}
	if err := commitNow(s, 1); err != nil {
		t.Fatal(err)
	}
	check("live")
	// Exactly once, from the checkpointed state on a restore.
	c.CreateTopic(t, "restored", 2)
	cfg := sinkConfig(c, "restored")
	cfg.Operator = "restored"
	s2, err := NewSink(testCtx(t), cfg, 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if err := s2.CommitPending([][]byte{state}); err != nil {
		t.Fatal(err)
	}
	check("restored")
	// At least once.
	c.CreateTopic(t, "alo", 2)
	acfg := sinkConfig(c, "alo")
	acfg.Delivery = AtLeastOnce
	a, err := NewAnySink(testCtx(t), acfg, 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Write(recs); err != nil {
		t.Fatal(err)
	}
	if err := a.Flush(); err != nil {
		t.Fatal(err)
	}
	check("alo")
	a.Close()
}

// A staged state with a header block cut short is refused, not read past.
func TestStagedHeadersMalformed(t *testing.T) {
	var b stagedBuf
	b.add(abi.Record{Key: []byte("k"), Value: []byte("v"), Headers: abi.AppendHeader(nil, "n", []byte("value"))})
	data := b.records()
	var got []abi.Record
	if err := eachStaged(data, func(r abi.Record) { got = append(got, r) }); err != nil || len(got) != 1 ||
		fmt.Sprint(headersOf(got[0].Headers)) != "[n=value]" {
		t.Fatalf("staged record read back as %v, %v", got, err)
	}
	for n := len(data) - 1; n > 0; n-- {
		if err := eachStaged(data[:n], func(abi.Record) {}); err == nil {
			t.Fatalf("a staged record cut to %d of %d bytes reads", n, len(data))
		}
	}
}
