package natsch

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/dataplane"
)

// waitFor waits until cond holds, checking it each time a message arrives at
// r (or 5s pass: the test fails, saying what it waited for).
func waitFor(t *testing.T, r *Receiver, what string, cond func() bool) {
	t.Helper()
	n := make(chan struct{}, 1)
	r.SetNotify(n)
	deadline := time.After(5 * time.Second)
	for !cond() {
		select {
		case <-n:
		case <-deadline:
			t.Fatalf("%s: not within 5s", what)
		}
	}
}

// arrived reports whether message seq has arrived at r.
func arrived(r *Receiver, seq uint64) func() bool {
	return func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.arrivedSeq >= seq
	}
}

// newChannel makes testID's channel on a server of maxPayload (0: the
// default), one connection for both ends.
func newChannel(t *testing.T, maxPayload int32, opts ...Option) *Channel {
	t.Helper()
	ch, err := transport(t, connect(t, startServer(t, maxPayload)), opts...).NewChannel(testID)
	if err != nil {
		t.Fatal(err)
	}
	return ch
}

// takeBarrier calls r.TakeBarrier, returning the events visited, described.
func takeBarrier(t *testing.T, r *Receiver) ([]string, dataplane.Barrier, bool) {
	t.Helper()
	var visited []string
	b, ok, err := r.TakeBarrier(func(ev dataplane.Event) { visited = append(visited, describe(ev)) })
	if err != nil {
		t.Fatal(err)
	}
	return visited, b, ok
}

// takeAhead waits for checkpoint id's barrier to be queued at r and takes
// it ahead, returning the events visited, described.
func takeAhead(t *testing.T, r *Receiver, id int64) []string {
	t.Helper()
	waitFor(t, r, fmt.Sprintf("barrier %d", id), r.Overtaking)
	visited, b, ok := takeBarrier(t, r)
	if !ok || b.ID != id {
		t.Fatalf("took %+v (%v), want barrier %d", b, ok, id)
	}
	return visited
}

func describeAll(evs []dataplane.Event) []string {
	var s []string
	for _, ev := range evs {
		s = append(s, describe(ev))
	}
	return s
}

// joinRecords joins each run of consecutive described records events into
// one: a receiver hands queued records messages on as one batch
// (Receiver.merge), so where a batch ends is not part of what is compared.
func joinRecords(evs []string) []string {
	var out []string
	for _, d := range evs {
		if n := len(out); n > 0 && strings.HasPrefix(d, "records[") && strings.HasPrefix(out[n-1], "records[") {
			out[n-1] = strings.TrimSuffix(out[n-1], "]") + strings.TrimPrefix(d, "records[")
			continue
		}
		out = append(out, d)
	}
	return out
}

// sameEvents compares described events, naming the first difference;
// consecutive records events compare as one (joinRecords).
func sameEvents(t *testing.T, what string, got, want []string) {
	t.Helper()
	got, want = joinRecords(got), joinRecords(want)
	for i := range max(len(got), len(want)) {
		if i >= len(got) || i >= len(want) || got[i] != want[i] {
			g, w := "(none)", "(none)"
			if i < len(got) {
				g = got[i]
			}
			if i < len(want) {
				w = want[i]
			}
			t.Fatalf("%s: %d events, want %d; event %d is %.100s, want %.100s", what, len(got), len(want), i, g, w)
		}
	}
}

