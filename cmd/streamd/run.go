package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/host"
	"github.com/streamd/streamd/internal/checkpoint"
	"github.com/streamd/streamd/internal/connector"
	"github.com/streamd/streamd/internal/jobfile"
	"github.com/streamd/streamd/internal/runtime"
	"github.com/streamd/streamd/internal/webapi"
)

type runFlags struct {
	source, sink string
	parallelism  int
	config       []string
	allowClock   bool
	from         string
	drain        bool
	name         string // deploy: the job's name
	asJSON       bool   // run: print the result as JSON on stdout
}

func (c *cli) runCommand() *cobra.Command {
	var f runFlags
	cmd := &cobra.Command{
		Use:   "run JOB.yaml | MODULE.wasm",
		Short: "Run a job file, or one wasm module as a filter, in this process until it finishes",
		Long: `Run a job in this process until it finishes.

With a job file (docs/job-file.md) the whole job runs; the file is checked first
and nothing starts if it is invalid. With a .wasm module, that one operator runs
between a source (default: standard input, one record per line) and a sink
(default: standard output), like a Unix filter.

Progress (records in and out per operator, rate) is redrawn every second on a
terminal and logged every 5s otherwise; a summary and where the output went follow
at the end. Exit status: 0 when the job finished, 1 when it failed or is invalid,
2 on a usage error, 130 when interrupted (Ctrl-C stops the job cleanly).

A job file with a checkpoint section checkpoints (docs/checkpoints.md): a failed
subtask restarts the job from the latest completed checkpoint, the file sink's
output is exactly-once, and Ctrl-C (SIGINT or SIGTERM) stops the job with a
savepoint and prints its path; resume with --from PATH (not after --drain: the
input ended). When no savepoint can be taken (the job is restarting) or the
stop fails, Ctrl-C cancels the job instead and says so. --from also takes a
checkpoint directory (its newest completed checkpoint or savepoint, by id), at any parallelism.`,
		Example: `  streamd run examples/wasm/wordcount/wordcount.yaml
  streamd run --parallelism 4 job.yaml
  streamd run job.yaml --from checkpoints/
  streamd run job.yaml --from checkpoints/savepoint-7-1a2b3c --parallelism 3
  streamd run upper.wasm < in.txt > out.txt
  streamd run filter.wasm --source file:in.txt --sink file:out/ --config min_length=3`,
		Args:              exactArgs(1),
		ValidArgsFunction: completeJobFile,
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.run(cmd.Context(), cmd, args[0], f)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.source, "source", "stdin", "module only: where records come from: stdin, file:PATH or generator:COUNT")
	fl.StringVar(&f.sink, "sink", "stdout", "module only: where records go: stdout, file:DIR or discard")
	fl.IntVarP(&f.parallelism, "parallelism", "p", 0, "job: replace the default parallelism (operators that set their own keep it); module: the operator's parallelism")
	fl.StringArrayVar(&f.config, "config", nil, "module only: operator config entry KEY=VALUE (repeatable)")
	fl.BoolVar(&f.allowClock, "allow-clock", false, "module only: give the guest the real wall clock")
	fl.StringVar(&f.from, "from", "", "job: restore from a checkpoint, a savepoint, or a checkpoint directory (its newest completed checkpoint or savepoint)")
	fl.BoolVar(&f.asJSON, "json", false, `print the result on stdout when the job ends: {"job", "state", "elapsed", "restarts", "checkpoints", "last_checkpoint", "savepoint", "error", "operators"} (not with a stdout sink)`)
	fl.BoolVar(&f.drain, "drain", false, "job: on Ctrl-C (SIGINT, SIGTERM) stop with a savepoint after draining (end_input and finish run; timers fire)")
	fl.String("progress", progressAuto, "progress display: auto, table, log or off ("+keyProgress+")")
	fl.Int("batch-size", 1024, "records per batch on channels and into wasm ("+keyBatchSize+")")
	fl.Int("channel-capacity", 16, "batches queued per channel ("+keyChannelCapacity+")")
	bufferTimeoutFlag(fl)
	settings := c.connectorFlags(cmd)
	cmd.PreRunE = func(cmd *cobra.Command, _ []string) error {
		for _, b := range settings {
			c.bind(cmd.Flags(), b.key, b.flag)
		}
		return nil
	}
	c.bind(fl, keyProgress, "progress")
	c.bind(fl, keyBatchSize, "batch-size")
	c.bind(fl, keyChannelCapacity, "channel-capacity")
	c.bind(fl, keyBufferTimeout, "buffer-timeout")
	c.bind(fl, keyRunHTTP, httpFlag(cmd, keyRunHTTP, defaultHTTP).flag)
	dirFlags(cmd, "from")
	return cmd
}

