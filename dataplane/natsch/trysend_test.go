package natsch

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/streamd/streamd/dataplane"
)

// drainWriter sends what w queued, waiting for room as a subtask's loop
// does (dataplane.RecordWriter.TryDrain, then its room channel), until
// nothing is queued.
func drainWriter(t *testing.T, ctx context.Context, w *dataplane.RecordWriter) {
	t.Helper()
	for {
		room, err := w.TryDrain(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if room == nil {
			return
		}
		select {
		case <-room:
		case <-ctx.Done():
			t.Fatalf("waiting for room: %v", context.Cause(ctx))
		}
	}
}

// TestTrySendNoCredit: TrySend sends nothing while the credit is short
// (asking for more at once, and again each time Room wakes after
// CreditRetry), Room is ready once a grant came, and an event larger than
// half the window (here larger than the window) goes as soon as half the
// window is free. The test grants credit itself, as a receiver would.
func TestTrySendNoCredit(t *testing.T) {
	nc := connect(t, startServer(t, 0))
	s, err := transport(t, nc, CreditRetry(10*time.Millisecond)).NewSender(testID) // no receiver: the test grants
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	try := func(ev dataplane.Event) bool {
		t.Helper()
		ok, err := s.TrySend(ctx, ev)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	wake := func(what string) {
		t.Helper()
		select {
		case <-s.Room():
		case <-ctx.Done():
			t.Fatalf("%s: Room not ready", what)
		}
	}
	grant := func(g uint64) {
		t.Helper()
		if err := nc.Publish(testID.CreditSubject(), appendCredit(nil, g, 1<<10)); err != nil {
			t.Fatal(err)
		}
		for {
			s.mu.Lock()
			got := s.granted
			s.mu.Unlock()
			if got == g {
				return
			}
			wake(fmt.Sprintf("grant of %d", g))
		}
	}
	b := batchOf(rec(1, 100)) // 132 bytes a message
	if try(dataplane.RecordsEvent(b)) {
		t.Fatal("sent before the first grant")
	}
	requests := s.Stats().CreditRequests
	if requests == 0 {
		t.Fatal("no credit request")
	}
	for s.Stats().CreditRequests == requests { // no grant: Room wakes to ask again
		wake("credit request again")
		if try(dataplane.RecordsEvent(b)) {
			t.Fatal("sent without a grant")
		}
	}
	grant(1 << 10)
	for i := 1; i <= 7; i++ { // 924 of the 1024 granted
		if !try(dataplane.RecordsEvent(batchOf(rec(i, 100)))) {
			t.Fatalf("record %d: no room with %d of 1024 bytes sent", i, s.sent)
		}
	}
	b.Release()
	b = batchOf(rec(8, 100))
	if try(dataplane.RecordsEvent(b)) {
		t.Fatal("record 8 sent beyond the credit")
	}
	if st := s.Stats(); st.Messages != 7 || st.CreditWaits != 2 {
		t.Fatalf("sender %+v: want 7 messages, 2 credit waits", st)
	}
	grant(1024 + 4*132) // the receiver consumed 4 messages
	if !try(dataplane.RecordsEvent(b)) {
		t.Fatal("record 8: no room after a grant")
	}
	// 528 bytes in flight. A batch of 1286 bytes is larger than the window;
	// it goes once in flight is down to half of it (not down to 1024-1286).
	big := batchOf(rec(12, 300), rec(13, 300), rec(14, 300), rec(15, 300))
	if try(dataplane.RecordsEvent(big)) {
		t.Fatal("a batch of 1286 bytes went with 528 of 1024 in flight")
	}
	grant(1024 + 8*132) // the receiver consumed all
	if !try(dataplane.RecordsEvent(big)) {
		t.Fatal("no room for a batch larger than the window with nothing in flight")
	}
	if st := s.Stats(); st.Messages != 9 || st.MaxInFlight != 1286 {
		t.Fatalf("sender %+v: want 9 messages, 1286 bytes in flight at most", st)
	}
}

// TestWriterOverdraftOnNATS: a RecordWriter with an overdraft over a NATS
// channel whose credit is used up does not wait in Emit: what the credit
// has no room for stays queued in the writer (TryDrain returns a room
// channel instead of waiting), so an unaligned checkpoint is taken at once:
// the queued batches are captured as output buffers (CaptureBuffers), the
// barrier goes ahead of them (BroadcastAhead) and the receiver takes it
// ahead of the records in its window. Then the writer drains as a subtask's
// loop does and every record arrives once, in order.
func TestWriterOverdraftOnNATS(t *testing.T) {
	ch := newChannel(t, 0, Window(1<<10), CreditRetry(10*time.Millisecond))
	s, r := ch.S, ch.R
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	w, err := dataplane.NewRecordWriter([]dataplane.Output{s}, dataplane.Forward,
		dataplane.WriterOptions{BatchSize: 1, BufferTimeout: -1, Overdraft: 8})
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	emit := func(i int) {
		t.Helper()
		rc := rec(i, 100)
		want = append(want, describe(dataplane.RecordsEvent(batchOf(rc))))
		if err := w.Emit(ctx, rc); err != nil {
			t.Fatal(err)
		}
	}
	for i := 1; i <= 7; i++ { // 7 messages of 132 bytes: 924 of the 1024 granted
		emit(i)
	}
	drainWriter(t, ctx, w) // the first grant may come after the first emits
	for i := 8; i <= 10; i++ {
		emit(i) // no credit: queued, not waited for
	}
	room, err := w.TryDrain(ctx)
	if err != nil || room == nil {
		t.Fatalf("TryDrain with the credit used up: room %v, %v; want a room channel", room, err)
	}
	if st := s.Stats(); st.Messages != 7 || st.CreditWaits == 0 {
		t.Fatalf("sender %+v: want 7 messages sent, a credit wait", st)
	}

	// The unaligned checkpoint, as the subtask takes it in its loop.
	var captured []string
	w.CaptureBuffers(func(_ int, ev dataplane.Event) { captured = append(captured, describe(ev)) })
	sameEvents(t, "output buffers", captured, want[7:])
	if err := w.BroadcastAhead(ctx, dataplane.BarrierEvent(dataplane.Barrier{ID: 5, Unaligned: true})); err != nil {
		t.Fatal(err)
	}
	sameEvents(t, "channel state", takeAhead(t, r, 5), want[:7])

	// The loop goes on draining; the receiver consumes.
	got := make(chan []dataplane.Event, 1)
	go func() {
		evs, err := recvAll(ctx, r, 0)
		if err != nil {
			t.Error(err)
		}
		got <- evs
	}()
	drainWriter(t, ctx, w)
	if err := w.Broadcast(ctx, dataplane.EndOfPartitionEvent()); err != nil {
		t.Fatal(err)
	}
	sameEvents(t, "received", describeAll(<-got), append(want, dataplane.EndOfPartitionEvent().String()))
}
