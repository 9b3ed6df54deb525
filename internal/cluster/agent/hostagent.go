// Package agent is streamd's host agent: it registers a host with the
// controller by its heartbeats, runs the subtasks the controller assigns to
// it (Executor; LocalExecutor runs them in this process), and reports how
// each attempt goes (package wire's host protocol). Of a job spread over
// hosts it runs the host's end of the subtask protocol: events to the
// controller, the checkpoint coordinator's commands from it.
//
// The host agent has one mutex (Host.mu) over its table of running
// attempts; it is never held while talking to NATS or waiting for a run.
package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/host"
	"github.com/streamd/streamd/internal/cluster/wire"
	"github.com/streamd/streamd/internal/runtime"
	"github.com/streamd/streamd/internal/telemetry"
)

// HostOptions configures a host agent.
type HostOptions struct {
	// ID names the host; letters, digits, '-' and '_'. Default: the
	// hostname followed by a random suffix.
	ID string
	// Slots is how many slots the host offers (a slot runs subtask i of every
	// operator of a job); default 1.
	Slots int
	// DataDir holds the artifact cache (DataDir/artifacts); required.
	DataDir string
	// HeartbeatInterval is how often the host publishes a heartbeat; default 1s.
	HeartbeatInterval time.Duration
	// Executor runs assignments; required (LocalExecutor runs whole jobs).
	Executor Executor
	Logger   *slog.Logger
	// RequestTimeout bounds reports to the controller; default 10s.
	RequestTimeout time.Duration
	// Outcomes is how many of its latest attempts' final reports the host
	// remembers, to answer the controller's outcome requests (a final report
	// that never reached the controller); default DefaultOutcomes, < 0: none.
	Outcomes int
	// SendFinalReport, if set, is asked before the host reports an
	// attempt's end (finished, failed or canceled); false drops the report
	// as if every retry was lost. For tests only.
	SendFinalReport func(wire.HostEvent) bool
}

// DefaultOutcomes is the default of HostOptions.Outcomes.
const DefaultOutcomes = 64

// Host is a host agent: it registers with the controller by heartbeats, runs
// the attempts assigned to it and reports their state.
type Host struct {
	nc   *nats.Conn
	opts HostOptions
	log  *slog.Logger
	arts *wire.Artifacts

	ctx    context.Context
	cancel context.CancelFunc

	mu   sync.Mutex // guards runs, floor, term and closed
	runs map[wire.AttemptRef]*hostRun
	// term is the newest controller term this host knows (from the
	// leader's announcements and requests), leader its controller: requests
	// of older terms are refused.
	term    uint64
	leader  string
	floor   map[string]int                     // per job, the oldest attempt that may still start here (older ones are fenced)
	ends    map[wire.AttemptRef]wire.HostEvent // final reports of the latest attempts (at most opts.Outcomes)
	endList []wire.AttemptRef                  // the keys of ends, oldest first
	closed  bool
	paused  bool // heartbeats paused (tests)
	subs    []*nats.Subscription
	wg      sync.WaitGroup
	release chan struct{}
}

type hostRun struct {
	ref    wire.AttemptRef
	slots  int
	cancel context.CancelFunc
	done   chan struct{}
	// replaces are the older attempts of the job that ran here when this
	// one was assigned: canceled then, and waited for before this one
	// starts, so two attempts of a job never overlap on a host.
	replaces []*hostRun

	mu   sync.Mutex // guards exec
	exec Execution
}

