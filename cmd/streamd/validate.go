package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/host"
	"github.com/streamd/streamd/internal/checkpoint"
	"github.com/streamd/streamd/internal/connector"
	"github.com/streamd/streamd/internal/jobfile"
)

func (c *cli) validateCommand() *cobra.Command {
	var parallelism int
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "validate JOB.yaml | MODULE.wasm",
		Short: "Check a job file and its modules (or one module) without running anything, and print the job graph",
		Long: `Check a job file and its modules without running anything, and print the job graph.

Every problem in the file is reported, one per line, with the operator, line and
field. Each wasm module is also compiled and checked for the exports and ABI
version streamd needs. Given a .wasm module, validate checks that module the same
way and prints its ABI version, the functions it exports and those it imports.
Exit status 0 when the job or module is valid, 1 when it is not.`,
		Example: `  streamd validate examples/wasm/wordcount/wordcount.yaml
  streamd validate upper.wasm`,
		Args:              exactArgs(1),
		ValidArgsFunction: completeJobFile,
		RunE: func(cmd *cobra.Command, args []string) error {
			if isModule(args[0]) {
				if cmd.Flags().Changed("parallelism") {
					return usagef("--parallelism applies only to a job file")
				}
				return c.validateModule(cmd.Context(), args[0])
			}
			if asJSON && isModule(args[0]) {
				return usagef("--json applies only to a job file")
			}
			lo, err := c.loadOptions(parallelism)
			if err != nil {
				return err
			}
			job, err := jobfile.LoadJob(args[0], lo)
			if err == nil {
				err = c.checkModules(cmd.Context(), job)
			}
			if asJSON {
				if jerr := c.printJSON(validation(job, err)); jerr != nil {
					return jerr
				}
			}
			if err != nil {
				return err
			}
			if !asJSON {
				printGraph(c.stdout, job)
			}
			return nil
		},
	}
	cmd.Flags().IntVarP(&parallelism, "parallelism", "p", 0, "replace the job's default parallelism, as run would")
	cmd.Flags().BoolVar(&asJSON, "json", false, `print {"valid", "problems"} or, when valid, {"valid", "job", "operators", "checkpoint", "restart", "state", "autoscaler"} (the exit status as without it)`)
	return cmd
}

// validateModule loads one module with the host, which checks its exports,
// imports and ABI version, and prints what it exports and imports.
func (c *cli) validateModule(ctx context.Context, path string) error {
	eng, err := c.newEngine(ctx)
	if err != nil {
		return err
	}
	defer eng.Close(context.WithoutCancel(ctx))
	m, err := eng.LoadFile(ctx, path)
	if err != nil {
		return err
	}
	defer m.Close(ctx)
	w := c.stdout
	fmt.Fprintf(w, "module %s: valid, abi v%d\n", path, abi.Version)
	fmt.Fprintf(w, "exports: %s\n", strings.Join(m.Exports(), " "))
	var mods []string
	byModule := map[string][]string{}
	for _, imp := range m.Imports() {
		mod, fn, _ := strings.Cut(imp, ".")
		if byModule[mod] == nil {
			mods = append(mods, mod)
		}
		byModule[mod] = append(byModule[mod], fn)
	}
	if len(mods) == 0 {
		fmt.Fprintln(w, "imports: none")
	}
	for _, mod := range mods {
		fmt.Fprintf(w, "imports %s: %s\n", mod, strings.Join(byModule[mod], " "))
	}
	return nil
}

// newEngine is a host engine with the wasm.* settings.
func (c *cli) newEngine(ctx context.Context) (*host.Engine, error) {
	opts, err := c.engineOptions()
	if err != nil {
		return nil, err
	}
	return host.NewEngine(ctx, opts...)
}

// checkModules compiles every wasm module of job and checks its exports.
func (c *cli) checkModules(ctx context.Context, job *jobfile.Job) error {
	var mods []namedModule
	for _, v := range job.Graph.Vertices {
		if ws, ok := v.Spec.(*jobfile.WasmSpec); ok {
			mods = append(mods, namedModule{what: fmt.Sprintf("operator %q", v.UID), path: ws.Path})
		}
	}
	return c.loadModules(ctx, mods...)
}