// isModule tells a wasm module from a job file: by extension, else by the wasm magic number.
func isModule(path string) bool {
	if strings.EqualFold(filepath.Ext(path), ".wasm") {
		return true
	}
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	var magic [4]byte
	n, _ := f.Read(magic[:])
	return n == 4 && magic == [4]byte{0, 'a', 's', 'm'}
}

// runResult is what run --json prints when the job ends.
type runResult struct {
	Job            string           `json:"job"`
	State          string           `json:"state"` // finished, stopped, canceled or failed
	Elapsed        string           `json:"elapsed"`
	Restarts       int              `json:"restarts"`
	Checkpoints    int              `json:"checkpoints"`
	LastCheckpoint string           `json:"last_checkpoint,omitempty"`
	Savepoint      string           `json:"savepoint,omitempty"`
	Error          string           `json:"error,omitempty"`
	Operators      []runOperatorRes `json:"operators"`
}

type runOperatorRes struct {
	UID        string `json:"uid"`
	RecordsIn  int64  `json:"records_in"`
	RecordsOut int64  `json:"records_out"`
}

func (c *cli) run(ctx context.Context, cmd *cobra.Command, target string, f runFlags) (retErr error) {
	filter := isModule(target)
	var job *jobfile.Job
	var err error
	if filter {
		cfg := map[string]string{}
		for _, kv := range f.config {
			k, v, ok := strings.Cut(kv, "=")
			if !ok || k == "" {
				return usagef("--config %q: want KEY=VALUE", kv)
			}
			cfg[k] = v
		}
		var mrb int
		if mrb, err = c.maxRecordBytes(); err == nil {
			job, err = jobfile.FilterJob(jobfile.Filter{Module: target, Source: f.source, Sink: f.sink,
				Parallelism: f.parallelism, Config: cfg, AllowClock: f.allowClock, MaxRecordBytes: mrb})
		}
		for _, name := range []string{"from", "drain"} {
			if cmd.Flags().Changed(name) {
				return usagef("--%s applies only to a job file", name)
			}
		}
	} else {
		for _, name := range []string{"source", "sink", "config", "allow-clock"} {
			if cmd.Flags().Changed(name) {
				return usagef("--%s applies only when running a .wasm module; %s is a job file (set it in the file)", name, target)
			}
		}
		var lo jobfile.Options
		if lo, err = c.loadOptions(f.parallelism); err == nil {
			job, err = jobfile.LoadJob(target, lo)
		}
	}
	if err != nil {
		return err
	}
	if f.asJSON {
		for _, v := range job.Graph.Vertices {
			if s, ok := v.Spec.(*jobfile.SinkSpec); ok && s.Type == "stdout" {
				return usagef("--json prints the result on standard output, where the sink %q writes: give it another sink (--sink file:DIR or discard for a module)", v.UID)
			}
		}
	}

	mode := c.v.GetString(keyProgress)
	switch mode {
	case progressAuto:
		switch {
		case isTerminal(c.stderr):
			mode = progressTable
		case filter:
			mode = progressOff // a filter in a pipeline stays quiet
		default:
			mode = progressLog
		}
	case progressTable, progressLog, progressOff:
	default:
		return usagef("%s: %q is not a progress mode (want auto, table, log or off)", keyProgress, mode)
	}
	batch, err := c.positiveInt(keyBatchSize)
	if err != nil {
		return err
	}
	chanCap, err := c.positiveInt(keyChannelCapacity)
	if err != nil {
		return err
	}
	bufTimeout, err := c.bufferTimeout()
	if err != nil {
		return err
	}
	engOpts, err := c.engineOptions()
	if err != nil {
		return err
	}
	stopTelemetry, err := c.startTelemetry(ctx, "streamd-run")
	if err != nil {
		return err
	}
	defer stopTelemetry()
	eng, err := host.NewEngine(ctx, engOpts...)
	if err != nil {
		return err
	}
	defer eng.Close(context.WithoutCancel(ctx))

	g := job.Graph
	log := c.log.With("job", g.Name)
	startLevel := log.Info
	if filter {
		startLevel = log.Debug
	}
	startLevel("job starting", "operators", len(g.Vertices), "file", job.Path)
	opts := runtime.Options{
		Engine:          eng,
		Logger:          log,
		BatchSize:       batch,
		ChannelCapacity: chanCap,
		BufferTimeout:   bufTimeout,
		MaxRecordBytes:  job.MaxRecordBytes,
		State:           job.State,
		DataDir:         c.v.GetString(keyRunDataDir),
		Stdout:          c.stdout,
		Stdin:           c.stdin,
		Restart:         job.Restart,

		ConnectorSettings: c.connectorSettings(),
	}
	if usesNATS(g) {
		c.clusterDefaults()
		if opts.NATS, err = c.natsOptions("streamd run " + g.Name); err != nil {
			return err
		}
	}
	if f.from != "" {
		md, reader, closeFrom, err := c.resolveCheckpoint(ctx, f.from, "streamd run "+g.Name)
		if err != nil {
			return err
		}
		if newer, err := checkpoint.NewerThanIn(ctx, reader, md); err != nil {
			log.Warn("cannot tell whether a checkpoint or savepoint newer than the one restored exists", "from", md.Location, "err", err)
		} else if newer != nil {
			log.Warn(fmt.Sprintf("restoring %s %d, but %s %d beside it is newer: the output committed after %s %d will be written again",
				md.Kind, md.ID, newer.Kind, newer.ID, md.Kind, md.ID), "from", md.Location, "newer", newer.Location)
		}
		rs, err := checkpoint.LoadRestoreFrom(ctx, reader, md, g)
		closeFrom()
		if err != nil {
			return err
		}
		opts.Restore = rs
		log.Info("restoring", "from", rs.Metadata.Location, "kind", rs.Metadata.Kind, "id", rs.Metadata.ID)
	}
	// With checkpointing, Ctrl-C stops the job with a savepoint: the job runs
	// on a context that the signal does not cancel.
	runCtx := ctx
	api := webapi.LocalJob{Graph: g}
	var stopped <-chan struct{}
	if cs := job.Checkpoint; cs != nil {
		store, closeStore, err := c.openRunStore(ctx, cs, g.Name, log)
		if err != nil {
			return err
		}
		defer closeStore()
		opts.Checkpoint = runtime.NewCheckpointOptions(cs, store)
		stop := make(chan runtime.StopRequest, 1)
		opts.Stop = stop
		sp := make(chan runtime.SavepointRequest)
		opts.Savepoint = sp
		api.Stop, api.Savepoint, api.CheckpointMode = stop, sp, cs.ModeString()
		runCtx = context.WithoutCancel(ctx)
		done := make(chan struct{})
		defer close(done)
		stopped = ctx.Done()
		go c.stopOnSignal(ctx, done, stop, f.drain)
	}
	// The REST API's cancel cancels runCtx only.
	runCtx, api.Cancel = context.WithCancel(runCtx)
	defer api.Cancel()
	local := webapi.NewLocal(api)
	stopAPI, err := c.startAPI(keyRunHTTP, "run", local, startLevel, "#/jobs/"+local.ID())
	if err != nil {
		return err
	}
	defer stopAPI()
	prog := newProgress(mode, c.stderr, log)
	opts.Progress = func(s runtime.Stats) { prog.update(s); local.Update(s) }
	start := time.Now()
	var stats runtime.Stats
	endState := ""
	finish := func(state string) { prog.finish(stats, state); endState = state }
	if f.asJSON {
		defer func() {
			res := runResult{Job: g.Name, State: endState, Elapsed: stats.Elapsed.Round(time.Millisecond).String(), Restarts: stats.Restarts,
				Checkpoints: stats.Checkpoints, LastCheckpoint: stats.LastCheckpoint, Savepoint: stats.Savepoint, Operators: []runOperatorRes{}}
			if retErr != nil && !errors.Is(retErr, errStopped) {
				res.Error = retErr.Error()
			}
			for _, o := range stats.Operators {
				res.Operators = append(res.Operators, runOperatorRes{UID: o.UID, RecordsIn: o.RecordsIn, RecordsOut: o.RecordsOut})
			}
			if jerr := c.printJSON(res); jerr != nil && retErr == nil {
				retErr = jerr
			}
		}()
	}
	stats, err = runtime.Run(runCtx, g, opts)
	endLocal(local, stats, err, runCtx.Err() != nil)
	if stats.Savepoint != "" {
		finish("stopped")
		if f.drain {
			// The input ended and every operator finished: nothing is left to resume.
			fmt.Fprintf(c.stderr, "drained and stopped with savepoint %s\n", stats.Savepoint)
		} else {
			fmt.Fprintf(c.stderr, "stopped with savepoint %s\nresume with: streamd run %s --from %s\n", stats.Savepoint, target, stats.Savepoint)
		}
		if err == nil && stopped != nil && ctx.Err() != nil {
			return errStopped
		}
		return err
	}
	if stats.Elapsed == 0 {
		stats.Elapsed = time.Since(start)
	}
	switch {
	case err == nil:
		finish("finished")
		startLevel("job finished", "elapsed", stats.Elapsed.Round(time.Millisecond))
		if !filter || mode == progressTable {
			c.printOutputs(job)
		}
		return nil
	case ctx.Err() != nil && errors.Is(err, ctx.Err()):
		finish("canceled")
		if stopped != nil && err != ctx.Err() {
			// The stop could not take a savepoint: say why it canceled.
			fmt.Fprintf(c.stderr, "streamd: %v\n", err)
			return errStopped
		}
		return ctx.Err()
	case runCtx.Err() != nil && errors.Is(err, context.Canceled):
		finish("canceled")
		return fmt.Errorf("the job was canceled through the REST API: %w", context.Canceled)
	default:
		finish("failed")
		return err
	}
}

