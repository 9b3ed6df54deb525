package runtime

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/dataplane"
	"github.com/streamd/streamd/host"
	"github.com/streamd/streamd/internal/checkpoint"
	"github.com/streamd/streamd/internal/connector"
	"github.com/streamd/streamd/internal/jobfile"
	"github.com/streamd/streamd/internal/natsutil"
	"github.com/streamd/streamd/internal/telemetry"
)

// Options configures Run.
type Options struct {
	Engine *host.Engine // loads wasm modules (Vertex.Spec *jobfile.WasmSpec)
	// Logger gets the runtime's log lines as given: the caller names the
	// job in it (streamd run and the hosts do), the runtime adds no job
	// attribute of its own (it would repeat job=...). nil: no logs.
	Logger *slog.Logger
	// GuestLog, if set, also gets the guest lines of the wasm subtasks
	// (host.InstanceConfig.GuestLog).
	GuestLog slog.Handler
	Attempt  int // attempt number of the first run (later attempts count up)
	// JobID is a deployed job's id, for spans (streamd.job.id); "": the
	// job's name (streamd run).
	JobID string
	// Host is the id of the host running the subtasks (a metric label);
	// "": none (streamd run).
	Host            string
	BatchSize       int // records per batch on channels and into wasm; default 1024
	ChannelCapacity int // bounded queue length in batches per channel; default 16
	// BufferTimeout bounds how long a busy subtask holds an output's
	// records back in a batch that is not full (runtime.buffer_timeout);
	// 0 means DefaultBufferTimeout, negative never (a subtask still sends
	// what is pending whenever it idles).
	BufferTimeout time.Duration
	// MaxRecordBytes is the job's max_record_bytes (jobfile.Job.MaxRecordBytes;
	// 0 means abi.DefaultMaxRecordBytes): a larger record, read by a source,
	// emitted by an operator or arriving on a channel, fails its subtask
	// with an error wrapping abi.ErrRecordTooLarge that names the operator,
	// the subtask and the size.
	MaxRecordBytes int
	// State is the job's state section (jobfile.Job.State): the keyed-state
	// backend of its wasm operators; the zero value is memory. A pebble job
	// shares one block cache of State.CacheMiB among its subtasks in this
	// process.
	State jobfile.StateSettings
	// DataDir is where pebble subtasks keep their files: each subtask
	// attempt makes a directory of its own below it and removes it when it
	// closes. "": the OS temp directory.
	DataDir  string
	Stdout   io.Writer   // for the stdout sink; default os.Stdout
	Stdin    io.Reader   // for a file source with Path "-" (stdin); default os.Stdin
	Progress func(Stats) // called about once per second and once at the end, may be nil

	// TracerProvider makes the job's spans (nil: the global provider, a
	// no-op unless telemetry is set up). Records are never traced.
	TracerProvider trace.TracerProvider
	// Metrics records per-operator and checkpoint metrics (nil: none).
	Metrics *telemetry.Metrics

	// Checkpoint turns checkpointing on (nil: off; then nothing waits for a
	// final checkpoint, sinks commit when the job finishes and a failure
	// restarts from the beginning).
	Checkpoint *CheckpointOptions
	// Restart is the restart strategy after a failure (of a subtask, of a
	// checkpoint too many times, of a stop's savepoint); the zero value
	// never restarts.
	Restart jobfile.RestartSettings
	// Restore is the checkpoint or savepoint to start from (see
	// checkpoint.LoadRestore); nil: fresh state.
	Restore *checkpoint.Restore
	// Stop, when it delivers, stops the job with a savepoint (checkpointing
	// jobs only): Run then returns nil with Stats.Savepoint set.
	Stop <-chan StopRequest
	// Savepoint, when it delivers, takes a savepoint while the job keeps
	// running (checkpointing jobs only); the request's Result hears where it
	// is, or why there is none.
	Savepoint <-chan SavepointRequest
	// NATS is how nats sources and sinks connect (URLs, credentials, TLS);
	// a source or sink that names a url replaces the URLs. Every server is
	// connected to once per Run, when a nats source or sink first opens.
	NATS natsutil.ConnectOptions
	// ConnectorSettings are the values of the connectors' configuration
	// keys (connector.RegisterSetting), for their SourceEnv and SinkEnv.
	ConnectorSettings map[string]string
}

