package cluster

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// taskRequestTimeout is how long a subtask event or command waits for its
// answer before it is sent again.
const taskRequestTimeout = 2 * time.Second

// reliableQueue sends messages on one subject in order, each as a request
// that is sent again (with the same sequence number) until the receiver
// answers or the queue stops: while both ends live nothing is lost, and the
// receiver drops a repeat by its sequence number. The subtask events of a
// job spread over hosts (host -> controller) and the driver's commands
// (controller -> host) go through one each per attempt and host, so a lost
// message can no longer leave a checkpoint, a final checkpoint or the end of
// a job waiting forever.
type reliableQueue struct {
	nc      *nats.Conn
	subject string
	timeout time.Duration
	log     *slog.Logger
	ctx     context.Context
	cancel  context.CancelFunc
	done    chan struct{}

	mu    sync.Mutex // guards seq, queue
	seq   uint64
	queue [][]byte
	wake  chan struct{}
	idle  chan struct{} // closed and replaced whenever the queue becomes empty
}

func newReliableQueue(nc *nats.Conn, subject string, log *slog.Logger) *reliableQueue {
	q := &reliableQueue{nc: nc, subject: subject, timeout: taskRequestTimeout, log: log,
		done: make(chan struct{}), wake: make(chan struct{}, 1), idle: make(chan struct{})}
	q.ctx, q.cancel = context.WithCancel(context.Background())
	go q.run()
	return q
}

// send gives the next sequence number to encode, which returns the message;
// it never blocks on the network.
func (q *reliableQueue) send(encode func(seq uint64) ([]byte, error)) error {
	q.mu.Lock()
	data, err := encode(q.seq + 1)
	if err != nil {
		q.mu.Unlock()
		return err
	}
	q.seq++
	q.queue = append(q.queue, data)
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
	return nil
}

// drain waits until every message was answered, at most d.
func (q *reliableQueue) drain(d time.Duration) bool {
	q.mu.Lock()
	empty, idle := len(q.queue) == 0, q.idle
	q.mu.Unlock()
	if empty {
		return true
	}
	select {
	case <-idle:
		return true
	case <-time.After(d):
		return false
	case <-q.done:
		return false
	}
}

// stop ends the queue at once (unsent messages are dropped); it does not
// wait for the goroutine.
func (q *reliableQueue) stop() { q.cancel() }

func (q *reliableQueue) run() {
	defer close(q.done)
	for {
		q.mu.Lock()
		var head []byte
		if len(q.queue) > 0 {
			head = q.queue[0]
		}
		q.mu.Unlock()
		if head == nil {
			select {
			case <-q.wake:
				continue
			case <-q.ctx.Done():
				return
			}
		}
		for tries := 0; ; tries++ {
			ctx, cancel := context.WithTimeout(q.ctx, q.timeout)
			_, err := q.nc.RequestWithContext(ctx, q.subject, head)
			cancel()
			if err == nil {
				break
			}
			if q.ctx.Err() != nil {
				return
			}
			if tries == 0 {
				q.log.Warn("no answer on "+q.subject+"; sending again", "err", err)
			}
			if errors.Is(err, nats.ErrNoResponders) {
				select { // nobody subscribed (yet): do not spin
				case <-time.After(100 * time.Millisecond):
				case <-q.ctx.Done():
					return
				}
			}
		}
		q.mu.Lock()
		q.queue = q.queue[1:]
		if len(q.queue) == 0 {
			close(q.idle)
			q.idle = make(chan struct{})
		}
		q.mu.Unlock()
	}
}