// StartHost registers the host agent on nc and starts heartbeating.
func StartHost(nc *nats.Conn, opts HostOptions) (*Host, error) {
	if opts.ID == "" {
		opts.ID = wire.NewHostID()
	}
	if !wire.HostIDRE.MatchString(opts.ID) {
		return nil, fmt.Errorf("cluster: host id %q: may contain only letters, digits, '-' and '_'", opts.ID)
	}
	if opts.Slots == 0 {
		opts.Slots = 1
	}
	if opts.Slots < 0 || opts.Slots > wire.MaxSlots {
		return nil, fmt.Errorf("cluster: host %s: slots %d out of range [1, %d]", opts.ID, opts.Slots, wire.MaxSlots)
	}
	if opts.DataDir == "" {
		return nil, fmt.Errorf("cluster: host %s: no data directory", opts.ID)
	}
	if opts.Executor == nil {
		return nil, fmt.Errorf("cluster: host %s: no executor", opts.ID)
	}
	if opts.HeartbeatInterval <= 0 {
		opts.HeartbeatInterval = wire.DefaultHeartbeatInterval
	}
	if opts.RequestTimeout <= 0 {
		opts.RequestTimeout = wire.DefaultRequestTimeout
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Outcomes == 0 {
		opts.Outcomes = DefaultOutcomes
	}
	if err := os.MkdirAll(filepath.Join(opts.DataDir, "artifacts"), 0o755); err != nil {
		return nil, fmt.Errorf("cluster: host %s: data directory: %w", opts.ID, err)
	}
	arts, err := wire.NewArtifacts(nc)
	if err != nil {
		return nil, err
	}
	h := &Host{nc: nc, opts: opts, log: opts.Logger.With("component", "host", "host", opts.ID), arts: arts,
		runs: map[wire.AttemptRef]*hostRun{}, floor: map[string]int{}, ends: map[wire.AttemptRef]wire.HostEvent{}, release: make(chan struct{})}
	h.ctx, h.cancel = context.WithCancel(context.Background())
	for subject, fn := range map[string]nats.MsgHandler{
		wire.HostSubject(opts.ID, wire.HostVerbAssign):    h.handleAssign,
		wire.HostSubject(opts.ID, wire.HostVerbCancel):    h.handleCancel,
		wire.HostSubject(opts.ID, wire.HostVerbSavepoint): h.handleSavepoint,
		wire.HostSubject(opts.ID, wire.HostVerbStop):      h.handleSavepoint,
		wire.HostSubject(opts.ID, wire.HostVerbOutcome):   h.handleOutcome,
		wire.SubjectLeader: h.handleLeader,
	} {
		sub, err := nc.Subscribe(subject, fn)
		if err != nil {
			h.unsubscribe()
			return nil, fmt.Errorf("cluster: host %s: subscribe: %w", opts.ID, err)
		}
		h.subs = append(h.subs, sub)
	}
	if err := nc.Flush(); err != nil {
		h.unsubscribe()
		return nil, fmt.Errorf("cluster: host %s: %w", opts.ID, err)
	}
	h.wg.Add(1)
	go h.heartbeats()
	h.log.Info("host started", "slots", opts.Slots, "nats", nc.ConnectedUrlRedacted(), "heartbeat_interval", opts.HeartbeatInterval)
	return h, nil
}

// ID is the host's id.
func (h *Host) ID() string { return h.opts.ID }

// Term is the newest controller term the host knows.
func (h *Host) Term() uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.term
}

