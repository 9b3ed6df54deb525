package main

import (
	"context"
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
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
	onError  string // skip | dead_letter[:SUBJECT]; "" or fail: fail
}

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
		if err := jobfile.CheckSubject(subj, false); err != nil {
			return nil, usagef("--on-error: %v", err)
		}
		return &jobfile.OnError{Mode: jobfile.OnErrorDeadLetter, DeadLetter: &jobfile.SinkSpec{Type: "nats", Subject: subj}}, nil
	}
	return nil, usagef("--on-error %q: want fail, skip or dead_letter[:SUBJECT]", v)
}

var notSubjectToken = regexp.MustCompile(`[^A-Za-z0-9_-]+`)

// checkOnError checks --on-error before anything connects: its form, and
// that a transform's dead letters go to a subject of their own.
func checkOnError(v, module string, f runFlags, transform bool, in transformInput, outs []string) error {
	oe, err := parseOnError(v, filterName(jobfile.Filter{Module: module, Name: f.name}), transform)
	if err != nil || oe == nil || oe.DeadLetter == nil {
		return err
	}
	subj := oe.DeadLetter.Subject
	if slices.Contains(outs, subj) {
		return usagef("--on-error dead_letter:%s is also an --output: give the dead letters a subject of their own", subj)
	}
	read := in.subject
	if in.stream != "" {
		read = in.filter
	}
	if err := jobfile.CheckTransformOutput(read, subj); err != nil {
		return usagef("--on-error dead_letter:%s: %v", subj, err)
	}
	return nil
}

// transformOnly are the flags that need --input.
var transformOnly = []string{"output", "start", "checkpoint-interval"}

// transformInput is --input parsed: a subject to find or create a stream
// for, or a stream named with an optional filter.
type transformInput struct {
	subject string // nats:SUBJECT
	stream  string // jetstream:STREAM
	filter  string // jetstream:STREAM:FILTER
}

// checkTransform checks the transform's flags before anything connects.
func checkTransform(cmd *cobra.Command, f runFlags, t transformFlags) (transformInput, []string, error) {
	var in transformInput
	fl := cmd.Flags()
	if t.input == "" {
		for _, name := range transformOnly {
			if fl.Changed(name) {
				return in, nil, usagef("--%s applies only to a transform: deploy MODULE.wasm --input nats:SUBJECT", name)
			}
		}
		return in, nil, nil
	}
	if fl.Changed("source") {
		return in, nil, usagef("--input and --source are two sources; give one")
	}
	if len(t.outputs) > 0 && fl.Changed("sink") {
		return in, nil, usagef("--output and --sink are two kinds of output; give nats outputs or one --sink")
	}
	if f.from != "" && fl.Changed("start") {
		return in, nil, usagef("--start applies to a first start; --from resumes where the savepoint's sources stopped")
	}
	if t.interval <= 0 {
		return in, nil, usagef("--checkpoint-interval must be positive, got %v", t.interval)
	}
	kind, arg, _ := strings.Cut(t.input, ":")
	switch kind {
	case "nats":
		in.subject = arg
		if arg == "" {
			return in, nil, usagef("--input nats:SUBJECT: no subject")
		}
		if err := jobfile.CheckSubject(arg, true); err != nil {
			return in, nil, usagef("--input: %v", err)
		}
	case "jetstream":
		in.stream, in.filter, _ = strings.Cut(arg, ":")
		if in.stream == "" || strings.ContainsAny(in.stream, " \t.*>") {
			return in, nil, usagef("--input jetstream:STREAM[:FILTER]: %q is not a stream name (no spaces, '.', '*' or '>')", in.stream)
		}
		if in.filter != "" {
			if err := jobfile.CheckSubject(in.filter, true); err != nil {
				return in, nil, usagef("--input: %v", err)
			}
		}
	default:
		return in, nil, usagef("--input %q: want nats:SUBJECT or jetstream:STREAM[:FILTER]", t.input)
	}
	var outs []string
	for _, o := range t.outputs {
		subj, ok := strings.CutPrefix(o, "nats:")
		if !ok || subj == "" {
			return in, nil, usagef("--output %q: want nats:SUBJECT", o)
		}
		if err := jobfile.CheckSubject(subj, false); err != nil {
			return in, nil, usagef("--output: %v", err)
		}
		read := in.subject
		if in.stream != "" {
			read = in.filter
		}
		if err := jobfile.CheckTransformOutput(read, subj); err != nil {
			return in, nil, usagef("--output: %v", err)
		}
		outs = append(outs, subj)
	}
	if _, err := jobfile.ParseNATSStart(t.start); err != nil {
		return in, nil, usagef("--start %v", err)
	}
	return in, outs, nil
}

