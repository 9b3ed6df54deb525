package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"

	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/host"
	"github.com/streamd/streamd/internal/runtime"
)

// ExecRequest is what a host asks its Executor to run: the subtasks of one
// job attempt that the assignment places on this host.
type ExecRequest struct {
	HostID    string
	JobID     string
	Attempt   int
	Graph     *control.JobGraph // artifacts resolved to local paths
	Placement control.Placement // every slot's host: where the remote ends of channels are
	Local     []SubtaskRef      // the subtasks to run here
	Logger    *slog.Logger
	Progress  func(runtime.Stats) // about once a second and at the end; may be nil
}

// Executor runs subtasks on a host. Start returns once the execution has
// started (or failed to); Wait on the Execution returns when it ends. An
// Executor that can run a subset of a job's subtasks (with remote channels
// to the others) plugs in here without changing the host agent or the
// assignment message.
type Executor interface {
	Start(ctx context.Context, r ExecRequest) (Execution, error)
}

// Execution is one running attempt on a host.
type Execution interface {
	// Wait blocks until the execution ends: nil when every local subtask
	// finished, ctx.Err() after a cancel, else the failure.
	Wait() (runtime.Stats, error)
}

// Savepointer is implemented by executions that can take a savepoint and stop
// with one. Executions without it answer savepoint and stop requests with
// ErrNotSupported.
type Savepointer interface {
	Savepoint(ctx context.Context, dir string) (string, error)
	StopWithSavepoint(ctx context.Context, dir string, drain bool) (string, error)
}

// ErrNotSupported is returned for savepoint and stop requests while the
// runtime has no stop-with-savepoint hook.
var ErrNotSupported = errors.New("cluster: not supported yet")

// LocalExecutor runs a whole job graph in this process with runtime.Run. It
// accepts only assignments that put every subtask on this host.
type LocalExecutor struct {
	Engine          *host.Engine
	Stdout          io.Writer // stdout sinks; default os.Stdout (runtime default)
	BatchSize       int
	ChannelCapacity int
}

// Start checks that the whole job is local and starts runtime.Run.
func (e *LocalExecutor) Start(ctx context.Context, r ExecRequest) (Execution, error) {
	total := 0
	for _, v := range r.Graph.Vertices {
		total += v.Parallelism
	}
	if len(r.Local) != total || len(r.Placement.Hosts()) != 1 {
		return nil, fmt.Errorf("cluster: job %s attempt %d: %d of %d subtasks on host %s, the others on %v: %w",
			r.JobID, r.Attempt, len(r.Local), total, r.HostID, r.Placement.Hosts(), ErrCrossHost)
	}
	x := &localExecution{done: make(chan struct{})}
	go func() {
		defer close(x.done)
		x.stats, x.err = runtime.Run(ctx, r.Graph, runtime.Options{
			Engine:          e.Engine,
			Logger:          r.Logger,
			Attempt:         r.Attempt,
			BatchSize:       e.BatchSize,
			ChannelCapacity: e.ChannelCapacity,
			Stdout:          e.Stdout,
			Stdin:           eofReader{},
			Progress:        r.Progress,
		})
	}()
	return x, nil
}

type localExecution struct {
	done  chan struct{}
	stats runtime.Stats
	err   error
}

func (x *localExecution) Wait() (runtime.Stats, error) {
	<-x.done
	return x.stats, x.err
}

// eofReader is the standard input of deployed jobs: empty.
type eofReader struct{}

func (eofReader) Read([]byte) (int, error) { return 0, io.EOF }
