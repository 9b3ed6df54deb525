package agent

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/dataplane/natsch"
	"github.com/streamd/streamd/host"
	"github.com/streamd/streamd/internal/checkpoint"
	"github.com/streamd/streamd/internal/cluster/wire"
	"github.com/streamd/streamd/internal/jobfile"
	"github.com/streamd/streamd/internal/natsutil"
	"github.com/streamd/streamd/internal/runtime"
)

// ExecRequest is what a host asks its Executor to run: the subtasks of one
// job attempt that the assignment places on this host. The controller
// drives the attempt (its checkpoints, stops and restarts); the subtasks
// talk to it and to the other hosts over Conn.
type ExecRequest struct {
	HostID    string
	JobID     string
	Attempt   int
	Graph     *control.JobGraph // artifacts resolved to local paths
	Placement control.Placement // every slot's host: where the remote ends of channels are
	Local     []wire.SubtaskRef // the subtasks to run here
	Logger    *slog.Logger
	Progress  func(runtime.Stats) // about once a second and at the end; may be nil

	Checkpoint *jobfile.CheckpointSettings // nil: no checkpointing
	Conn       *nats.Conn
	// RestoreFrom is the checkpoint the attempt restores from (chosen by
	// the controller); "" = fresh state.
	RestoreFrom string
	// MaxRecordBytes is the job's max_record_bytes (JobSpec); 0: the
	// executor's.
	MaxRecordBytes int
	// State is the job's keyed-state backend (JobSpec).
	State jobfile.StateSettings
	// Fence, if set, refuses a command of controller term `term` when the
	// host knows a newer term (the host's fencing; raises the host's term
	// otherwise).
	Fence func(term uint64) error
}

func (r ExecRequest) fence(term uint64) error {
	if r.Fence == nil {
		return nil
	}
	return r.Fence(term)
}

// Executor runs subtasks on a host. Start returns once the execution has
// started (or failed to); Wait on the Execution returns when it ends.
type Executor interface {
	Start(ctx context.Context, r ExecRequest) (Execution, error)
}

// Execution is one running attempt on a host.
type Execution interface {
	// Wait blocks until the execution ends: nil when every local subtask
	// finished, ctx.Err() after a cancel, else the failure.
	Wait() (runtime.Stats, error)
}

// LocalExecutor runs this host's subtasks of an attempt with
// runtime.StartAttempt: channels between two of them in-process, the others
// over NATS (dataplane/natsch).
type LocalExecutor struct {
	Engine          *host.Engine
	Stdout          io.Writer // stdout sinks; default os.Stdout (runtime default)
	BatchSize       int
	ChannelCapacity int
	// BufferTimeout is runtime.Options.BufferTimeout (the host's
	// runtime.buffer_timeout).
	BufferTimeout time.Duration
	// MaxRecordBytes is max_record_bytes of jobs whose spec carries none
	// (the host's runtime.max_record_bytes); 0: abi.DefaultMaxRecordBytes.
	MaxRecordBytes int
	// DataDir is where pebble subtasks keep their files (runtime.Options
	// DataDir): a directory per subtask attempt below it, removed when the
	// subtask closes. "": the OS temp directory.
	DataDir string
	// NATS is how the jobs' nats sources and sinks connect when they name
	// no url (runtime.Options.NATS): normally the host's own NATS settings.
	NATS natsutil.ConnectOptions
	// ConnectorSettings are the host's values of the connectors'
	// configuration keys (runtime.Options.ConnectorSettings).
	ConnectorSettings map[string]string
	// ChannelOptions configure the NATS channels between hosts
	// (natsch.NewTransport), e.g. the credit window; default none.
	ChannelOptions []natsch.Option
	// Logs, if set, publishes the jobs' log lines (guest and task) to the
	// job log stream (LogPublisher); nil: they go to the host's log only.
	Logs *wire.LogPublisher

	mu         sync.Mutex
	transports map[*nats.Conn]*natsch.Transport
}

// Start starts this host's subtasks of the attempt.
func (e *LocalExecutor) Start(ctx context.Context, r ExecRequest) (Execution, error) {
	return e.startDistributed(ctx, r)
}

// eofReader is the standard input of deployed jobs: empty.
type eofReader struct{}

func (eofReader) Read([]byte) (int, error) { return 0, io.EOF }

// loadRestoreRetry is LoadRestore with transient errors retried under
// DefaultRetry.
func loadRestoreRetry(ctx context.Context, nc *nats.Conn, location string, g *control.JobGraph, log *slog.Logger) (*checkpoint.Restore, error) {
	var rs *checkpoint.Restore
	err := wire.DefaultRetry.Do(ctx, log, "load checkpoint "+location, func(ctx context.Context) error {
		var err error
		rs, err = wire.LoadRestore(ctx, nc, location, g)
		return err
	})
	return rs, err
}
