package jobfile

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/internal/connector"
)

// Filter describes a job without a job file: one wasm operator between a
// source and a sink, as `streamd run MODULE.wasm` runs it.
type Filter struct {
	Module      string            // path of the .wasm module (relative to the current directory)
	Source      string            // "stdin" (default) | "file:PATH" | "generator:COUNT"
	Sink        string            // "stdout" (default) | "file:DIR" | "discard"
	Parallelism int               // of the operator (and of generator sources and file/discard sinks); default 1
	Config      map[string]string // the operator's config
	AllowClock  bool
	// MaxRecordBytes is the job's max_record_bytes; 0 means abi.DefaultMaxRecordBytes.
	MaxRecordBytes int

	// A transform (streamd deploy MODULE.wasm --input): Input replaces
	// Source and Outputs replace Sink, as the connector schemes made them
	// (connector.Scheme; their types' TransformInput and TransformOutput
	// check them); the source, the operator and the sinks all run with
	// Parallelism.
	Input   *SourceSpec
	Outputs []*SinkSpec
	// Name names the job; default the operator's uid.
	Name string
	// Checkpoint, when set, is the job's checkpoint section; the job then
	// restarts as a job file with one does (Restart, else exponential-delay).
	Checkpoint *CheckpointSettings
	Restart    *RestartSettings
	// OnError is the operator's on_error (nil: fail); a dead-letter sink
	// runs at the operator's parallelism.
	OnError *OnError
}

// Uids of the vertices of a filter job; the operator's uid is derived from
// the module's file name. The sink of a transform's output subject S is
// FilterSinkUID-S (with every character but letters, digits, '-' and '_' as
// '_'), so a savepoint restores each output whatever their order.
const (
	FilterSourceUID = "source"
	FilterSinkUID   = "sink"
)

// transformKind stands for Input or Outputs in FilterJob's switches (no
// --source or --sink can spell it).
const transformKind = "\x00transform"

var notUIDChar = regexp.MustCompile(`[^A-Za-z0-9_-]+`)

