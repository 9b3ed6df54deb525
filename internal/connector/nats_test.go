package connector

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/internal/natstest"
	"github.com/streamd/streamd/internal/natsutil"
)

// jsServer starts an embedded JetStream server and creates stream ORDERS on
// "orders.>" with a one-minute duplicate window and atomic publish.
func jsServer(t *testing.T) (natsutil.ConnectOptions, *nats.Conn, jetstream.JetStream) {
	t.Helper()
	s := natstest.Server(t)
	co, err := natsutil.NewConnectOptions(natsutil.URLs(s.URL()))
	if err != nil {
		t.Fatal(err)
	}
	nc := natstest.Connect(t, s.URL())
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}, Duplicates: time.Minute, AllowAtomicPublish: true}); err != nil {
		t.Fatal(err)
	}
	return co, nc, js
}

// publishOrders publishes n messages: message i (0-based, counted from
// first) goes to orders.<region>.c<i%5>, value "order-<i>", with a
// Streamd-Key header "k<i%3>" and, for even i, a Streamd-Timestamp of 1000+i.
func publishOrders(t *testing.T, js jetstream.JetStream, first, n int) {
	t.Helper()
	for i := first; i < first+n; i++ {
		region := "eu"
		if i%4 == 3 {
			region = "us"
		}
		m := &nats.Msg{Subject: fmt.Sprintf("orders.%s.c%d", region, i%5), Data: fmt.Appendf(nil, "order-%d", i), Header: nats.Header{}}
		m.Header.Set(HeaderKey, fmt.Sprintf("k%d", i%3))
		if i%2 == 0 {
			m.Header.Set(HeaderTimestamp, fmt.Sprint(1000+i))
		}
		if _, err := js.PublishMsg(context.Background(), m); err != nil {
			t.Errorf("publish order %d: %v", i, err) // may run on another goroutine: no Fatal
			return
		}
	}
}

type readRec struct {
	key, value string
	ts         int64
	headers    string // the header block, as bytes
}

// readSome reads until max records or EOF, chunk records per Read.
func readSome(t *testing.T, s *NATSSource, chunk, max int) ([]readRec, bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	buf := make([]abi.Record, chunk)
	var out []readRec
	for len(out) < max {
		n, err := s.Read(ctx, buf[:min(chunk, max-len(out))])
		if err == io.EOF {
			return out, true
		}
		if err != nil {
			t.Fatalf("read after %d records: %v", len(out), err)
		}
		for _, r := range buf[:n] {
			out = append(out, readRec{string(r.Key), string(r.Value), r.Timestamp, string(r.Headers)})
		}
	}
	return out, false
}

func natsValues(rs []readRec) []string {
	var v []string
	for _, r := range rs {
		v = append(v, r.value)
	}
	return v
}

func orders(from, to int) []string {
	var v []string
	for i := from; i < to; i++ {
		v = append(v, fmt.Sprintf("order-%d", i))
	}
	return v
}

