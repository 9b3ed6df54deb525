package dataplane

import (
	"context"
	"errors"
	"fmt"
	"sync"
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
	// EndOfData.
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

// Channel is one point-to-point channel between two subtasks. The in-process
// implementation is LocalChannel; a NATS implementation plugs in here.
type Channel interface {
	Output() Output
	Input() Input
}

// message is what travels on a LocalChannel.
type message struct {
	seq uint64
	ev  Event
}

// LocalChannel is a bounded in-process channel.
type LocalChannel struct {
	name   string
	ch     chan message
	notify chan<- struct{}
	out    localOutput
	in     localInput

	ackMu sync.Mutex
	acked bool   // the receiver acknowledged EndOfData
	onAck func() // the sender's NotifyEndOfDataAck
}

// NewLocalChannel returns a channel holding at most capacity messages
// (capacity < 1 is treated as 1). name appears in errors, e.g. "map[0]->sink[1]".
func NewLocalChannel(name string, capacity int) *LocalChannel {
	if capacity < 1 {
		capacity = 1
	}
	c := &LocalChannel{name: name, ch: make(chan message, capacity)}
	c.out.c = c
	c.in.c = c
	return c
}

// Output returns the sending side.
func (c *LocalChannel) Output() Output { return &c.out }

// Input returns the receiving side.
func (c *LocalChannel) Input() Input { return &c.in }

// Len is the number of queued messages.
func (c *LocalChannel) Len() int { return len(c.ch) }

// Cap is the channel's capacity in messages.
func (c *LocalChannel) Cap() int { return cap(c.ch) }

type localOutput struct {
	c     *LocalChannel
	seq   uint64
	ended bool
}

func (o *localOutput) Name() string { return o.c.name }

func (o *localOutput) Send(ctx context.Context, ev Event) error {
	if o.ended {
		return fmt.Errorf("%w: %s: send %s after end-of-partition", ErrChannelEnded, o.c.name, ev)
	}
	o.seq++
	if err := o.c.put(ctx, message{seq: o.seq, ev: ev}); err != nil {
		return err
	}
	if ev.Kind == KindEndOfPartition {
		o.ended = true
	}
	return nil
}

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

// put queues m, blocking while the channel is full.
func (c *LocalChannel) put(ctx context.Context, m message) error {
	select {
	case c.ch <- m:
	default:
		select {
		case c.ch <- m:
		case <-ctx.Done():
			return fmt.Errorf("dataplane: %s: send %s: %w", c.name, m.ev, context.Cause(ctx))
		}
	}
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
	select {
	case m := <-in.c.ch:
		if err := in.check(m); err != nil {
			return Event{}, false, err
		}
		return m.ev, true, nil
	default:
		return Event{}, false, nil
	}
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
