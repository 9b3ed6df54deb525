package runtime

import (
	"sync"
	"sync/atomic"

	"github.com/streamd/streamd/dataplane"
)

// cmdKind says what the driver asks of a subtask.
type cmdKind uint8

const (
	cmdTrigger      cmdKind = iota + 1 // start checkpoint barrier.ID here (source, or non-source with finished predecessors)
	cmdNotify                          // checkpoint id is complete
	cmdAbort                           // checkpoint id was aborted
	cmdStop                            // stop-with-savepoint: end the input now (sources)
	cmdAck                             // the receiver of output channel id acknowledged EndOfData (not from the driver)
	cmdAlignTimeout                    // the aligned timeout of checkpoint id fired (the subtask's own timer)
	cmdProcTime                        // the earliest processing-time timer is due (the subtask's own wake-up, proctime.go)
)

type command struct {
	kind    cmdKind
	id      int64
	barrier dataplane.Barrier // cmdTrigger
	drain   bool              // cmdStop
	trace   map[string]string // cmdNotify: the checkpoint's trace context (nil: tracing off)
}

// mailbox carries commands from the driver to one subtask (and the
// end-of-data acknowledgements of its receivers). The driver never
// blocks on it; the subtask polls it (one atomic load) between batches and
// is woken through notify when it waits: for an operator the input gate's
// wake-up channel (the mailbox is one more channel of the gate, cmdInput),
// for a source its own channel.
type mailbox struct {
	mu     sync.Mutex
	cmds   []command
	n      atomic.Int32
	closed bool
	notify chan<- struct{}
}

// send queues c; false if the subtask has exited.
func (m *mailbox) send(c command) bool {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return false
	}
	m.cmds = append(m.cmds, c)
	m.n.Add(1)
	n := m.notify
	m.mu.Unlock()
	if n != nil {
		select {
		case n <- struct{}{}:
		default:
		}
	}
	return true
}

// take appends the queued commands to buf and empties the mailbox.
func (m *mailbox) take(buf []command) []command {
	m.mu.Lock()
	buf = append(buf, m.cmds...)
	m.cmds = m.cmds[:0]
	m.n.Store(0)
	m.mu.Unlock()
	return buf
}

// close refuses further commands: the subtask has exited.
func (m *mailbox) close() {
	m.mu.Lock()
	m.closed = true
	m.mu.Unlock()
}

// cmdInput makes a mailbox one more channel of an input gate, so a subtask
// waiting on its gate wakes up for a command. It delivers a wake-up event
// (never data) while commands are queued, and never ends.
type cmdInput struct{ m *mailbox }

var wakeEvent = dataplane.CancelCheckpointEvent(-1)

func (c cmdInput) TryRecv() (dataplane.Event, bool, error) {
	if c.m.n.Load() > 0 {
		return wakeEvent, true, nil
	}
	return dataplane.Event{}, false, nil
}

func (c cmdInput) SetNotify(n chan<- struct{}) {
	c.m.mu.Lock()
	c.m.notify = n
	c.m.mu.Unlock()
}

func (c cmdInput) Name() string { return "commands" }