// transformJob finds or creates the streams of a transform, says which on
// stderr, and builds its job: a nats source, the module, a nats sink per
// output (else the --sink), checkpointed into the JetStream object store.
func (c *cli) transformJob(ctx context.Context, cl *cluster.Client, module string, f runFlags, t transformFlags, in transformInput, outs []string) (*jobfile.Job, error) {
	filter, err := c.moduleFilter(module, f)
	if err != nil {
		return nil, err
	}
	oe, err := parseOnError(t.onError, filterName(filter), true)
	if err != nil {
		return nil, err
	}
	js, err := jetstream.New(cl.Conn())
	if err != nil {
		return nil, err
	}
	src := &jobfile.SourceSpec{Type: "nats", Subject: in.subject, Start: t.start}
	if in.stream != "" {
		if _, err := js.Stream(ctx, in.stream); err != nil {
			return nil, fmt.Errorf("--input jetstream:%s: %w", in.stream, err)
		}
		src.Stream, src.Subject = in.stream, in.filter
	}
	// Every stream is checked before one is created: a refused deploy
	// leaves none behind.
	var sinks []*jobfile.SinkSpec
	var notes []string
	for _, check := range []bool{true, false} {
		if in.stream == "" {
			use, err := connector.InputStream(ctx, js, in.subject, check)
			if err != nil {
				return nil, err
			}
			src.Stream = use.Stream
			if !check {
				notes = append(notes, fmt.Sprintf("input %s: stream %s%s", in.subject, use.Stream, createdNote(use.Created, "")))
			}
		}
		for _, subj := range append(slices.Clip(outs), deadLetterSubject(oe)...) {
			use, err := connector.OutputStream(ctx, js, subj, "", check)
			if err != nil {
				return nil, err
			}
			if use.Stream == src.Stream && src.Subject == "" {
				return nil, usagef("--output nats:%s goes to stream %s, which the input reads whole: the transform would read its own output", subj, use.Stream)
			}
			if !check && oe != nil && oe.DeadLetter != nil && subj == oe.DeadLetter.Subject {
				notes = append(notes, fmt.Sprintf("dead letters %s: stream %s%s", subj, use.Stream, createdNote(use.Created, "")))
			} else if !check {
				sinks = append(sinks, &jobfile.SinkSpec{Type: "nats", Subject: subj})
				notes = append(notes, fmt.Sprintf("output %s: stream %s%s", subj, use.Stream,
					createdNote(use.Created, ", atomic publish, commit markers on "+connector.DefaultCommitSubject(subj)+".>")))
			}
		}
	}
	if in.stream != "" {
		notes = append([]string{fmt.Sprintf("input: stream %s%s", in.stream, filterNote(in.filter))}, notes...)
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
	filter.Source, filter.Input, filter.Outputs, filter.OnError = "", src, sinks, oe
	if len(sinks) > 0 {
		filter.Sink = ""
	}
	filter.Checkpoint, filter.Restart = ck, lo.Restart
	return jobfile.FilterJob(filter)
}

// deadLetterSubject is the subject of oe's dead letters, if it has any.
func deadLetterSubject(oe *jobfile.OnError) []string {
	if oe == nil || oe.DeadLetter == nil {
		return nil
	}
	return []string{oe.DeadLetter.Subject}
}

// filterName is the name of the job of f: its --name, else the module's
// file name.
func filterName(f jobfile.Filter) string {
	if f.Name != "" {
		return f.Name
	}
	return strings.TrimSuffix(filepath.Base(f.Module), filepath.Ext(f.Module))
}

func filterNote(filter string) string {
	if filter == "" {
		return ""
	}
	return " (filter " + filter + ")"
}

func createdNote(created bool, what string) string {
	if !created {
		return ""
	}
	return " (created" + what + ")"
}