// handleLeader takes a leader's announcement: its term fences older ones.
func (h *Host) handleLeader(msg *nats.Msg) {
	var la wire.LeaderAnnounce
	if err := json.Unmarshal(msg.Data, &la); err != nil {
		h.log.Warn("bad leader announcement", "err", err)
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.raiseTermLocked(la.Term, la.ID)
}

func (h *Host) raiseTermLocked(term uint64, leader string) {
	if term > h.term {
		first := h.term == 0
		if !first {
			h.log.Info("new controller leader", "term", term, "leader", leader, "previous_term", h.term)
		}
		h.term = term
		if leader != "" {
			h.leader = leader
		}
		if !first {
			h.reportRunningLocked()
		}
	}
}

// reportRunningLocked tells a new leader again which attempts run here: it
// may have taken over a job whose running report reached only the leader
// before it (whose record still says created), and the next progress report
// may be a second away, or never come from an executor without progress.
func (h *Host) reportRunningLocked() {
	var evs []wire.HostEvent
	for ref, r := range h.runs {
		r.mu.Lock()
		started := r.exec != nil
		r.mu.Unlock()
		if started {
			evs = append(evs, wire.HostEvent{HostID: h.opts.ID, JobID: ref.JobID, Attempt: ref.Attempt, State: wire.SubtaskRunning})
		}
	}
	if len(evs) > 0 {
		go func() {
			for _, ev := range evs {
				h.report(ev, false)
			}
		}()
	}
}

// fence refuses a request of controller term `term` if the host knows a
// newer one; else term is the newest known from now on.
func (h *Host) fence(term uint64, what string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if term < h.term {
		h.log.Info("request of an older controller term refused", "request", what, "term", term, "current_term", h.term)
		return &wire.FencedError{Host: h.opts.ID, What: what, Term: term, Current: h.term, Leader: h.leader}
	}
	h.raiseTermLocked(term, "")
	return nil
}

func (h *Host) unsubscribe() {
	for _, s := range h.subs {
		_ = s.Unsubscribe()
	}
	h.subs = nil
}

// Close stops the host: no more heartbeats or assignments, every run is
// canceled without being reported (the controller finds the host lost after
// the missed heartbeats and fails its jobs over). It waits for the runs.
func (h *Host) Close() {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return
	}
	h.closed = true
	h.mu.Unlock()
	h.unsubscribe()
	h.cancel()
	close(h.release)
	h.wg.Wait()
}

// PauseHeartbeats stops (true) or resumes (false) heartbeats while runs go on:
// for tests of lost-host detection.
func (h *Host) PauseHeartbeats(pause bool) {
	h.mu.Lock()
	h.paused = pause
	h.mu.Unlock()
}

// Running lists the attempts running here.
func (h *Host) Running() []wire.AttemptRef {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]wire.AttemptRef, 0, len(h.runs))
	for r := range h.runs {
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].JobID != out[j].JobID {
			return out[i].JobID < out[j].JobID
		}
		return out[i].Attempt < out[j].Attempt
	})
	return out
}

func (h *Host) heartbeats() {
	defer h.wg.Done()
	t := time.NewTicker(h.opts.HeartbeatInterval)
	defer t.Stop()
	for {
		h.mu.Lock()
		paused := h.paused
		h.mu.Unlock()
		if !paused {
			hb := wire.Heartbeat{HostID: h.opts.ID, Slots: h.opts.Slots, Running: h.Running(), Interval: h.opts.HeartbeatInterval.String()}
			data, _ := json.Marshal(hb)
			if err := h.nc.Publish(wire.SubjectHeartbeat, data); err != nil {
				h.log.Warn("heartbeat not sent", "err", err)
			}
		}
		select {
		case <-h.release:
			return
		case <-t.C:
		}
	}
}

func (h *Host) usedSlotsLocked() int {
	n := 0
	for _, r := range h.runs {
		n += r.slots
	}
	return n
}

