package main

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/streamd/streamd/internal/cluster/client"
	"github.com/streamd/streamd/internal/connector"
	"github.com/streamd/streamd/internal/jobfile"
)

// transformFlags are deploy's flags of a module deployed as a transform.
type transformFlags struct {
	input    string   // nats:SUBJECT or jetstream:STREAM[:FILTER]
	outputs  []string // nats:SUBJECT
	start    string
	interval time.Duration
	onError  string // skip | dead_letter[:SUBJECT]; "" or fail: fail
}

// deadLetterScheme is the output scheme of a transform's dead letters.
const deadLetterScheme = "nats"

// parseOnError reads deploy's --on-error for a module named name: nil for
// fail; a dead letter subject (a nats sink) only for a transform, by
// default dead_letter.NAME.
func parseOnError(v, name string, transform bool) (*jobfile.OnError, error) {
	mode, subj, hasSubj := strings.Cut(v, ":")
	switch mode {
	case "", jobfile.OnErrorFail:
		if hasSubj {
			return nil, usagef("--on-error %q: fail takes no subject", v)
		}
		return nil, nil
	case jobfile.OnErrorSkip:
		if hasSubj {
			return nil, usagef("--on-error %q: skip takes no subject (dead_letter:SUBJECT sends the failing records there)", v)
		}
		return &jobfile.OnError{Mode: jobfile.OnErrorSkip}, nil
	case jobfile.OnErrorDeadLetter:
		if !transform {
			return nil, usagef("--on-error dead_letter: dead letters go to a NATS subject, so only a transform (--input) has them; use skip, or a job file's dead_letter sink")
		}
		if !hasSubj {
			subj = "dead_letter." + notSubjectToken.ReplaceAllString(name, "_")
		} else if subj == "" {
			return nil, usagef("--on-error %q: no subject after dead_letter:", v)
		}
		sch, ok := connector.OutputScheme(deadLetterScheme)
		if !ok {
			return nil, fmt.Errorf("--on-error: no %s output scheme registered", deadLetterScheme)
		}
		dl, err := sch.Output(subj, connector.SchemeEnv{}) // the nats scheme reads no settings
		if err != nil {
			return nil, usagef("--on-error: %v", err)
		}
		return &jobfile.OnError{Mode: jobfile.OnErrorDeadLetter, DeadLetter: dl}, nil
	}
	return nil, usagef("--on-error %q: want fail, skip or dead_letter[:SUBJECT]", v)
}

var notSubjectToken = regexp.MustCompile(`[^A-Za-z0-9_-]+`)

// checkOnError checks --on-error before anything connects: its form, and
// that a transform's dead letters go to a subject of their own.
func checkOnError(v, module string, f runFlags, transform bool, ts transformSpecs) error {
	oe, err := parseOnError(v, filterName(jobfile.Filter{Module: module, Name: f.name}), transform)
	if err != nil || oe == nil || oe.DeadLetter == nil {
		return err
	}
	subj := oe.DeadLetter.Subject
	for _, o := range ts.outputs {
		if o.Subject == subj {
			return usagef("--on-error dead_letter:%s is also an --output: give the dead letters a subject of their own", subj)
		}
	}
	if _, err := connector.TransformOutput(ts.input, oe.DeadLetter); err != nil {
		return usagef("--on-error dead_letter:%s: %v", subj, err)
	}
	return nil
}

// filterName is the name of the job of f: its --name, else the module's
// file name.
func filterName(f jobfile.Filter) string {
	if f.Name != "" {
		return f.Name
	}
	return strings.TrimSuffix(filepath.Base(f.Module), filepath.Ext(f.Module))
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
func (c *cli) transformJob(ctx context.Context, cl *client.Client, module string, f runFlags, t transformFlags, ts transformSpecs) (*jobfile.Job, error) {
	filter, err := c.moduleFilter(module, f)
	if err != nil {
		return nil, err
	}
	oe, err := parseOnError(t.onError, filterName(filter), true)
	if err != nil {
		return nil, err
	}
	dlScheme, _ := connector.OutputScheme(deadLetterScheme)
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
		if oe != nil && oe.DeadLetter != nil {
			// The dead letters' stream, found or made as an output's,
			// noted as theirs.
			env.Output = oe.DeadLetter
			n := len(notes)
			if err := prepare(dlScheme); err != nil {
				return nil, err
			}
			for i := n; i < len(notes); i++ {
				notes[i] = "dead letters " + strings.TrimPrefix(notes[i], "output ")
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
	filter.Source, filter.Input, filter.Outputs, filter.OnError = "", ts.input, ts.outputs, oe
	if len(ts.outputs) > 0 {
		filter.Sink = ""
	}
	filter.Checkpoint, filter.Restart = ck, lo.Restart
	return jobfile.FilterJob(filter)
}
