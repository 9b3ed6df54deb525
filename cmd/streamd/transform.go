package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/streamd/streamd/internal/cluster"
	"github.com/streamd/streamd/internal/connector"
	"github.com/streamd/streamd/internal/jobfile"
)

// transformFlags are deploy's flags of a module deployed as a transform.
type transformFlags struct {
	input    string   // nats:SUBJECT or jetstream:STREAM[:FILTER]
	outputs  []string // nats:SUBJECT
	start    string
	interval time.Duration
}

// transformOnly are the flags that need --input.
var transformOnly = []string{"output", "start", "checkpoint-interval"}

// transformSpecs are --input and --output made into specs by the
// connector registry's schemes (connector.Scheme).
type transformSpecs struct {
	input   *jobfile.SourceSpec
	inputS  *connector.Scheme
	outputs []*jobfile.SinkSpec
	outputS []*connector.Scheme
}

// checkTransform checks the transform's flags before anything connects.
func (c *cli) checkTransform(cmd *cobra.Command, f runFlags, t transformFlags) (transformSpecs, error) {
	var ts transformSpecs
	fl := cmd.Flags()
	if t.input == "" {
		for _, name := range transformOnly {
			if fl.Changed(name) {
				return ts, usagef("--%s applies only to a transform: deploy MODULE.wasm --input nats:SUBJECT", name)
			}
		}
		return ts, nil
	}
	if fl.Changed("source") {
		return ts, usagef("--input and --source are two sources; give one")
	}
	if len(t.outputs) > 0 && fl.Changed("sink") {
		return ts, usagef("--output and --sink are two kinds of output; give transform outputs or one --sink")
	}
	if f.from != "" && fl.Changed("start") {
		return ts, usagef("--start applies to a first start; --from resumes where the savepoint's sources stopped")
	}
	if t.interval <= 0 {
		return ts, usagef("--checkpoint-interval must be positive, got %v", t.interval)
	}
	kind, arg, _ := strings.Cut(t.input, ":")
	sch, ok := connector.InputScheme(kind)
	if !ok {
		return ts, usagef("--input %q: want %s", t.input, orList(connector.InputUsages()))
	}
	env := connector.SchemeEnv{Start: t.start, Settings: c.connectorSettings()}
	src, err := sch.Input(arg, env)
	if err != nil {
		return ts, usageError{err}
	}
	ts.input, ts.inputS = src, sch
	for _, o := range t.outputs {
		kind, arg, _ := strings.Cut(o, ":")
		sch, ok := connector.OutputScheme(kind)
		if !ok {
			return ts, usagef("--output %q: want %s", o, orList(connector.OutputUsages()))
		}
		sink, err := sch.Output(arg, env)
		if err != nil {
			return ts, usageError{err}
		}
		if _, err := connector.TransformOutput(src, sink); err != nil {
			return ts, usageError{err}
		}
		ts.outputs, ts.outputS = append(ts.outputs, sink), append(ts.outputS, sch)
	}
	return ts, nil
}

// orList is "a, b or c".
func orList(xs []string) string {
	if len(xs) < 2 {
		return strings.Join(xs, "")
	}
	return strings.Join(xs[:len(xs)-1], ", ") + " or " + xs[len(xs)-1]
}

// transformJob readies what the transform's input and outputs need (their
// schemes' Prepare: find or create streams, checked for all of them before
// anything is created, so a refused deploy leaves nothing behind), says
// what on stderr, and builds its job: the source, the module, a sink per
// output (else the --sink), checkpointed into the JetStream object store.
func (c *cli) transformJob(ctx context.Context, cl *cluster.Client, module string, f runFlags, t transformFlags, ts transformSpecs) (*jobfile.Job, error) {
	var notes []string
	for _, create := range []bool{false, true} {
		env := connector.DeployEnv{NATS: cl.Conn(), Input: ts.input}
		prepare := func(s *connector.Scheme) error {
			if s.Prepare == nil {
				return nil
			}
			note, err := s.Prepare(ctx, env, create)
			var fe *connector.FlagError
			if errors.As(err, &fe) {
				return usagef("%s %s", fe.Flag, fe.Message)
			}
			if err != nil {
				return err
			}
			if note != "" {
				notes = append(notes, note)
			}
			return nil
		}
		if err := prepare(ts.inputS); err != nil {
			return nil, err
		}
		for i, sink := range ts.outputs {
			env.Output = sink
			if err := prepare(ts.outputS[i]); err != nil {
				return nil, err
			}
		}
	}
	for _, n := range notes {
		fmt.Fprintln(c.stderr, n)
	}
	lo, err := c.loadOptions(0)
	if err != nil {
		return nil, err
	}
	ck := jobfile.NewCheckpointSettings(t.interval, "")
	ck.Storage = jobfile.StorageJetStream
	if lo.CheckpointMode != "" {
		ck.Mode = lo.CheckpointMode
	}
	ck.AlignedTimeout = lo.AlignedTimeout
	filter, err := c.moduleFilter(module, f)
	if err != nil {
		return nil, err
	}
	filter.Source, filter.Input, filter.Outputs = "", ts.input, ts.outputs
	if len(ts.outputs) > 0 {
		filter.Sink = ""
	}
	filter.Checkpoint, filter.Restart = ck, lo.Restart
	return jobfile.FilterJob(filter)
}