// handleAssign takes an assignment (AssignReply). Attempts are fenced by
// their number: an attempt older than one this host was assigned, or whose
// cancel it received, is refused; older attempts of the job still running
// here are canceled, and the new one starts once they ended (their slots
// pass to it). Without enough free slots the reply says Busy.
func (h *Host) handleAssign(msg *nats.Msg) {
	var a wire.Assignment
	if err := json.Unmarshal(msg.Data, &a); err != nil {
		wire.Respond(msg, wire.AssignReply{Reply: wire.Reply{Error: fmt.Sprintf("cluster: host %s: bad assignment: %v", h.opts.ID, err)}})
		return
	}
	if err := h.fence(a.Term, "assignment"); err != nil {
		wire.Respond(msg, wire.AssignReply{Reply: wire.ErrorReply(err)})
		return
	}
	ref := wire.AttemptRef{JobID: a.JobID, Attempt: a.Attempt}
	slots := 0
	for _, s := range a.Placement {
		if s == h.opts.ID {
			slots++
		}
	}
	h.mu.Lock()
	var older []*hostRun
	oldSlots := 0
	for other, r := range h.runs {
		if other.JobID == a.JobID && other.Attempt < a.Attempt {
			older = append(older, r)
			oldSlots += r.slots
		}
	}
	used := h.usedSlotsLocked() - oldSlots
	switch {
	case h.closed:
		h.mu.Unlock()
		wire.Respond(msg, wire.AssignReply{Reply: wire.Reply{Error: fmt.Sprintf("cluster: host %s is shutting down", h.opts.ID)}})
		return
	case h.runs[ref] != nil:
		h.mu.Unlock()
		wire.Respond(msg, wire.AssignReply{}) // a repeated assignment
		return
	case a.Attempt < h.floor[a.JobID]:
		floor := h.floor[a.JobID]
		h.mu.Unlock()
		h.log.Info("assignment of an older attempt refused", "job", a.JobID, "attempt", a.Attempt, "fenced_below", floor)
		wire.Respond(msg, wire.AssignReply{Reply: wire.Reply{Error: fmt.Sprintf("cluster: host %s: job %s attempt %d is fenced: this host was assigned or told to cancel a later attempt (%d or later run here)", h.opts.ID, a.JobID, a.Attempt, floor)}})
		return
	case used+slots > h.opts.Slots:
		h.mu.Unlock()
		wire.Respond(msg, wire.AssignReply{Busy: true, Reply: wire.Reply{Error: fmt.Sprintf("cluster: host %s: job %s attempt %d needs %d slots, %d of %d free", h.opts.ID, a.JobID, a.Attempt, slots, h.opts.Slots-used, h.opts.Slots)}})
		return
	}
	h.floor[a.JobID] = a.Attempt
	ctx, cancel := context.WithCancel(h.ctx)
	r := &hostRun{ref: ref, slots: slots, cancel: cancel, done: make(chan struct{}), replaces: older}
	h.runs[ref] = r
	h.wg.Add(1)
	h.mu.Unlock()
	for _, o := range older {
		h.log.Info("canceling an older attempt before the new one starts", "job", a.JobID, "attempt", o.ref.Attempt, "new_attempt", a.Attempt)
		o.cancel()
	}
	wire.Respond(msg, wire.AssignReply{})
	go h.execute(ctx, r, a)
}

// execute fetches the artifacts, runs the attempt and reports its end.
func (h *Host) execute(ctx context.Context, r *hostRun, a wire.Assignment) {
	defer h.wg.Done()
	defer close(r.done)
	defer func() {
		h.mu.Lock()
		delete(h.runs, r.ref)
		h.mu.Unlock()
	}()
	defer r.cancel()
	log := h.log.With("job", a.JobID, "attempt", a.Attempt)
	h.report(wire.HostEvent{HostID: h.opts.ID, JobID: a.JobID, Attempt: a.Attempt, State: wire.SubtaskDeploying}, false)

	stats, err := h.runAssignment(ctx, r, a, log)
	ev := wire.HostEvent{HostID: h.opts.ID, JobID: a.JobID, Attempt: a.Attempt, Stats: stats.Operators, Checkpoints: stats.Recent}
	if stats.Elapsed > 0 {
		ev.Elapsed = stats.Elapsed.Round(time.Millisecond).String()
	}
	switch {
	case err == nil:
		ev.State, ev.Savepoint = wire.SubtaskFinished, stats.Savepoint
		// A spread job's savepoint is the controller's (its "job stopped"
		// line names it): the host names one only when it took it.
		if stats.Savepoint != "" {
			log.Info("attempt finished", "elapsed", stats.Elapsed, "savepoint", stats.Savepoint)
		} else {
			log.Info("attempt finished", "elapsed", stats.Elapsed)
		}
	case ctx.Err() != nil:
		ev.State = wire.SubtaskCanceled
		log.Info("attempt canceled")
	default:
		ev.State, ev.Error = wire.SubtaskFailed, err.Error()
		ev.Subtasks = failedSubtask(err)
		if c := runtime.FailureClass(err); c != control.FailureRestartable {
			ev.Class = c.String()
		}
		log.Warn("attempt failed", "err", err)
	}
	h.mu.Lock()
	closing := h.closed
	h.rememberEndLocked(ev)
	h.mu.Unlock()
	switch {
	case closing:
	case h.opts.SendFinalReport != nil && !h.opts.SendFinalReport(ev):
		log.Warn("final report dropped (test hook)", "state", ev.State)
	default:
		h.report(ev, true)
	}
}