// CheckpointOptions configure checkpointing.
type CheckpointOptions struct {
	Store checkpoint.Store
	// Mode is checkpoint.mode: aligned (the default) or unaligned barriers;
	// savepoints are always aligned.
	Mode control.AlignmentMode
	// AlignedTimeout is checkpoint.aligned_timeout: with aligned barriers, a
	// subtask whose alignment has not completed after this long takes the
	// checkpoint unaligned; 0: never.
	AlignedTimeout time.Duration
	Interval       time.Duration // between periodic checkpoints; 0: none (final checkpoints and savepoints still happen)
	Timeout        time.Duration // a checkpoint not complete after this is aborted; 0: never
	MinPause       time.Duration // between the end of one checkpoint and the next trigger
	// MaxConcurrent pending checkpoints; default 1.
	MaxConcurrent int
	// TolerableFailures: consecutive failed checkpoints tolerated before the
	// job fails over; nil: DefaultTolerableFailures; negative: unlimited.
	TolerableFailures *int
	// Tick is the coordinator's clock step; default DefaultTick.
	Tick time.Duration
	// DelayFinalCheckpoint: wait for the next interval for the final
	// checkpoint instead of triggering it as soon as every running subtask
	// reached end of data.
	DelayFinalCheckpoint bool
	// OnComplete, if set, is called by the driver after each checkpoint or
	// savepoint is durable, before any subtask hears of it.
	OnComplete func(*checkpoint.Metadata)
	// JobID, for a deployed job, is its id, recorded in every checkpoint's
	// metadata; "" for streamd run.
	JobID string
	// SkipIDs is how many checkpoint ids after the store's NextID are not
	// used: a controller that takes a job over skips the ids its
	// predecessor may have triggered without any state written yet (the
	// subtasks ignore a barrier whose id is not above the last they saw).
	SkipIDs int64
}

// NewCheckpointOptions returns the checkpoint options of a job file's
// checkpoint section cs (interval, timeout, min_pause, tolerable_failures,
// max_concurrent, final_immediately), with store as the checkpoint store.
func NewCheckpointOptions(cs *jobfile.CheckpointSettings, store checkpoint.Store) *CheckpointOptions {
	tf := cs.TolerableFailures
	co := &CheckpointOptions{Store: store, Interval: cs.Interval, Timeout: cs.Timeout, MinPause: cs.MinPause,
		MaxConcurrent: cs.MaxConcurrent, TolerableFailures: &tf, DelayFinalCheckpoint: !cs.FinalImmediately}
	co.SetMode(cs)
	return co
}

// SetMode sets Mode and AlignedTimeout from the job file's checkpoint
// section (a host running its part of a deployed job gets only these).
func (co *CheckpointOptions) SetMode(cs *jobfile.CheckpointSettings) {
	co.Mode, co.AlignedTimeout = control.AlignAligned, cs.AlignedTimeout
	if cs.Unaligned() {
		co.Mode, co.AlignedTimeout = control.AlignUnaligned, 0
	}
}

// StopRequest asks to stop the job with a savepoint; with Drain the
// operators finish (end_input, finish) first.
type StopRequest struct {
	Drain bool
	// Failed, if set, hears why the stop failed when the job goes on (its
	// savepoint failed; the job restarts as its strategy says) or refused
	// it. Run does not block on it. A stop that succeeds ends Run.
	Failed chan<- error
	// Terminate: the stop must end the job (Ctrl-C): when no savepoint can
	// be taken (the job restarts) or the stop fails, the job is canceled
	// and Run returns an error matching context.Canceled that says why.
	Terminate bool
}

// SavepointRequest asks for a savepoint of a running job. Result must have
// room for one value: the driver never blocks on it.
type SavepointRequest struct{ Result chan<- SavepointResult }

