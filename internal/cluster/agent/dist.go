package agent

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"

	"github.com/nats-io/nats.go"

	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/dataplane/natsch"
	"github.com/streamd/streamd/internal/cluster/wire"
	"github.com/streamd/streamd/internal/runtime"
)

// The host's end of a job spread over hosts (the controller's end is the
// cluster package's dist.go): this host's subtasks of an attempt, run with
// runtime.StartAttempt, their events sent to the controller and the
// checkpoint coordinator's commands taken from it (wire.TaskEvent,
// wire.TaskCommand).

// distExecution is a host's part of a job attempt spread over hosts.
type distExecution struct {
	att    *runtime.Attempt
	sub    *nats.Subscription
	events *wire.ReliableQueue
}

func (x *distExecution) Wait() (runtime.Stats, error) {
	st, err := x.att.Wait()
	if err == nil {
		// The last events (finished) reach the controller before the host
		// reports its part finished.
		x.events.Drain(2 * wire.TaskRequestTimeout)
	}
	x.events.Stop()
	_ = x.sub.Unsubscribe()
	return st, err
}

// transport returns the executor's NATS channel transport over nc.
func (e *LocalExecutor) transport(nc *nats.Conn) (*natsch.Transport, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.transports == nil {
		e.transports = map[*nats.Conn]*natsch.Transport{}
	}
	if t := e.transports[nc]; t != nil {
		return t, nil
	}
	t, err := natsch.NewTransport(nc, e.ChannelOptions...)
	if err != nil {
		return nil, err
	}
	e.transports[nc] = t
	return t, nil
}

