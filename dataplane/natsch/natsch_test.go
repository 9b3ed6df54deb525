package natsch

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/dataplane"
	"github.com/streamd/streamd/internal/natsutil"
)

// startServer runs an embedded core NATS server on a random port for the test.
func startServer(tb testing.TB, maxPayload int32) *natsutil.Server {
	tb.Helper()
	s, err := natsutil.StartEmbedded(natsutil.EmbeddedOptions{Port: -1, NoLog: true, NoJetStream: true, MaxPayload: maxPayload})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(s.Shutdown)
	return s
}

func connect(tb testing.TB, s *natsutil.Server) *nats.Conn {
	tb.Helper()
	nc, err := nats.Connect(s.URL())
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(nc.Close)
	return nc
}

func transport(tb testing.TB, nc *nats.Conn, opts ...Option) *Transport {
	tb.Helper()
	t, err := NewTransport(nc, opts...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { t.Close() })
	return t
}

var testID = ChannelID{Job: "job-1", Attempt: 3, From: "map", FromSubtask: 0, To: "sink", ToSubtask: 1, Input: 0}

func batchOf(recs ...abi.Record) *dataplane.Batch {
	b := dataplane.GetBatch()
	for _, r := range recs {
		b.Append(r)
	}
	return b
}

func rec(i int, size int) abi.Record {
	v := fmt.Appendf(nil, "value-%d-", i)
	for len(v) < size {
		v = append(v, '.')
	}
	return abi.Record{Key: fmt.Appendf(nil, "k%d", i%7), Value: v, Timestamp: int64(i)}
}

// describe renders an event with its records, to compare sent and received.
func describe(ev dataplane.Event) string {
	if ev.Kind != dataplane.KindRecords {
		return ev.String()
	}
	var b strings.Builder
	b.WriteString("records[")
	for _, r := range ev.Batch.Records {
		fmt.Fprintf(&b, "%q=%q@%d ", r.Key, r.Value, r.Timestamp)
	}
	b.WriteString("]")
	return b.String()
}

// recvAll drains a gate over in until the channel ends, optionally pausing
// after every event.
func recvAll(ctx context.Context, in dataplane.Input, pause time.Duration) ([]dataplane.Event, error) {
	g := dataplane.NewInputGate([]dataplane.GateChannel{{In: in}})
	var evs []dataplane.Event
	for {
		_, ev, err := g.Next(ctx)
		if errors.Is(err, dataplane.ErrGateEnded) {
			return evs, nil
		}
		if err != nil {
			return evs, err
		}
		evs = append(evs, ev)
		if pause > 0 {
			time.Sleep(pause)
		}
	}
}

func TestSubjects(t *testing.T) {
	if got, want := testID.DataSubject(), "streamd.v1.data.job-1.3.map.0.sink.1.0"; got != want {
		t.Errorf("data subject %q, want %q", got, want)
	}
	if got, want := testID.CreditSubject(), "streamd.v1.credit.job-1.3.map.0.sink.1.0"; got != want {
		t.Errorf("credit subject %q, want %q", got, want)
	}
	next := testID
	next.Attempt = 4
	if next.DataSubject() == testID.DataSubject() {
		t.Error("a new attempt must use new subjects")
	}
	for _, bad := range []ChannelID{
		{Job: "a.b", From: "x", To: "y"},
		{Job: "j", From: "x*", To: "y"},
		{Job: "j", From: "x", To: ">"},
		{Job: "j", From: "", To: "y"},
		{Job: "j", From: "x", To: "y", ToSubtask: -1},
	} {
		if err := bad.Validate(); err == nil {
			t.Errorf("%+v: no error", bad)
		}
	}
}