// SavepointResult is where a requested savepoint was written, or why it was not.
type SavepointResult struct {
	Location string
	Err      error
}

// Defaults of Options.
const (
	DefaultBatchSize         = dataplane.DefaultBatchSize
	DefaultBufferTimeout     = dataplane.DefaultBufferTimeout
	DefaultChannelCapacity   = 16
	DefaultTick              = 100 * time.Millisecond
	DefaultTolerableFailures = jobfile.DefaultTolerableFailures
)

// ProgressInterval is how often Options.Progress is called while a job runs.
const ProgressInterval = time.Second

// OperatorStats counts the records of one operator over all its subtasks.
type OperatorStats struct {
	UID         string
	Parallelism int
	RecordsIn   int64
	RecordsOut  int64
	// Subtasks has the state of each subtask (StateRunning ...), by index;
	// "" for a subtask that does not run in this process.
	Subtasks []string `json:",omitempty"`
	// UnionDeclines counts the checkpoints declined because the operator
	// has union list state and was partially finished.
	UnionDeclines int `json:",omitempty"`
	// MaxSnapshotPause is the longest synchronous part of a snapshot of any
	// of its subtasks so far (the operator's snapshot_state and the cut of
	// its keyed state): the time the subtask processed nothing for a
	// checkpoint. Encoding and writing run in the background.
	MaxSnapshotPause time.Duration `json:",omitempty"`
	// MaxRestore is the longest time any of its subtasks took to load its
	// restored keyed state (fetching the files of an incremental
	// checkpoint included).
	MaxRestore time.Duration `json:",omitempty"`
	// DeadLetters counts the records its on_error skip or dead_letter took
	// out of the stream (a failover may count a record again, as RecordsIn).
	DeadLetters int64 `json:",omitempty"`
	// SideOutputDropped counts the records it emitted (emit_to) to side
	// outputs that no edge reads (the metric streamd.side_output.dropped).
	SideOutputDropped int64 `json:",omitempty"`
	// Live has the counters of each subtask that runs in this process
	// (watermark, back-pressured, busy and idle time, source lag), by
	// index; the zero value for the others.
	Live []telemetry.SubtaskLive `json:",omitempty"`
}

// Stats is a snapshot of a run's counters.
type Stats struct {
	Elapsed   time.Duration
	Operators []OperatorStats // in graph (topological) order
	// Restarts is the number of failovers so far.
	Restarts int
	// Checkpoints is the number of completed checkpoints and savepoints.
	Checkpoints int
	// LastCheckpoint is the location of the latest completed checkpoint.
	LastCheckpoint string
	// Savepoint is the location of the stop-with-savepoint savepoint, set
	// when the job stopped.
	Savepoint string
	// Recent are the latest completed checkpoints (at most
	// RecentCheckpoints), oldest first, with duration and size.
	Recent []CheckpointStats `json:",omitempty"`
	// Failures are the latest failed attempts that were restarted (at
	// most RecentFailures), oldest first, with their cause.
	Failures []AttemptFailure `json:",omitempty"`
}

// AttemptFailure is one failed attempt of a run and why it failed.
type AttemptFailure struct {
	Attempt int
	Time    time.Time
	Error   string
}

// RecentFailures is how many failed attempts Stats keeps.
const RecentFailures = 10

// appendFailure records that attempt failed with err, keeping the latest
// RecentFailures.
func appendFailure(fs []AttemptFailure, attempt int, err error) []AttemptFailure {
	msg := "unknown cause"
	if err != nil {
		msg = err.Error()
	}
	fs = append(fs, AttemptFailure{Attempt: attempt, Time: time.Now(), Error: msg})
	if n := len(fs); n > RecentFailures {
		fs = append(fs[:0], fs[n-RecentFailures:]...)
	}
	return fs
}

