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
	"github.com/streamd/streamd/internal/natsutil"
)

// jsServer starts an embedded JetStream server and creates stream ORDERS on
// "orders.>" with a one-minute duplicate window.
func jsServer(t *testing.T) (natsutil.ConnectOptions, *nats.Conn, jetstream.JetStream) {
	t.Helper()
	s, err := natsutil.StartEmbedded(natsutil.EmbeddedOptions{Port: -1, NoLog: true, StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Shutdown)
	co, err := natsutil.NewConnectOptions(natsutil.URLs(s.URL()))
	if err != nil {
		t.Fatal(err)
	}
	nc, err := co.Connect()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}, Duplicates: time.Minute}); err != nil {
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
			out = append(out, readRec{string(r.Key), string(r.Value), r.Timestamp})
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

// streamMsgs returns the values and message ids of the stream's messages.
func streamMsgs(t *testing.T, js jetstream.JetStream) (vals, ids []string, hdr []nats.Header) {
	t.Helper()
	ctx := context.Background()
	st, err := js.Stream(ctx, "ORDERS")
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := st.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		vals = append(vals, string(m.Data))
		ids = append(ids, m.Header.Get(jetstream.MsgIDHeader))
		hdr = append(hdr, m.Header)
	}
	return vals, ids, hdr
}

func sinkRecs(from, to int) []abi.Record {
	var recs []abi.Record
	for i := from; i < to; i++ {
		r := abi.Record{Value: fmt.Appendf(nil, "out-%d", i), Timestamp: abi.NoTimestamp}
		if i%2 == 0 {
			r.Key, r.Timestamp = fmt.Appendf(nil, "k%d", i), int64(i)
		}
		recs = append(recs, r)
	}
	return recs
}

// TestNATSSinkReplayDeduplicated: a sink writes, checkpoints, writes more and
// fails; restored from the checkpoint it writes the same records again, and
// the stream drops them as duplicates.
func TestNATSSinkReplayDeduplicated(t *testing.T) {
	co, _, js := jsServer(t)
	ctx := context.Background()
	o := NATSSinkOptions{Conn: co, Subject: "orders.out", Job: "job1", Operator: "sink", MaxPending: 16}
	s, err := NewNATSSink(ctx, o, 1, 2)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.CommitPending(nil); err != nil {
		t.Fatal(err)
	}
	if err := s.Write(sinkRecs(0, 100)); err != nil {
		t.Fatal(err)
	}
	state, err := s.PreCommit(7)
	if err != nil {
		t.Fatal(err)
	}
	if s.Acked() != 100 {
		t.Fatalf("%d acks after PreCommit, want 100", s.Acked())
	}
	if err := s.Write(sinkRecs(100, 150)); err != nil {
		t.Fatal(err)
	}
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	s.Close() // the subtask fails here

	s2, err := NewNATSSink(ctx, o, 1, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if err := s2.CommitPending([][]byte{state}); err != nil {
		t.Fatal(err)
	}
	if s2.Epoch() != 0 || s2.Index() != 100 {
		t.Fatalf("restored at epoch %d index %d, want 0 and 100", s2.Epoch(), s2.Index())
	}
	if err := s2.Write(sinkRecs(100, 160)); err != nil { // the replay, and 10 new records
		t.Fatal(err)
	}
	if err := s2.CommitFinal(); err != nil {
		t.Fatal(err)
	}
	if s2.Duplicates() != 50 || s2.Acked() != 60 {
		t.Errorf("replay: %d acks, %d duplicates; want 60 and 50", s2.Acked(), s2.Duplicates())
	}
	vals, ids, hdr := streamMsgs(t, js)
	var want []string
	for _, r := range sinkRecs(0, 160) {
		want = append(want, string(r.Value))
	}
	if !slices.Equal(vals, want) {
		t.Fatalf("stream holds %d messages %v", len(vals), vals)
	}
	if ids[0] != "job1:sink:p2:1:0:0" || ids[159] != "job1:sink:p2:1:0:159" {
		t.Errorf("message ids %s .. %s", ids[0], ids[159])
	}
	if hdr[4].Get(HeaderKey) != "k4" || hdr[4].Get(HeaderTimestamp) != "4" || hdr[5].Get(HeaderKey) != "" || hdr[5].Get(HeaderTimestamp) != "" {
		t.Errorf("headers %v, %v", hdr[4], hdr[5])
	}
}

func TestNATSSinkRescaledEpoch(t *testing.T) {
	co, _, _ := jsServer(t)
	ctx := context.Background()
	o := NATSSinkOptions{Conn: co, Subject: "orders.out", Job: "job1", Operator: "sink"}
	var states [][]byte
	for i := 0; i < 2; i++ {
		s, err := NewNATSSink(ctx, o, i, 2)
		if err != nil {
			t.Fatal(err)
		}
		s.Write(sinkRecs(0, 3))
		st, err := s.PreCommit(9)
		if err != nil {
			t.Fatal(err)
		}
		states = append(states, st)
		s.Close()
	}
	s, err := NewNATSSink(ctx, o, 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.CommitPending(states); err != nil {
		t.Fatal(err)
	}
	if s.Epoch() != 9 || s.Index() != 0 || s.MsgID(9, 0) != "job1:sink:p1:0:9:0" {
		t.Errorf("rescaled: epoch %d index %d id %s", s.Epoch(), s.Index(), s.MsgID(9, 0))
	}
	if err := s.CommitPending([][]byte{{1, 2, 3}}); err == nil {
		t.Error("bad state accepted")
	}
}

func TestNATSSinkNoStream(t *testing.T) {
	co, _, _ := jsServer(t)
	_, err := NewNATSSink(context.Background(), NATSSinkOptions{Conn: co, Subject: "elsewhere", Job: "j", Operator: "o"}, 0, 1)
	if err == nil || !strings.Contains(err.Error(), "no JetStream stream captures the subject") {
		t.Errorf("error %v", err)
	}
}

// TestNATSSinkToSource: what the sink writes, the source reads back with
// the same keys, values and timestamps.
func TestNATSSinkToSource(t *testing.T) {
	co, _, _ := jsServer(t)
	ctx := context.Background()
	s, err := NewNATSSink(ctx, NATSSinkOptions{Conn: co, Subject: "orders.out", Job: "j", Operator: "o"}, 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	recs := sinkRecs(0, 20)
	if err := s.Write(recs); err != nil {
		t.Fatal(err)
	}
	if err := s.CommitFinal(); err != nil {
		t.Fatal(err)
	}
	s.Close()
	src, err := NewNATSSource(ctx, NATSSourceOptions{Conn: co, Stream: "ORDERS", Bounded: true}, 0, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	got, eof := readSome(t, src, 8, 100)
	if !eof || len(got) != len(recs) {
		t.Fatalf("read %d records, eof %v", len(got), eof)
	}
	for i, r := range got {
		if r.value != string(recs[i].Value) || r.key != string(recs[i].Key) || (recs[i].Timestamp != abi.NoTimestamp && r.ts != recs[i].Timestamp) {
			t.Errorf("record %d: %+v, wrote %q/%q@%d", i, r, recs[i].Key, recs[i].Value, recs[i].Timestamp)
		}
	}
}
