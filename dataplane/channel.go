package dataplane

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
)

// Errors of the data plane.
var (
	// ErrSequence is wrapped by the error a receiver returns when a message's
	// sequence number shows a gap (lost messages) or a duplicate.
	ErrSequence = errors.New("dataplane: sequence error")
	// ErrChannelEnded is wrapped when a message is sent or received after the
	// channel's EndOfPartition.
	ErrChannelEnded = errors.New("dataplane: channel ended")
)

// Output is the sending side of a channel. One goroutine sends on it.
type Output interface {
	// Send stamps ev with the next sequence number and queues it. It blocks
	// while the channel is full (back-pressure) and returns ctx's error if ctx
	// ends first. A Batch sent belongs to the receiver from then on.
	// EndOfPartition must be the last event sent.
	Send(ctx context.Context, ev Event) error
	Name() string
}

// Input is the receiving side of a channel, as an InputGate drives it. One
// goroutine receives on it.
type Input interface {
	// TryRecv returns the next event if one is ready, without blocking. It
	// fails with an error wrapping ErrSequence when the message's sequence
	// number is not the one expected.
	TryRecv() (ev Event, ok bool, err error)
	// SetNotify registers c, on which the channel does a non-blocking send
	// whenever a message arrives. It is called once, before the first Send.
	SetNotify(c chan<- struct{})
	Name() string
}

// The finishing handshake (FLIP-147) is the one signal that flows from the
// receiver back to the sender: once the receiver has processed every record
// the sender sent before EndOfData, it acknowledges that EndOfData, and the
// sender closes only after the acknowledgement of each of its channels.

// EndOfDataAcker is an Input that can acknowledge to its sender the
// EndOfData it delivered.
type EndOfDataAcker interface {
	// AckEndOfData tells the sender that every record before EndOfData has
	// been processed. Call it once, after EndOfData was received.
	AckEndOfData() error
}

// AckNotifier is an Output whose receiver acknowledges EndOfData.
type AckNotifier interface {
	// NotifyEndOfDataAck arranges for f to be called once, on any
	// goroutine, when the receiver has acknowledged the EndOfData sent on
	// the channel (at once if it already has). It reports false when the
	// receiver does not take part in the handshake (an older peer): f is
	// never called and the sender must not wait. Call it after sending
	// EndOfData, or after handing it to a RecordWriter whose overdraft may
	// hold it queued: the acknowledgement is then waited for once it is
	// sent.
	NotifyEndOfDataAck(f func()) bool
}

// NotifyEndOfDataAck is o's NotifyEndOfDataAck, false for an Output that
// is no AckNotifier.
func NotifyEndOfDataAck(o Output, f func()) bool {
	if n, ok := o.(AckNotifier); ok {
		return n.NotifyEndOfDataAck(f)
	}
	return false
}

// AckEndOfData is in's AckEndOfData; nothing for an Input that is no
// EndOfDataAcker.
func AckEndOfData(in Input) error {
	if a, ok := in.(EndOfDataAcker); ok {
		return a.AckEndOfData()
	}
	return nil
}

// Unaligned checkpoints let a barrier overtake the records queued before
// it (DESIGN.md "Unaligned checkpoints"). The barrier still travels in
// order, behind those records; what changes is who may look ahead:
//
//   - the sender does not wait for room in the channel for the records of
//     its output buffers and the barrier behind them (Overtaker.SendNow), so
//     a back-pressured channel never delays the barrier;
//   - the receiver takes the barrier out of the middle of the queue as soon
//     as it is queued (Overtakable), together with copies of the records
//     and watermarks before it, which become the channel's state in the
//     checkpoint and are still processed afterwards as usual.

// Overtaker is an Output that can send without waiting for room.
type Overtaker interface {
	// SendNow is Send without back-pressure: the event is queued even when
	// the channel is full. The channel may exceed its capacity by what is
	// sent this way (one batch per output and a barrier per checkpoint).
	SendNow(ctx context.Context, ev Event) error
}

// SendNow is o's SendNow, or Send for an Output that is no Overtaker.
func SendNow(ctx context.Context, o Output, ev Event) error {
	if n, ok := o.(Overtaker); ok {
		return n.SendNow(ctx, ev)
	}
	return o.Send(ctx, ev)
}

