package webapi

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/internal/cluster/wire"
	"github.com/streamd/streamd/internal/connector"
	"github.com/streamd/streamd/internal/runtime"
	"github.com/streamd/streamd/internal/telemetry"
)

// Local is the Backend of `streamd run`: its one job, seen through the
// runtime's Stats (Update is the run's Progress callback) and acted on
// through the run's Stop and Savepoint channels and the cancel of its
// context.
type Local struct {
	id, name string
	g        *control.JobGraph
	mode     string
	stop     chan<- runtime.StopRequest      // nil: the job does not checkpoint
	sp       chan<- runtime.SavepointRequest // nil: the job does not checkpoint
	cancel   func()
	created  time.Time
	done     chan struct{} // closed by End

	mu       sync.Mutex
	stats    runtime.Stats
	stopping bool
	state    string
	reason   string
	ended    *time.Time
}

// LocalJob describes the job of a Local.
type LocalJob struct {
	Graph *control.JobGraph
	// CheckpointMode is the checkpoint mode's description ("" without
	// checkpointing).
	CheckpointMode string
	// Stop and Savepoint are the run's runtime.Options Stop and Savepoint
	// channels; nil for a job that does not checkpoint.
	Stop      chan<- runtime.StopRequest
	Savepoint chan<- runtime.SavepointRequest
	// Cancel cancels the run's context.
	Cancel func()
}

// NewLocal returns the backend of a run of j, with a job id made of its
// name and a random suffix (like a deployed job's).
func NewLocal(j LocalJob) *Local {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return &Local{id: j.Graph.Name + "-" + hex.EncodeToString(b[:]), name: j.Graph.Name, g: j.Graph, mode: j.CheckpointMode,
		stop: j.Stop, sp: j.Savepoint, cancel: j.Cancel, created: time.Now(), done: make(chan struct{}),
		state: wire.JobRunning}
}

// ID is the job's id in the API.
func (l *Local) ID() string { return l.id }

// Update records the run's latest stats (runtime.Options.Progress).
func (l *Local) Update(s runtime.Stats) {
	l.mu.Lock()
	l.stats = s
	l.mu.Unlock()
}

// End records how the run ended: its final stats, a job state (finished,
// stopped, failed or canceled) and the reason of a failure.
func (l *Local) End(s runtime.Stats, state, reason string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ended != nil {
		return
	}
	now := time.Now()
	l.stats, l.state, l.reason, l.ended = s, state, reason, &now
	close(l.done)
}

func (l *Local) find(jobID string) error {
	if jobID != l.id {
		return errorf(http.StatusNotFound, "no job %q (this streamd run runs job %s)", jobID, l.id)
	}
	return nil
}

func (l *Local) status() wire.JobStatus {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.stats
	st := wire.JobStatus{ID: l.id, Name: l.name, State: l.state, Reason: l.reason, Attempt: s.Restarts,
		Slots: 1, Hosts: []string{"local"}, Created: l.created, Updated: time.Now(), Ended: l.ended,
		Elapsed: s.Elapsed.Round(time.Millisecond).String(), Savepoint: s.Savepoint, CheckpointMode: l.mode,
		Checkpoints: s.Recent}
	if l.stopping && l.ended == nil {
		st.State = wire.JobStopping
	}
	slots := control.SlotsNeeded(l.g) // streamd run runs a job as declared
	st.Parallelism, st.DeclaredParallelism, st.MinParallelism = slots, slots, slots
	for _, f := range s.Failures {
		st.Attempts = append(st.Attempts, wire.AttemptStatus{Attempt: f.Attempt, Hosts: []string{"local"},
			State: wire.JobFailed, Reason: f.Error})
	}
	for i, v := range l.g.Vertices {
		op := wire.OperatorStatus{UID: v.UID, Parallelism: v.Parallelism, DeclaredParallelism: v.Parallelism, Kind: string(v.Kind), Inputs: wire.EdgeStatuses(v.Inputs),
			Connector: connector.Describe(v.Spec)}
		var subs []string
		var live []telemetry.SubtaskLive
		if i < len(s.Operators) {
			o := s.Operators[i]
			op.RecordsIn, op.RecordsOut, op.UnionDeclines, subs, live = o.RecordsIn, o.RecordsOut, o.UnionDeclines, o.Subtasks, o.Live
		}
		for k := 0; k < v.Parallelism; k++ {
			sub := wire.SubtaskStatus{Index: k, Host: "local", State: runtime.StateDeploying}
			if k < len(subs) && subs[k] != "" {
				sub.State = subs[k]
			}
			if k < len(live) {
				sub.Live = &live[k]
			}
			op.Subtasks = append(op.Subtasks, sub)
		}
		st.Operators = append(st.Operators, op)
	}
	return st
}