// opStats are the live counters of one operator, added to once per batch.
type opStats struct {
	in, out atomic.Int64
	dead    atomic.Int64 // dead letters (on_error)
	// sideDropped counts the records emitted to side outputs no edge reads.
	sideDropped atomic.Int64
	// pause is the longest synchronous part of a snapshot of any subtask,
	// in nanoseconds: the time it processed nothing for a checkpoint.
	pause atomic.Int64
	// restore is the longest time a subtask took to load its restored
	// keyed state (making its instance), in nanoseconds.
	restore atomic.Int64
}

// addPause records a synchronous snapshot pause of d.
func (s *opStats) addPause(d time.Duration) { storeMax(&s.pause, d) }

// storeMax raises v to d.
func storeMax(v *atomic.Int64, d time.Duration) {
	for cur := v.Load(); int64(d) > cur && !v.CompareAndSwap(cur, int64(d)); cur = v.Load() {
	}
}

// job is one attempt of a Run: what every subtask of the attempt shares.
type job struct {
	g       *control.JobGraph
	opts    Options
	log     *slog.Logger
	stats   []*opStats // by vertex index
	tasks   []*task
	byID    map[control.SubtaskID]*task
	modules map[string]*host.Module
	// stateCache is the pebble block cache of the run (nil: memory backend).
	stateCache *host.StateCache
	stdout     *sync.Mutex // serializes the stdout sinks
	nats       *natsConns  // the Run's NATS connections (nats sources and sinks)
	start      time.Time
	attempt    int
	restore    *checkpoint.Restore
	store      checkpoint.Store
	events     chan control.Event // subtask -> driver
	remote     *Remote            // nil: every subtask runs here (Run); else StartAttempt's
	remotes    []io.Closer        // the remote channel ends, closed when the attempt ends

	cancel  context.CancelCauseFunc
	done    chan struct{} // closed when every subtask returned
	failed  control.SubtaskID
	err     error // first failure (the context's cause)
	errOnce sync.Once
}

// Run runs the job until every subtask finished (nil), it stopped with a
// savepoint (nil, Stats.Savepoint set), it failed for good (the error names
// job, operator, subtask and phase; wasm errors are *host.Error), or ctx is
// canceled (ctx.Err()). Before anything starts it loads every wasm module, so
// a bad module fails Run before anything runs, and checks a restore against
// the graph. A failed subtask restarts the whole job under Options.Restart:
// from the latest completed checkpoint with checkpointing, else from the
// beginning.
func Run(ctx context.Context, g *control.JobGraph, opts Options) (Stats, error) {
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
		opts.Stdin = os.Stdin
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	r := &runner{g: g, opts: opts, log: opts.Logger, start: time.Now(), modules: map[string]*host.Module{}}
	if opts.Restore == nil {
		jobfile.PinNewStart(g, r.start) // restarts read from the first start on
	}
	for range g.Vertices {
		r.stats = append(r.stats, &opStats{})
	}
	defer r.closeModules()
	defer r.nats.close()
	return r.run(ctx)
}

func maxParallelism(v *control.Vertex) int {
	if v.MaxParallelism > 0 {
		return v.MaxParallelism
	}
	return abi.DefaultMaxParallelism
}

func toDataplane(p control.Partitioning) (dataplane.Partitioning, error) {
	switch p {
	case control.Forward:
		return dataplane.Forward, nil
	case control.Rebalance:
		return dataplane.Rebalance, nil
	case control.Hash:
		return dataplane.Hash, nil
	case control.Broadcast:
		return dataplane.Broadcast, nil
	}
	return 0, fmt.Errorf("unknown partitioning %q", p)
}