func TestWireRoundTrip(t *testing.T) {
	evs := []dataplane.Event{
		dataplane.RecordsEvent(batchOf(rec(1, 10), abi.Record{Value: []byte("no key"), Timestamp: abi.NoTimestamp})),
		dataplane.RecordsEvent(batchOf()),
		dataplane.WatermarkEvent(-5),
		dataplane.WatermarkEvent(abi.MaxWatermark),
		dataplane.BarrierEvent(dataplane.Barrier{ID: 7, Kind: dataplane.Savepoint, IsSync: true}),
		dataplane.BarrierEvent(dataplane.Barrier{ID: 8}),
		dataplane.CancelCheckpointEvent(8),
		dataplane.EndOfDataEvent(true),
		dataplane.EndOfDataEvent(false),
		dataplane.EndOfPartitionEvent(),
	}
	for i, ev := range evs {
		data, err := AppendEvent(nil, uint64(i+1), ev)
		if err != nil {
			t.Fatal(err)
		}
		seq, got, err := DecodeEvent(data)
		if err != nil {
			t.Fatalf("%s: %v", ev, err)
		}
		if seq != uint64(i+1) || describe(got) != describe(ev) {
			t.Errorf("round trip of %s (seq %d): got %s (seq %d)", describe(ev), i+1, describe(got), seq)
		}
		// Every truncation is an error, never a panic or a different event.
		for n := 0; n < len(data); n++ {
			if _, got, err := DecodeEvent(data[:n]); err == nil && describe(got) == describe(ev) && ev.Kind != dataplane.KindRecords {
				t.Errorf("%s truncated to %d bytes decoded without error", ev, n)
			}
		}
	}
	if _, _, err := DecodeEvent([]byte{2, 1, 0, 0, 0, 0, 0, 0, 0, 0}); !errors.Is(err, ErrWire) || !strings.Contains(err.Error(), "version 2") {
		t.Errorf("wrong version: %v", err)
	}
}

func FuzzDecodeEvent(f *testing.F) {
	for _, ev := range []dataplane.Event{dataplane.RecordsEvent(batchOf(rec(1, 5))), dataplane.WatermarkEvent(3), dataplane.BarrierEvent(dataplane.Barrier{ID: 1})} {
		data, _ := AppendEvent(nil, 1, ev)
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		seq, ev, err := DecodeEvent(data)
		if err != nil {
			return
		}
		again, err := AppendEvent(nil, seq, ev)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(again, data) {
			t.Fatalf("decode/encode changed %x to %x", data, again)
		}
	})
}

