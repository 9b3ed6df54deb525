package cluster

import (
	"context"
	"log/slog"
	"slices"
	"strconv"

	"github.com/streamd/streamd/internal/cluster/wire"
)

// ControllerLogHost is the Host of the log records the controller publishes
// about a job (Source "controller"): its decisions, as `streamd logs`
// shows them beside the hosts' lines.
const ControllerLogHost = "controller"

// jobEventHandler passes every record to the controller's own handler and
// publishes those about one job (a "job" attribute) at info level and above
// on the job's log subject, so `streamd logs` shows why an attempt failed
// over, an upgrade, a rollback, a stop and its savepoint.
type jobEventHandler struct {
	inner slog.Handler
	pub   *wire.LogPublisher
	attrs []slog.Attr
}

func (h *jobEventHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= slog.LevelInfo || h.inner.Enabled(ctx, l)
}

func (h *jobEventHandler) Handle(ctx context.Context, r slog.Record) error {
	var err error
	if h.inner.Enabled(ctx, r.Level) {
		err = h.inner.Handle(ctx, r)
	}
	if r.Level < slog.LevelInfo {
		return err
	}
	rec := &wire.LogRecord{Time: r.Time, Level: r.Level.String(), Host: ControllerLogHost, Source: "controller", Msg: r.Message, Attrs: map[string]string{}}
	take := func(a slog.Attr) bool {
		v := a.Value.Resolve().String()
		switch a.Key {
		case "job":
			rec.Job = v
		case "attempt":
			rec.Attempt, _ = strconv.Atoi(v)
		case "component", "controller":
		default:
			rec.Attrs[a.Key] = v
		}
		return true
	}
	for _, a := range h.attrs {
		take(a)
	}
	r.Attrs(take)
	if rec.Job == "" || !wire.ValidJobID(rec.Job) {
		return err
	}
	h.pub.Publish(rec)
	return err
}

func (h *jobEventHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &jobEventHandler{inner: h.inner.WithAttrs(as), pub: h.pub, attrs: append(slices.Clip(h.attrs), as...)}
}

func (h *jobEventHandler) WithGroup(name string) slog.Handler {
	return &jobEventHandler{inner: h.inner.WithGroup(name), pub: h.pub, attrs: h.attrs}
}