// List returns the one job.
func (l *Local) List(context.Context, bool) ([]wire.JobStatus, error) {
	return []wire.JobStatus{l.status()}, nil
}

// Status returns the job's status.
func (l *Local) Status(_ context.Context, jobID string) (*wire.JobStatus, error) {
	if err := l.find(jobID); err != nil {
		return nil, err
	}
	st := l.status()
	return &st, nil
}

// live refuses an action on an ended job.
func (l *Local) live(verb string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ended != nil {
		return errorf(http.StatusConflict, "%s job %s: the job is already %s", verb, l.id, l.state)
	}
	return nil
}

// Cancel cancels the run and waits for it to end.
func (l *Local) Cancel(ctx context.Context, jobID string) (*wire.JobStatus, error) {
	if err := l.find(jobID); err != nil {
		return nil, err
	}
	if err := l.live("cancel"); err != nil {
		return nil, err
	}
	l.cancel()
	select {
	case <-l.done:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	st := l.status()
	return &st, nil
}

// checkpoints refuses a savepoint or stop of a job that does not checkpoint.
func (l *Local) checkpoints(verb, dir string) error {
	if l.stop == nil {
		return errorf(http.StatusConflict, "%s job %s: the job has no checkpoint section, so it takes no savepoints", verb, l.id)
	}
	if dir != "" {
		return errorf(http.StatusBadRequest, "%s job %s: targetDirectory: streamd run writes savepoints into the job's checkpoint directory; leave it out", verb, l.id)
	}
	return l.live(verb)
}

// Savepoint takes a savepoint while the job goes on.
func (l *Local) Savepoint(ctx context.Context, jobID, dir string) (string, error) {
	if err := l.find(jobID); err != nil {
		return "", err
	}
	if err := l.checkpoints("savepoint", dir); err != nil {
		return "", err
	}
	res := make(chan runtime.SavepointResult, 1)
	select {
	case l.sp <- runtime.SavepointRequest{Result: res}:
	case <-l.done:
		return "", l.live("savepoint")
	case <-ctx.Done():
		return "", ctx.Err()
	}
	select {
	case r := <-res:
		if r.Err != nil {
			return "", fmt.Errorf("savepoint job %s: %w", l.id, r.Err)
		}
		return r.Location, nil
	case <-l.done:
		return "", errorf(http.StatusConflict, "savepoint job %s: the job ended (%s) before the savepoint completed", l.id, l.state)
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

// Stop stops the job with a savepoint and waits for it to end.
func (l *Local) Stop(ctx context.Context, jobID, dir string, drain bool) (string, error) {
	if err := l.find(jobID); err != nil {
		return "", err
	}
	if err := l.checkpoints("stop", dir); err != nil {
		return "", err
	}
	failed := make(chan error, 1)
	select {
	case l.stop <- runtime.StopRequest{Drain: drain, Failed: failed}:
	case <-l.done:
		return "", l.live("stop")
	case <-ctx.Done():
		return "", ctx.Err()
	}
	l.setStopping(true)
	select {
	case err := <-failed:
		l.setStopping(false)
		return "", fmt.Errorf("stop job %s: %w", l.id, err)
	case <-l.done:
	case <-ctx.Done():
		return "", ctx.Err()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stats.Savepoint == "" {
		return "", errors.New("stop job " + l.id + ": the job ended " + l.state + " without a savepoint: " + l.reason)
	}
	return l.stats.Savepoint, nil
}

func (l *Local) setStopping(on bool) {
	l.mu.Lock()
	l.stopping = on
	l.mu.Unlock()
}

// Hosts is the one process of the run, "local": one slot, taken until the
// job ends.
func (l *Local) Hosts(context.Context) ([]wire.HostStatus, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	free := 0
	if l.ended != nil {
		free = 1
	}
	return []wire.HostStatus{{ID: "local", Slots: 1, Free: free, State: wire.HostAlive, LastSeen: time.Now()}}, nil
}