// TrySender is an Output that can tell whether a send would wait, so the
// sending subtask waits for room together with its mailbox rather than
// inside Send (RecordWriter's overdraft).
type TrySender interface {
	// TrySend sends ev if the channel has room now; false, without
	// sending, when it has none.
	TrySend(ctx context.Context, ev Event) (bool, error)
	// Room returns a channel that is ready when room may have been made
	// since a TrySend found none (spurious readiness is allowed).
	Room() <-chan struct{}
}

// TrySend is o's TrySend; for an Output that is no TrySender, Send (it
// waits) and true.
func TrySend(ctx context.Context, o Output, ev Event) (bool, error) {
	if n, ok := o.(TrySender); ok {
		return n.TrySend(ctx, ev)
	}
	return true, o.Send(ctx, ev)
}

// Room is o's Room; nil for an Output that is no TrySender.
func Room(o Output) <-chan struct{} {
	if n, ok := o.(TrySender); ok {
		return n.Room()
	}
	return nil
}

// Overtakable is an Input whose receiver can take a barrier ahead of the
// events queued before it.
type Overtakable interface {
	// WantBarrier asks the channel to flag checkpoint id's barrier as an
	// overtaking one once it is queued (it may be queued already): the
	// receiver's unaligned checkpoint waits for it.
	WantBarrier(id int64)
	// Overtaking reports whether an overtaking barrier (one sent unaligned,
	// or the wanted one) may be queued. Any goroutine may call it.
	Overtaking() bool
	// TakeBarrier removes the first overtaking barrier from the queue and
	// returns it, after calling visit with each records and watermark event
	// queued before it, in order (visit must copy what it keeps: the
	// batches stay queued and are delivered by TryRecv later). The barrier
	// overtakes an end-of-data queued before it too (a finished sender's
	// checkpoints go on while the receiver drains, FLIP-147): the
	// end-of-data stays queued, after the records, and is delivered in
	// order. It takes nothing, and clears the flag, when end-of-partition
	// comes first: the barrier is then delivered in order.
	TakeBarrier(visit func(Event)) (Barrier, bool, error)
}

// Announcer is an Overtakable input that announces an aligned barrier as
// soon as it is queued behind records (Flink's EventAnnouncement), so that
// the receiver's alignment, and its aligned timeout, start then rather
// than when the barrier comes out of the queue.
type Announcer interface {
	// AnnounceBarriers turns announcements on (off by default). Then
	// Overtaking also reports a pending announcement.
	AnnounceBarriers()
	// Announced returns the newest aligned barrier queued since the last
	// call; false when none was.
	Announced() (Barrier, bool)
}

// Channel is one point-to-point channel between two subtasks. The in-process
// implementation is LocalChannel; a NATS implementation plugs in here.
type Channel interface {
	Output() Output
	Input() Input
}

// message is what travels on a LocalChannel.
type message struct {
	seq   uint64
	ev    Event
	taken bool // a barrier the receiver took ahead (TakeBarrier)
}

// LocalChannel is a bounded in-process channel: a queue under a mutex, so
// the receiver can look into it for an overtaking barrier.
type LocalChannel struct {
	name   string
	cap    int
	notify chan<- struct{}
	out    localOutput
	in     localInput

	mu    sync.Mutex
	q     []message // q[head:] is queued
	head  int
	n     int           // queued messages that count against cap
	room  chan struct{} // poked when a message is taken
	want  int64         // the barrier the receiver waits for (WantBarrier)
	prio  atomic.Bool   // an overtaking barrier (or an announcement) may be queued
	ended bool
	// announce: the receiver wants aligned barriers announced (Announcer);
	// announced is the newest queued since it last looked, if any.
	announce  bool
	announced *Barrier

	ackMu sync.Mutex
	acked bool   // the receiver acknowledged EndOfData
	onAck func() // the sender's NotifyEndOfDataAck

	onBlock func() // tests: called when a sender finds the channel full and waits
}