// startDistributed runs this host's subtasks of an attempt whose driver is
// the controller's.
func (e *LocalExecutor) startDistributed(ctx context.Context, r ExecRequest) (Execution, error) {
	if r.Conn == nil {
		return nil, fmt.Errorf("cluster: job %s attempt %d: a job spread over hosts needs the host's NATS connection", r.JobID, r.Attempt)
	}
	tr, err := e.transport(r.Conn)
	if err != nil {
		return nil, fmt.Errorf("cluster: job %s: %w", r.JobID, err)
	}
	local := map[control.SubtaskID]bool{}
	for _, s := range r.Local {
		local[control.SubtaskID{Operator: s.Operator, Index: s.Subtask}] = true
	}
	var guestLog slog.Handler
	r.Logger, guestLog = e.jobLoggers(r)
	opts := runtime.Options{
		Engine: e.Engine, Logger: r.Logger, GuestLog: guestLog, Attempt: r.Attempt, BatchSize: e.BatchSize, JobID: r.JobID, Host: r.HostID,
		ChannelCapacity: e.ChannelCapacity, BufferTimeout: e.BufferTimeout, Stdout: e.Stdout, Stdin: eofReader{}, Progress: r.Progress, NATS: e.NATS,
		MaxRecordBytes: cmp.Or(r.MaxRecordBytes, e.MaxRecordBytes),
		State:          r.State, DataDir: e.DataDir, ConnectorSettings: e.ConnectorSettings,
	}
	if cs := r.Checkpoint; cs != nil {
		store, err := wire.OpenStoreRetry(ctx, r.Conn, cs, r.JobID, r.Logger)
		if err != nil {
			return nil, fmt.Errorf("cluster: job %s: %w", r.JobID, err)
		}
		// The interval is the controller's to keep; here it only tells
		// the sinks how long an epoch lasts (connector.SinkEnv).
		opts.Checkpoint = &runtime.CheckpointOptions{Store: store, Interval: cs.Interval}
		opts.Checkpoint.SetMode(cs)
		if r.RestoreFrom != "" {
			rs, err := loadRestoreRetry(ctx, r.Conn, r.RestoreFrom, r.Graph, r.Logger)
			if err != nil {
				return nil, fmt.Errorf("cluster: job %s: restore: %w", r.JobID, err)
			}
			opts.Restore = rs
			md := rs.Metadata
			r.Logger.Info("restoring", "from", md.Location, "kind", md.Kind, "id", md.ID)
		}
	}
	nc := r.Conn
	events := wire.NewReliableQueue(nc, wire.TaskEventsSubject(r.JobID, r.Attempt), r.Logger)
	var lifeMu sync.Mutex
	var life []control.Event // the subtasks' lifecycle events so far, for a resync
	send := func(ev control.Event) {
		te, err := wire.NewTaskEvent(r.HostID, ev)
		if err == nil {
			err = events.Send(func(seq uint64) ([]byte, error) {
				te.Seq = seq
				return json.Marshal(te)
			})
		}
		if err != nil {
			r.Logger.Warn("subtask event not sent", "event", ev.String(), "err", err)
		}
	}
	// report sends ev; lifeMu orders it with a resync's events.
	report := func(ev control.Event) {
		lifeMu.Lock()
		defer lifeMu.Unlock()
		switch ev.(type) {
		case control.TaskRunning, control.TaskEndOfData, control.TaskFinished:
			life = append(life, ev)
		}
		send(ev)
	}
	var lastCmd, cmdTerm uint64 // of the command subscription's goroutine
	ready := make(chan struct{})
	var att *runtime.Attempt
	sub, err := nc.Subscribe(wire.TaskCommandSubject(r.JobID, r.Attempt, r.HostID), func(m *nats.Msg) {
		select {
		case <-ready:
		case <-ctx.Done():
			return
		}
		var tc wire.TaskCommand
		if err := json.Unmarshal(m.Data, &tc); err != nil {
			r.Logger.Warn("bad command from the controller", "err", err)
			wire.Respond(m, wire.Reply{Error: "cluster: bad command: " + err.Error()})
			return
		}
		if err := r.fence(tc.Term); err != nil || tc.Term < cmdTerm {
			if err == nil {
				err = fmt.Errorf("cluster: host %s: command of controller term %d refused: term %d leads", r.HostID, tc.Term, cmdTerm)
			}
			wire.Respond(m, wire.Reply{Error: err.Error()})
			return
		}
		defer wire.Respond(m, wire.Reply{})
		if tc.Term > cmdTerm {
			cmdTerm, lastCmd = tc.Term, 0 // a new leader numbers its commands from 1
		}
		if att == nil || tc.Seq != 0 && tc.Seq <= lastCmd {
			return // a repeat of a command already applied
		}
		lastCmd = max(lastCmd, tc.Seq)
		if tc.Resync {
			lifeMu.Lock()
			r.Logger.Info("reporting the subtasks' state to a new controller", "term", tc.Term, "events", len(life))
			for _, ev := range life {
				send(ev)
			}
			lifeMu.Unlock()
			return
		}
		if !att.Command(tc.Subtask, tc.Command) && tc.Command.Kind == runtime.CommandTrigger {
			report(control.TriggerFailed{CheckpointID: tc.Command.ID, Subtask: tc.Subtask, Reason: "the subtask has finished"})
		}
	})
	if err != nil {
		events.Stop()
		return nil, fmt.Errorf("cluster: job %s: subscribe to commands: %w", r.JobID, err)
	}
	_ = sub.SetPendingLimits(-1, -1)
	if err := nc.Flush(); err != nil {
		sub.Unsubscribe()
		events.Stop()
		return nil, fmt.Errorf("cluster: job %s: %w", r.JobID, err)
	}
	att, err = runtime.StartAttempt(ctx, r.Graph, opts, runtime.Remote{
		JobID: r.JobID, Local: func(id control.SubtaskID) bool { return local[id] }, Channels: tr, Report: report})
	close(ready)
	if err != nil {
		sub.Unsubscribe()
		events.Stop()
		return nil, err
	}
	return e.logged(r, &distExecution{att: att, sub: sub, events: events}), nil
}