// namedModule is a module file and what it is, for errors.
type namedModule struct{ what, path string }

// loadModules compiles each module and checks its exports, imports and ABI
// version; an error names the module's what.
func (c *cli) loadModules(ctx context.Context, mods ...namedModule) error {
	eng, err := c.newEngine(ctx)
	if err != nil {
		return err
	}
	defer eng.Close(context.WithoutCancel(ctx))
	for _, nm := range mods {
		m, err := eng.LoadFile(ctx, nm.path)
		if err != nil {
			return fmt.Errorf("%s: %w", nm.what, err)
		}
		_ = m.Close(ctx)
	}
	return nil
}

// validationJ is what validate --json prints.
type validationJ struct {
	Valid      bool            `json:"valid"`
	Problems   []problemJ      `json:"problems,omitempty"`
	Job        string          `json:"job,omitempty"`
	Path       string          `json:"path,omitempty"`
	Operators  []operatorJ     `json:"operators,omitempty"`
	Checkpoint *checkpointJ    `json:"checkpoint,omitempty"`
	Restart    string          `json:"restart,omitempty"`
	State      *stateSettingsJ `json:"state,omitempty"`
	// Autoscaler is the autoscaler section as its settings (docs/job-file.md
	// "Autoscaling"); nil without one.
	Autoscaler *jobfile.AutoscalerSettings `json:"autoscaler,omitempty"`
}

type problemJ struct {
	Operator string `json:"operator,omitempty"`
	Line     int    `json:"line,omitempty"`
	Field    string `json:"field,omitempty"`
	Message  string `json:"message"`
}

type operatorJ struct {
	UID            string   `json:"uid"`
	Parallelism    int      `json:"parallelism"`
	MinParallelism int      `json:"min_parallelism"`
	MaxParallelism int      `json:"max_parallelism"`
	Inputs         []inputJ `json:"inputs,omitempty"`
	Runs           string   `json:"runs"`
}

type inputJ struct {
	From      string `json:"from"`
	Output    string `json:"output,omitempty"`
	Partition string `json:"partition"`
}

type checkpointJ struct {
	Interval string `json:"interval"`
	Into     string `json:"into"`
	Retain   int    `json:"retain"`
	Timeout  string `json:"timeout"`
	Mode     string `json:"mode"`
}

type stateSettingsJ struct {
	Backend     string `json:"backend"`
	CacheMiB    int    `json:"cache_mib,omitempty"`
	Incremental bool   `json:"incremental,omitempty"`
}

// validation is validate's verdict on job (nil when it did not load) with
// err, for --json: every problem of an invalid job file, else the graph.
func validation(job *jobfile.Job, err error) validationJ {
	if err != nil {
		v := validationJ{}
		var je *jobfile.Error
		if errors.As(err, &je) {
			for _, p := range je.Problems {
				v.Problems = append(v.Problems, problemJ{Operator: p.Operator, Line: p.Line, Field: p.Field, Message: p.Message})
			}
		} else {
			v.Problems = []problemJ{{Message: err.Error()}}
		}
		return v
	}
	v := validationJ{Valid: true, Job: job.Graph.Name, Path: job.Path, Restart: job.Restart.String(),
		State: &stateSettingsJ{Backend: job.State.Backend}, Autoscaler: job.Autoscaler}
	if v.State.Backend == "" {
		v.State.Backend = jobfile.StateMemory
	}
	if v.State.Backend == jobfile.StatePebble {
		v.State.CacheMiB, v.State.Incremental = job.State.CacheMiB, job.State.Incremental
	}
	for _, vx := range job.Graph.Vertices {
		o := operatorJ{UID: vx.UID, Parallelism: vx.Parallelism, MinParallelism: max(vx.MinParallelism, 1), MaxParallelism: vx.MaxParallelism, Runs: describeSpec(vx.Spec)}
		for _, e := range vx.Inputs {
			o.Inputs = append(o.Inputs, inputJ{From: e.From, Output: e.Output, Partition: fmt.Sprint(e.Partition)})
		}
		v.Operators = append(v.Operators, o)
	}
	if cp := job.Checkpoint; cp != nil {
		v.Checkpoint = &checkpointJ{Interval: cp.Interval.String(), Into: checkpointWhere(cp, job.Graph.Name), Retain: cp.Retain,
			Timeout: cp.Timeout.String(), Mode: cp.ModeString()}
	}
	return v
}