// rememberEndLocked keeps ev, an attempt's final report, for outcome
// requests; the oldest is forgotten beyond opts.Outcomes.
func (h *Host) rememberEndLocked(ev wire.HostEvent) {
	if h.opts.Outcomes < 0 {
		return
	}
	ref := wire.AttemptRef{JobID: ev.JobID, Attempt: ev.Attempt}
	if _, ok := h.ends[ref]; !ok {
		h.endList = append(h.endList, ref)
	}
	h.ends[ref] = ev
	for len(h.endList) > h.opts.Outcomes {
		delete(h.ends, h.endList[0])
		h.endList = h.endList[1:]
	}
}

// handleOutcome answers how an attempt ended here (OutcomeReply).
func (h *Host) handleOutcome(msg *nats.Msg) {
	var req wire.HostRequest
	if err := json.Unmarshal(msg.Data, &req); err != nil {
		wire.Respond(msg, wire.OutcomeReply{Reply: wire.Reply{Error: fmt.Sprintf("cluster: host %s: bad outcome request: %v", h.opts.ID, err)}})
		return
	}
	if err := h.fence(req.Term, "outcome request"); err != nil {
		wire.Respond(msg, wire.OutcomeReply{Reply: wire.ErrorReply(err)})
		return
	}
	ref := wire.AttemptRef{JobID: req.JobID, Attempt: req.Attempt}
	var out wire.OutcomeReply
	h.mu.Lock()
	if ev, ok := h.ends[ref]; ok {
		out.Event = &ev
	} else if h.runs[ref] != nil {
		out.Running = true
	}
	h.mu.Unlock()
	wire.Respond(msg, out)
}

// failedSubtask names the subtask whose failure err is, when it names one.
func failedSubtask(err error) []wire.SubtaskRef {
	var te *runtime.TaskError
	if errors.As(err, &te) {
		return []wire.SubtaskRef{{Operator: te.Operator, Subtask: te.Subtask}}
	}
	var he *host.Error
	if errors.As(err, &he) && he.Operator != "" {
		return []wire.SubtaskRef{{Operator: he.Operator, Subtask: he.Subtask}}
	}
	return nil
}

func (h *Host) runAssignment(ctx context.Context, r *hostRun, a wire.Assignment, log *slog.Logger) (runtime.Stats, error) {
	cache := filepath.Join(h.opts.DataDir, "artifacts")
	g, err := a.Job.Graph(func(art wire.Artifact) (string, error) { return h.arts.FetchRetry(ctx, cache, art, log) })
	if err != nil {
		return runtime.Stats{}, err
	}
	// The older attempts of the job here were canceled on assignment: this
	// one starts once they ended.
	for _, o := range r.replaces {
		select {
		case <-o.done:
		default:
			log.Info("waiting for the older attempt to end", "older_attempt", o.ref.Attempt)
			select {
			case <-o.done:
			case <-ctx.Done():
				return runtime.Stats{}, ctx.Err()
			}
		}
	}
	r.replaces = nil
	req := ExecRequest{HostID: h.opts.ID, JobID: a.JobID, Attempt: a.Attempt, Graph: g,
		Placement: control.Placement{Slots: a.Placement}, Local: a.Local, Logger: log,
		Checkpoint: a.Job.Checkpoint, Conn: h.nc, RestoreFrom: a.Restore, MaxRecordBytes: a.Job.MaxRecordBytes,
		State: a.Job.State,
		Fence: func(term uint64) error { return h.fence(term, "command") },
		Progress: func(s runtime.Stats) {
			h.report(wire.HostEvent{HostID: h.opts.ID, JobID: a.JobID, Attempt: a.Attempt, State: wire.SubtaskRunning,
				Stats: s.Operators, Checkpoints: s.Recent, Elapsed: s.Elapsed.Round(time.Millisecond).String()}, false)
		}}
	// The attempt's spans (task, under it the phases) are children of the
	// controller's span of the attempt, if it sent one.
	exec, err := h.opts.Executor.Start(telemetry.ExtractMap(ctx, a.Trace), req)
	if err != nil {
		return runtime.Stats{}, err
	}
	r.mu.Lock()
	r.exec = exec
	r.mu.Unlock()
	log.Info("attempt running", "subtasks", len(a.Local))
	h.report(wire.HostEvent{HostID: h.opts.ID, JobID: a.JobID, Attempt: a.Attempt, State: wire.SubtaskRunning}, false)
	return exec.Wait()
}