// TestOrderedMixedEvents sends records and every control event over NATS
// and checks they arrive complete and in order.
func TestOrderedMixedEvents(t *testing.T) {
	nc := connect(t, startServer(t, 0))
	tr := transport(t, nc)
	ch, err := tr.NewChannel(testID)
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	var evs []dataplane.Event
	n := 0
	add := func(ev dataplane.Event) {
		want = append(want, describe(ev))
		evs = append(evs, ev)
	}
	for i := 0; i < 20; i++ {
		var recs []abi.Record
		for j := 0; j < i*13%50; j++ {
			recs = append(recs, rec(n, 30))
			n++
		}
		add(dataplane.RecordsEvent(batchOf(recs...)))
		switch i % 5 {
		case 1:
			add(dataplane.WatermarkEvent(int64(n)))
		case 2:
			add(dataplane.BarrierEvent(dataplane.Barrier{ID: int64(i)}))
		case 3:
			add(dataplane.CancelCheckpointEvent(int64(i - 1)))
		case 4:
			add(dataplane.BarrierEvent(dataplane.Barrier{ID: int64(i), Kind: dataplane.Savepoint, IsSync: i == 19}))
		}
	}
	add(dataplane.WatermarkEvent(abi.MaxWatermark))
	add(dataplane.EndOfDataEvent(true))
	add(dataplane.EndOfPartitionEvent())

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		for _, ev := range evs {
			if err := ch.Output().Send(ctx, ev); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	got, err := recvAll(ctx, ch.Input(), 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	sameEvents(t, "received", describeAll(got), want)
	if err := ch.Output().Send(ctx, dataplane.WatermarkEvent(1)); !errors.Is(err, dataplane.ErrChannelEnded) {
		t.Errorf("send after end-of-partition: %v, want ErrChannelEnded", err)
	}
}

// TestSlowReceiver: a receiver that consumes slowly gets every record, and
// neither the sender's in-flight bytes nor the receiver's queue ever exceed
// the window.
func TestSlowReceiver(t *testing.T) {
	const window = 16 << 10
	s := startServer(t, 0)
	// Sender and receiver on separate connections, as on two hosts.
	r, snd := channelEnds(t, transport(t, connect(t, s), Window(window)), transport(t, connect(t, s), Window(window)))
	const batches, perBatch = 300, 10 // 300 x ~1.2 KB: ~23 windows
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		for i := 0; i < batches; i++ {
			b := dataplane.GetBatch()
			for j := 0; j < perBatch; j++ {
				b.Append(rec(i*perBatch+j, 100))
			}
			if err := snd.Send(ctx, dataplane.RecordsEvent(b)); err != nil {
				done <- err
				return
			}
		}
		done <- snd.Send(ctx, dataplane.EndOfPartitionEvent())
	}()
	g := dataplane.NewInputGate([]dataplane.GateChannel{{In: r}})
	next := 0
	for {
		_, ev, err := g.Next(ctx)
		if errors.Is(err, dataplane.ErrGateEnded) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if ev.Kind == dataplane.KindRecords {
			for _, got := range ev.Batch.Records {
				want := rec(next, 100)
				if !bytes.Equal(got.Value, want.Value) || !bytes.Equal(got.Key, want.Key) || got.Timestamp != want.Timestamp {
					t.Fatalf("record %d: got %q, want %q", next, got.Value, want.Value)
				}
				next++
			}
			ev.Batch.Release()
		}
		if next%200 == 0 {
			time.Sleep(5 * time.Millisecond) // slow consumer: the sender must wait
		}
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if next != batches*perBatch {
		t.Fatalf("received %d records, sent %d", next, batches*perBatch)
	}
	ss, rs := snd.Stats(), r.Stats()
	t.Logf("sender %+v, receiver %+v", ss, rs)
	if ss.MaxInFlight > window || ss.MaxInFlight == 0 {
		t.Errorf("sender had %d bytes in flight, window %d", ss.MaxInFlight, window)
	}
	if rs.MaxQueued > window {
		t.Errorf("receiver queued %d bytes, window %d", rs.MaxQueued, window)
	}
	if ss.CreditWaits == 0 {
		t.Error("the sender never waited for credit: the test does not exercise flow control")
	}
	if ss.Bytes != rs.Bytes || ss.Messages != rs.Messages {
		t.Errorf("sent %d messages (%d bytes), received %d (%d bytes)", ss.Messages, ss.Bytes, rs.Messages, rs.Bytes)
	}
}

// rawPublish publishes a data message directly, bypassing the sender.
func rawPublish(t *testing.T, nc *nats.Conn, seq uint64, ev dataplane.Event) {
	t.Helper()
	data, err := AppendEvent(nil, seq, ev)
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Publish(testID.DataSubject(), data); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
}

// recvErr waits for the receiver's first error, collecting events before it.
func recvErr(t *testing.T, r *Receiver) ([]string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	evs, err := recvAll(ctx, r, 0)
	var got []string
	for _, ev := range evs {
		got = append(got, ev.String())
	}
	if err == nil || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("no error from the receiver (got %v, err %v)", got, err)
	}
	return got, err
}

func TestGapFailsReceiver(t *testing.T) {
	nc := connect(t, startServer(t, 0))
	r, err := transport(t, nc).NewReceiver(testID)
	if err != nil {
		t.Fatal(err)
	}
	rawPublish(t, nc, 1, dataplane.WatermarkEvent(1))
	rawPublish(t, nc, 2, dataplane.WatermarkEvent(2))
	rawPublish(t, nc, 5, dataplane.WatermarkEvent(5))
	got, err := recvErr(t, r)
	if !errors.Is(err, dataplane.ErrSequence) || !strings.Contains(err.Error(), "gap: got message 5, want 3 (2 lost)") || !strings.Contains(err.Error(), "map[0]->sink[1]") {
		t.Errorf("error %q: want a gap error naming the channel", err)
	}
	if strings.Join(got, " ") != "watermark(1) watermark(2)" {
		t.Errorf("events before the gap: %v", got)
	}
	if _, _, err2 := r.TryRecv(); err2 != err {
		t.Errorf("the error is not sticky: then %v", err2)
	}
}

func TestDuplicateFailsReceiver(t *testing.T) {
	nc := connect(t, startServer(t, 0))
	r, err := transport(t, nc).NewReceiver(testID)
	if err != nil {
		t.Fatal(err)
	}
	rawPublish(t, nc, 1, dataplane.WatermarkEvent(1))
	rawPublish(t, nc, 2, dataplane.BarrierEvent(dataplane.Barrier{ID: 1}))
	rawPublish(t, nc, 2, dataplane.BarrierEvent(dataplane.Barrier{ID: 1}))
	_, err = recvErr(t, r)
	if !errors.Is(err, dataplane.ErrSequence) || !strings.Contains(err.Error(), "duplicate: got message 2 again, want 3") {
		t.Errorf("error %q: want a duplicate error", err)
	}
}

// TestLostLastMessage: the last message before a sender waits for credit is
// lost; its credit request says how many it sent, and the receiver fails.
func TestLostLastMessage(t *testing.T) {
	nc := connect(t, startServer(t, 0))
	r, err := transport(t, nc).NewReceiver(testID)
	if err != nil {
		t.Fatal(err)
	}
	rawPublish(t, nc, 1, dataplane.WatermarkEvent(1))
	if err := nc.Publish(testID.DataSubject(), appendCreditRequest(nil, 2)); err != nil {
		t.Fatal(err)
	}
	_, err = recvErr(t, r)
	if !errors.Is(err, dataplane.ErrSequence) || !strings.Contains(err.Error(), "sent 2 messages but only 1 arrived") {
		t.Errorf("error %q: want a lost-message error", err)
	}
}

func TestMalformedMessageFailsReceiver(t *testing.T) {
	nc := connect(t, startServer(t, 0))
	r, err := transport(t, nc).NewReceiver(testID)
	if err != nil {
		t.Fatal(err)
	}
	nc.Publish(testID.DataSubject(), []byte{1, 2, 3})
	if _, err := recvErr(t, r); !errors.Is(err, ErrWire) {
		t.Errorf("error %v: want ErrWire", err)
	}
}

// TestSlowConsumerFailsChannel: an async NATS error on the receiver's
// subscription fails the channel with that error.
func TestSlowConsumerFailsChannel(t *testing.T) {
	nc := connect(t, startServer(t, 0))
	var prev []error
	var mu sync.Mutex
	nc.SetErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		mu.Lock()
		prev = append(prev, err)
		mu.Unlock()
	})
	tr := transport(t, nc)
	r, err := tr.NewReceiver(testID)
	if err != nil {
		t.Fatal(err)
	}
	// What nats.go calls when the subscription overflows its pending limits.
	nc.Opts.AsyncErrorCB(nc, r.sub, nats.ErrSlowConsumer)
	if _, err := recvErr(t, r); !errors.Is(err, nats.ErrSlowConsumer) || !strings.Contains(err.Error(), testID.DataSubject()) {
		t.Errorf("error %v: want the slow consumer error of %s", err, testID.DataSubject())
	}
	mu.Lock()
	defer mu.Unlock()
	if len(prev) != 1 {
		t.Errorf("the connection's previous error handler saw %v, want the one error", prev)
	}
}

