package runtime

import (
	"sync"
	"time"

	"github.com/streamd/streamd/control"
)

// Executor executes the attempts of one job for its JobLoop: in this process
// (Run: in-process channels), or on hosts over NATS (internal/cluster). The
// JobLoop calls it from its goroutine only, with the lifecycle's actions and
// every tick; it reports back by posting to the loop (subtask events,
// the end of an attempt).
type Executor interface {
	// StartAttempt deploys attempt a, restored from a.Restore.
	StartAttempt(a control.StartAttempt)
	// CancelAttempt tears attempt a.Attempt down.
	CancelAttempt(a control.CancelAttempt)
	// StopFailed: a stop did not stop the job; tell whoever asked.
	StopFailed(a control.StopFailed)
	// JobEnded: the job is over.
	JobEnded(a control.JobEnded)
	// Tick is called every tick of the loop (step the driver with
	// control.Tick: checkpoint intervals and restart delays are ticks).
	Tick()
}

// JobLoop is the one goroutine of a job (raft's node.run): the only caller
// of its driver's Step, whether the job runs with `streamd run` or is
// deployed. Everything else posts work to it (Post); it never blocks the
// poster. It runs the posted work in order and ticks the Executor, and
// hands the lifecycle's own actions (StartAttempt, CancelAttempt,
// StopFailed, JobEnded) to the Executor.
type JobLoop struct {
	exec Executor
	tick time.Duration
	stop <-chan struct{} // ends the loop at once (nil: never)

	mu      sync.Mutex
	work    []func()
	closing bool // the loop ends once its queue is empty
	exited  bool
	wake    chan struct{}
	done    chan struct{}
}

// NewJobLoop returns the loop of the job that d drives, executing its
// attempts with exec. d's lifecycle actions go to exec from now on.
func NewJobLoop(d *Driver, exec Executor, tick time.Duration, stop <-chan struct{}) *JobLoop {
	if tick <= 0 {
		tick = DefaultTick
	}
	l := &JobLoop{exec: exec, tick: tick, stop: stop, wake: make(chan struct{}, 1), done: make(chan struct{})}
	d.onLifecycle = l.lifecycleAction
	return l
}

func (l *JobLoop) lifecycleAction(a control.Action) {
	switch x := a.(type) {
	case control.StartAttempt:
		l.exec.StartAttempt(x)
	case control.CancelAttempt:
		l.exec.CancelAttempt(x)
	case control.StopFailed:
		l.exec.StopFailed(x)
	case control.JobEnded:
		l.exec.JobEnded(x)
	}
}

// Post queues f for the loop; false when the loop has ended.
func (l *JobLoop) Post(f func()) bool {
	l.mu.Lock()
	if l.exited {
		l.mu.Unlock()
		return false
	}
	l.work = append(l.work, f)
	l.mu.Unlock()
	l.poke()
	return true
}

func (l *JobLoop) poke() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// Close ends the loop once the work queued so far has run.
func (l *JobLoop) Close() {
	l.mu.Lock()
	l.closing = true
	l.mu.Unlock()
	l.poke()
}

// Done is closed when the loop has ended.
func (l *JobLoop) Done() <-chan struct{} { return l.done }

// Run runs the loop until Close (after the queued work) or stop.
func (l *JobLoop) Run() {
	defer close(l.done)
	t := time.NewTicker(l.tick)
	defer t.Stop()
	for {
		select {
		case <-l.stop:
			l.mu.Lock()
			l.exited = true
			l.mu.Unlock()
			return
		case <-t.C:
			l.mu.Lock()
			closing := l.closing
			l.mu.Unlock()
			if !closing {
				l.exec.Tick()
			}
		case <-l.wake:
		}
		for {
			l.mu.Lock()
			work := l.work
			l.work = nil
			end := len(work) == 0 && l.closing
			if end {
				l.exited = true
			}
			l.mu.Unlock()
			if end {
				return
			}
			if len(work) == 0 {
				break
			}
			for _, f := range work {
				f()
			}
		}
	}
}