// report sends ev to the controller: published, or when reliable as a
// request retried a few times.
func (h *Host) report(ev wire.HostEvent, reliable bool) {
	if !reliable {
		data, _ := json.Marshal(ev)
		_ = h.nc.Publish(wire.SubjectHostEvents, data)
		return
	}
	var err error
	for try := 0; try < 3; try++ {
		var rep wire.Reply
		if err = wire.RequestTimeout(h.nc, wire.SubjectHostEvents, h.opts.RequestTimeout, ev, &rep); err == nil {
			return
		}
		select {
		case <-h.release:
			return
		case <-time.After(h.opts.HeartbeatInterval):
		}
	}
	h.log.Warn("controller did not acknowledge a report", "job", ev.JobID, "attempt", ev.Attempt, "state", ev.State, "err", err)
}

func (h *Host) handleCancel(msg *nats.Msg) {
	var req wire.HostRequest
	if err := json.Unmarshal(msg.Data, &req); err != nil {
		wire.Respond(msg, wire.Reply{Error: fmt.Sprintf("cluster: host %s: bad cancel request: %v", h.opts.ID, err)})
		return
	}
	if err := h.fence(req.Term, "cancel"); err != nil {
		wire.Respond(msg, wire.ErrorReply(err))
		return
	}
	h.mu.Lock()
	r := h.runs[wire.AttemptRef{JobID: req.JobID, Attempt: req.Attempt}]
	// The controller never wants a canceled attempt back: a late assignment
	// of it (overtaken by this cancel) is refused.
	if req.Attempt+1 > h.floor[req.JobID] && !h.closed {
		h.floor[req.JobID] = req.Attempt + 1
	}
	h.mu.Unlock()
	if r == nil {
		wire.Respond(msg, wire.Reply{}) // not (or no longer) running here
		return
	}
	r.cancel()
	select {
	case <-r.done:
		wire.Respond(msg, wire.Reply{})
	case <-time.After(h.opts.RequestTimeout / 2):
		wire.Respond(msg, wire.Reply{Error: fmt.Sprintf("cluster: host %s: job %s attempt %d did not stop within %s", h.opts.ID, req.JobID, req.Attempt, h.opts.RequestTimeout/2)})
	}
}

func (h *Host) handleSavepoint(msg *nats.Msg) {
	verb := wire.HostVerbSavepoint
	if len(msg.Subject) > 5 && msg.Subject[len(msg.Subject)-5:] == "."+wire.HostVerbStop {
		verb = wire.HostVerbStop
	}
	var req wire.HostRequest
	if err := json.Unmarshal(msg.Data, &req); err != nil {
		wire.Respond(msg, wire.SavepointReply{Reply: wire.Reply{Error: fmt.Sprintf("cluster: host %s: bad %s request: %v", h.opts.ID, verb, err)}})
		return
	}
	// The controller drives the checkpoints of every deployed job (its
	// savepoint and stop requests go to the job's subtasks as commands);
	// a host takes none of its own.
	wire.Respond(msg, wire.SavepointReply{Reply: wire.Reply{Error: fmt.Sprintf("cluster: host %s: %s job %s: the controller takes savepoints of deployed jobs (streamd savepoint / streamd stop)", h.opts.ID, verb, req.JobID)}})
}
