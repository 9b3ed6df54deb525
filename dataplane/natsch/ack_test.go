package natsch

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/streamd/streamd/dataplane"
)

// recvUntil takes events from r until one of kind k.
func recvUntil(t *testing.T, r *Receiver, k dataplane.Kind) {
	t.Helper()
	wake := make(chan struct{}, 1) // the receiver pokes it when a message arrives
	r.SetNotify(wake)
	timeout := time.After(5 * time.Second)
	for {
		ev, ok, err := r.TryRecv()
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			select {
			case <-wake:
			case <-timeout:
				t.Fatalf("no %s within 5s", k)
			}
			continue
		}
		if ev.Kind == dataplane.KindRecords {
			ev.Batch.Release()
		}
		if ev.Kind == k {
			return
		}
	}
}

func waitAck(t *testing.T, acked <-chan struct{}) {
	t.Helper()
	select {
	case <-acked:
	case <-time.After(5 * time.Second):
		t.Fatal("no end-of-data acknowledgement within 5s")
	}
}

// receiverAcks takes events from r up to EndOfData and acknowledges it;
// the sender must hear of the acknowledgement (acked) then, not before.
func receiverAcks(t *testing.T, r *Receiver, acked <-chan struct{}) {
	t.Helper()
	recvUntil(t, r, dataplane.KindEndOfData)
	select {
	case <-acked:
		t.Fatal("acknowledged before the receiver acknowledged")
	default:
	}
	if err := r.AckEndOfData(); err != nil {
		t.Fatal(err)
	}
	waitAck(t, acked)
}

// The finishing handshake over NATS: the sender hears of the
// acknowledgement only once the receiver sent it, after taking EndOfData.
func TestEndOfDataAck(t *testing.T) {
	nc := connect(t, startServer(t, 0))
	tr := transport(t, nc)
	r, s := channelEnds(t, tr, tr)
	ctx := context.Background()
	for _, ev := range []dataplane.Event{dataplane.RecordsEvent(batchOf(rec(1, 10))), dataplane.EndOfDataEvent(true)} {
		if err := s.Send(ctx, ev); err != nil {
			t.Fatal(err)
		}
	}
	acked := make(chan struct{}, 2)
	if !s.NotifyEndOfDataAck(func() { acked <- struct{}{} }) {
		t.Fatal("the receiver does not take part in the handshake")
	}
	receiverAcks(t, r, acked)
	if err := r.AckEndOfData(); err == nil {
		t.Fatal("second acknowledgement accepted")
	}
	// Barriers still flow after EndOfData; EndOfPartition ends the channel.
	for _, ev := range []dataplane.Event{dataplane.BarrierEvent(dataplane.Barrier{ID: 1}), dataplane.EndOfPartitionEvent()} {
		if err := s.Send(ctx, ev); err != nil {
			t.Fatal(err)
		}
	}
	recvUntil(t, r, dataplane.KindBarrier)
	recvUntil(t, r, dataplane.KindEndOfPartition)
}

// A lost acknowledgement is sent again: the waiting sender asks with credit
// requests, and the receiver answers them with the acknowledgement too.
func TestEndOfDataAckRepeated(t *testing.T) {
	srv := startServer(t, 0)
	tr := transport(t, connect(t, srv), CreditRetry(10*time.Millisecond))
	r, err := tr.NewReceiver(testID)
	if err != nil {
		t.Fatal(err)
	}
	if err := tr.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	s, err := tr.NewSender(testID)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(context.Background(), dataplane.EndOfDataEvent(true)); err != nil {
		t.Fatal(err)
	}
	recvUntil(t, r, dataplane.KindEndOfData)
	if err := r.AckEndOfData(); err != nil { // published before the sender waits: its callback misses nothing
		t.Fatal(err)
	}
	// Forget the acknowledgement, as if it had been lost.
	s.mu.Lock()
	s.acked = false
	s.mu.Unlock()
	acked := make(chan struct{}, 4)
	if !s.NotifyEndOfDataAck(func() { acked <- struct{}{} }) {
		t.Fatal("the receiver does not take part in the handshake")
	}
	waitAck(t, acked)
	s.Close()
	r.Close()
}

