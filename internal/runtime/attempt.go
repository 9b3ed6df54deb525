package runtime

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/dataplane"
	"github.com/streamd/streamd/dataplane/natsch"
	"github.com/streamd/streamd/host"
	"github.com/streamd/streamd/internal/checkpoint"
)

// CommandKind says what a driver asks of a subtask.
type CommandKind string

// Command kinds.
const (
	CommandTrigger CommandKind = "trigger" // start checkpoint Barrier.ID at this subtask
	CommandNotify  CommandKind = "notify"  // checkpoint ID is complete
	CommandAbort   CommandKind = "abort"   // checkpoint ID was aborted
	CommandStop    CommandKind = "stop"    // stop-with-savepoint ID: end the input now (sources), with Drain
)

// Command is one command of a Driver to a subtask. It is JSON-encodable so a
// driver on another host can send it (internal/cluster).
type Command struct {
	Kind    CommandKind       `json:"kind"`
	ID      int64             `json:"id"`
	Barrier dataplane.Barrier `json:"barrier,omitempty"` // CommandTrigger
	Drain   bool              `json:"drain,omitempty"`   // CommandStop
	// Trace is the checkpoint's trace context for CommandNotify (the
	// trigger's is Barrier.Trace); nil when tracing is off.
	Trace map[string]string `json:"trace,omitempty"`
	// Location, for the trigger of a savepoint driven from another host,
	// is where the savepoint goes (see SavepointPreparer); "" = the store's
	// default.
	Location string `json:"location,omitempty"`
}

func (c Command) internal() (command, error) {
	var k cmdKind
	switch c.Kind {
	case CommandTrigger:
		k = cmdTrigger
	case CommandNotify:
		k = cmdNotify
	case CommandAbort:
		k = cmdAbort
	case CommandStop:
		k = cmdStop
	default:
		return command{}, fmt.Errorf("runtime: unknown command %q", c.Kind)
	}
	return command{kind: k, id: c.ID, barrier: c.Barrier, drain: c.Drain, trace: c.Trace}, nil
}

// SavepointPreparer is implemented by stores that can put a savepoint at a
// location chosen before it is triggered (the controller of a multi-host
// job chooses it, so that every host writes into the same place).
type SavepointPreparer interface {
	PrepareSavepoint(id int64, location string) error
}

// Command sends c to the local subtask id (Target); false when the subtask
// is not in this attempt or has exited.
func (j *job) Command(id control.SubtaskID, c Command) bool {
	if j == nil {
		return false
	}
	t := j.byID[id]
	if t == nil {
		return false
	}
	cmd, err := c.internal()
	if err != nil {
		return false
	}
	return t.mb.send(cmd)
}

// Fail fails the attempt (Target).
func (j *job) Fail(err error) {
	if j != nil {
		j.fail(control.SubtaskID{}, err)
	}
}

// State is the coordinator's job state.
func (d *Driver) State() control.JobState {
	if d.lc != nil {
		return d.lc.State()
	}
	return d.coord.State()
}

// CanStop reports whether the coordinator takes a stop-with-savepoint or a
// savepoint now.
func (d *Driver) CanStop() bool {
	if d.lc != nil {
		return d.lc.CanSavepoint()
	}
	st := d.coord.State()
	return st == control.JobRunning || st == control.JobFinishing
}

// Latest is the latest completed checkpoint or savepoint, nil if none.
func (d *Driver) Latest() *checkpoint.Metadata {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.lastMD
}

// Done is the coordinator's JobDone, nil while the job has not ended.
func (d *Driver) Done() *control.JobDone { return d.jobDone }

// Savepoint is the location of the stop-with-savepoint savepoint, once the
// job stopped.
func (d *Driver) Savepoint() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.savepath
}

// Checkpoints is the number of completed checkpoints and savepoints.
func (d *Driver) Checkpoints() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.count
}

// Status is the coordinator's status.
func (d *Driver) Status() control.Status { return d.coord.Status() }

// RemoteChannels makes the ends of channels whose other end is on another
// host. *natsch.Transport implements it.
type RemoteChannels interface {
	NewSender(natsch.ChannelID, ...natsch.Option) (*natsch.Sender, error)
	NewReceiver(natsch.ChannelID, ...natsch.Option) (*natsch.Receiver, error)
}