// errStopped is returned when Ctrl-C stopped the job with a savepoint, or
// canceled it when none could be taken: the exit status is exitCanceled,
// and the savepoint or the cancel was already reported.
var errStopped = errors.New("stopped by a signal")

// stopOnSignal stops the job with a savepoint when ctx is canceled (Ctrl-C,
// SIGTERM); a second signal kills the process (main restores the default
// handlers). The stop must end the job: when no savepoint can be taken (the
// job restarts) or the stop fails, the job is canceled instead, and run
// says which.
func (c *cli) stopOnSignal(ctx context.Context, done <-chan struct{}, stop chan<- runtime.StopRequest, drain bool) {
	select {
	case <-ctx.Done():
	case <-done:
		return
	}
	failed := make(chan error, 1)
	fmt.Fprintf(c.stderr, "stopping with a savepoint (drain=%t), or canceling if none can be taken; press Ctrl-C again to kill\n", drain)
	stop <- runtime.StopRequest{Drain: drain, Failed: failed, Terminate: true}
	select {
	case err := <-failed:
		fmt.Fprintf(c.stderr, "streamd: %v\n", err)
	case <-done:
	}
}

// usesNATS reports whether a nats source or sink of g connects with the
// nats.* settings.
func usesNATS(g *control.JobGraph) bool {
	for _, v := range g.Vertices {
		if connector.UsesNATS(v.Spec) {
			return true
		}
		if w, ok := v.Spec.(*jobfile.WasmSpec); ok && w.OnError != nil && w.OnError.DeadLetter != nil && connector.UsesNATS(w.OnError.DeadLetter) {
			return true
		}
	}
	return false
}

// printOutputs says where the job's sinks wrote, on stderr (stdout may be data).
func (c *cli) printOutputs(job *jobfile.Job) {
	for _, v := range job.Graph.Vertices {
		what := "output"
		s, ok := v.Spec.(*jobfile.SinkSpec)
		if w, isWasm := v.Spec.(*jobfile.WasmSpec); isWasm && w.OnError != nil && w.OnError.DeadLetter != nil {
			what, s, ok = "dead letters", w.OnError.DeadLetter, true
		}
		if !ok {
			continue
		}
		switch s.Type {
		case "file":
			parts, _ := filepath.Glob(filepath.Join(s.Path, "part-*"))
			sort.Strings(parts)
			fmt.Fprintf(c.stderr, "%s of %q: %s%c (%d part files)\n", what, v.UID, s.Path, filepath.Separator, len(parts))
		case "stdout":
			fmt.Fprintf(c.stderr, "%s of %q: standard output\n", what, v.UID)
		case "nats":
			fmt.Fprintf(c.stderr, "%s of %q: NATS subject %s\n", what, v.UID, s.Subject)
		case "discard":
		default:
			fmt.Fprintf(c.stderr, "%s of %q: %s\n", what, v.UID, connector.DescribeSink(s))
		}
	}
}
