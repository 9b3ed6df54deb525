package wire

import (
	"encoding/binary"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/streamd/streamd/internal/natstest"
)

// TestReliableQueueResendsUntilAnswered loses answers on purpose (the
// receiver takes every third request but does not answer it) and checks that every message
// arrives, in order, the repeats recognizable by their sequence numbers.
func TestReliableQueueResendsUntilAnswered(t *testing.T) {
	nc := natstest.Connect(t, natstest.Server(t).URL())
	const n = 30
	var mu sync.Mutex
	var got []uint64
	calls, last := 0, uint64(0)
	done := make(chan struct{})
	// Nobody answers at first: the queue waits (no responders) and sends
	// later. The receiver subscribes once the queue has logged that its
	// first request went unanswered.
	unanswered := make(notifyWriter, 1)
	q := NewReliableQueue(nc, "test.reliable", slog.New(slog.NewTextHandler(unanswered, nil)))
	q.timeout = 50 * time.Millisecond
	defer q.Stop()
	for i := 0; i < n; i++ {
		if err := q.Send(func(seq uint64) ([]byte, error) { return binary.LittleEndian.AppendUint64(nil, seq), nil }); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-unanswered:
	case <-time.After(30 * time.Second):
		t.Fatal("the queue logged no unanswered request within 30s")
	}
	sub, err := nc.Subscribe("test.reliable", func(m *nats.Msg) {
		mu.Lock()
		defer mu.Unlock()
		calls++
		if seq := binary.LittleEndian.Uint64(m.Data); seq > last { // a repeat is dropped
			got = append(got, seq)
			last = seq
			if seq == n {
				close(done)
			}
		}
		if calls%3 != 0 {
			m.Respond(nil)
		} // else the answer is lost: the same message comes again
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatalf("after 10s the receiver has %v", got)
	}
	if !q.Drain(time.Second) {
		t.Fatal("queue not drained")
	}
	mu.Lock()
	defer mu.Unlock()
	for i, s := range got {
		if s != uint64(i+1) {
			t.Fatalf("received %v: want 1..%d in order", got, n)
		}
	}
	if calls <= n {
		t.Fatalf("%d requests for %d messages: want repeats after the lost answers", calls, n)
	}
	t.Logf("%d messages in %d requests", n, calls)
}

// notifyWriter signals each write (a log line) without blocking.
type notifyWriter chan struct{}

func (w notifyWriter) Write(p []byte) (int, error) {
	select {
	case w <- struct{}{}:
	default:
	}
	return len(p), nil
}

// TestReliableQueueEndsOnClosedConnection closes the connection under a
// queue with a message nobody answers: the queue ends, as if stopped,
// instead of sending again in a loop (each failed request also left an
// entry in nats.go's response map: a leaked queue of an ended attempt
// spun a core and grew without bound).
func TestReliableQueueEndsOnClosedConnection(t *testing.T) {
	nc := natstest.Connect(t, natstest.Server(t).URL())
	closed := make(notifyWriter, 1)
	q := NewReliableQueue(nc, "test.closed", slog.New(slog.NewTextHandler(closed, nil)))
	defer q.Stop()
	if err := q.Send(func(seq uint64) ([]byte, error) { return []byte("x"), nil }); err != nil {
		t.Fatal(err)
	}
	nc.Close()
	select {
	case <-q.done:
	case <-time.After(30 * time.Second):
		t.Fatal("the queue still runs 30s after its connection closed")
	}
	if q.Drain(0) {
		t.Fatal("Drain reported the unsent message as answered")
	}
}
