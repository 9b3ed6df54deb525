package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"

	"github.com/nats-io/nats.go"

	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/dataplane/natsch"
	"github.com/streamd/streamd/host"
	"github.com/streamd/streamd/internal/checkpoint"
	"github.com/streamd/streamd/internal/jobfile"
	"github.com/streamd/streamd/internal/natsutil"
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

	Checkpoint *jobfile.CheckpointSettings // nil: no checkpointing
	Restart    jobfile.RestartSettings     // for task failures within this execution
	// RestoreLatest restores from the latest completed checkpoint of the
	// job's checkpoint directory, if there is one (a failover attempt).
	RestoreLatest bool

	// Distributed: the job is spread over hosts; the controller drives its
	// checkpoints, the subtasks talk to it and to the other hosts over Conn.
	Distributed bool
	Conn        *nats.Conn
	// RestoreFrom is the checkpoint a distributed attempt restores from
	// (chosen by the controller); "" = fresh state.
	RestoreFrom string
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
	// NATS is how the jobs' nats sources and sinks connect when they name
	// no url (runtime.Options.NATS): normally the host's own NATS settings.
	NATS natsutil.ConnectOptions
	// ChannelOptions configure the NATS channels of jobs spread over hosts
	// (natsch.NewTransport), e.g. the credit window; default none.
	ChannelOptions []natsch.Option

	mu         sync.Mutex
	transports map[*nats.Conn]*natsch.Transport
}

// Start runs a whole job with runtime.Run, or, for a job spread over hosts
// (r.Distributed), this host's subtasks with runtime.StartAttempt.
func (e *LocalExecutor) Start(ctx context.Context, r ExecRequest) (Execution, error) {
	if r.Distributed {
		return e.startDistributed(ctx, r)
	}
	total := 0
	for _, v := range r.Graph.Vertices {
		total += v.Parallelism
	}
	if len(r.Local) != total || len(r.Placement.Hosts()) != 1 {
		return nil, fmt.Errorf("cluster: job %s attempt %d: %d of %d subtasks on host %s, the others on %v: %w",
			r.JobID, r.Attempt, len(r.Local), total, r.HostID, r.Placement.Hosts(), ErrCrossHost)
	}
	opts := runtime.Options{
		Engine:          e.Engine,
		Logger:          r.Logger,
		Attempt:         r.Attempt,
		BatchSize:       e.BatchSize,
		ChannelCapacity: e.ChannelCapacity,
		Stdout:          e.Stdout,
		Stdin:           eofReader{},
		Progress:        r.Progress,
		NATS:            e.NATS,
	}
	opts.Restart = r.Restart
	x := &localExecution{done: make(chan struct{})}
	if cs := r.Checkpoint; cs != nil {
		store, err := openStoreRetry(ctx, r.Conn, cs, r.JobID, r.Logger)
		if err != nil {
			return nil, fmt.Errorf("cluster: job %s: %w", r.JobID, err)
		}
		opts.Checkpoint = runtime.NewCheckpointOptions(cs, store)
		x.stop = make(chan runtime.StopRequest, 1)
		x.savepoint = make(chan runtime.SavepointRequest)
		x.checkpointDir = cs.Dir
		x.nc = r.Conn
		opts.Stop = x.stop
		opts.Savepoint = x.savepoint
		if r.RestoreLatest {
			var md *checkpoint.Metadata
			err := DefaultRetry.Do(ctx, r.Logger, "latest checkpoint", func(ctx context.Context) error {
				var err error
				md, err = store.Latest(ctx)
				if errors.Is(err, checkpoint.ErrNoCheckpoint) {
					return Permanent(err)
				}
				return err
			})
			switch {
			case errors.Is(err, checkpoint.ErrNoCheckpoint):
				r.Logger.Info("no completed checkpoint: the attempt starts from the beginning", "store", storeName(store))
			case err != nil:
				return nil, fmt.Errorf("cluster: job %s: latest checkpoint: %w", r.JobID, err)
			default:
				var rs *checkpoint.Restore
				err := DefaultRetry.Do(ctx, r.Logger, "load checkpoint "+md.Location, func(ctx context.Context) error {
					var err error
					rs, err = checkpoint.LoadRestoreFrom(ctx, store, md, r.Graph)
					return err
				})
				if err != nil {
					return nil, fmt.Errorf("cluster: job %s: %w", r.JobID, err)
				}
				opts.Restore = rs
				r.Logger.Info("restoring", "from", md.Location, "kind", md.Kind, "id", md.ID)
			}
		}
		if opts.Restore == nil && r.RestoreFrom != "" { // deployed --from
			rs, err := loadRestoreRetry(ctx, r.Conn, r.RestoreFrom, r.Graph, r.Logger)
			if err != nil {
				return nil, fmt.Errorf("cluster: job %s: restore: %w", r.JobID, err)
			}
			opts.Restore = rs
			r.Logger.Info("restoring", "from", rs.Metadata.Location, "kind", rs.Metadata.Kind, "id", rs.Metadata.ID)
		}
	}
	go func() {
		defer close(x.done)
		x.stats, x.err = runtime.Run(ctx, r.Graph, opts)
	}()
	return x, nil
}