// NewLocalChannel returns a channel holding at most capacity messages
// (capacity < 1 is treated as 1). name appears in errors, e.g. "map[0]->sink[1]".
func NewLocalChannel(name string, capacity int) *LocalChannel {
	if capacity < 1 {
		capacity = 1
	}
	c := &LocalChannel{name: name, cap: capacity, q: make([]message, 0, capacity), room: make(chan struct{}, 1)}
	c.out.c = c
	c.in.c = c
	return c
}

// Output returns the sending side.
func (c *LocalChannel) Output() Output { return &c.out }

// Input returns the receiving side.
func (c *LocalChannel) Input() Input { return &c.in }

// Len is the number of queued messages.
func (c *LocalChannel) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

// Cap is the channel's capacity in messages.
func (c *LocalChannel) Cap() int { return c.cap }

type localOutput struct {
	c     *LocalChannel
	seq   uint64
	ended bool
}

func (o *localOutput) Name() string { return o.c.name }

func (o *localOutput) Send(ctx context.Context, ev Event) error { return o.send(ctx, ev, true) }

// SendNow implements Overtaker.
func (o *localOutput) SendNow(ctx context.Context, ev Event) error { return o.send(ctx, ev, false) }

func (o *localOutput) send(ctx context.Context, ev Event, wait bool) error {
	if o.ended {
		return fmt.Errorf("%w: %s: send %s after end-of-partition", ErrChannelEnded, o.c.name, ev)
	}
	if err := o.c.put(ctx, message{seq: o.seq + 1, ev: ev}, wait); err != nil {
		return err
	}
	o.seq++
	if ev.Kind == KindEndOfPartition {
		o.ended = true
	}
	return nil
}

// TrySend implements TrySender.
func (o *localOutput) TrySend(ctx context.Context, ev Event) (bool, error) {
	c := o.c
	c.mu.Lock()
	full := c.n >= c.cap
	c.mu.Unlock()
	if full && !o.ended { // one sender: the room it saw stays until it sends
		return false, nil
	}
	return true, o.send(ctx, ev, false)
}

// Room implements TrySender.
func (o *localOutput) Room() <-chan struct{} { return o.c.room }

// NotifyEndOfDataAck implements AckNotifier.
func (o *localOutput) NotifyEndOfDataAck(f func()) bool {
	c := o.c
	c.ackMu.Lock()
	if !c.acked {
		c.onAck = f
		c.ackMu.Unlock()
		return true
	}
	c.ackMu.Unlock()
	f()
	return true
}

// put queues m, with wait blocking while the channel is full.
func (c *LocalChannel) put(ctx context.Context, m message, wait bool) error {
	c.mu.Lock()
	for wait && c.n >= c.cap {
		c.mu.Unlock()
		if c.onBlock != nil {
			c.onBlock()
		}
		select {
		case <-c.room:
		case <-ctx.Done():
			return fmt.Errorf("dataplane: %s: send %s: %w", c.name, m.ev, context.Cause(ctx))
		}
		c.mu.Lock()
	}
	c.q = append(c.q, m)
	c.n++
	if m.ev.Kind == KindBarrier && (m.ev.Barrier.Unaligned || m.ev.Barrier.ID == c.want && c.want != 0) {
		c.prio.Store(true)
	} else if m.ev.Kind == KindBarrier && c.announce && c.n > 1 {
		b := m.ev.Barrier // behind what is queued: announce it
		c.announced = &b
		c.prio.Store(true)
	}
	c.mu.Unlock()
	if c.notify != nil {
		select {
		case c.notify <- struct{}{}:
		default:
		}
	}
	return nil
}

type localInput struct {
	c     *LocalChannel
	seq   uint64 // last sequence number received
	ended bool
}

func (in *localInput) Name() string { return in.c.name }

func (in *localInput) SetNotify(n chan<- struct{}) { in.c.notify = n }

