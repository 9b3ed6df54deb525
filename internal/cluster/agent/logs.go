package agent

import (
	"context"
	"errors"
	"log/slog"

	"github.com/streamd/streamd/internal/runtime"
	"github.com/streamd/streamd/internal/telemetry"
)

// jobLoggers are the loggers of an attempt run by a LocalExecutor with
// Logs: its task logger, which also publishes, and the handler of its guest
// lines (nil without Logs).
func (e *LocalExecutor) jobLoggers(r ExecRequest) (*slog.Logger, slog.Handler) {
	if e.Logs == nil || r.Logger == nil {
		return r.Logger, nil
	}
	task := e.Logs.Handler(r.HostID, r.JobID, r.Attempt, "task")
	return slog.New(telemetry.TeeHandler(r.Logger.Handler(), task)), e.Logs.Handler(r.HostID, r.JobID, r.Attempt, "guest")
}

// logged publishes the start and the end of this host's part of an attempt
// as job lines (to the log stream only: the host agent logs them itself).
func (e *LocalExecutor) logged(r ExecRequest, x Execution) Execution {
	if e.Logs == nil {
		return x
	}
	log := slog.New(e.Logs.Handler(r.HostID, r.JobID, r.Attempt, "task"))
	log.Info("attempt started", "subtasks", len(r.Local))
	return loggedExecution{x, log}
}

type loggedExecution struct {
	Execution
	log *slog.Logger
}

func (x loggedExecution) Wait() (runtime.Stats, error) {
	st, err := x.Execution.Wait()
	switch {
	case err == nil:
		x.log.Info("attempt finished")
	case errors.Is(err, context.Canceled):
		x.log.Info("attempt canceled")
	default:
		x.log.Error("attempt failed", "err", err.Error())
	}
	return st, err
}
