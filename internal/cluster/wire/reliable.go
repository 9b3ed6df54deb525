package wire

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TaskRequestTimeout is how long a subtask event or command waits for its
// answer before it is sent again.
const TaskRequestTimeout = 2 * time.Second

// ReliableQueue sends messages on one subject in order, each as a request
// that is sent again (with the same sequence number) until the receiver
// answers or the queue stops: while both ends live nothing is lost, and the
// receiver drops a repeat by its sequence number. The subtask events of a
// job spread over hosts (host -> controller) and the driver's commands
// (controller -> host) go through one each per attempt and host, so a lost
// message can no longer leave a checkpoint, a final checkpoint or the end of
// a job waiting forever.
type ReliableQueue struct {
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

func NewReliableQueue(nc *nats.Conn, subject string, log *slog.Logger) *ReliableQueue {
	q := &ReliableQueue{nc: nc, subject: subject, timeout: TaskRequestTimeout, log: log,
		done: make(chan struct{}), wake: make(chan struct{}, 1), idle: make(chan struct{})}
	q.ctx, q.cancel = context.WithCancel(context.Background())
	go q.run()
	return q
}

// Send gives the next sequence number to encode, which returns the message;
// it never blocks on the network.
func (q *ReliableQueue) Send(encode func(seq uint64) ([]byte, error)) error {
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

// Drain waits until every message was answered, at most d.
func (q *ReliableQueue) Drain(d time.Duration) bool {
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

// Stop ends the queue at once (unsent messages are dropped); it does not
// wait for the goroutine.
func (q *ReliableQueue) Stop() { q.cancel() }

func (q *ReliableQueue) run() {
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
		backoff := time.Duration(0)
		for tries := 0; ; tries++ {
			ctx, cancel := context.WithTimeout(q.ctx, q.timeout)
			sent := time.Now()
			_, err := q.nc.RequestWithContext(ctx, q.subject, head)
			cancel()
			if err == nil {
				break
			}
			if q.ctx.Err() != nil {
				return
			}
			if errors.Is(err, nats.ErrConnectionClosed) {
				// Nothing is ever sent on a closed connection again: the
				// queue ends, as Stop ends it, instead of spinning.
				q.mu.Lock()
				n := len(q.queue)
				q.mu.Unlock()
				q.log.Warn("connection closed: "+q.subject+" stops", "unsent", n)
				return
			}
			if tries == 0 {
				q.log.Warn("no answer on "+q.subject+"; sending again", "err", err)
			}
			// An error that came before the request's timeout (nobody
			// subscribed yet, the reconnect buffer full, ...) is retried
			// after a pause, 100 ms doubling to 1 s: a failing send must
			// not spin.
			if time.Since(sent) < q.timeout/2 {
				backoff = min(max(2*backoff, 100*time.Millisecond), time.Second)
				select {
				case <-time.After(backoff):
				case <-q.ctx.Done():
					return
				}
			} else {
				backoff = 0
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

// RetryPolicy retries transient errors with exponential backoff: the first
// retry after Initial, each next one after twice the delay, at most Max,
// until Total has passed since the first try (or the context ends).
type RetryPolicy struct {
	Initial, Max, Total time.Duration
}

// DefaultRetry is the policy for transient errors within an attempt (an
// artifact fetch, opening the checkpoint store or loading the checkpoint to
// restore while NATS reconnects): 100ms doubling to 5s, for up to a minute.
var DefaultRetry = RetryPolicy{Initial: 100 * time.Millisecond, Max: 5 * time.Second, Total: time.Minute}

// permanentError marks an error no retry mends.
type permanentError struct{ err error }

func (e permanentError) Error() string { return e.err.Error() }
func (e permanentError) Unwrap() error { return e.err }

// Permanent marks err as not worth a retry (Transient reports false).
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return permanentError{err}
}

// Transient reports whether err may go away when the same call is tried
// again: a timeout, NATS disconnected or reconnecting, no responder (yet),
// JetStream temporarily unavailable (an API error with code 503 other than
// "not enabled"), an object read back corrupt (jetstream.ErrDigestMismatch:
// the object store's own check, met on a NATS cluster reading an object
// just written). Errors marked Permanent, a missing artifact, an object
// whose content is not the digest asked for (ErrDigestMismatch), a closed
// connection and anything else are not.
func Transient(err error) bool {
	var pe permanentError
	switch {
	case err == nil, errors.As(err, &pe),
		errors.Is(err, ErrArtifactMissing), errors.Is(err, ErrDigestMismatch),
		errors.Is(err, nats.ErrConnectionClosed), errors.Is(err, jetstream.ErrJetStreamNotEnabled),
		errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount), errors.Is(err, context.Canceled):
		return false
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, nats.ErrTimeout),
		errors.Is(err, nats.ErrConnectionReconnecting), errors.Is(err, nats.ErrDisconnected),
		errors.Is(err, nats.ErrNoResponders), errors.Is(err, jetstream.ErrNoStreamResponse),
		errors.Is(err, jetstream.ErrNoHeartbeat), errors.Is(err, jetstream.ErrDigestMismatch):
		return true
	}
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.Code == 503
}

// Do calls fn until it returns nil or an error that is not Transient, ctx
// ends, or p.Total has passed; each retry is logged at warn with the error
// and the delay. The error returned is fn's last one (with the number of
// tries when there were retries).
func (p RetryPolicy) Do(ctx context.Context, log *slog.Logger, what string, fn func(ctx context.Context) error) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	start := time.Now()
	delay := p.Initial
	for try := 1; ; try++ {
		err := fn(ctx)
		if err == nil {
			if try > 1 {
				log.Info(what+": succeeded after retries", "tries", try, "elapsed", time.Since(start).Round(time.Millisecond))
			}
			return nil
		}
		if ctx.Err() != nil || !Transient(err) {
			if try > 1 {
				return fmt.Errorf("%w (after %d tries)", err, try)
			}
			return err
		}
		if time.Since(start)+delay > p.Total {
			return fmt.Errorf("%w (transient, still failing after %d tries in %s)", err, try, time.Since(start).Round(time.Millisecond))
		}
		log.Warn(what+": transient error; retrying", "err", err, "try", try, "retry_in", delay)
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w (retry interrupted: %w)", err, ctx.Err())
		}
		delay = min(2*delay, p.Max)
	}
}
