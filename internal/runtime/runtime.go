package runtime

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/dataplane"
	"github.com/streamd/streamd/host"
	"github.com/streamd/streamd/internal/connector"
	"github.com/streamd/streamd/internal/jobfile"
)

// Options configures Run.
type Options struct {
	Engine          *host.Engine // loads wasm modules (Vertex.Spec *jobfile.WasmSpec)
	Logger          *slog.Logger
	Attempt         int
	BatchSize       int         // records per batch on channels and into wasm; default 1024
	ChannelCapacity int         // bounded queue length in batches per channel; default 16
	Stdout          io.Writer   // for the stdout sink; default os.Stdout
	Stdin           io.Reader   // for a file source with Path "-" (stdin); default os.Stdin
	Progress        func(Stats) // called about once per second and once at the end, may be nil
}

// Defaults of Options.
const (
	DefaultBatchSize       = dataplane.DefaultBatchSize
	DefaultChannelCapacity = 16
)

// ProgressInterval is how often Options.Progress is called while a job runs.
const ProgressInterval = time.Second

// OperatorStats counts the records of one operator over all its subtasks.
type OperatorStats struct {
	UID         string
	Parallelism int
	RecordsIn   int64
	RecordsOut  int64
}

// Stats is a snapshot of a run's counters.
type Stats struct {
	Elapsed   time.Duration
	Operators []OperatorStats // in graph (topological) order
}

// opStats are the live counters of one operator, added to once per batch.
type opStats struct {
	in, out atomic.Int64
}

// job is one Run: what every subtask shares.
type job struct {
	g       *control.JobGraph
	opts    Options
	log     *slog.Logger
	stats   []*opStats // by vertex index
	tasks   []*task
	modules []*host.Module
	stdout  sync.Mutex // serializes the stdout sinks
	start   time.Time
}

// Run runs the job until every subtask finished (nil), a subtask failed (the
// error names job, operator, subtask and phase; wasm errors are *host.Error),
// or ctx is canceled (ctx.Err()). Before anything starts it loads every wasm
// module, so a bad module fails Run before anything runs.
func Run(ctx context.Context, g *control.JobGraph, opts Options) (Stats, error) {
	if opts.BatchSize <= 0 {
		opts.BatchSize = DefaultBatchSize
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
	j := &job{g: g, opts: opts, log: opts.Logger.With("job", g.Name), start: time.Now()}
	defer j.closeModules()
	if err := j.build(ctx); err != nil {
		return j.snapshot(), err
	}

	runCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	grp := &group{cancel: cancel}
	for _, t := range j.tasks {
		grp.Go(func() error { return t.run(runCtx) })
	}
	stopProgress := make(chan struct{})
	var progress sync.WaitGroup
	if opts.Progress != nil {
		progress.Add(1)
		go func() {
			defer progress.Done()
			tick := time.NewTicker(ProgressInterval)
			defer tick.Stop()
			for {
				select {
				case <-tick.C:
					opts.Progress(j.snapshot())
				case <-stopProgress:
					return
				}
			}
		}()
	}
	grp.Wait()
	close(stopProgress)
	progress.Wait()
	stats := j.snapshot()
	if opts.Progress != nil {
		opts.Progress(stats)
	}
	if runCtx.Err() == nil {
		j.log.Debug("job finished", "elapsed", stats.Elapsed)
		return stats, nil
	}
	err := context.Cause(runCtx)
	if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		return stats, ctx.Err()
	}
	return stats, err
}

func (j *job) snapshot() Stats {
	s := Stats{Elapsed: time.Since(j.start), Operators: make([]OperatorStats, len(j.g.Vertices))}
	for i, v := range j.g.Vertices {
		s.Operators[i] = OperatorStats{UID: v.UID, Parallelism: v.Parallelism}
		if i < len(j.stats) {
			s.Operators[i].RecordsIn = j.stats[i].in.Load()
			s.Operators[i].RecordsOut = j.stats[i].out.Load()
		}
	}
	return s
}