// build creates every channel and subtask of one attempt.
func (j *job) build() error {
	g := j.g
	modules := j.modules
	var deployedFinished map[control.SubtaskID]bool
	if j.restore != nil {
		deployedFinished = map[control.SubtaskID]bool{}
		for _, id := range control.DeployAsFinished(g, j.restore.Finished) {
			deployedFinished[id] = true
		}
	}
	// 2. Channels: for each edge, one per (sender, receiver) pair it connects.
	for _, v := range g.Vertices {
		if v.Parallelism < 1 {
			return fmt.Errorf("runtime: job %q operator %q: parallelism %d", g.Name, v.UID, v.Parallelism)
		}
	}
	type edgeKey struct {
		to    string
		input int
	}
	type ends struct {
		out []dataplane.Output // by receiver; nil where the sender or the channel is elsewhere
		in  []dataplane.Input  // by receiver; nil where the receiver or the channel is elsewhere
	}
	edgeChans := map[edgeKey][]ends{} // [sender]
	for _, v := range g.Vertices {
		for _, e := range v.Inputs {
			from := g.Vertex(e.From)
			if from == nil {
				return fmt.Errorf("runtime: job %q operator %q: input %d from unknown operator %q", g.Name, v.UID, e.Input, e.From)
			}
			if _, err := toDataplane(e.Partition); err != nil {
				return fmt.Errorf("runtime: job %q operator %q input %d: %w", g.Name, v.UID, e.Input, err)
			}
			if e.Partition.Pointwise() && from.Parallelism != v.Parallelism {
				return fmt.Errorf("runtime: job %q operator %q input %d: forward from %q needs equal parallelism, got %d and %d",
					g.Name, v.UID, e.Input, e.From, from.Parallelism, v.Parallelism)
			}
			cs := make([]ends, from.Parallelism)
			for s := range cs {
				cs[s] = ends{out: make([]dataplane.Output, v.Parallelism), in: make([]dataplane.Input, v.Parallelism)}
				for r := 0; r < v.Parallelism; r++ {
					if e.Partition.Pointwise() && s != r {
						continue
					}
					out, in, err := j.channel(from, s, v, r, e.Input)
					if err != nil {
						return fmt.Errorf("runtime: job %q operator %q input %d: %w", g.Name, v.UID, e.Input, err)
					}
					cs[s].out[r], cs[s].in[r] = out, in
				}
			}
			edgeChans[edgeKey{v.UID, e.Input}] = cs
		}
	}

	// 3. Subtasks.
	for vi, v := range g.Vertices {
		for s := 0; s < v.Parallelism; s++ {
			id := control.SubtaskID{Operator: v.UID, Index: s}
			if !j.local(id) {
				continue
			}
			t := &task{
				j:     j,
				v:     v,
				sub:   s,
				id:    id,
				stats: j.stats[vi],
				info: SubtaskInfo{
					Job: g.Name, JobID: cmp.Or(j.opts.JobID, g.Name), Operator: v.UID, Subtask: s, Parallelism: v.Parallelism,
					MaxParallelism: maxParallelism(v), Attempt: j.attempt, NumInputs: len(v.Inputs),
				},
				ckpt:             j.opts.Checkpoint != nil,
				mb:               &mailbox{},
				deployedFinished: deployedFinished[id],
				outWM:            abi.MinWatermark,
			}
			// Input gate: channels by input, then by sender; the mailbox last.
			if len(v.Inputs) > 0 {
				var gcs []dataplane.GateChannel
				for _, e := range v.Inputs {
					for from, row := range edgeChans[edgeKey{v.UID, e.Input}] {
						if in := row.in[s]; in != nil {
							gcs = append(gcs, dataplane.GateChannel{In: in, Input: e.Input})
							t.origins = append(t.origins, chanOrigin{op: e.From, sub: from, input: e.Input})
						}
					}
				}
				t.setGate(gcs)
			} else {
				t.srcWake = make(chan struct{}, 1)
				t.mb.notify = t.srcWake
			}
			t.initMetrics() // before the attempt is seen: Stats read its counters
			// Record writers: one per output edge.
			for _, e := range g.Outputs(v.UID) {
				to := g.Vertex(e.To)
				row := edgeChans[edgeKey{e.To, e.Input}][s]
				var outs []dataplane.Output
				var dests []chanOrigin
				for r, o := range row.out {
					if o != nil {
						outs = append(outs, o)
						dests = append(dests, chanOrigin{op: e.To, sub: r, input: e.Input})
					}
				}
				outs = t.timeOutputs(outs)
				p, _ := toDataplane(e.Partition)
				w, err := dataplane.NewRecordWriter(outs, p, dataplane.WriterOptions{
					BatchSize: j.opts.BatchSize, MaxParallelism: maxParallelism(to), Start: s, MaxRecordBytes: j.opts.MaxRecordBytes,
					BufferTimeout: j.opts.BufferTimeout, Overdraft: outputOverdraft,
				})
				if err != nil {
					return t.fail(phaseSetup, fmt.Errorf("output to %q: %w", e.To, err))
				}
				t.addWriter(e, w, dests)
			}
			if err := j.bindSpec(t, modules); err != nil {
				return t.fail(phaseSetup, err)
			}
			if err := t.newMachine(); err != nil {
				return t.fail(phaseSetup, err)
			}
			if t.op != nil {
				t.cp = checkpointerOf(t.op)
			}
			j.tasks = append(j.tasks, t)
			j.byID[id] = t
		}
	}
	return nil
}