// printGraph writes the job's operators in topological order.
func printGraph(w io.Writer, job *jobfile.Job) {
	g := job.Graph
	fmt.Fprintf(w, "job %q: %d operators", g.Name, len(g.Vertices))
	if job.Path != "" {
		fmt.Fprintf(w, " (%s)", job.Path)
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "  OPERATOR\tPARALLELISM\tINPUTS\tRUNS")
	for _, v := range g.Vertices {
		var ins []string
		for _, e := range v.Inputs {
			from := e.From
			if e.Output != "" {
				from += "." + e.Output
			}
			ins = append(ins, fmt.Sprintf("%s(%s)", from, e.Partition))
		}
		in := strings.Join(ins, " ")
		if in == "" {
			in = "-"
		}
		par := fmt.Sprint(v.Parallelism)
		if v.MinParallelism > 1 {
			par += fmt.Sprintf(" (min %d)", v.MinParallelism)
		}
		if v.MaxParallelism != 128 {
			par += fmt.Sprintf(" (max %d)", v.MaxParallelism)
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", v.UID, par, in, describeSpec(v.Spec))
	}
	tw.Flush()
	if cp := job.Checkpoint; cp != nil {
		fmt.Fprintf(w, "checkpoint: every %v into %s (retain %d, timeout %v, %s)\n", cp.Interval, checkpointWhere(cp, job.Graph.Name), cp.Retain, cp.Timeout, cp.ModeString())
		if cp.Storage == jobfile.StorageJetStream {
			fmt.Fprintln(w, "  (the JetStream object store of the NATS server; a deployed job's checkpoints go under its job id)")
		}
	} else {
		fmt.Fprintln(w, "checkpoint: none")
	}
	fmt.Fprintf(w, "restart: %s\n", job.Restart)
	if a := job.Autoscaler; a != nil {
		fmt.Fprintf(w, "autoscaler: %s\n", a)
	}
	if n := job.MaxRecordBytes; n != 0 && n != abi.DefaultMaxRecordBytes {
		fmt.Fprintf(w, "max_record_bytes: %d\n", n)
	}
	if st := job.State; st.Backend == jobfile.StatePebble {
		kind := "incremental"
		if !st.Incremental {
			kind = "full"
		}
		fmt.Fprintf(w, "state: %s (block cache %d MiB, %s checkpoints)\n", st.Backend, st.CacheMiB, kind)
	}
}

func describeSpec(spec any) string {
	if d := connector.Describe(spec); d != "" {
		return d
	}
	switch s := spec.(type) {
	case *jobfile.WasmSpec:
		d := "wasm " + s.Path
		keys := make([]string, 0, len(s.Config))
		for k := range s.Config {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			d += fmt.Sprintf(" %s=%s", k, s.Config[k])
		}
		if s.AllowClock {
			d += " allow_clock"
		}
		if oe := s.OnError; oe != nil {
			d += " on_error=" + oe.Mode
			if oe.DeadLetter != nil {
				d += " (" + describeSpec(oe.DeadLetter) + ")"
			}
			if oe.Max.Count > 0 {
				d += " max_dead_letters=" + oe.Max.String()
			}
		}
		return d
	}
	return fmt.Sprintf("%T", spec)
}

// checkpointWhere says where streamd run keeps a job's checkpoints: its
// directory, or the JetStream object store under the job's name (a cluster
// keeps them under the job's id).
func checkpointWhere(cp *jobfile.CheckpointSettings, name string) string {
	if cp.Storage != jobfile.StorageJetStream {
		return cp.Dir
	}
	bucket := cp.Bucket
	if bucket == "" {
		bucket = checkpoint.DefaultBucket
	}
	return fmt.Sprintf("%s%s/%s/", checkpoint.JetStreamScheme, bucket, name)
}