// FilterJob builds and validates the three-vertex job of f. Standard input
// and a file are read by one source subtask and standard output is written by
// one sink subtask; edges between different parallelisms rebalance.
func FilterJob(f Filter) (*Job, error) {
	maxRec := f.MaxRecordBytes
	if maxRec == 0 {
		maxRec = abi.DefaultMaxRecordBytes
	} else if err := abi.CheckMaxRecordBytes("max_record_bytes", int64(maxRec)); err != nil {
		return nil, fmt.Errorf("jobfile: %w", err)
	}
	fail := func(field, format string, args ...any) (*Job, error) {
		return nil, &Error{Problems: []Problem{{Field: field, Message: fmt.Sprintf(format, args...)}}}
	}
	par := f.Parallelism
	if par == 0 {
		par = 1
	}
	if par < 1 || par > control.DefaultMaxParallelism {
		return fail("--parallelism", "must be between 1 and %d, got %d", control.DefaultMaxParallelism, par)
	}
	module, err := filepath.Abs(f.Module)
	if err != nil {
		return nil, fmt.Errorf("jobfile: %w", err)
	}
	p := &parser{err: &Error{}}
	p.checkModule("", "module", 0, module)
	if len(p.err.Problems) > 0 {
		return nil, p.err
	}

	src := &SourceSpec{Type: "file", Path: "-"}
	srcPar := 1
	kind, arg, _ := strings.Cut(f.Source, ":")
	if f.Input != nil {
		kind = transformKind
	}
	switch kind {
	case transformKind:
		if f.Source != "" {
			return fail("--input", "a transform reads its input; --source %q is a second source", f.Source)
		}
		in, err := connector.TransformInput(f.Input)
		if err != nil {
			return transformError(err)
		}
		src, srcPar = in, par
	case "nats":
		return fail("--source", "%q: a module reads NATS as a transform: streamd deploy MODULE.wasm --input nats:SUBJECT (or jetstream:STREAM[:FILTER])", f.Source)
	case "", "stdin":
		if arg != "" {
			return fail("--source", "stdin takes no argument, got %q", f.Source)
		}
	case "file":
		if arg == "" {
			return fail("--source", "file needs a path: file:PATH")
		}
		path, err := filepath.Abs(arg)
		if err != nil {
			return nil, fmt.Errorf("jobfile: %w", err)
		}
		if !p.checkReadableFile("", "--source", 0, path, "input file") {
			return nil, p.err
		}
		src.Path = path
	case "generator":
		n, err := strconv.ParseInt(arg, 10, 64)
		if err != nil || n < 1 {
			return fail("--source", "generator needs a record count: generator:COUNT, got %q", f.Source)
		}
		src = &SourceSpec{Type: "generator", Count: n, KeyPattern: "key-{k}", ValuePattern: "value-{n}", Keys: 100, TSStep: 1}
		srcPar = par
	default:
		return fail("--source", "unknown source %q (want stdin, file:PATH or generator:COUNT)", f.Source)
	}

	sink := &SinkSpec{Type: "stdout", Format: "value"}
	sinkPar := 1
	kind, arg, _ = strings.Cut(f.Sink, ":")
	if len(f.Outputs) > 0 {
		kind = transformKind
	}
	switch kind {
	case transformKind:
		if f.Sink != "" {
			return fail("--output", "--sink %q is a second kind of output; give transform outputs or one --sink", f.Sink)
		}
	case "nats":
		return fail("--sink", "%q: a module writes to NATS as a transform: streamd deploy MODULE.wasm --input ... --output nats:SUBJECT", f.Sink)
	case "", "stdout":
		if arg != "" {
			return fail("--sink", "stdout takes no argument, got %q", f.Sink)
		}
	case "file":
		if arg == "" {
			return fail("--sink", "file needs a directory: file:DIR")
		}
		dir, err := filepath.Abs(arg)
		if err != nil {
			return nil, fmt.Errorf("jobfile: %w", err)
		}
		if fi, err := os.Stat(dir); err == nil && !fi.IsDir() {
			return fail("--sink", "%s is a file; a file sink writes into a directory", dir)
		}
		sink = &SinkSpec{Type: "file", Path: dir, Format: "value"}
		sinkPar = par
	case "discard":
		if arg != "" {
			return fail("--sink", "discard takes no argument, got %q", f.Sink)
		}
		sink = &SinkSpec{Type: "discard", Format: "value"}
		sinkPar = par
	default:
		return fail("--sink", "unknown sink %q (want stdout, file:DIR or discard)", f.Sink)
	}

	opUID := notUIDChar.ReplaceAllString(strings.TrimSuffix(filepath.Base(module), filepath.Ext(module)), "_")
	if opUID == "" || opUID == FilterSourceUID || opUID == FilterSinkUID || len(opUID) > control.MaxUIDLength {
		opUID = "operator"
	}
	cfg := map[string]string{}
	for k, v := range f.Config {
		cfg[k] = v
	}
	edge := func(from string, fromPar, toPar int) control.Edge {
		if fromPar == toPar {
			return control.Edge{From: from, Partition: control.Forward}
		}
		return control.Edge{From: from, Partition: control.Rebalance}
	}
	in := edge(FilterSourceUID, srcPar, par)
	if f.Input != nil {
		// A transform's module may keep keyed state: its subtasks get the
		// records by key (the message's key; its value when it has none),
		// as keyed state needs, at any parallelism.
		in = control.Edge{From: FilterSourceUID, Partition: control.Hash}
	}
	vertices := []*control.Vertex{
		{UID: FilterSourceUID, Kind: control.KindSource, Parallelism: srcPar, Spec: src},
		{UID: opUID, Kind: control.KindOperator, Parallelism: par, Spec: &WasmSpec{Path: module, Config: cfg, AllowClock: f.AllowClock, OnError: f.OnError},
			Inputs: []control.Edge{in}},
	}
	if len(f.Outputs) == 0 {
		vertices = append(vertices, &control.Vertex{UID: FilterSinkUID, Kind: control.KindSink, Parallelism: sinkPar, Spec: sink,
			Inputs: []control.Edge{edge(opUID, par, sinkPar)}})
	}
	seen := map[string]bool{}
	for _, o := range f.Outputs {
		name, err := connector.TransformOutput(f.Input, o)
		if err != nil {
			return transformError(err)
		}
		if seen[name] {
			return fail("--output", "%s given twice", name)
		}
		seen[name] = true
		_, arg, _ := strings.Cut(name, ":")
		uid := FilterSinkUID + "-" + notUIDChar.ReplaceAllString(arg, "_")
		if len(uid) > control.MaxUIDLength {
			return fail("--output", "%s: the name is too long to name the sink (%s is over %d characters)", name, uid, control.MaxUIDLength)
		}
		c := *o
		vertices = append(vertices, &control.Vertex{UID: uid, Kind: control.KindSink, Parallelism: par, Spec: &c,
			Inputs: []control.Edge{{From: opUID, Partition: control.Forward}}})
	}
	if oe := f.OnError; oe != nil && oe.DeadLetter != nil {
		name, err := connector.TransformOutput(f.Input, oe.DeadLetter)
		if err != nil {
			return fail("--on-error", "dead letters: %v", err)
		}
		if seen[name] {
			return fail("--on-error", "dead letters to %s, which is also an --output: give the dead letters their own", name)
		}
	}
	name := f.Name
	if name == "" {
		name = opUID
	}
	g, err := control.NewJobGraph(name, vertices)
	if err != nil {
		return nil, fmt.Errorf("jobfile: %w", err)
	}
	job := &Job{Graph: g, Restart: RestartSettings{Strategy: RestartNone}, MaxRecordBytes: maxRec, Checkpoint: f.Checkpoint}
	if f.Checkpoint != nil {
		job.Restart = DefaultRestart(RestartExponentialDelay)
		if f.Restart != nil {
			job.Restart = *f.Restart
		}
	}
	return job, nil
}

// transformError is the error of FilterJob for a transform's input or
// output its connector refused (a *connector.FlagError names the flag).
func transformError(err error) (*Job, error) {
	var fe *connector.FlagError
	if errors.As(err, &fe) {
		return nil, &Error{Problems: []Problem{{Field: fe.Flag, Message: fe.Message}}}
	}
	return nil, fmt.Errorf("jobfile: %w", err)
}
