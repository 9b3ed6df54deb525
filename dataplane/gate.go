package dataplane

import (
	"context"
	"errors"
	"fmt"
)

// ErrGateEnded is returned by InputGate.Next once every channel delivered its
// EndOfPartition.
var ErrGateEnded = errors.New("dataplane: all input channels ended")

// InputGate multiplexes the input channels of one subtask. It serves the
// channels round robin, one event at a time, so no channel starves another.
// A channel can be blocked (for barrier alignment): its events stay queued,
// and back-pressure its sender, until it is unblocked. A channel is retired
// after it delivered EndOfPartition. One goroutine uses a gate.
type InputGate struct {
	chans  []gateChannel
	notify chan struct{}
	next   int // channel to poll first
	open   int // channels that have not delivered EndOfPartition
}

type gateChannel struct {
	in      Input
	input   int // index of the logical input (job-graph edge) it belongs to
	blocked bool
	ended   bool
}

// GateChannel is one channel given to NewInputGate: its receiving side and the
// logical input (the index of the job-graph edge) it belongs to.
type GateChannel struct {
	In    Input
	Input int
}

// NewInputGate returns a gate over chans and registers itself for their
// notifications; it must be built before anything is sent on them.
func NewInputGate(chans []GateChannel) *InputGate {
	g := &InputGate{notify: make(chan struct{}, 1), open: len(chans)}
	for _, c := range chans {
		c.In.SetNotify(g.notify)
		g.chans = append(g.chans, gateChannel{in: c.In, input: c.Input})
	}
	return g
}

// NumChannels is the number of channels of the gate; channel indexes are
// 0..NumChannels()-1 in the order given to NewInputGate.
func (g *InputGate) NumChannels() int { return len(g.chans) }

// Input returns the logical input channel ch belongs to.
func (g *InputGate) Input(ch int) int { return g.chans[ch].input }

// In returns the receiving side of channel ch.
func (g *InputGate) In(ch int) Input { return g.chans[ch].in }

// Name returns the name of channel ch.
func (g *InputGate) Name(ch int) string { return g.chans[ch].in.Name() }

// Ended reports whether channel ch delivered EndOfPartition.
func (g *InputGate) Ended(ch int) bool { return g.chans[ch].ended }

// Open is the number of channels that have not delivered EndOfPartition.
func (g *InputGate) Open() int { return g.open }

// Block stops delivering events of channel ch until Unblock(ch).
func (g *InputGate) Block(ch int) { g.chans[ch].blocked = true }

// Unblock resumes delivering events of channel ch.
func (g *InputGate) Unblock(ch int) {
	if g.chans[ch].blocked {
		g.chans[ch].blocked = false
		g.wake()
	}
}

// UnblockAll unblocks every channel.
func (g *InputGate) UnblockAll() {
	for i := range g.chans {
		g.chans[i].blocked = false
	}
	g.wake()
}

// Blocked reports whether channel ch is blocked.
func (g *InputGate) Blocked(ch int) bool { return g.chans[ch].blocked }

func (g *InputGate) wake() {
	select {
	case g.notify <- struct{}{}:
	default:
	}
}

// Notify returns the channel the gate's channels wake it on when an event
// arrives (what Next waits for): a subtask that waits for something else
// too selects on it. A wake-up taken from it is harmless: Next polls first.
func (g *InputGate) Notify() <-chan struct{} { return g.notify }

// TryNext returns the next event of an unblocked channel if one is ready,
// without blocking.
func (g *InputGate) TryNext() (ch int, ev Event, ok bool, err error) {
	n := len(g.chans)
	for i := 0; i < n; i++ {
		c := g.next + i
		if c >= n {
			c -= n
		}
		gc := &g.chans[c]
		if gc.blocked || gc.ended {
			continue
		}
		ev, ok, err := gc.in.TryRecv()
		if err != nil {
			return c, Event{}, false, err
		}
		if !ok {
			continue
		}
		if ev.Kind == KindEndOfPartition {
			gc.ended = true
			g.open--
		}
		g.next = c + 1
		if g.next == n {
			g.next = 0
		}
		return c, ev, true, nil
	}
	return 0, Event{}, false, nil
}

// Next returns the next event of an unblocked channel, waiting for one. It
// returns ErrGateEnded when every channel has ended, and ctx's error when ctx
// ends first. Waiting while every open channel is blocked is an error.
func (g *InputGate) Next(ctx context.Context) (ch int, ev Event, err error) {
	for {
		if g.open == 0 {
			return 0, Event{}, ErrGateEnded
		}
		ch, ev, ok, err := g.TryNext()
		if err != nil || ok {
			return ch, ev, err
		}
		if g.allBlocked() {
			return 0, Event{}, fmt.Errorf("dataplane: input gate: all %d open channels are blocked", g.open)
		}
		select {
		case <-g.notify:
		case <-ctx.Done():
			return 0, Event{}, fmt.Errorf("dataplane: input gate: %w", context.Cause(ctx))
		}
	}
}

func (g *InputGate) allBlocked() bool {
	for i := range g.chans {
		if !g.chans[i].ended && !g.chans[i].blocked {
			return false
		}
	}
	return true
}

// Overtaking reports whether a channel that has not ended may hold an
// overtaking barrier (Overtakable.Overtaking).
func (g *InputGate) Overtaking() bool {
	for i := range g.chans {
		if o, ok := g.chans[i].in.(Overtakable); ok && !g.chans[i].ended && o.Overtaking() {
			return true
		}
	}
	return false
}

// TakeOvertaking takes an overtaking barrier out of the first channel, in
// channel order, that holds one (blocked or not), calling visit with the
// records and watermarks queued before it on that channel
// (Overtakable.TakeBarrier). ok is false when none was taken.
func (g *InputGate) TakeOvertaking(visit func(ch int, ev Event)) (ch int, b Barrier, ok bool, err error) {
	for c := range g.chans {
		o, isO := g.chans[c].in.(Overtakable)
		if !isO || g.chans[c].ended || !o.Overtaking() {
			continue
		}
		b, ok, err := o.TakeBarrier(func(ev Event) { visit(c, ev) })
		if err != nil || ok {
			return c, b, ok, err
		}
	}
	return 0, Barrier{}, false, nil
}

// AnnounceBarriers asks every channel that can (Announcer) to announce
// aligned barriers as soon as they are queued.
func (g *InputGate) AnnounceBarriers() {
	for i := range g.chans {
		if a, ok := g.chans[i].in.(Announcer); ok {
			a.AnnounceBarriers()
		}
	}
}

// Announced calls f with each barrier announced (Announcer.Announced) on
// a channel that has not ended, in channel order.
func (g *InputGate) Announced(f func(ch int, b Barrier)) {
	for c := range g.chans {
		a, ok := g.chans[c].in.(Announcer)
		if !ok || g.chans[c].ended {
			continue
		}
		if b, ok := a.Announced(); ok {
			f(c, b)
		}
	}
}

// WantBarrier asks channel ch to flag checkpoint id's barrier as overtaking
// once it is queued (Overtakable.WantBarrier); nothing for a channel that
// cannot.
func (g *InputGate) WantBarrier(ch int, id int64) {
	if o, ok := g.chans[ch].in.(Overtakable); ok {
		o.WantBarrier(id)
	}
}
