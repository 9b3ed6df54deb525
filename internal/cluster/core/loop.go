package core

import (
	"context"
	"errors"
	"time"
)

// Loop runs a Core on one goroutine, the only caller of its Step, as
// raft's node.run does a RawNode: events come from Post (heartbeats,
// requests, the results of IO), a Tick every interval, and the actions of
// each step go to exec in order, on the loop's goroutine. exec must not
// block: it starts the IO and posts its result back.
type Loop struct {
	core     *Core
	exec     func(Action)
	interval time.Duration
	events   chan Event
	reads    chan func(*Core)
	done     chan struct{}
}

// ErrStopped: the loop stopped (its context ended, or the core was
// deposed).
var ErrStopped = errors.New("core: the controller's loop stopped")

// NewLoop returns the loop of c, ticking every interval; Run starts it.
func NewLoop(c *Core, interval time.Duration, exec func(Action)) *Loop {
	return &Loop{core: c, exec: exec, interval: interval, events: make(chan Event, 1024),
		reads: make(chan func(*Core)), done: make(chan struct{})}
}

// Post hands ev to the loop; it reports false once the loop stopped.
func (l *Loop) Post(ev Event) bool {
	select {
	case <-l.done:
		return false
	default:
	}
	select {
	case l.events <- ev:
		return true
	case <-l.done:
		return false
	}
}

// Read runs f on the loop's goroutine (to read the core: status, lists)
// and waits for it; ErrStopped once the loop stopped.
func (l *Loop) Read(f func(*Core)) error {
	ran := make(chan struct{})
	select {
	case <-l.done:
		return ErrStopped
	default:
	}
	select {
	case l.reads <- func(c *Core) { f(c); close(ran) }:
		<-ran
		return nil
	case <-l.done:
		return ErrStopped
	}
}

// Done is closed once the loop stopped.
func (l *Loop) Done() <-chan struct{} { return l.done }

// Run steps the core until ctx ends or the core is deposed (after exec
// got its Deposed action); it returns ErrStopped then.
func (l *Loop) Run(ctx context.Context) error {
	defer close(l.done)
	t := time.NewTicker(l.interval)
	defer t.Stop()
	for {
		var ev Event
		select {
		case <-ctx.Done():
			return ErrStopped
		case <-t.C:
			ev = Tick{}
		case ev = <-l.events:
		case f := <-l.reads:
			f(l.core)
			continue
		}
		for _, a := range l.core.Step(ev) {
			l.exec(a)
		}
		if l.core.Deposed() {
			return ErrStopped
		}
	}
}