// bindSpec sets what t runs: a source, or an operator (wasm, native or sink).
func (j *job) bindSpec(t *task, modules map[string]*host.Module) error {
	v := t.v
	var rs *checkpoint.SubtaskRestore
	if j.restore != nil {
		rs = j.restore.Subtasks[t.id]
	}
	if rs != nil {
		t.srcPos, t.srcFinished, t.inflight = rs.SourcePosition, rs.SourceFinished, rs.InFlight
	}
	switch spec := v.Spec.(type) {
	case *jobfile.SourceSpec:
		if len(v.Inputs) > 0 {
			return fmt.Errorf("a source cannot have inputs")
		}
		if _, ok := connector.LookupSource(spec.Type); !ok {
			return fmt.Errorf("unknown source type %q", spec.Type)
		}
		env := j.sourceEnv(t)
		t.newSource = func(pos []byte) (connector.Source, error) {
			env := env
			env.Position = pos
			return connector.NewSource(spec, env)
		}
		return nil
	case *jobfile.SinkSpec:
		if _, ok := connector.LookupSink(spec.Type); !ok {
			return fmt.Errorf("unknown sink type %q", spec.Type)
		}
		env := j.sinkEnv(t, v.UID)
		open := func() (connector.Sink, error) { return connector.NewSink(spec, env) }
		so := &sinkOperator{open: open, ckpt: t.ckpt}
		if rs != nil {
			so.pending = rs.SinkPending
		}
		t.op = so
	case *jobfile.WasmSpec:
		wo := &wasmOperator{mod: modules[spec.Path], cfg: host.InstanceConfig{
			Job: t.info.Job, JobID: t.info.JobID, Operator: v.UID, Subtask: t.sub, Parallelism: v.Parallelism,
			MaxParallelism: t.info.MaxParallelism, Attempt: t.info.Attempt, NumInputs: len(v.Inputs),
			Config: spec.Config, AllowClock: spec.AllowClock,
			LendEmits:      true, // the record writers copy every emitted record into their batches
			MaxRecordBytes: j.opts.MaxRecordBytes,
			State:          host.StateConfig{Backend: j.opts.State.Backend, DataDir: j.opts.DataDir, Cache: j.stateCache, Incremental: j.opts.State.Incremental},
			GuestLog:       j.opts.GuestLog,
		}}
		wo.cfg.Outputs = taskOutputs{t, wo}
		if rs != nil {
			wo.cfg.Restore = rs.Snapshot
			wo.restoredID = j.restore.Metadata.ID
			wo.stats = t.stats
		}
		if r, ok := j.store.(interface{ Root() string }); ok {
			wo.root = r.Root()
		}
		if spec.OnError != nil {
			wo.cfg.Isolate = true
			var pending [][]byte
			if rs != nil {
				pending = rs.SinkPending
			}
			wo.dl = j.newDeadLetters(t, spec.OnError, pending)
		}
		t.op = wo
	case NativeFactory:
		t.op = spec(t.info)
	case NativeOperator:
		t.op = spec
	default:
		return fmt.Errorf("unsupported operator spec %T", v.Spec)
	}
	if len(v.Inputs) == 0 {
		return fmt.Errorf("an operator or sink needs at least one input")
	}
	return nil
}