// TestUnalignedBarrierOvertakes: on a channel whose credit is used up, the
// output buffer (split into messages and record parts) and an unaligned
// barrier go out at once (SendNow); the receiver takes the barrier ahead,
// with exactly the records queued before it, in order, and then delivers all
// of them, and those sent after the barrier, with no sequence error. The
// sender's next Send waits until the receiver has consumed.
func TestUnalignedBarrierOvertakes(t *testing.T) {
	ch := newChannel(t, 2048, Window(1<<10), CreditRetry(10*time.Millisecond))
	s, r := ch.S, ch.R
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var want []dataplane.Event
	for i := 1; i <= 7; i++ { // 7 messages of 132 bytes: 924 of the 1024 granted
		want = append(want, dataplane.RecordsEvent(batchOf(rec(i, 100))))
		if err := s.Send(ctx, dataplane.RecordsEvent(batchOf(rec(i, 100)))); err != nil {
			t.Fatal(err)
		}
	}
	s.mu.Lock()
	full := s.sent+132 > s.granted
	s.mu.Unlock()
	if !full {
		t.Fatalf("sent %d bytes of %d granted: another batch would fit", s.sent, s.granted)
	}
	waits := s.Stats().CreditWaits
	// The output buffer: a message of two records, three parts of a record
	// too large for a message, and a last small record.
	buffer := []abi.Record{rec(8, 900), rec(9, 900), bigRecord(1, 5000), rec(10, 100)}
	want = append(want, dataplane.RecordsEvent(batchOf(buffer[:2]...)), dataplane.RecordsEvent(batchOf(buffer[2])), dataplane.RecordsEvent(batchOf(buffer[3])))
	if err := s.SendNow(ctx, dataplane.RecordsEvent(batchOf(buffer...))); err != nil {
		t.Fatal(err)
	}
	if err := s.SendNow(ctx, dataplane.BarrierEvent(dataplane.Barrier{ID: 5, Unaligned: true})); err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.CreditWaits != waits || st.Parts != 3 || st.MaxInFlight <= 1<<10 {
		t.Errorf("sender %+v: want no more credit waits than %d, 3 parts, more in flight than the window", st, waits)
	}

	waitFor(t, r, "an overtaking barrier", r.Overtaking)
	if st := r.Stats(); st.Messages != 0 {
		t.Fatalf("the receiver consumed %d messages before taking the barrier", st.Messages)
	}
	visited, b, ok := takeBarrier(t, r)
	if !ok {
		t.Fatal("the unaligned barrier was not taken")
	}
	if b.ID != 5 || !b.Unaligned || b.Trace != nil {
		t.Errorf("took barrier %+v, want 5, unaligned, no trace", b)
	}
	sameEvents(t, "visited", visited, describeAll(want))
	if r.Overtaking() {
		t.Error("still overtaking after the barrier was taken")
	}
	if _, _, ok := takeBarrier(t, r); ok {
		t.Error("a second barrier taken")
	}

	after := []dataplane.Event{dataplane.RecordsEvent(batchOf(rec(11, 100))), dataplane.WatermarkEvent(12), dataplane.EndOfPartitionEvent()}
	for _, ev := range after {
		want = append(want, ev)
	}
	wantDesc := describeAll(want) // before the sender releases the batches
	done := sendAll(ctx, s, after)
	// Credit still counts what SendNow sent: the next Send waits.
	deadline := time.Now().Add(5 * time.Second)
	for s.Stats().CreditWaits == waits {
		if time.Now().After(deadline) {
			t.Fatal("the Send after SendNow did not wait for credit")
		}
		time.Sleep(time.Millisecond)
	}
	got, err := recvAll(ctx, r, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	sameEvents(t, "received", describeAll(got), wantDesc)
	if ss, rs := s.Stats(), r.Stats(); ss.Messages != rs.Messages || ss.Bytes != rs.Bytes {
		t.Errorf("sent %d messages (%d bytes), received %d (%d bytes)", ss.Messages, ss.Bytes, rs.Messages, rs.Bytes)
	}
}

// TestWantBarrier: an ordinary (aligned) barrier is taken ahead once the
// receiver wants it, whether it asked before the barrier arrived or after.
func TestWantBarrier(t *testing.T) {
	ch := newChannel(t, 0)
	r := ch.R
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	recs := func(from, to int) (evs []dataplane.Event) {
		for i := from; i <= to; i++ {
			evs = append(evs, dataplane.RecordsEvent(batchOf(rec(i, 10))))
		}
		return evs
	}
	want := describeAll(append(recs(1, 5), dataplane.EndOfPartitionEvent()))
	var evs []dataplane.Event
	evs = append(evs, recs(1, 3)...)
	evs = append(evs, dataplane.BarrierEvent(dataplane.Barrier{ID: 6}))
	evs = append(evs, recs(4, 4)...)
	evs = append(evs, dataplane.BarrierEvent(dataplane.Barrier{ID: 7}))
	evs = append(evs, recs(5, 5)...)
	evs = append(evs, dataplane.EndOfPartitionEvent())

	r.WantBarrier(6) // before it arrives
	done := sendAll(ctx, ch.S, evs)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	waitFor(t, r, "all 8 messages", arrived(r, 8))
	if !r.Overtaking() {
		t.Fatal("the wanted barrier 6 is not flagged")
	}
	visited, b, ok := takeBarrier(t, r)
	if !ok || b.ID != 6 || b.Unaligned {
		t.Fatalf("took %+v (%v), want barrier 6, not unaligned", b, ok)
	}
	sameEvents(t, "visited for 6", visited, want[:3])
	if r.Overtaking() {
		t.Fatal("barrier 7, not wanted yet, is flagged")
	}
	r.WantBarrier(7) // queued already
	if !r.Overtaking() {
		t.Fatal("the wanted barrier 7, queued, is not flagged")
	}
	visited, b, ok = takeBarrier(t, r)
	if !ok || b.ID != 7 {
		t.Fatalf("took %+v (%v), want barrier 7", b, ok)
	}
	sameEvents(t, "visited for 7", visited, want[:4])
	got, err := recvAll(ctx, r, 0)
	if err != nil {
		t.Fatal(err)
	}
	sameEvents(t, "received", describeAll(got), want)
}

// TestEndOfDataBeforeUnalignedBarrier: a barrier queued behind end-of-data
// overtakes it too (a finished sender's checkpoints go on while the
// receiver drains, FLIP-147), with the records before it; the records and
// the end-of-data are still delivered in order, the barrier not again. A
// barrier behind end-of-partition cannot be: nothing follows it.
func TestEndOfDataBeforeUnalignedBarrier(t *testing.T) {
	ch := newChannel(t, 0)
	r := ch.R
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	evs := []dataplane.Event{
		dataplane.RecordsEvent(batchOf(rec(1, 10))),
		dataplane.EndOfDataEvent(false),
		dataplane.BarrierEvent(dataplane.Barrier{ID: 9, Unaligned: true}),
		dataplane.EndOfPartitionEvent(),
	}
	want := describeAll(evs)
	for _, ev := range evs {
		if err := ch.S.SendNow(ctx, ev); err != nil {
			t.Fatal(err)
		}
	}
	sameEvents(t, "visited for 9", takeAhead(t, r, 9), want[:1])
	if r.Overtaking() {
		t.Error("still overtaking after the barrier was taken")
	}
	got, err := recvAll(ctx, r, 0)
	if err != nil {
		t.Fatal(err)
	}
	sameEvents(t, "received", describeAll(got), []string{want[0], want[1], want[3]})
}

// newReceiver makes testID's receiver and a connection to publish to it.
func newReceiver(t *testing.T, opts ...Option) (*nats.Conn, *Receiver) {
	t.Helper()
	nc := connect(t, startServer(t, 0))
	r, err := transport(t, nc).NewReceiver(testID, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return nc, r
}

// publishMsgs publishes raw data messages of testID from nc.
func publishMsgs(t *testing.T, nc *nats.Conn, msgs ...*nats.Msg) {
	t.Helper()
	for _, m := range msgs {
		m.Subject = testID.DataSubject()
		if err := nc.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
}

func unalignedBarrier(t *testing.T, seq uint64, id int64) *nats.Msg {
	return &nats.Msg{Data: event(t, seq, dataplane.BarrierEvent(dataplane.Barrier{ID: id})), Header: nats.Header{HeaderUnaligned: {"1"}}}
}

// TestTakeBarrierReassemblesParts: the records visited include a record
// whose parts the receiver has begun to take (and the rest are queued) and
// one whose parts are all queued; TryRecv's reassembly is left as it was.
func TestTakeBarrierReassemblesParts(t *testing.T) {
	nc, r := newReceiver(t)
	big1, big2 := bigRecord(1, 3000), bigRecord(2, 1500)
	f1, f2 := abi.AppendBatch(nil, []abi.Record{big1}), abi.AppendBatch(nil, []abi.Record{big2})
	t1, t2 := uint64(len(f1)), uint64(len(f2))
	publishMsgs(t, nc, &nats.Msg{Data: part(1, t1, 0, f1[:1000])})
	waitFor(t, r, "the first part", arrived(r, 1))
	if _, ok, err := r.TryRecv(); ok || err != nil || len(r.part) != 1000 {
		t.Fatalf("TryRecv of a first part: %v, %v, %d bytes reassembled", ok, err, len(r.part))
	}
	publishMsgs(t, nc,
		&nats.Msg{Data: part(2, t1, 1000, f1[1000:2000])},
		&nats.Msg{Data: part(3, t1, 2000, f1[2000:])},
		&nats.Msg{Data: event(t, 4, dataplane.RecordsEvent(batchOf(rec(1, 10))))},
		&nats.Msg{Data: part(5, t2, 0, f2[:800])},
		&nats.Msg{Data: part(6, t2, 800, f2[800:])},
		&nats.Msg{Data: event(t, 7, dataplane.WatermarkEvent(9))},
		unalignedBarrier(t, 8, 3),
		&nats.Msg{Data: event(t, 9, dataplane.RecordsEvent(batchOf(rec(2, 10))))},
		&nats.Msg{Data: event(t, 10, dataplane.EndOfPartitionEvent())},
	)
	waitFor(t, r, "all 10 messages", arrived(r, 10))
	if !r.Overtaking() {
		t.Fatal("the unaligned barrier is not flagged")
	}
	before := []dataplane.Event{
		dataplane.RecordsEvent(batchOf(big1)), dataplane.RecordsEvent(batchOf(rec(1, 10))),
		dataplane.RecordsEvent(batchOf(big2)), dataplane.WatermarkEvent(9),
	}
	visited, b, ok := takeBarrier(t, r)
	if !ok || b.ID != 3 || !b.Unaligned {
		t.Fatalf("took %+v (%v), want unaligned barrier 3", b, ok)
	}
	sameEvents(t, "visited", visited, describeAll(before))
	if len(r.part) != 1000 || cap(r.part) != int(t1) || r.seq != 1 || !bytes.Equal(r.part, f1[:1000]) {
		t.Fatalf("TakeBarrier changed the reassembly: %d of %d bytes, seq %d", len(r.part), cap(r.part), r.seq)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	got, err := recvAll(ctx, r, 0)
	if err != nil {
		t.Fatal(err)
	}
	want := describeAll(append(before, dataplane.RecordsEvent(batchOf(rec(2, 10))), dataplane.EndOfPartitionEvent()))
	sameEvents(t, "received", describeAll(got), want)
}

// TestTakeBarrierChecksSequence: a message lost before an unaligned barrier
// fails the channel when the barrier is taken (the checkpoint would
// otherwise take the state of a channel that lost a record), and TryRecv
// keeps failing.
func TestTakeBarrierChecksSequence(t *testing.T) {
	nc, r := newReceiver(t)
	publishMsgs(t, nc,
		&nats.Msg{Data: event(t, 1, dataplane.RecordsEvent(batchOf(rec(1, 10))))},
		&nats.Msg{Data: event(t, 3, dataplane.RecordsEvent(batchOf(rec(3, 10))))},
		unalignedBarrier(t, 4, 2),
	)
	waitFor(t, r, "the unaligned barrier", r.Overtaking)
	_, ok, err := r.TakeBarrier(func(dataplane.Event) {})
	if ok || !errors.Is(err, dataplane.ErrSequence) || !strings.Contains(err.Error(), "got message 3, want 2") {
		t.Fatalf("TakeBarrier over a gap: %v, %v", ok, err)
	}
	if _, _, err2 := r.TryRecv(); err2 != err {
		t.Errorf("TryRecv after the failed take: %v, want %v", err2, err)
	}
}

// TestUnalignedHeaderInterop: the unaligned mark is a header only. The
// payload of an unaligned barrier is that of an ordinary one (an older
// receiver reads an ordinary barrier, delivered in order, which stays
// correct), and a barrier without the header (an older sender) is an
// ordinary barrier, never taken ahead.
func TestUnalignedHeaderInterop(t *testing.T) {
	nc := connect(t, startServer(t, 0))
	raw, err := nc.SubscribeSync(testID.DataSubject())
	if err != nil {
		t.Fatal(err)
	}
	ch, err := transport(t, nc).NewChannel(testID)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	tp := "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	if err := ch.S.SendNow(ctx, dataplane.BarrierEvent(dataplane.Barrier{ID: 4, Unaligned: true, Trace: map[string]string{"traceparent": tp}})); err != nil {
		t.Fatal(err)
	}
	if err := ch.S.Send(ctx, dataplane.EndOfPartitionEvent()); err != nil {
		t.Fatal(err)
	}
	for {
		m, err := raw.NextMsg(5 * time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if kind, _, _, _ := decodeHeader(m.Data); kind == wireCreditRequest {
			continue
		}
		if old := event(t, 1, dataplane.BarrierEvent(dataplane.Barrier{ID: 4})); !bytes.Equal(m.Data, old) {
			t.Errorf("unaligned barrier payload %x, want that of an ordinary barrier %x", m.Data, old)
		}
		if m.Header.Get(HeaderUnaligned) != "1" || m.Header.Get("traceparent") != tp {
			t.Errorf("headers %v", m.Header)
		}
		if _, ev, err := DecodeEvent(m.Data); err != nil || ev.Kind != dataplane.KindBarrier || ev.Barrier.Unaligned {
			t.Errorf("the payload alone decodes as %s, %v: want an ordinary barrier", ev, err)
		}
		break
	}
	got, err := recvAll(ctx, ch.R, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || !got[0].Barrier.Unaligned || len(got[0].Barrier.Trace) != 1 || got[0].Barrier.Trace["traceparent"] != tp {
		t.Fatalf("received %v (trace %v): want the unaligned barrier with its trace context only, then end-of-partition", got, got[0].Barrier.Trace)
	}

	// An older sender: no header.
	id := testID
	id.Attempt++
	r, err := transport(t, nc).NewReceiver(id)
	if err != nil {
		t.Fatal(err)
	}
	for seq, ev := range []dataplane.Event{dataplane.RecordsEvent(batchOf(rec(1, 10))), dataplane.BarrierEvent(dataplane.Barrier{ID: 2}), dataplane.EndOfPartitionEvent()} {
		if err := nc.Publish(id.DataSubject(), event(t, uint64(seq+1), ev)); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, r, "all 3 messages", arrived(r, 3))
	if r.Overtaking() {
		t.Error("a barrier without the header is flagged as overtaking")
	}
	if _, _, ok := takeBarrier(t, r); ok {
		t.Error("a barrier without the header was taken ahead")
	}
	got, err = recvAll(ctx, r, 0)
	if err != nil {
		t.Fatal(err)
	}
	if s := fmt.Sprint(describeAll(got)); len(got) != 3 || got[1].Barrier.Unaligned || got[1].Barrier.Trace != nil || got[1].Barrier.ID != 2 {
		t.Errorf("received %s: want records, the ordinary barrier 2 without trace, end-of-partition", s)
	}
}

// TestReceiverMergesQueuedRecords: records messages queued one behind the
// other come out of TryRecv as one batch, in order, up to
// dataplane.DefaultBatchSize records (the default MergeRecords); a watermark between them, or a records message with headers,
// ends the batch (the latter starts the next one).
func TestReceiverMergesQueuedRecords(t *testing.T) {
	nc, r := newReceiver(t)
	var msgs []*nats.Msg
	seq := uint64(0)
	add := func(ev dataplane.Event, h nats.Header) {
		seq++
		msgs = append(msgs, &nats.Msg{Data: event(t, seq, ev), Header: h})
	}
	for i := 0; i < 3; i++ {
		add(dataplane.RecordsEvent(batchOf(rec(i, 10))), nil)
	}
	add(dataplane.WatermarkEvent(5), nil)
	add(dataplane.RecordsEvent(batchOf(rec(3, 10))), nil)
	add(dataplane.RecordsEvent(batchOf(rec(4, 10))), nats.Header{"X-Test": {"1"}})
	var many []abi.Record
	for i := 0; i < dataplane.DefaultBatchSize+1; i++ {
		many = append(many, rec(i, 1))
	}
	add(dataplane.RecordsEvent(batchOf(many[:dataplane.DefaultBatchSize-1]...)), nil) // fills the batch of r4 to the cap
	add(dataplane.RecordsEvent(batchOf(many[dataplane.DefaultBatchSize-1:]...)), nil)
	add(dataplane.RecordsEvent(batchOf(rec(5, 10))), nil)
	add(dataplane.EndOfPartitionEvent(), nil)
	publishMsgs(t, nc, msgs...)
	waitFor(t, r, "every message", arrived(r, seq))
	// r0-r2; the watermark; r3 (the message with headers is not merged
	// into it); r4 with the records behind it up to the cap; the rest.
	want := []int{3, -1, 1, dataplane.DefaultBatchSize, 3}
	if lens := batchLens(t, r); !slices.Equal(lens, want) {
		t.Fatalf("events of %v records (-1: control), want %v", lens, want)
	}
}

// TestReceiverMergesUpToMergeRecords: with MergeRecords(4) (the runtime's
// batch size) a message that would take a merged batch beyond 4 records
// starts the next one.
func TestReceiverMergesUpToMergeRecords(t *testing.T) {
	nc, r := newReceiver(t, MergeRecords(4))
	var msgs []*nats.Msg
	n := 0
	for i, k := range []int{1, 2, 2, 3, 5, 1} {
		var recs []abi.Record
		for range k {
			n++
			recs = append(recs, rec(n, 10))
		}
		msgs = append(msgs, &nats.Msg{Data: event(t, uint64(i+1), dataplane.RecordsEvent(batchOf(recs...)))})
	}
	msgs = append(msgs, &nats.Msg{Data: event(t, 7, dataplane.EndOfPartitionEvent())})
	publishMsgs(t, nc, msgs...)
	waitFor(t, r, "every message", arrived(r, 7))
	// A message larger than the cap still goes, alone.
	if lens, want := batchLens(t, r), []int{3, 2, 3, 5, 1}; !slices.Equal(lens, want) {
		t.Fatalf("batches of %v records, want %v", lens, want)
	}
}

// batchLens takes every event queued at r up to end-of-partition and
// returns the record count of each (-1: a control event).
func batchLens(t *testing.T, r *Receiver) []int {
	t.Helper()
	var lens []int
	for {
		ev, ok, err := r.TryRecv()
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			t.Fatal("TryRecv ran out before end-of-partition")
		}
		if ev.Kind == dataplane.KindEndOfPartition {
			return lens
		}
		n := -1 // a control event
		if ev.Kind == dataplane.KindRecords {
			n = ev.Batch.Len()
		}
		lens = append(lens, n)
	}
}