// Remote makes a run one host's part of a job attempt whose driver runs
// elsewhere (the controller of internal/cluster).
type Remote struct {
	// JobID is the job token of the channel subjects (natsch.ChannelID.Job).
	JobID string
	// Local reports whether this host runs a subtask.
	Local func(control.SubtaskID) bool
	// Channels makes the channel ends to and from the other hosts.
	Channels RemoteChannels
	// Report gets the local subtasks' events for the driver (checkpointing
	// jobs only), in order per subtask, from one goroutine.
	Report func(control.Event)
}

// Attempt is one host's part of a job attempt (StartAttempt).
type Attempt struct {
	r    *runner
	j    *job
	done chan struct{}

	stats Stats
	err   error
}

// StartAttempt starts the subtasks rem.Local selects of attempt
// opts.Attempt of g, restored from opts.Restore: channels between two local
// subtasks are in-process, the others are made by rem.Channels. It does not
// restart anything (the driver elsewhere restarts the whole job) and runs no
// coordinator: with opts.Checkpoint (whose Store takes the local subtasks'
// state) the subtasks report to rem.Report and take the driver's commands
// through Command. opts.Stop and opts.Restart are ignored.
func StartAttempt(ctx context.Context, g *control.JobGraph, opts Options, rem Remote) (*Attempt, error) {
	if rem.Local == nil || rem.Channels == nil || rem.JobID == "" {
		return nil, fmt.Errorf("runtime: job %q: a remote attempt needs Local, Channels and JobID", g.Name)
	}
	if opts.Checkpoint != nil && (opts.Checkpoint.Store == nil || rem.Report == nil) {
		return nil, fmt.Errorf("runtime: job %q: a checkpointing remote attempt needs a store and Report", g.Name)
	}
	if opts.BatchSize <= 0 {
		opts.BatchSize = DefaultBatchSize
	}
	if opts.MaxRecordBytes <= 0 {
		opts.MaxRecordBytes = abi.DefaultMaxRecordBytes
	}
	if opts.ChannelCapacity <= 0 {
		opts.ChannelCapacity = DefaultChannelCapacity
	}
	if opts.Stdout == nil {
		opts.Stdout = os.Stdout
	}
	if opts.Stdin == nil {
		opts.Stdin = eof{}
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	r := &runner{g: g, opts: opts, log: opts.Logger, start: time.Now(), modules: map[string]*host.Module{}}
	for range g.Vertices {
		r.stats = append(r.stats, &opStats{})
	}
	a := &Attempt{r: r, done: make(chan struct{})}
	if err := r.loadModules(ctx); err != nil {
		r.closeModules()
		return nil, err
	}
	if opts.Restore != nil {
		if err := control.CheckRestore(g, opts.Restore.Finished); err != nil {
			r.closeModules()
			return nil, fmt.Errorf("runtime: restore from %s %d: %w", opts.Restore.Metadata.Kind, opts.Restore.Metadata.ID, err)
		}
	}
	j := r.newJob(opts.Attempt, opts.Restore)
	if opts.Checkpoint != nil {
		j.store = opts.Checkpoint.Store
	}
	j.remote = &rem
	if err := j.build(); err != nil {
		j.endMetrics()
		j.closeRemote()
		r.closeModules()
		return nil, err
	}
	a.j = j
	r.cur = j
	go a.run(ctx)
	return a, nil
}

func (a *Attempt) run(ctx context.Context) {
	r, j := a.r, a.j
	defer close(a.done)
	defer r.closeModules()
	defer r.nats.close()
	runCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	j.cancel = cancel
	j.events = make(chan control.Event, 4*len(j.tasks)+64)
	var wg sync.WaitGroup
	for _, t := range j.tasks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := t.run(runCtx); err != nil {
				j.fail(t.id, err)
			}
		}()
	}
	go func() { wg.Wait(); j.endMetrics(); close(j.done) }()
	stopProgress := r.startProgress()
	for done := false; !done; {
		select {
		case ev := <-j.events:
			j.remote.Report(ev)
		case <-j.done:
			for more := true; more; {
				select {
				case ev := <-j.events:
					j.remote.Report(ev)
				default:
					more = false
				}
			}
			done = true
		}
	}
	j.closeRemote()
	stopProgress()
	a.err = j.result(ctx)
	a.stats = r.snapshot()
	if r.opts.Progress != nil {
		r.opts.Progress(a.stats)
	}
}