// An older receiver (grants without the Streamd-Acks header) never
// acknowledges: the sender says so and nobody waits.
func TestEndOfDataAckOldReceiver(t *testing.T) {
	nc := connect(t, startServer(t, 0))
	tr := transport(t, nc)
	data, err := nc.SubscribeSync(testID.DataSubject())
	if err != nil {
		t.Fatal(err)
	}
	s, err := tr.NewSender(testID)
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Publish(testID.CreditSubject(), appendCredit(nil, 1<<20, 1<<20)); err != nil {
		t.Fatal(err)
	}
	if err := s.Send(context.Background(), dataplane.EndOfDataEvent(true)); err != nil {
		t.Fatal(err)
	}
	if s.NotifyEndOfDataAck(func() { t.Error("acknowledged by an older receiver") }) {
		t.Fatal("the sender waits for an older receiver")
	}
	var m *nats.Msg
	for m == nil || m.Data[1] == wireCreditRequest { // the sender may have asked for credit first
		if m, err = data.NextMsg(5 * time.Second); err != nil {
			t.Fatal(err)
		}
	}
	if m.Header.Get(HeaderAckRequest) != "1" {
		t.Fatalf("end-of-data without %s header: %v", HeaderAckRequest, m.Header)
	}
}

// An older sender (EndOfData without the Streamd-Ack-Request header) gets
// grants only, never an acknowledgement it could not decode.
func TestEndOfDataAckOldSender(t *testing.T) {
	nc := connect(t, startServer(t, 0))
	credit := make(chan *nats.Msg, 64)
	sub, err := nc.ChanSubscribe(testID.CreditSubject(), credit)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	r, err := transport(t, nc).NewReceiver(testID)
	if err != nil {
		t.Fatal(err)
	}
	rawPublish(t, nc, 1, dataplane.EndOfDataEvent(true))
	recvUntil(t, r, dataplane.KindEndOfData)
	if err := r.AckEndOfData(); err != nil {
		t.Fatal(err)
	}
	rawPublish(t, nc, 2, dataplane.EndOfPartitionEvent())
	recvUntil(t, r, dataplane.KindEndOfPartition)
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	for len(credit) > 0 {
		m := <-credit
		if _, _, err := decodeCredit(m.Data); err != nil {
			t.Fatalf("an older sender got %d bytes it cannot decode: %v", len(m.Data), err)
		}
		if m.Header.Get(HeaderAcks) != "1" {
			t.Fatalf("grant without %s header", HeaderAcks)
		}
	}
}

// TestEndOfDataAckBeforeSent: a RecordWriter with an overdraft may still
// hold EndOfData queued, behind records the credit had no room for, when
// its subtask asks to hear of the acknowledgement: the sender waits for it
// once EndOfData is published. An older receiver's channel then counts as
// acknowledged when EndOfData is published (nothing will come).
func TestEndOfDataAckBeforeSent(t *testing.T) {
	nc := connect(t, startServer(t, 0))
	tr := transport(t, nc)
	r, s := channelEnds(t, tr, tr)
	acked := make(chan struct{}, 2)
	if !s.NotifyEndOfDataAck(func() { acked <- struct{}{} }) {
		t.Fatal("before end-of-data is sent, the sender does not wait for its acknowledgement")
	}
	ctx := context.Background()
	for _, ev := range []dataplane.Event{dataplane.RecordsEvent(batchOf(rec(1, 10))), dataplane.EndOfDataEvent(true)} {
		if err := s.Send(ctx, ev); err != nil {
			t.Fatal(err)
		}
	}
	receiverAcks(t, r, acked)

	// An older receiver: grants without the Streamd-Acks header.
	old := testID
	old.ToSubtask = 2
	s, err := tr.NewSender(old)
	if err != nil {
		t.Fatal(err)
	}
	if !s.NotifyEndOfDataAck(func() { acked <- struct{}{} }) {
		t.Fatal("before end-of-data is sent, the sender does not wait for its acknowledgement")
	}
	if err := nc.Publish(old.CreditSubject(), appendCredit(nil, 1<<20, 1<<20)); err != nil {
		t.Fatal(err)
	}
	if err := s.Send(ctx, dataplane.EndOfDataEvent(true)); err != nil {
		t.Fatal(err)
	}
	waitAck(t, acked)
}