func TestNATSSourceBounded(t *testing.T) {
	co, _, js := jsServer(t)
	publishOrders(t, js, 0, 50)
	before := time.Now().UnixMilli()
	ctx := context.Background()
	s, err := NewNATSSource(ctx, NATSSourceOptions{Conn: co, Stream: "ORDERS", Bounded: true}, 0, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	publishOrders(t, js, 50, 10) // after the start: beyond the bound
	got, eof := readSome(t, s, 16, 1000)
	if !eof || !slices.Equal(natsValues(got), orders(0, 50)) {
		t.Fatalf("eof %v, read %v", eof, natsValues(got))
	}
	for i, r := range got {
		if r.key != fmt.Sprintf("k%d", i%3) {
			t.Errorf("record %d: key %q from the header", i, r.key)
		}
		if i%2 == 0 && r.ts != int64(1000+i) || i%2 == 1 && (r.ts < before-60_000 || r.ts > before+1000) {
			t.Errorf("record %d: timestamp %d (header for even records, else the stream time near %d)", i, r.ts, before)
		}
	}
	if w := s.Watermark(); w < before-60_000 {
		t.Errorf("watermark %d", w)
	}
	if _, err := s.Read(ctx, make([]abi.Record, 4)); err != io.EOF {
		t.Errorf("read after the end: %v", err)
	}
}

func TestNATSSourceFilterAndKeyFromSubject(t *testing.T) {
	co, _, js := jsServer(t)
	publishOrders(t, js, 0, 40)
	s, err := NewNATSSource(context.Background(), NATSSourceOptions{Conn: co, Stream: "ORDERS", Subject: "orders.us.>", Bounded: true, KeyFrom: KeyFromSubject}, 0, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	got, eof := readSome(t, s, 3, 1000)
	var want []string
	for i := 3; i < 40; i += 4 {
		want = append(want, fmt.Sprintf("order-%d=c%d", i, i%5))
	}
	var have []string
	for _, r := range got {
		have = append(have, r.value+"="+r.key)
	}
	if !eof || !slices.Equal(have, want) {
		t.Fatalf("eof %v\n got %v\nwant %v", eof, have, want)
	}
}

func TestNATSSourceEmptyBounded(t *testing.T) {
	co, _, js := jsServer(t)
	s, err := NewNATSSource(context.Background(), NATSSourceOptions{Conn: co, Stream: "ORDERS", Bounded: true}, 0, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, eof := readSome(t, s, 4, 10); !eof || len(got) != 0 {
		t.Errorf("empty stream: %v, eof %v", got, eof)
	}
	s.Close()
	// Messages exist, but none matches the filter.
	publishOrders(t, js, 0, 3)
	s, err = NewNATSSource(context.Background(), NATSSourceOptions{Conn: co, Stream: "ORDERS", Subject: "orders.none", Bounded: true}, 0, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if got, eof := readSome(t, s, 4, 10); !eof || len(got) != 0 {
		t.Errorf("no match: %v, eof %v", got, eof)
	}
}

// TestNATSSourceResume: a source restored from a position continues where
// the first stopped, and keeps the first one's bound.
func TestNATSSourceResume(t *testing.T) {
	co, _, js := jsServer(t)
	publishOrders(t, js, 0, 50)
	ctx := context.Background()
	o := NATSSourceOptions{Conn: co, Stream: "ORDERS", Bounded: true}
	s, err := NewNATSSource(ctx, o, 0, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	first, eof := readSome(t, s, 7, 21)
	if eof || len(first) != 21 {
		t.Fatalf("first read: %d records, eof %v", len(first), eof)
	}
	pos := s.Position()
	s.Close()
	publishOrders(t, js, 50, 10) // published after the first start: beyond the bound
	s, err = NewNATSSource(ctx, o, 0, 1, pos)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	rest, eof := readSome(t, s, 7, 1000)
	if all := append(natsValues(first), natsValues(rest)...); !eof || !slices.Equal(all, orders(0, 50)) {
		t.Fatalf("eof %v, resumed read %v", eof, all)
	}
	// A position of a bounded source does not fit an unbounded one.
	if _, err := NewNATSSource(ctx, NATSSourceOptions{Conn: co, Stream: "ORDERS"}, 0, 1, pos); err == nil || !strings.Contains(err.Error(), "is of a bounded source") {
		t.Errorf("bounded position for an unbounded source: %v", err)
	}
	if _, err := NewNATSSource(ctx, o, 0, 1, []byte{1, 2}); err == nil || !strings.Contains(err.Error(), "bad position") {
		t.Errorf("bad position: %v", err)
	}
}

func TestNATSSourceParallel(t *testing.T) {
	co, _, js := jsServer(t)
	publishOrders(t, js, 0, 31)
	var all []string
	for i := 0; i < 3; i++ {
		s, err := NewNATSSource(context.Background(), NATSSourceOptions{Conn: co, Stream: "ORDERS", Bounded: true}, i, 3, nil)
		if err != nil {
			t.Fatal(err)
		}
		got, eof := readSome(t, s, 5, 1000)
		s.Close()
		if !eof || len(got) < 9 || len(got) > 12 {
			t.Fatalf("subtask %d: %d records, eof %v", i, len(got), eof)
		}
		all = append(all, natsValues(got)...)
	}
	slices.Sort(all)
	want := orders(0, 31)
	slices.Sort(want)
	if !slices.Equal(all, want) {
		t.Fatalf("subtasks together read %v", all)
	}
}

func TestNATSSourceUnbounded(t *testing.T) {
	co, _, js := jsServer(t)
	publishOrders(t, js, 0, 5)
	s, err := NewNATSSource(context.Background(), NATSSourceOptions{Conn: co, Stream: "ORDERS", WatermarkLag: time.Second}, 0, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	got, _ := readSome(t, s, 10, 5)
	go func() {
		time.Sleep(50 * time.Millisecond)
		publishOrders(t, js, 5, 5)
	}()
	more, eof := readSome(t, s, 10, 5)
	if eof || !slices.Equal(append(natsValues(got), natsValues(more)...), orders(0, 10)) {
		t.Fatalf("eof %v, read %v then %v", eof, natsValues(got), natsValues(more))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := s.Read(ctx, make([]abi.Record, 4)); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("read with nothing to read: %v", err)
	}
}

func TestNATSSourceErrors(t *testing.T) {
	co, _, _ := jsServer(t)
	ctx := context.Background()
	if _, err := NewNATSSource(ctx, NATSSourceOptions{Conn: co, Stream: "NOPE"}, 0, 1, nil); err == nil || !strings.Contains(err.Error(), "nats source NOPE") {
		t.Errorf("missing stream: %v", err)
	}
	if _, err := NewNATSSource(ctx, NATSSourceOptions{Conn: co, Stream: "ORDERS", KeyFrom: "body"}, 0, 1, nil); err == nil || !strings.Contains(err.Error(), `key from "body"`) {
		t.Errorf("bad key mode: %v", err)
	}
}

// TestNATSSourceStart: a source without a position starts at first, new,
// seq:N or time:T; one with a position resumes there whatever its start.
func TestNATSSourceStart(t *testing.T) {
	co, _, js := jsServer(t)
	ctx := context.Background()
	publishOrders(t, js, 0, 20)
	stream, err := js.Stream(ctx, "ORDERS")
	if err != nil {
		t.Fatal(err)
	}
	m10, err := stream.GetMsg(ctx, 11) // order-10
	if err != nil {
		t.Fatal(err)
	}
	if m9, err := stream.GetMsg(ctx, 10); err != nil || !m9.Time.Before(m10.Time) {
		t.Fatalf("orders 9 and 10 stored at %v and %v (%v): want the time to tell them apart", m9.Time, m10.Time, err)
	}
	cut := m10.Time
	for _, tt := range []struct {
		start NATSStart
		from  int // the first order read
	}{
		{NATSStart{}, 0},
		{NATSStart{Kind: StartFirst}, 0},
		{NATSStart{Kind: StartSeq, Seq: 15}, 14},
		{NATSStart{Kind: StartTime, Time: cut}, 10},
		{NATSStart{Kind: StartNew}, 20},
	} {
		s, err := NewNATSSource(ctx, NATSSourceOptions{Conn: co, Stream: "ORDERS", Start: tt.start}, 0, 1, nil)
		if err != nil {
			t.Fatalf("start %s: %v", tt.start, err)
		}
		if tt.start.Kind == StartNew {
			publishOrders(t, js, 20, 6) // after the source opened
		}
		got, _ := readSome(t, s, 4, 5)
		if want := orders(tt.from, tt.from+5); !slices.Equal(natsValues(got), want) {
			t.Errorf("start %s: read %v, want %v", tt.start, natsValues(got), want)
		}
		pos := s.Position()
		s.Close()
		// Resuming ignores the start: it goes on after what was read.
		r, err := NewNATSSource(ctx, NATSSourceOptions{Conn: co, Stream: "ORDERS", Start: NATSStart{Kind: StartNew}}, 0, 1, pos)
		if err != nil {
			t.Fatal(err)
		}
		got, _ = readSome(t, r, 4, 1)
		r.Close()
		if want := orders(tt.from+5, tt.from+6); !slices.Equal(natsValues(got), want) {
			t.Errorf("start %s, resumed: read %v, want %v", tt.start, natsValues(got), want)
		}
	}
	// A bounded source that starts new has nothing to read.
	s, err := NewNATSSource(ctx, NATSSourceOptions{Conn: co, Stream: "ORDERS", Bounded: true, Start: NATSStart{Kind: StartNew}}, 0, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if got, eof := readSome(t, s, 4, 100); !eof || len(got) != 0 {
		t.Errorf("bounded, start new: eof %v, read %v; want nothing and the end", eof, natsValues(got))
	}
}

// TestNATSSourceLag: the source's lag is the messages of the stream after
// what it read: all of them when it opens, fewer as it reads, 0 once it read
// everything; a bounded source's counts up to its bound.
func TestNATSSourceLag(t *testing.T) {
	co, _, js := jsServer(t)
	publishOrders(t, js, 0, 50)
	s, err := NewNATSSource(context.Background(), NATSSourceOptions{Conn: co, Stream: "ORDERS"}, 0, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if n, ok := s.Lag(); !ok || n != 50 {
		t.Fatalf("lag at open %d (known %v), want 50", n, ok)
	}
	readSome(t, s, 10, 10)
	if n, _ := s.Lag(); n != 40 {
		t.Fatalf("lag after 10 of 50: %d, want 40", n)
	}
	readSome(t, s, 10, 40)
	if n, _ := s.Lag(); n != 0 {
		t.Fatalf("lag after all 50: %d, want 0", n)
	}
	b, err := NewNATSSource(context.Background(), NATSSourceOptions{Conn: co, Stream: "ORDERS", Bounded: true, Start: NATSStart{Kind: StartSeq, Seq: 21}}, 0, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	publishOrders(t, js, 50, 5) // past the bound
	if n, _ := b.Lag(); n != 30 {
		t.Fatalf("bounded lag at open: %d, want 30 (21..50)", n)
	}
	if _, eof := readSome(t, b, 7, 100); !eof {
		t.Fatal("bounded source did not end")
	}
	if n, _ := b.Lag(); n != 0 {
		t.Fatalf("bounded lag at its end: %d, want 0", n)
	}
}

// TestNATSSourceTimestampField: with a timestamp field the event time is
// the payload's JSON field (a number of ms or an RFC 3339 string), the
// watermark follows it, and a message without a valid one fails Read,
// naming the stream and the sequence.
func TestNATSSourceTimestampField(t *testing.T) {
	co, _, js := jsServer(t)
	for _, p := range []string{`{"at": 5000}`, `{"at": "1970-01-01T00:00:07Z", "x": 1}`, `{"at": 6000}`, `{"x": 1}`} {
		if _, err := js.Publish(context.Background(), "orders.eu.c1", []byte(p)); err != nil {
			t.Fatal(err)
		}
	}
	s, err := NewNATSSource(context.Background(), NATSSourceOptions{Conn: co, Stream: "ORDERS", Bounded: true, TimestampField: "at", WatermarkLag: time.Second}, 0, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	got, _ := readSome(t, s, 1, 3)
	if ts := []int64{got[0].ts, got[1].ts, got[2].ts}; !slices.Equal(ts, []int64{5000, 7000, 6000}) {
		t.Fatalf("timestamps %v, want [5000 7000 6000]", ts)
	}
	if w := s.Watermark(); w != 6000 {
		t.Errorf("watermark %d, want 7000 - 1s", w)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = s.Read(ctx, make([]abi.Record, 4))
	if err == nil || !strings.Contains(err.Error(), `stream ORDERS sequence 4: bad event timestamp: field "at" is missing`) {
		t.Fatalf("read of a message without the field: %v", err)
	}
}