func (j *job) closeModules() {
	for _, m := range j.modules {
		_ = m.Close(context.Background())
	}
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

// build loads the wasm modules, then creates every channel and subtask.
func (j *job) build(ctx context.Context) error {
	g := j.g
	// 1. Load each wasm module once, before anything runs.
	modules := map[string]*host.Module{}
	for _, v := range g.Vertices {
		ws, ok := v.Spec.(*jobfile.WasmSpec)
		if !ok || modules[ws.Path] != nil {
			continue
		}
		if j.opts.Engine == nil {
			return fmt.Errorf("runtime: job %q operator %q: a wasm operator needs Options.Engine", g.Name, v.UID)
		}
		m, err := j.opts.Engine.LoadFile(ctx, ws.Path)
		if err != nil {
			return fmt.Errorf("runtime: job %q operator %q: %w", g.Name, v.UID, err)
		}
		modules[ws.Path] = m
		j.modules = append(j.modules, m)
	}

	// 2. Channels: for each edge, one per (sender, receiver) pair it connects.
	index := map[string]int{}
	for i, v := range g.Vertices {
		index[v.UID] = i
		j.stats = append(j.stats, &opStats{})
		if v.Parallelism < 1 {
			return fmt.Errorf("runtime: job %q operator %q: parallelism %d", g.Name, v.UID, v.Parallelism)
		}
	}
	type edgeKey struct {
		to    string
		input int
	}
	edgeChans := map[edgeKey][][]*dataplane.LocalChannel{} // [sender][receiver]
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
			cs := make([][]*dataplane.LocalChannel, from.Parallelism)
			for s := range cs {
				cs[s] = make([]*dataplane.LocalChannel, v.Parallelism)
				for r := range cs[s] {
					if e.Partition.Pointwise() && s != r {
						continue
					}
					name := fmt.Sprintf("%s[%d]->%s[%d]", from.UID, s, v.UID, r)
					if len(v.Inputs) > 1 {
						name += fmt.Sprintf(" (input %d)", e.Input)
					}
					cs[s][r] = dataplane.NewLocalChannel(name, j.opts.ChannelCapacity)
				}
			}
			edgeChans[edgeKey{v.UID, e.Input}] = cs
		}
	}

	// 3. Subtasks.
	for vi, v := range g.Vertices {
		for s := 0; s < v.Parallelism; s++ {
			t := &task{
				j:     j,
				v:     v,
				sub:   s,
				stats: j.stats[vi],
				info: SubtaskInfo{
					Job: g.Name, Operator: v.UID, Subtask: s, Parallelism: v.Parallelism,
					MaxParallelism: maxParallelism(v), Attempt: j.opts.Attempt, NumInputs: len(v.Inputs),
				},
			}
			// Input gate: channels by input, then by sender.
			if len(v.Inputs) > 0 {
				var gcs []dataplane.GateChannel
				for _, e := range v.Inputs {
					for _, row := range edgeChans[edgeKey{v.UID, e.Input}] {
						if c := row[s]; c != nil {
							gcs = append(gcs, dataplane.GateChannel{In: c.Input(), Input: e.Input})
						}
					}
				}
				t.gate = dataplane.NewInputGate(gcs)
			}
			// Record writers: one per output edge.
			for _, e := range g.Outputs(v.UID) {
				to := g.Vertex(e.To)
				row := edgeChans[edgeKey{e.To, e.Input}][s]
				var outs []dataplane.Output
				for _, c := range row {
					if c != nil {
						outs = append(outs, c.Output())
					}
				}
				p, _ := toDataplane(e.Partition)
				w, err := dataplane.NewRecordWriter(outs, p, dataplane.WriterOptions{
					BatchSize: j.opts.BatchSize, MaxParallelism: maxParallelism(to), Start: s,
				})
				if err != nil {
					return t.fail(phaseSetup, fmt.Errorf("output to %q: %w", e.To, err))
				}
				t.writers = append(t.writers, w)
			}
			if err := j.bindSpec(t, modules); err != nil {
				return t.fail(phaseSetup, err)
			}
			j.tasks = append(j.tasks, t)
		}
	}
	return nil
}

// bindSpec sets what t runs: a source, or an operator (wasm, native or sink).
func (j *job) bindSpec(t *task, modules map[string]*host.Module) error {
	v := t.v
	switch spec := v.Spec.(type) {
	case *jobfile.SourceSpec:
		if len(v.Inputs) > 0 {
			return fmt.Errorf("a source cannot have inputs")
		}
		switch spec.Type {
		case "generator":
			t.newSource = func() (connector.Source, error) {
				return connector.NewGenerator(spec, t.sub, v.Parallelism, nil)
			}
		case "file":
			t.newSource = func() (connector.Source, error) {
				return connector.NewFileSource(spec.Path, j.opts.Stdin, t.sub, v.Parallelism, nil)
			}
		default:
			return fmt.Errorf("unknown source type %q", spec.Type)
		}
		return nil
	case *jobfile.SinkSpec:
		var open func() (connector.Sink, error)
		switch spec.Type {
		case "file":
			open = func() (connector.Sink, error) { return connector.NewFileSink(spec.Path, t.sub, spec.Format) }
		case "stdout":
			open = func() (connector.Sink, error) { return connector.NewStdoutSink(j.opts.Stdout, &j.stdout), nil }
		case "discard":
			open = func() (connector.Sink, error) { return connector.DiscardSink{}, nil }
		default:
			return fmt.Errorf("unknown sink type %q", spec.Type)
		}
		t.op = &sinkOperator{open: open}
	case *jobfile.WasmSpec:
		t.op = &wasmOperator{mod: modules[spec.Path], cfg: host.InstanceConfig{
			Job: t.info.Job, Operator: v.UID, Subtask: t.sub, Parallelism: v.Parallelism,
			MaxParallelism: t.info.MaxParallelism, Attempt: t.info.Attempt, NumInputs: len(v.Inputs),
			Config: spec.Config, AllowClock: spec.AllowClock,
		}}
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
