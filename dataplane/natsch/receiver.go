package natsch

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/nats-io/nats.go"
	"github.com/streamd/streamd/dataplane"
)

// Receiver is the receiving side of a NATS channel: a dataplane.Input. The
// subscription's goroutine queues arriving messages under mu; the subtask's
// goroutine takes them with TryRecv, checks their sequence numbers, decodes
// them and re-grants credit.
type Receiver struct {
	t          *Transport
	id         ChannelID
	name       string
	creditSubj string
	window     uint64
	sub        *nats.Subscription

	mu          sync.Mutex
	queue       []*nats.Msg
	head        int
	queuedBytes uint64 // payload bytes arrived and not yet taken by TryRecv
	arrivedSeq  uint64 // highest sequence number arrived
	granted     uint64 // cumulative grant last published
	consumed    uint64 // payload bytes delivered by TryRecv
	err         error  // a failure reported asynchronously
	notify      chan<- struct{}

	// Owned by the receiving goroutine.
	seq    uint64 // last sequence number delivered
	ended  bool
	failed error // sticky: TryRecv keeps returning it
	closed atomic.Bool

	stats struct {
		messages, bytes, maxQueued, grants atomic.Uint64
	}
}

// NewReceiver subscribes to id's data subject and grants the sender the
// transport's window. The subscription's pending limits are set far above
// what credits allow to queue, so NATS does not drop its messages.
func (t *Transport) NewReceiver(id ChannelID) (*Receiver, error) {
	if err := id.Validate(); err != nil {
		return nil, err
	}
	r := &Receiver{t: t, id: id, name: "nats " + id.String(), creditSubj: id.CreditSubject(), window: uint64(t.opts.Window)}
	sub, err := t.nc.Subscribe(id.DataSubject(), r.onData)
	if err != nil {
		return nil, fmt.Errorf("natsch: %s: subscribe: %w", r.name, err)
	}
	r.sub = sub
	// Messages wait here only until the callback queues them; credits bound
	// the bytes in flight to the window (plus one oversized message).
	pending := 2*t.opts.Window + 2*t.maxMessage + 1<<20
	if err := sub.SetPendingLimits(-1, pending); err != nil {
		sub.Unsubscribe()
		return nil, fmt.Errorf("natsch: %s: pending limits: %w", r.name, err)
	}
	if err := t.register(sub, r); err != nil {
		sub.Unsubscribe()
		return nil, err
	}
	// Make sure the server knows the subscription before the sender can get
	// credit to publish.
	if err := t.nc.Flush(); err != nil {
		r.Close()
		return nil, fmt.Errorf("natsch: %s: flush subscription: %w", r.name, err)
	}
	r.mu.Lock()
	r.granted = r.window
	r.mu.Unlock()
	if err := r.publishCredit(r.window); err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

// Name names the channel in errors.
func (r *Receiver) Name() string { return r.name }

// ID is the channel's id.
func (r *Receiver) ID() ChannelID { return r.id }

func (r *Receiver) publishCredit(granted uint64) error {
	r.stats.grants.Add(1)
	var b [creditLen]byte // TryRecv and onData both grant: no shared buffer
	if err := r.t.nc.Publish(r.creditSubj, appendCredit(b[:0], granted, uint32(r.window))); err != nil {
		return fmt.Errorf("natsch: %s: grant credit: %w", r.name, err)
	}
	return nil
}

// onData runs on the subscription's goroutine, one message at a time, in
// arrival order.
func (r *Receiver) onData(m *nats.Msg) {
	kind, seq, body, err := decodeHeader(m.Data)
	if err != nil {
		r.fail(fmt.Errorf("natsch: %s: %w", r.name, err))
		return
	}
	if kind == wireCreditRequest {
		if len(body) != 8 {
			r.fail(fmt.Errorf("natsch: %s: %w: credit request of %d bytes", r.name, ErrWire, len(m.Data)))
			return
		}
		lastSent := binary.LittleEndian.Uint64(body)
		// The sender waits for credit: grant all that has been consumed, not
		// only the last re-grant (which waits for a quarter of the window).
		r.mu.Lock()
		arrived := r.arrivedSeq
		if g := r.consumed + r.window; g > r.granted {
			r.granted = g
		}
		granted := r.granted
		r.mu.Unlock()
		if lastSent > arrived {
			// The request follows the sender's messages on the same subject,
			// so they should all have arrived before it.
			r.fail(fmt.Errorf("%w: %s: gap: the sender has sent %d messages but only %d arrived (%d lost)", dataplane.ErrSequence, r.name, lastSent, arrived, lastSent-arrived))
			return
		}
		if !r.closed.Load() {
			// A failure shows in the sender's next request or in TryRecv.
			_ = r.publishCredit(granted)
		}
		return
	}
	r.mu.Lock()
	r.queue = append(r.queue, m)
	if seq > r.arrivedSeq {
		r.arrivedSeq = seq
	}
	r.queuedBytes += uint64(len(m.Data))
	if r.queuedBytes > r.stats.maxQueued.Load() {
		r.stats.maxQueued.Store(r.queuedBytes)
	}
	n := r.notify
	r.mu.Unlock()
	wake(n)
}

func wake(n chan<- struct{}) {
	if n != nil {
		select {
		case n <- struct{}{}:
		default:
		}
	}
}

func (r *Receiver) fail(err error) {
	r.mu.Lock()
	if r.err == nil {
		r.err = err
	}
	n := r.notify
	r.mu.Unlock()
	wake(n)
}

// SetNotify registers the channel the receiver wakes when a message arrives
// (or the channel fails).
func (r *Receiver) SetNotify(c chan<- struct{}) {
	r.mu.Lock()
	r.notify = c
	ready := r.head < len(r.queue) || r.err != nil
	r.mu.Unlock()
	if ready {
		wake(c)
	}
}

// TryRecv returns the next event if one has arrived. It fails, for good, when
// the message's sequence number is not the next one (an error wrapping
// dataplane.ErrSequence), when a message is malformed, or when NATS reported
// an error for the subscription (e.g. a slow consumer).
func (r *Receiver) TryRecv() (dataplane.Event, bool, error) {
	if r.failed != nil {
		return dataplane.Event{}, false, r.failed
	}
	r.mu.Lock()
	if r.err != nil {
		r.failed = r.err
		r.mu.Unlock()
		return dataplane.Event{}, false, r.failed
	}
	if r.head == len(r.queue) {
		r.mu.Unlock()
		return dataplane.Event{}, false, nil
	}
	m := r.queue[r.head]
	r.queue[r.head] = nil
	if r.head++; r.head == len(r.queue) {
		r.queue, r.head = r.queue[:0], 0
	}
	r.queuedBytes -= uint64(len(m.Data))
	r.mu.Unlock()

	seq, ev, err := DecodeEvent(m.Data)
	if err != nil {
		r.failed = fmt.Errorf("natsch: %s: message after %d: %w", r.name, r.seq, err)
		return dataplane.Event{}, false, r.failed
	}
	if r.ended {
		r.failed = fmt.Errorf("%w: %s: received %s (seq %d) after end-of-partition", dataplane.ErrChannelEnded, r.name, ev, seq)
		return dataplane.Event{}, false, r.failed
	}
	if err := dataplane.CheckSeq(r.name, r.seq, seq); err != nil {
		if ev.Kind == dataplane.KindRecords {
			ev.Batch.Release()
		}
		r.failed = err
		return dataplane.Event{}, false, err
	}
	r.seq = seq
	size := uint64(len(m.Data))
	r.stats.messages.Add(1)
	r.stats.bytes.Add(size)
	if ev.Kind == dataplane.KindBarrier && len(m.Header) > 0 {
		ev.Barrier.Trace = make(map[string]string, len(m.Header))
		for k, v := range m.Header {
			if len(v) > 0 {
				ev.Barrier.Trace[k] = v[0]
			}
		}
	}
	if h := r.t.opts.RecvHeader; h != nil {
		h(ev, m.Header)
	}
	// Re-grant once a quarter of the window has been consumed.
	r.mu.Lock()
	r.consumed += size
	if ev.Kind == dataplane.KindEndOfPartition {
		r.mu.Unlock()
		r.ended = true
		r.Close()
		return ev, true, nil
	}
	regrant := r.consumed+r.window-r.granted >= r.window/4
	if regrant {
		r.granted = r.consumed + r.window
	}
	g := r.granted
	r.mu.Unlock()
	if regrant {
		if err := r.publishCredit(g); err != nil {
			r.failed = err
			return dataplane.Event{}, false, err
		}
	}
	return ev, true, nil
}

// ReceiverStats are counters of a Receiver.
type ReceiverStats struct {
	Messages, Bytes uint64 // data messages and payload bytes delivered
	// MaxQueued is the most payload bytes ever queued at the receiver
	// (arrived, not yet taken by TryRecv): at most the window.
	MaxQueued uint64
	Grants    uint64 // credit messages published
	Window    uint64
}

// Stats returns the receiver's counters; any goroutine may call it.
func (r *Receiver) Stats() ReceiverStats {
	return ReceiverStats{
		Messages: r.stats.messages.Load(), Bytes: r.stats.bytes.Load(), MaxQueued: r.stats.maxQueued.Load(),
		Grants: r.stats.grants.Load(), Window: r.window,
	}
}

// Close unsubscribes. The receiver closes itself after delivering
// EndOfPartition; call Close when abandoning it earlier.
func (r *Receiver) Close() error {
	if r.closed.Swap(true) {
		return nil
	}
	r.t.unregister(r.sub)
	if err := r.sub.Unsubscribe(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) && !errors.Is(err, nats.ErrBadSubscription) {
		return fmt.Errorf("natsch: %s: %w", r.name, err)
	}
	return nil
}

var _ dataplane.Input = (*Receiver)(nil)