type localExecution struct {
	done          chan struct{}
	stats         runtime.Stats
	err           error
	stop          chan runtime.StopRequest      // nil: the job does not checkpoint
	savepoint     chan runtime.SavepointRequest // nil: the job does not checkpoint
	checkpointDir string
	nc            *nats.Conn // reads JetStream savepoints to export them
}

// Savepoint takes a savepoint while the job keeps running. It is written to
// the job's checkpoint storage; with dir, it is then copied into dir.
func (x *localExecution) Savepoint(ctx context.Context, dir string) (string, error) {
	if x.savepoint == nil {
		return "", errors.New("cluster: a savepoint needs checkpointing: the job file has no checkpoint section")
	}
	res := make(chan runtime.SavepointResult, 1)
	select {
	case x.savepoint <- runtime.SavepointRequest{Result: res}:
	case <-x.done:
		return "", errors.New("cluster: the job ended before the savepoint was taken")
	case <-ctx.Done():
		return "", fmt.Errorf("cluster: savepoint: %w", ctx.Err())
	}
	select {
	case r := <-res:
		if r.Err != nil {
			return "", r.Err
		}
		return x.export(ctx, r.Location, dir)
	case <-x.done:
		return "", errors.New("cluster: the job ended before the savepoint was taken")
	case <-ctx.Done():
		return "", fmt.Errorf("cluster: savepoint: %w", ctx.Err())
	}
}

// export copies the savepoint at location into dir, unless dir is empty or
// the job's checkpoint directory (where it already is).
func (x *localExecution) export(ctx context.Context, location, dir string) (string, error) {
	if dir == "" || dir == x.checkpointDir {
		return location, nil
	}
	return ExportSavepoint(ctx, x.nc, location, dir)
}

// StopWithSavepoint stops the run with a savepoint in the job's checkpoint
// directory and waits for it to end. When the stop fails (its savepoint is
// aborted, or a subtask fails before the job stopped, e.g. in
// notify_checkpoint_complete of the savepoint) the run fails over under the
// job's restart strategy and runs on: StopWithSavepoint then returns an
// error at once, naming the savepoint when it was written, instead of
// waiting for a run that no longer stops.
func (x *localExecution) StopWithSavepoint(ctx context.Context, dir string, drain bool) (string, error) {
	if x.stop == nil {
		return "", errors.New("cluster: stop with a savepoint needs checkpointing: the job file has no checkpoint section (use streamd cancel)")
	}
	// The runtime says when the stop fails and the job goes on (its
	// savepoint failed, or was written but the job failed before it
	// stopped): the error names the savepoint.
	failed := make(chan error, 1)
	select {
	case x.stop <- runtime.StopRequest{Drain: drain, Failed: failed}:
	default:
		return "", errors.New("cluster: a stop is already in progress")
	}
	select {
	case <-x.done:
	case err := <-failed:
		return "", fmt.Errorf("cluster: %w", err)
	case <-ctx.Done():
		x.withdraw()
		return "", fmt.Errorf("cluster: stop with savepoint: %w", ctx.Err())
	}
	if x.err != nil {
		return "", fmt.Errorf("cluster: stop with savepoint: the job failed: %w", x.err)
	}
	if x.stats.Savepoint == "" {
		return "", errors.New("cluster: the job ended before the savepoint was taken")
	}
	return x.export(ctx, x.stats.Savepoint, dir)
}

// withdraw takes back a stop request the run has not taken yet.
func (x *localExecution) withdraw() bool {
	select {
	case <-x.stop:
		return true
	default:
		return false
	}
}

func (x *localExecution) Wait() (runtime.Stats, error) {
	<-x.done
	return x.stats, x.err
}

// eofReader is the standard input of deployed jobs: empty.
type eofReader struct{}

func (eofReader) Read([]byte) (int, error) { return 0, io.EOF }

// openStoreRetry is OpenStore with transient errors (NATS reconnecting,
// JetStream briefly unavailable) retried under DefaultRetry.
func openStoreRetry(ctx context.Context, nc *nats.Conn, cs *jobfile.CheckpointSettings, jobID string, log *slog.Logger) (checkpoint.Store, error) {
	var store checkpoint.Store
	err := DefaultRetry.Do(ctx, log, "open checkpoint store", func(ctx context.Context) error {
		var err error
		store, err = OpenStore(ctx, nc, cs, jobID, log)
		return err
	})
	return store, err
}

// loadRestoreRetry is LoadRestore with transient errors retried under
// DefaultRetry.
func loadRestoreRetry(ctx context.Context, nc *nats.Conn, location string, g *control.JobGraph, log *slog.Logger) (*checkpoint.Restore, error) {
	var rs *checkpoint.Restore
	err := DefaultRetry.Do(ctx, log, "load checkpoint "+location, func(ctx context.Context) error {
		var err error
		rs, err = LoadRestore(ctx, nc, location, g)
		return err
	})
	return rs, err
}