// Command delivers a driver command to local subtask id; false when the
// subtask is not here or has exited (for a trigger: report TriggerFailed).
func (a *Attempt) Command(id control.SubtaskID, c Command) bool {
	if c.Kind == CommandTrigger && c.Location != "" && c.Barrier.Kind == dataplane.Savepoint {
		if sp, ok := a.j.store.(SavepointPreparer); ok {
			if err := sp.PrepareSavepoint(c.ID, c.Location); err != nil {
				a.r.log.Warn("savepoint location refused", "id", c.ID, "location", c.Location, "err", err)
			}
		}
	}
	return a.j.Command(id, c)
}

// Cancel cancels the attempt.
func (a *Attempt) Cancel(err error) { a.j.fail(control.SubtaskID{}, err) }

// Wait returns when every local subtask has returned: nil when they all
// finished, ctx.Err() after a cancel, else the first failure.
func (a *Attempt) Wait() (Stats, error) {
	<-a.done
	return a.stats, a.err
}

// Done is closed when the attempt has ended.
func (a *Attempt) Done() <-chan struct{} { return a.done }

// channel makes the channel from subtask s of operator from to subtask rcv of
// operator to (edge input). Every channel of an attempt is made here: an
// in-process channel when both ends run here, else the local end of a remote
// channel (out or in is nil when that end runs elsewhere; both are nil when
// neither end runs here).
func (j *job) channel(from *control.Vertex, s int, to *control.Vertex, rcv int, input int) (dataplane.Output, dataplane.Input, error) {
	name := fmt.Sprintf("%s[%d]->%s[%d]", from.UID, s, to.UID, rcv)
	if len(to.Inputs) > 1 {
		name += fmt.Sprintf(" (input %d)", input)
	}
	sendHere := j.local(control.SubtaskID{Operator: from.UID, Index: s})
	recvHere := j.local(control.SubtaskID{Operator: to.UID, Index: rcv})
	if sendHere && recvHere {
		c := dataplane.NewLocalChannel(name, j.opts.ChannelCapacity)
		return c.Output(), c.Input(), nil
	}
	if !sendHere && !recvHere {
		return nil, nil, nil
	}
	id := natsch.ChannelID{Job: j.remote.JobID, Attempt: j.attempt, From: from.UID, FromSubtask: s, To: to.UID, ToSubtask: rcv, Input: input}
	if sendHere {
		snd, err := j.remote.Channels.NewSender(id, natsch.MaxRecord(j.opts.MaxRecordBytes))
		if err != nil {
			return nil, nil, err
		}
		j.remotes = append(j.remotes, snd)
		return snd, nil, nil
	}
	// Batches of the job's batch size, as from an in-process channel: a
	// receiving subtask that has fallen behind takes no more records in one
	// call, so an overtaking barrier waits for no more.
	rc, err := j.remote.Channels.NewReceiver(id, natsch.MaxRecord(j.opts.MaxRecordBytes), natsch.MergeRecords(j.opts.BatchSize))
	if err != nil {
		return nil, nil, err
	}
	j.remotes = append(j.remotes, rc)
	return nil, rc, nil
}

// local reports whether subtask id runs in this process.
func (j *job) local(id control.SubtaskID) bool {
	return j.remote == nil || j.remote.Local(id)
}

// closeRemote closes the remote channel ends (senders and receivers close
// themselves after EndOfPartition; this releases the others).
func (j *job) closeRemote() {
	for _, c := range j.remotes {
		_ = c.Close()
	}
	j.remotes = nil
}

type eof struct{}

func (eof) Read([]byte) (int, error) { return 0, io.EOF }

// newJob makes attempt `attempt` of the run, restored from restore.
func (r *runner) newJob(attempt int, restore *checkpoint.Restore) *job {
	return &job{
		g: r.g, opts: r.opts, log: r.log, stats: r.stats, modules: r.modules, stateCache: r.stateCache, stdout: &r.stdout, nats: &r.nats,
		start: r.start, attempt: attempt, restore: restore, store: r.store,
		byID: map[control.SubtaskID]*task{}, done: make(chan struct{}),
	}
}