func (in *localInput) TryRecv() (Event, bool, error) {
	c := in.c
	for {
		c.mu.Lock()
		if c.head == len(c.q) {
			c.mu.Unlock()
			return Event{}, false, nil
		}
		m := c.q[c.head]
		c.q[c.head] = message{}
		if c.head++; c.head == len(c.q) {
			c.q, c.head = c.q[:0], 0
		} else if c.head >= 64 && c.head*2 >= len(c.q) {
			k := copy(c.q, c.q[c.head:])
			clear(c.q[k:])
			c.q, c.head = c.q[:k], 0
		}
		if !m.taken {
			c.n--
		}
		c.mu.Unlock()
		if !m.taken {
			select {
			case c.room <- struct{}{}:
			default:
			}
		}
		if err := in.check(m); err != nil {
			return Event{}, false, err
		}
		if !m.taken {
			return m.ev, true, nil
		}
	}
}

// WantBarrier implements Overtakable.
func (in *localInput) WantBarrier(id int64) {
	c := in.c
	c.mu.Lock()
	c.want = id
	for _, m := range c.q[c.head:] {
		if m.ev.Kind == KindBarrier && m.ev.Barrier.ID == id && !m.taken {
			c.prio.Store(true)
		}
	}
	c.mu.Unlock()
}

// Overtaking implements Overtakable.
func (in *localInput) Overtaking() bool { return in.c.prio.Load() }

// AnnounceBarriers implements Announcer.
func (in *localInput) AnnounceBarriers() {
	in.c.mu.Lock()
	in.c.announce = true
	in.c.mu.Unlock()
}

// Announced implements Announcer.
func (in *localInput) Announced() (Barrier, bool) {
	c := in.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.announced == nil {
		return Barrier{}, false
	}
	b := *c.announced
	c.announced = nil
	return b, true
}

// TakeBarrier implements Overtakable.
func (in *localInput) TakeBarrier(visit func(Event)) (Barrier, bool, error) {
	c := in.c
	c.mu.Lock()
	defer c.mu.Unlock()
	c.prio.Store(false)
	q := c.q[c.head:]
	for i := range q {
		m := &q[i]
		if m.taken {
			continue
		}
		switch m.ev.Kind {
		case KindEndOfPartition:
			return Barrier{}, false, nil
		case KindBarrier:
			if !m.ev.Barrier.Unaligned && (c.want == 0 || m.ev.Barrier.ID != c.want) {
				continue
			}
			for _, p := range q[:i] {
				if !p.taken && (p.ev.Kind == KindRecords || p.ev.Kind == KindWatermark) {
					visit(p.ev)
				}
			}
			m.taken = true
			c.n--
			select {
			case c.room <- struct{}{}:
			default:
			}
			for _, p := range q[i+1:] {
				if p.ev.Kind == KindBarrier && !p.taken && (p.ev.Barrier.Unaligned || c.want != 0 && p.ev.Barrier.ID == c.want) {
					c.prio.Store(true) // another one behind it
				}
			}
			return m.ev.Barrier, true, nil
		}
	}
	return Barrier{}, false, nil
}

// AckEndOfData implements EndOfDataAcker.
func (in *localInput) AckEndOfData() error {
	c := in.c
	c.ackMu.Lock()
	if c.acked {
		c.ackMu.Unlock()
		return fmt.Errorf("dataplane: %s: end-of-data acknowledged twice", c.name)
	}
	c.acked = true
	f := c.onAck
	c.onAck = nil
	c.ackMu.Unlock()
	if f != nil {
		f()
	}
	return nil
}

func (in *localInput) check(m message) error {
	if in.ended {
		return fmt.Errorf("%w: %s: received %s (seq %d) after end-of-partition", ErrChannelEnded, in.c.name, m.ev, m.seq)
	}
	if err := CheckSeq(in.c.name, in.seq, m.seq); err != nil {
		return err
	}
	in.seq = m.seq
	if m.ev.Kind == KindEndOfPartition {
		in.ended = true
	}
	return nil
}

// CheckSeq checks that got follows last, the sequence number of the previous
// message on channel name (0 before the first message, which has 1).
func CheckSeq(name string, last, got uint64) error {
	want := last + 1
	switch {
	case got == want:
		return nil
	case got > want:
		return fmt.Errorf("%w: %s: gap: got message %d, want %d (%d lost)", ErrSequence, name, got, want, got-want)
	default:
		return fmt.Errorf("%w: %s: duplicate: got message %d again, want %d", ErrSequence, name, got, want)
	}
}