func TestLargeBatchIsSplit(t *testing.T) {
	nc := connect(t, startServer(t, 0))
	tr := transport(t, nc, MaxMessage(4<<10), Window(8<<10))
	ch, err := tr.NewChannel(testID)
	if err != nil {
		t.Fatal(err)
	}
	var recs []abi.Record
	for i := 0; i < 200; i++ {
		recs = append(recs, rec(i, 100))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		if err := ch.S.Send(ctx, dataplane.RecordsEvent(batchOf(recs...))); err != nil {
			done <- err
			return
		}
		done <- ch.S.Send(ctx, dataplane.EndOfPartitionEvent())
	}()
	evs, err := recvAll(ctx, ch.R, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	var got []abi.Record
	for _, ev := range evs {
		if ev.Kind == dataplane.KindRecords {
			got = append(got, ev.Batch.Records...)
		}
	}
	if m := ch.S.Stats().Messages; m < 6 || len(got) != len(recs) {
		t.Fatalf("%d messages sent, %d records received: want the batch split into several messages, every record received", m, len(got))
	}
	for i := range got {
		if !bytes.Equal(got[i].Value, recs[i].Value) {
			t.Fatalf("record %d: %q, want %q", i, got[i].Value, recs[i].Value)
		}
	}
	if st := ch.S.Stats(); st.MaxInFlight > 8<<10 {
		t.Errorf("in flight %d > window", st.MaxInFlight)
	}
}

// TestMessageLargerThanWindow: a message larger than the whole window goes
// out once nothing is in flight, instead of waiting forever.
func TestMessageLargerThanWindow(t *testing.T) {
	nc := connect(t, startServer(t, 0))
	ch, err := transport(t, nc, Window(2<<10), CreditRetry(10*time.Millisecond)).NewChannel(testID)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	evs := []dataplane.Event{
		dataplane.RecordsEvent(batchOf(rec(0, 500))),
		dataplane.RecordsEvent(batchOf(rec(1, 5000))),
		dataplane.RecordsEvent(batchOf(rec(2, 500))),
		dataplane.EndOfPartitionEvent(),
	}
	done := make(chan error, 1)
	go func() {
		for _, ev := range evs {
			if err := ch.S.Send(ctx, ev); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	got, err := recvAll(ctx, ch.R, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if len(got) != 4 || len(got[1].Batch.Records[0].Value) != 5000 {
		t.Fatalf("got %v", got)
	}
	if st := ch.S.Stats(); st.MaxInFlight < 5000 || st.MaxInFlight > 5100 {
		t.Errorf("max in flight %d: want the one large message alone", st.MaxInFlight)
	}
}

// TestRecordLargerThanMaxPayload: a record that does not fit in the server's
// max_payload travels as record parts (it used to be refused).
func TestRecordLargerThanMaxPayload(t *testing.T) {
	nc := connect(t, startServer(t, 2048))
	ch, err := transport(t, nc).NewChannel(testID)
	if err != nil {
		t.Fatal(err)
	}
	if ch.S.t.MaxMessage() != 2048 {
		t.Fatalf("max message %d, want the server's 2048", ch.S.t.MaxMessage())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	want := rec(1, 3000)
	go func() {
		ch.S.Send(ctx, dataplane.RecordsEvent(batchOf(want)))
		ch.S.Send(ctx, dataplane.EndOfPartitionEvent())
	}()
	evs, err := recvAll(ctx, ch.R, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 2 || describe(evs[0]) != describe(dataplane.RecordsEvent(batchOf(want))) {
		t.Fatalf("got %d events, first %.80s", len(evs), describe(evs[0]))
	}
	if st := ch.S.Stats(); st.Parts != 2 {
		t.Errorf("%d record parts, want 2 of at most 2048 bytes", st.Parts)
	}
}

func TestSendWaitsForCredit(t *testing.T) {
	nc := connect(t, startServer(t, 0))
	s, err := transport(t, nc, CreditRetry(10*time.Millisecond)).NewSender(testID) // no receiver
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	err = s.Send(ctx, dataplane.WatermarkEvent(1))
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "waiting for credit") {
		t.Errorf("error %v: want a credit wait ended by the context", err)
	}
	if st := s.Stats(); st.CreditRequests < 3 {
		t.Errorf("%d credit requests in 100ms at a 10ms retry", st.CreditRequests)
	}
}

// TestFailedSendLeavesTheBatchToTheCaller: a batch whose Send fails (here the
// credit wait ends with the context) is not released by the sender, as with
// an in-process channel: the RecordWriter releases it, and a second release
// would put it into the pool twice, so that two later batches (possibly of
// different receivers) would be one.
func TestFailedSendLeavesTheBatchToTheCaller(t *testing.T) {
	nc := connect(t, startServer(t, 0))
	s, err := transport(t, nc, CreditRetry(10*time.Millisecond)).NewSender(testID) // no receiver: no credit
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	b := batchOf(rec(1, 10), rec(2, 10))
	if err := s.Send(ctx, dataplane.RecordsEvent(b)); err == nil {
		t.Fatal("send without credit succeeded")
	}
	if len(b.Records) != 2 || string(b.Records[1].Value) != string(rec(2, 10).Value) {
		t.Fatalf("after a failed send the batch has %d records: the sender released it", len(b.Records))
	}
	b.Release()
}

// TestReceiverAfterSender: the receiver's first grant is missed by nobody:
// a sender that starts first asks for credit until the receiver answers.
// The receiver starts only after the sender's first two requests went
// unanswered (seen on the data subject).
func TestReceiverAfterSender(t *testing.T) {
	s := startServer(t, 0)
	asks, err := connect(t, s).SubscribeSync(testID.DataSubject())
	if err != nil {
		t.Fatal(err)
	}
	st := transport(t, connect(t, s), CreditRetry(20*time.Millisecond))
	snd, err := st.NewSender(testID)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- snd.Send(ctx, dataplane.EndOfPartitionEvent())
	}()
	for i := 0; i < 2; i++ {
		if _, err := asks.NextMsgWithContext(ctx); err != nil {
			t.Fatalf("credit request %d of the sender: %v", i+1, err)
		}
	}
	r, err := transport(t, connect(t, s)).NewReceiver(testID)
	if err != nil {
		t.Fatal(err)
	}
	evs, err := recvAll(ctx, r, 0)
	if err != nil || len(evs) != 1 {
		t.Fatalf("got %v, %v", evs, err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestHeaderHooks(t *testing.T) {
	nc := connect(t, startServer(t, 0))
	type key struct{}
	var seen []string
	tr := transport(t, nc,
		SendHeader(func(ctx context.Context, ev dataplane.Event, h nats.Header) {
			if v, ok := ctx.Value(key{}).(string); ok && ev.Kind == dataplane.KindBarrier {
				h.Set("traceparent", v)
			}
		}),
		RecvHeader(func(ev dataplane.Event, h nats.Header) {
			seen = append(seen, ev.String()+"="+h.Get("traceparent"))
		}))
	ch, err := tr.NewChannel(testID)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.WithValue(context.Background(), key{}, "00-abc-01"), 5*time.Second)
	defer cancel()
	for _, ev := range []dataplane.Event{dataplane.BarrierEvent(dataplane.Barrier{ID: 4}), dataplane.EndOfPartitionEvent()} {
		if err := ch.S.Send(ctx, ev); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := recvAll(ctx, ch.R, 0); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(seen, " "); got != "barrier(4, checkpoint, sync=false)=00-abc-01 end-of-partition=" {
		t.Errorf("headers seen: %s", got)
	}
}

// TestBarrierTrace: a barrier's trace context travels in the message's
// headers, without hooks, and comes back in the received barrier.
func TestBarrierTrace(t *testing.T) {
	nc := connect(t, startServer(t, 0))
	ch, err := transport(t, nc).NewChannel(testID)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	tp := "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	for _, ev := range []dataplane.Event{
		dataplane.BarrierEvent(dataplane.Barrier{ID: 3, Trace: map[string]string{"traceparent": tp, "tracestate": "a=1"}}),
		dataplane.BarrierEvent(dataplane.Barrier{ID: 4}),
		dataplane.EndOfPartitionEvent(),
	} {
		if err := ch.S.Send(ctx, ev); err != nil {
			t.Fatal(err)
		}
	}
	evs, err := recvAll(ctx, ch.R, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 3 {
		t.Fatalf("got %d events, want 3", len(evs))
	}
	if got := evs[0].Barrier.Trace; got["traceparent"] != tp || got["tracestate"] != "a=1" || len(got) != 2 {
		t.Errorf("barrier 3 trace = %v", got)
	}
	if got := evs[1].Barrier.Trace; got != nil {
		t.Errorf("barrier 4 without trace got %v", got)
	}
}

func TestOptionsValidate(t *testing.T) {
	nc := connect(t, startServer(t, 0))
	for _, o := range []Option{Window(10), MaxMessage(5), CreditRetry(0)} {
		if _, err := NewTransport(nc, o); err == nil || !strings.HasPrefix(err.Error(), "natsch: ") {
			t.Errorf("bad option accepted or unprefixed error: %v", err)
		}
	}
}

// BenchmarkThroughput sends 100-byte records in batches of 1000 over NATS
// loopback (sender and receiver on separate connections) and reports
// records/s.
func BenchmarkThroughput(b *testing.B) {
	s := startServer(b, 0)
	rt := transport(b, connect(b, s))
	st := transport(b, connect(b, s))
	r, err := rt.NewReceiver(testID)
	if err != nil {
		b.Fatal(err)
	}
	snd, err := st.NewSender(testID)
	if err != nil {
		b.Fatal(err)
	}
	const perBatch = 1000
	recs := make([]abi.Record, perBatch)
	for i := range recs {
		recs[i] = abi.Record{Key: []byte("key-00"), Value: bytes.Repeat([]byte{'v'}, 100), Timestamp: int64(i)}
	}
	ctx := context.Background()
	b.SetBytes(perBatch * 100)
	b.ResetTimer()
	start := time.Now()
	done := make(chan error, 1)
	go func() {
		for i := 0; i < b.N; i++ {
			bt := dataplane.GetBatch()
			for j := range recs {
				bt.Append(recs[j])
			}
			if err := snd.Send(ctx, dataplane.RecordsEvent(bt)); err != nil {
				done <- err
				return
			}
		}
		done <- snd.Send(ctx, dataplane.EndOfPartitionEvent())
	}()
	g := dataplane.NewInputGate([]dataplane.GateChannel{{In: r}})
	n := 0
	for {
		_, ev, err := g.Next(ctx)
		if errors.Is(err, dataplane.ErrGateEnded) {
			break
		}
		if err != nil {
			b.Fatal(err)
		}
		if ev.Kind == dataplane.KindRecords {
			n += len(ev.Batch.Records)
			ev.Batch.Release()
		}
	}
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	if n != b.N*perBatch {
		b.Fatalf("received %d records, sent %d", n, b.N*perBatch)
	}
	b.ReportMetric(float64(n)/time.Since(start).Seconds(), "records/s")
}

// TestWatermarkStatus: idle and active travel as watermark messages with
// the header Streamd-Watermark-Status, in order with the other events; an
// older receiver reading the body alone sees the watermark MIN.
func TestWatermarkStatus(t *testing.T) {
	nc := connect(t, startServer(t, 0))
	ch, err := transport(t, nc).NewChannel(testID)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	sent := []dataplane.Event{
		dataplane.WatermarkEvent(5),
		dataplane.WatermarkStatusEvent(true),
		dataplane.WatermarkStatusEvent(false),
		dataplane.RecordsEvent(batchOf(rec(1, 10))),
		dataplane.WatermarkEvent(9),
		dataplane.EndOfPartitionEvent(),
	}
	var want []string
	for _, ev := range sent {
		want = append(want, describe(ev))
		if err := ch.S.Send(ctx, ev); err != nil {
			t.Fatal(err)
		}
	}
	evs, err := recvAll(ctx, ch.R, 0)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, ev := range evs {
		got = append(got, describe(ev))
	}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("received %v, want %v", got, want)
	}
	data, err := AppendEvent(nil, 1, dataplane.WatermarkStatusEvent(true))
	if err != nil {
		t.Fatal(err)
	}
	if _, ev, err := DecodeEvent(data); err != nil || ev.Kind != dataplane.KindWatermark || ev.Watermark.TS != abi.MinWatermark {
		t.Errorf("the body of a status message decodes as %v, %v; want watermark(MIN)", ev, err)
	}
}
