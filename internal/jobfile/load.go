package jobfile

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/control"
)

// Job is a loaded, validated job file: the graph to run and the job-wide settings.
type Job struct {
	Path       string              // absolute path of the job file; "" when parsed from bytes
	Graph      *control.JobGraph   // vertices carry *SourceSpec, *SinkSpec or *WasmSpec
	Checkpoint *CheckpointSettings // nil: the job has no checkpoint section
	Restart    RestartSettings
	// MaxRecordBytes is max_record_bytes, the largest record (key and value
	// bytes) the job carries: the file's, else Options.MaxRecordBytes, else
	// abi.DefaultMaxRecordBytes.
	MaxRecordBytes int
	// State is the state section: the keyed-state backend (the file's, else
	// Options', else memory).
	State StateSettings
	// Autoscaler is the autoscaler section (nil: none; off).
	Autoscaler *AutoscalerSettings
}

// StateSettings is the job file's state section.
type StateSettings struct {
	// Backend is StateMemory or StatePebble (the names of host.BackendMemory
	// and host.BackendPebble).
	Backend string `json:"backend,omitempty"`
	// CacheMiB bounds the pebble block cache (state.cache_mib), shared by
	// the job's pebble subtasks on one host; 0 with memory.
	CacheMiB int `json:"cache_mib,omitempty"`
	// Incremental (state.incremental, default true with pebble): the
	// pebble backend's checkpoints are incremental (they upload only the
	// state files that are new since the last one); false: full, like
	// savepoints. Always false with memory.
	Incremental bool `json:"incremental,omitempty"`
}

// Keyed-state backends (state.backend).
const (
	StateMemory = "memory"
	StatePebble = "pebble"
	// DefaultStateCacheMiB is state.cache_mib of a pebble job that sets none.
	DefaultStateCacheMiB = 256
	// MaxStateCacheMiB is the largest state.cache_mib (1 TiB).
	MaxStateCacheMiB = 1 << 20
)

// CheckpointSettings is the job file's checkpoint section.
type CheckpointSettings struct {
	Interval time.Duration // time between checkpoint triggers; required, > 0
	Dir      string        // absolute; default "checkpoints" beside the job file
	Retain   int           // completed checkpoints kept; default 1
	Timeout  time.Duration // a checkpoint not complete after this is aborted; default 10m
	MinPause time.Duration // least time between the end of one checkpoint and the next trigger; default 0
	// TolerableFailures is how many checkpoint failures in a row (declined
	// by a subtask, timed out, not persisted) are tolerated; the next one
	// fails the job over. Default DefaultTolerableFailures; -1: unlimited.
	// Checkpoints aborted for other reasons (a subtask finished between plan
	// and trigger, union state of a partially finished operator, superseded
	// by a stop) do not count.
	TolerableFailures int
	// MaxConcurrent is how many checkpoints may be pending at once; default 1.
	MaxConcurrent int
	// FinalImmediately triggers the final checkpoint as soon as every
	// running subtask reached end of data instead of at the next interval;
	// default true.
	FinalImmediately bool
	// Storage is where checkpoints go: StorageDir (Dir) or StorageJetStream
	// (a JetStream object store: Bucket, the job's name as prefix); ""
	// when the file does not say (a directory, unless the controller's
	// checkpoint.storage says otherwise for deployed jobs).
	Storage string
	// Bucket is the object store bucket of StorageJetStream; "" = the
	// default, STREAMD_CHECKPOINTS.
	Bucket string
	// Mode is ModeAligned or ModeUnaligned (checkpoint.mode); "" means
	// aligned (a spec written before modes existed).
	Mode string `json:",omitempty"`
	// AlignedTimeout (checkpoint.aligned_timeout), with mode aligned: a
	// subtask whose alignment has not completed after this long takes the
	// checkpoint unaligned; 0: never.
	AlignedTimeout time.Duration `json:",omitempty"`
}

// Checkpoint modes (checkpoint.mode).
const (
	ModeAligned   = "aligned"
	ModeUnaligned = "unaligned"
)

// Unaligned reports whether checkpoints start unaligned.
func (c *CheckpointSettings) Unaligned() bool { return c.Mode == ModeUnaligned }

// ModeString is the mode as status shows it: "aligned", "unaligned" or
// "aligned, unaligned after 2s".
func (c *CheckpointSettings) ModeString() string {
	switch {
	case c.Unaligned():
		return ModeUnaligned
	case c.AlignedTimeout > 0:
		return fmt.Sprintf("aligned, unaligned after %v", c.AlignedTimeout)
	}
	return ModeAligned
}

// DefaultTolerableFailures is the default of checkpoint.tolerable_failures.
const DefaultTolerableFailures = 3

// RestartSettings is the job file's restart section. Fields that do not
// belong to Strategy are zero. Control turns it into control's
// RestartConfig, which applies it.
type RestartSettings struct {
	Strategy string // RestartNone, RestartFixedDelay, RestartFailureRate or RestartExponentialDelay; "" means none
	// Attempts is, for fixed-delay, the restarts before the job fails; for
	// exponential-delay, the restarts since the last reset before the job
	// fails (0: unlimited).
	Attempts int
	Delay    time.Duration // fixed-delay and failure-rate: pause before each restart
	// failure-rate: the job fails when more than MaxFailures failures fall
	// within FailureInterval.
	MaxFailures     int           `json:",omitempty"`
	FailureInterval time.Duration `json:",omitempty"`
	// exponential-delay: the first restart waits InitialDelay, each next one
	// Multiplier times longer, at most MaxDelay, each randomized by +-Jitter
	// (a fraction 0..1); after the job ran ResetAfter without failing, the
	// delay and the attempt count start over.
	InitialDelay time.Duration `json:",omitempty"`
	MaxDelay     time.Duration `json:",omitempty"`
	Multiplier   float64       `json:",omitempty"`
	Jitter       float64       `json:",omitempty"`
	ResetAfter   time.Duration `json:",omitempty"`
}

// Restart strategies, spelled as control spells them.
const (
	RestartNone             = string(control.RestartNone)
	RestartFixedDelay       = string(control.RestartFixedDelay)
	RestartFailureRate      = string(control.RestartFailureRate)
	RestartExponentialDelay = string(control.RestartExponentialDelay)
)

// RestartStrategies lists the strategies in the order the docs give them.
var RestartStrategies = []string{RestartNone, RestartFixedDelay, RestartFailureRate, RestartExponentialDelay}

// DefaultRestart returns a strategy with the defaults of its fields (as
// Flink's): fixed-delay 3 attempts, delay 1s; failure-rate 1 failure within
// 1m, delay 1s; exponential-delay 1s initial delay, 1m max, multiplier 1.5,
// jitter 0.1, reset after 1h, unlimited attempts. A job without a restart
// section gets exponential-delay when it has a checkpoint section and none
// otherwise.
func DefaultRestart(strategy string) RestartSettings {
	switch strategy {
	case RestartFixedDelay:
		return RestartSettings{Strategy: strategy, Attempts: 3, Delay: time.Second}
	case RestartFailureRate:
		return RestartSettings{Strategy: strategy, MaxFailures: 1, FailureInterval: time.Minute, Delay: time.Second}
	case RestartExponentialDelay:
		return RestartSettings{Strategy: strategy, InitialDelay: time.Second, MaxDelay: time.Minute,
			Multiplier: 1.5, Jitter: 0.1, ResetAfter: time.Hour}
	}
	return RestartSettings{Strategy: strategy}
}

// Control is the strategy as control applies it, with durations rounded up
// to whole ticks of length tick (which must be positive). The zero
// RestartSettings is none. This is the one place job-file restart settings
// become a control.RestartConfig.
func (r RestartSettings) Control(tick time.Duration) control.RestartConfig {
	if tick <= 0 {
		panic(fmt.Sprintf("jobfile: RestartSettings.Control: tick must be positive, got %v", tick))
	}
	ticks := func(d time.Duration) int64 {
		n := int64(d / tick) // rounded toward zero: up for negative d
		if d%tick > 0 {
			n++
		}
		return n
	}
	kind := control.RestartKind(r.Strategy)
	if kind == "" {
		kind = control.RestartNone
	}
	return control.RestartConfig{
		Kind:                 kind,
		Attempts:             r.Attempts,
		Delay:                ticks(r.Delay),
		MaxFailures:          r.MaxFailures,
		FailureIntervalTicks: ticks(r.FailureInterval),
		InitialDelay:         ticks(r.InitialDelay),
		MaxDelay:             ticks(r.MaxDelay),
		Multiplier:           r.Multiplier,
		Jitter:               r.Jitter,
		ResetTicks:           ticks(r.ResetAfter),
	}
}

// String is the strategy with its parameters, as `streamd validate` prints
// it: "none", "fixed-delay, 3 attempts, delay 1s", "failure-rate, fails
// after more than 1 failure within 1m0s, delay 1s", "exponential-delay,
// initial delay 1s, max delay 1m0s, multiplier 1.5, jitter 0.1, reset after
// 1h0m0s, unlimited attempts".
func (r RestartSettings) String() string {
	switch r.Strategy {
	case "", RestartNone:
		return RestartNone
	case RestartFixedDelay:
		return fmt.Sprintf("%s, %s, delay %v", r.Strategy, countOf(r.Attempts, "attempt"), r.Delay)
	case RestartFailureRate:
		return fmt.Sprintf("%s, fails after more than %s within %v, delay %v", r.Strategy, countOf(r.MaxFailures, "failure"), r.FailureInterval, r.Delay)
	case RestartExponentialDelay:
		attempts := "unlimited attempts"
		if r.Attempts > 0 {
			attempts = countOf(r.Attempts, "attempt") + " between resets"
		}
		return fmt.Sprintf("%s, initial delay %v, max delay %v, multiplier %s, jitter %s, reset after %v, %s", r.Strategy,
			r.InitialDelay, r.MaxDelay, strconv.FormatFloat(r.Multiplier, 'g', -1, 64), strconv.FormatFloat(r.Jitter, 'g', -1, 64), r.ResetAfter, attempts)
	}
	return strconv.Quote(r.Strategy)
}

func countOf(n int, word string) string {
	if n == 1 {
		return "1 " + word
	}
	return fmt.Sprintf("%d %ss", n, word)
}

// Options change how a job file is read.
type Options struct {
	// Filename names the file in error messages. Load sets it to the path it was given.
	Filename string
	// Parallelism, when > 0, replaces the job's default parallelism; operators
	// that set their own parallelism keep it.
	Parallelism int
	// Restart, when set, is the restart strategy of a job file without a
	// restart section (the configuration's restart.* keys) instead of the
	// built-in default.
	Restart *RestartSettings
	// MaxRecordBytes, when > 0, is max_record_bytes of a job file that sets
	// none (the configuration's runtime.max_record_bytes) instead of
	// abi.DefaultMaxRecordBytes.
	MaxRecordBytes int
	// CheckpointMode and AlignedTimeout, when set, are checkpoint.mode and
	// checkpoint.aligned_timeout of a checkpoint section that sets neither
	// (the configuration's keys of the same names).
	CheckpointMode string
	AlignedTimeout time.Duration
	// StateBackend and StateCacheMiB, when set, are state.backend and
	// state.cache_mib of a job file without a state section (the
	// configuration's keys of the same names). Check them with CheckState.
	StateBackend  string
	StateCacheMiB int
	// ModulesNotBuilt skips the checks of the wasm modules the file names
	// (that each exists and starts with the WebAssembly header): streamd
	// build reads the file to learn where to write a module.
	ModulesNotBuilt bool
}

// Load reads, validates and returns the job graph of the job file at path.
func Load(path string) (*control.JobGraph, error) {
	j, err := LoadJob(path, Options{})
	if err != nil {
		return nil, err
	}
	return j.Graph, nil
}

// Parse validates a job file's contents; relative paths in it are resolved
// against baseDir.
func Parse(data []byte, baseDir string) (*control.JobGraph, error) {
	j, err := ParseJob(data, baseDir, Options{})
	if err != nil {
		return nil, err
	}
	return j.Graph, nil
}

// LoadJob reads and validates the job file at path.
func LoadJob(path string, opts Options) (*Job, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("jobfile: %w", err)
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("jobfile: %w", err)
	}
	if opts.Filename == "" {
		opts.Filename = path
	}
	j, err := ParseJob(data, filepath.Dir(abs), opts)
	if err != nil {
		return nil, err
	}
	j.Path = abs
	return j, nil
}

// ParseJob validates a job file's contents; relative paths in it are resolved
// against baseDir. Every problem found is reported in one *Error.
func ParseJob(data []byte, baseDir string, opts Options) (*Job, error) {
	baseDir, err := filepath.Abs(baseDir)
	if err != nil {
		return nil, fmt.Errorf("jobfile: %w", err)
	}
	p := &parser{baseDir: baseDir, err: &Error{File: opts.Filename}, opts: opts}
	job := p.parse(data)
	if len(p.err.Problems) > 0 {
		p.err.sort()
		return nil, p.err
	}
	return job, nil
}

// parser walks the YAML node tree itself, so that every problem is reported
// with its line, unknown fields are errors, and all problems are collected.
type parser struct {
	baseDir string
	opts    Options
	err     *Error
}

func (p *parser) add(op string, line int, field, format string, args ...any) {
	p.err.Problems = append(p.err.Problems, Problem{Operator: op, Line: line, Field: field, Message: fmt.Sprintf(format, args...)})
}

var yamlLineRE = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

var jobFields = []string{"name", "parallelism", "min_parallelism", "max_parallelism", "max_record_bytes", "checkpoint", "restart", "state", "autoscaler", "operators"}

// operator is one parsed operators[] entry.
type operator struct {
	vertex *control.Vertex
	line   int
	lines  map[string]int // field path -> line, for problems found by control
	pinned bool           // sets its own parallelism
}

func (p *parser) parse(data []byte) *Job {
	var doc yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			p.add("", 0, "", "the job file is empty")
			return nil
		}
		msg := err.Error()
		if m := yamlLineRE.FindStringSubmatch(msg); m != nil {
			line, _ := strconv.Atoi(m[1])
			what := m[2]
			// yaml.v3 counts lines from 0 where its parser names the
			// collection it was in (an unclosed '{' or '[': the line it
			// began on; a block mapping or sequence), from 1 elsewhere.
			if strings.HasPrefix(what, "did not find expected") && !strings.HasSuffix(what, "node content") {
				line++
				switch {
				case strings.HasSuffix(what, "'}'"):
					what += " (the '{' on this line is not closed)"
				case strings.HasSuffix(what, "']'"):
					what += " (the '[' on this line is not closed)"
				case strings.HasSuffix(what, "'-' indicator"):
					what += " (in the list that begins on this line: check the indentation of the lines below)"
				}
			}
			p.add("", line, "", "YAML: %s", what)
		} else {
			p.add("", 0, "", "YAML: %s", strings.TrimPrefix(msg, "yaml: "))
		}
		return nil
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err == nil {
		p.add("", extra.Line, "", "more than one YAML document; a job file holds one")
	}
	root := resolve(doc.Content[0])
	if root.Kind != yaml.MappingNode {
		p.add("", root.Line, "", "the job file must be a mapping with name, parallelism and operators")
		return nil
	}
	f := p.fields("", "", root, jobFields)

	job := &Job{Restart: RestartSettings{Strategy: RestartNone}}
	name := ""
	if n := f["name"]; n != nil {
		if name = p.str("", "name", n); name == "" && n.Tag != "!!null" {
			p.add("", n.Line, "name", "empty: name the job")
		}
	} else if p.opts.Filename != "" {
		base := filepath.Base(p.opts.Filename)
		name = strings.TrimSuffix(base, filepath.Ext(base))
	} else {
		p.add("", root.Line, "name", "missing: name the job")
	}

	maxPar := control.DefaultMaxParallelism
	if n := f["max_parallelism"]; n != nil {
		if v, ok := p.int("", "max_parallelism", n); ok {
			if v < 1 || v > control.MaxMaxParallelism {
				p.add("", n.Line, "max_parallelism", "must be between 1 and %d, got %d", control.MaxMaxParallelism, v)
			} else {
				maxPar = v
			}
		}
	}
	par := 1
	if n := f["parallelism"]; n != nil {
		if v, ok := p.int("", "parallelism", n); ok {
			switch {
			case v < 1:
				p.add("", n.Line, "parallelism", "must be at least 1, got %d", v)
			case v > maxPar:
				p.add("", n.Line, "parallelism", "%d is above max_parallelism %d", v, maxPar)
			default:
				par = v
			}
		}
	}
	if o := p.opts.Parallelism; o > 0 {
		if o > maxPar {
			p.add("", 0, "parallelism", "the override %d is above max_parallelism %d", o, maxPar)
		} else {
			par = o
		}
	} else if o < 0 {
		p.add("", 0, "parallelism", "the override must be at least 1, got %d", o)
	}
	minPar := 0 // the operators' default min parallelism; 0: 1
	if n := f["min_parallelism"]; n != nil {
		if v, ok := p.int("", "min_parallelism", n); ok {
			switch {
			case v < 1:
				p.add("", n.Line, "min_parallelism", "must be at least 1, got %d", v)
			case v > par:
				p.add("", n.Line, "min_parallelism", "%d is above the job's parallelism %d", v, par)
			default:
				minPar = v
			}
		}
	}

	job.MaxRecordBytes = abi.DefaultMaxRecordBytes
	if o := p.opts.MaxRecordBytes; o > 0 {
		job.MaxRecordBytes = o
	}
	if n := f["max_record_bytes"]; n != nil {
		if v, ok := p.int64("", "max_record_bytes", n); ok {
			if err := abi.CheckMaxRecordBytes("max_record_bytes", v); err != nil {
				p.add("", n.Line, "max_record_bytes", "must be between 1 and %d (1 GiB), got %d", abi.MaxMaxRecordBytes, v)
			} else {
				job.MaxRecordBytes = int(v)
			}
		}
	}

	if n := f["checkpoint"]; n != nil {
		job.Checkpoint = p.checkpoint(n)
		job.Restart = DefaultRestart(RestartExponentialDelay)
	}
	job.State = p.state(f["state"])
	if n := f["restart"]; n != nil {
		p.restart(n, &job.Restart, f["checkpoint"] != nil)
	} else if r := p.opts.Restart; r != nil {
		job.Restart = *r
	}

	var ops []*operator
	if n := f["operators"]; n == nil {
		p.add("", root.Line, "operators", "missing: a job needs at least one operator")
	} else if n.Kind != yaml.SequenceNode {
		p.add("", n.Line, "operators", "want a list of operators")
	} else if len(n.Content) == 0 {
		p.add("", n.Line, "operators", "empty: a job needs at least one operator")
	} else {
		for i, c := range n.Content {
			if op := p.operator(i, resolve(c), par, minPar, maxPar); op != nil {
				ops = append(ops, op)
			}
		}
	}
	for _, op := range ops {
		if s, ok := op.vertex.Spec.(*SourceSpec); ok && s.Type == "generator" && s.ValueSize > job.MaxRecordBytes {
			p.add(op.vertex.UID, op.lines["source"], "source.value_size", "%d bytes is over the job's max_record_bytes %d: every record would fail the job", s.ValueSize, job.MaxRecordBytes)
		}
	}

	p.checkDeadLetterPaths(ops)
	job.Autoscaler = p.autoscaler(f["autoscaler"], ops, f["checkpoint"] != nil)

	// Duplicate uids are reported here, with both lines; control sees each uid once.
	first := map[string]*operator{}
	var vertices []*control.Vertex
	byUID := map[string]*operator{}
	for _, op := range ops {
		uid := op.vertex.UID
		if prev, dup := first[uid]; dup && uid != "" {
			p.add(uid, op.lines["uid"], "uid", "duplicate uid %q, first used on line %d", uid, prev.lines["uid"])
			continue
		}
		first[uid] = op
		byUID[uid] = op
		vertices = append(vertices, op.vertex)
	}
	if len(ops) == 0 {
		return nil
	}
	p.checkSideOutputs(ops, byUID)
	graphName := name
	if graphName == "" {
		graphName = "job" // the missing name is reported already
	}
	g, err := control.NewJobGraph(graphName, vertices)
	if err != nil {
		var ige *control.InvalidGraphError
		if !errors.As(err, &ige) {
			p.add("", 0, "", "%v", err)
			return nil
		}
		for _, pr := range ige.Problems {
			op := byUID[pr.Operator]
			line := 0
			if op != nil {
				line = op.line
				if l, ok := op.lines[pr.Field]; ok {
					line = l
				} else if base, _, ok := strings.Cut(pr.Field, "."); ok {
					if l, ok := op.lines[base]; ok {
						line = l
					}
				}
			}
			p.add(pr.Operator, line, pr.Field, "%s", pr.Message)
		}
		return nil
	}
	job.Graph = g
	return job
}

var operatorFields = []string{"uid", "parallelism", "min_parallelism", "max_parallelism", "source", "sink", "wasm", "config", "allow_clock", "on_error", "dead_letter", "max_dead_letters", "inputs"}

// wasmOnlyFields are the fields only a wasm operator takes.
var wasmOnlyFields = []string{"config", "allow_clock", "on_error", "dead_letter", "max_dead_letters"}

// operator parses operators[i]; defaultPar, defaultMin and maxPar are the
// job's parallelism, min_parallelism (0: none) and max_parallelism.
func (p *parser) operator(i int, n *yaml.Node, defaultPar, defaultMin, maxPar int) *operator {
	where := fmt.Sprintf("operators[%d]", i)
	if n.Kind != yaml.MappingNode {
		p.add("", n.Line, where, "want a mapping with uid and one of source, sink or wasm")
		return nil
	}
	op := &operator{line: n.Line, lines: map[string]int{}}
	v := &control.Vertex{Parallelism: defaultPar, MaxParallelism: maxPar}
	op.vertex = v

	uidNode := findKey(n, "uid")
	uid := ""
	if uidNode != nil {
		uid = p.str("", where+".uid", uidNode)
		op.lines["uid"] = uidNode.Line
	}
	if uid == "" {
		if uidNode == nil {
			p.add("", n.Line, where+".uid", "missing: every operator needs a stable uid")
		} else {
			p.add("", uidNode.Line, where+".uid", "empty: every operator needs a stable uid")
		}
		uid = "" // control is not told about it; the problem is reported
	}
	v.UID = uid
	label := uid // how problems name the operator
	prefix := ""
	if uid == "" {
		prefix = where + "."
	}
	f := p.fields(label, prefix, n, operatorFields)
	for k, c := range f {
		op.lines[k] = c.Line
	}

	if c := f["max_parallelism"]; c != nil {
		if x, ok := p.int(label, prefix+"max_parallelism", c); ok {
			v.MaxParallelism = x
			if v.Parallelism > x && f["parallelism"] == nil {
				v.Parallelism = x
			}
		}
	}
	if c := f["parallelism"]; c != nil {
		if x, ok := p.int(label, prefix+"parallelism", c); ok {
			v.Parallelism = x
			op.pinned = true
		}
	}
	// The job's min_parallelism holds for the operators that set none, up
	// to their own parallelism (a sink at 1 runs at 1); one an operator sets
	// is checked against its parallelism (control.NewJobGraph).
	if c := f["min_parallelism"]; c != nil {
		if x, ok := p.int(label, prefix+"min_parallelism", c); ok {
			v.MinParallelism = x
			if x < 1 {
				p.add(label, c.Line, prefix+"min_parallelism", "must be at least 1, got %d", x)
				v.MinParallelism = 0
			}
		}
	} else if defaultMin > 0 {
		v.MinParallelism = min(defaultMin, v.Parallelism)
	}

	var kinds []string
	for _, k := range []string{"source", "sink", "wasm"} {
		if f[k] != nil {
			kinds = append(kinds, k)
		}
	}
	switch len(kinds) {
	case 0:
		p.add(label, n.Line, strings.TrimSuffix(prefix, "."), "needs one of source, sink or wasm")
	case 1:
	default:
		p.add(label, f[kinds[1]].Line, prefix+kinds[1], "an operator has exactly one of source, sink or wasm; this one also has %s", kinds[0])
	}
	kind := ""
	if len(kinds) > 0 {
		kind = kinds[0]
	}
	switch kind {
	case "source":
		v.Kind = control.KindSource
		v.Spec = p.source(label, prefix, f["source"])
	case "sink":
		v.Kind = control.KindSink
		v.Spec = p.sink(label, prefix, f["sink"])
	case "wasm":
		v.Kind = control.KindOperator
		ws := &WasmSpec{Config: map[string]string{}}
		ws.Path = p.path(label, prefix+"wasm", f["wasm"])
		if ws.Path != "" && !p.opts.ModulesNotBuilt {
			p.checkModule(label, prefix+"wasm", f["wasm"].Line, ws.Path)
		}
		if c := f["config"]; c != nil {
			ws.Config = p.config(label, prefix+"config", c)
		}
		if c := f["allow_clock"]; c != nil {
			ws.AllowClock = p.bool(label, prefix+"allow_clock", c)
		}
		ws.OnError = p.onError(label, prefix, f)
		v.Spec = ws
	}
	if kind != "wasm" {
		for _, k := range wasmOnlyFields {
			if c := f[k]; c != nil && kind != "" {
				p.add(label, c.Line, prefix+k, "only a wasm operator takes %s", k)
			}
		}
	}

	if c := f["inputs"]; c != nil {
		if c.Kind != yaml.SequenceNode {
			p.add(label, c.Line, prefix+"inputs", "want a list like [{from: lines, partition: hash}]")
		} else {
			for j, in := range c.Content {
				in = resolve(in)
				field := fmt.Sprintf("inputs[%d]", j)
				op.lines[field] = in.Line
				e := control.Edge{}
				switch in.Kind {
				case yaml.ScalarNode: // shorthand: "- lines"
					e.From, e.Output = splitFrom(in.Value)
					op.lines[field+".from"] = in.Line
				case yaml.MappingNode:
					ff := p.fields(label, prefix+field+".", in, []string{"from", "partition"})
					if x := ff["from"]; x != nil {
						e.From, e.Output = splitFrom(p.str(label, prefix+field+".from", x))
						op.lines[field+".from"] = x.Line
					}
					if x := ff["partition"]; x != nil {
						e.Partition = control.Partitioning(p.str(label, prefix+field+".partition", x))
						op.lines[field+".partition"] = x.Line
					}
				default:
					p.add(label, in.Line, prefix+field, "want {from: UID or UID.OUTPUT, partition: forward|rebalance|hash|broadcast}")
					continue
				}
				v.Inputs = append(v.Inputs, e)
			}
		}
	}
	if uid == "" {
		return nil
	}
	return op
}

// checkSideOutputs checks every input from a side output (from: OP.OUTPUT):
// OP is a wasm operator and OUTPUT a valid name. A bad one is reported here
// and left out of the graph (control would report it again).
func (p *parser) checkSideOutputs(ops []*operator, byUID map[string]*operator) {
	for _, op := range ops {
		v := op.vertex
		for j := range v.Inputs {
			e := &v.Inputs[j]
			if e.Output == "" {
				continue
			}
			field := fmt.Sprintf("inputs[%d].from", j)
			line := op.lines[field]
			from := e.From + "." + e.Output
			up := byUID[e.From]
			switch {
			case e.Output == ".":
				p.add(v.UID, line, field, "%q: empty side-output name after the '.' (want OP.OUTPUT)", e.From+".")
			case up == nil || up.vertex.Kind == control.KindSink: // control reports an unknown operator or a sink
			case up.vertex.Kind != control.KindOperator:
				p.add(v.UID, line, field, "%q: %q is a %s; only a wasm operator has side outputs", from, e.From, up.vertex.Kind)
			default:
				if err := abi.CheckOutputName(e.Output); err != nil {
					p.add(v.UID, line, field, "%q: %v", from, err)
				} else {
					continue
				}
			}
			e.Output = "" // reported
		}
	}
}

// splitFrom splits an input's from, "UID" or "UID.OUTPUT" (the side
// output OUTPUT of the wasm operator UID).
func splitFrom(from string) (uid, output string) {
	uid, output, ok := strings.Cut(from, ".")
	if ok && output == "" {
		output = "." // "UID.": reported as an empty output name
	}
	return uid, output
}

// orList is "a, b or c".
func orList(xs []string) string {
	if len(xs) < 2 {
		return strings.Join(xs, "")
	}
	return strings.Join(xs[:len(xs)-1], ", ") + " or " + xs[len(xs)-1]
}

// eventTime reads a source's timestamp and watermark strategy:
// timestamp: {field: NAME}, watermark: {max_out_of_orderness,
// idle_timeout, interval} and watermark_lag (an alias of
// max_out_of_orderness). Lags take a duration or an integer number of
// milliseconds like the timestamps they are subtracted from.
func (p *parser) eventTime(op, prefix string, f map[string]*yaml.Node, s *SourceSpec) {
	lag := func(field string, c *yaml.Node) {
		if d, ok := p.durationOrMillis(op, field, c); ok {
			if d < 0 {
				p.add(op, c.Line, field, "must not be negative, got %v", d)
			}
			s.WatermarkLag = d
		}
	}
	if c := f["watermark_lag"]; c != nil {
		lag(prefix+"watermark_lag", c)
	}
	if c := f["timestamp"]; c != nil {
		if c.Kind != yaml.MappingNode {
			p.add(op, c.Line, prefix+"timestamp", "want a mapping like {field: ts}")
		} else {
			tf := p.fields(op, prefix+"timestamp.", c, []string{"field"})
			if x := tf["field"]; x == nil {
				p.add(op, c.Line, prefix+"timestamp.field", "missing: name the JSON field of the value that holds the event time")
			} else if s.TimestampField = p.str(op, prefix+"timestamp.field", x); s.TimestampField == "" && x.Tag != "!!null" {
				p.add(op, x.Line, prefix+"timestamp.field", "empty: name the JSON field of the value that holds the event time")
			}
		}
	}
	c := f["watermark"]
	if c == nil {
		return
	}
	if c.Kind != yaml.MappingNode {
		p.add(op, c.Line, prefix+"watermark", "want a mapping like {max_out_of_orderness: 2s, idle_timeout: 30s, interval: 200ms}")
		return
	}
	wf := p.fields(op, prefix+"watermark.", c, watermarkFields)
	if x := wf["max_out_of_orderness"]; x != nil {
		if old := f["watermark_lag"]; old != nil {
			p.add(op, x.Line, prefix+"watermark.max_out_of_orderness", "watermark_lag (line %d) is an alias of it: give one of them", old.Line)
		}
		lag(prefix+"watermark.max_out_of_orderness", x)
	}
	p.opDurationAtLeast(op, wf, prefix+"watermark.", "idle_timeout", 0, "must not be negative", &s.IdleTimeout)
	p.opDurationAtLeast(op, wf, prefix+"watermark.", "interval", time.Nanosecond, "must be positive", &s.WatermarkInterval)
}

// NewCheckpointSettings is a checkpoint section with interval, dir and
// the defaults of every other field (mode aligned).
func NewCheckpointSettings(interval time.Duration, dir string) *CheckpointSettings {
	return &CheckpointSettings{Interval: interval, Dir: dir, Retain: 1, Timeout: 10 * time.Minute,
		TolerableFailures: DefaultTolerableFailures, MaxConcurrent: 1, FinalImmediately: true, Mode: ModeAligned}
}

var checkpointFields = []string{"interval", "dir", "retain", "timeout", "min_pause", "tolerable_failures", "max_concurrent", "final_immediately", "storage", "bucket", "mode", "aligned_timeout"}

func (p *parser) checkpoint(n *yaml.Node) *CheckpointSettings {
	const prefix = "checkpoint."
	if n.Kind != yaml.MappingNode {
		p.add("", n.Line, "checkpoint", "want a mapping like {interval: 5s, dir: ./checkpoints}")
		return nil
	}
	f := p.fields("", prefix, n, checkpointFields)
	c := NewCheckpointSettings(0, filepath.Join(p.baseDir, "checkpoints"))
	if x := f["interval"]; x == nil {
		p.add("", n.Line, prefix+"interval", "missing: how often to checkpoint, like 5s")
	} else if d, ok := p.duration("", prefix+"interval", x); ok {
		if d <= 0 {
			p.add("", x.Line, prefix+"interval", "must be positive, got %v", d)
		}
		c.Interval = d
	}
	if x := f["dir"]; x != nil {
		c.Dir = p.path("", prefix+"dir", x)
	}
	p.intAtLeast(f, prefix, "retain", 1, "", &c.Retain)
	p.durationAtLeast(f, prefix, "timeout", time.Nanosecond, "must be positive", &c.Timeout)
	p.durationAtLeast(f, prefix, "min_pause", 0, "must not be negative", &c.MinPause)
	p.intAtLeast(f, prefix, "tolerable_failures", -1, "at least 0 (or -1: unlimited)", &c.TolerableFailures)
	p.intAtLeast(f, prefix, "max_concurrent", 1, "", &c.MaxConcurrent)
	if x := f["final_immediately"]; x != nil {
		c.FinalImmediately = p.bool("", prefix+"final_immediately", x)
	}
	p.checkpointStorage(c, f)
	p.checkpointMode(c, f)
	return c
}

var stateFields = []string{"backend", "cache_mib", "incremental"}

// CheckState checks a state backend and cache size (0: the default), as the
// configuration gives them.
func CheckState(backend string, cacheMiB int) error {
	if backend != StateMemory && backend != StatePebble {
		return fmt.Errorf("state.backend %q: want %s or %s", backend, StateMemory, StatePebble)
	}
	if cacheMiB < 0 || cacheMiB > MaxStateCacheMiB {
		return fmt.Errorf("state.cache_mib must be between 1 and %d, got %d", MaxStateCacheMiB, cacheMiB)
	}
	return nil
}

// state reads the state section (n nil: none; then Options decide).
func (p *parser) state(n *yaml.Node) StateSettings {
	const prefix = "state."
	s := StateSettings{Backend: StateMemory}
	if n == nil {
		if b := p.opts.StateBackend; b != "" {
			s.Backend = b
		}
		if s.Backend == StatePebble {
			s.CacheMiB = cmp.Or(p.opts.StateCacheMiB, DefaultStateCacheMiB)
			s.Incremental = true
		}
		return s
	}
	if n.Kind != yaml.MappingNode {
		p.add("", n.Line, "state", "want a mapping like {backend: pebble, cache_mib: 256}")
		return s
	}
	f := p.fields("", prefix, n, stateFields)
	if x := f["backend"]; x == nil {
		p.add("", n.Line, prefix+"backend", "missing: %s or %s", StateMemory, StatePebble)
	} else if s.Backend = p.str("", prefix+"backend", x); s.Backend != StateMemory && s.Backend != StatePebble {
		p.add("", x.Line, prefix+"backend", "%q: want %s or %s", s.Backend, StateMemory, StatePebble)
	}
	if x := f["cache_mib"]; x != nil {
		if s.Backend != StatePebble {
			p.add("", x.Line, prefix+"cache_mib", "only with backend: %s (the block cache of the LSM; the memory backend has none)", StatePebble)
		} else if v, ok := p.int("", prefix+"cache_mib", x); ok {
			if v < 1 || v > MaxStateCacheMiB {
				p.add("", x.Line, prefix+"cache_mib", "must be between 1 and %d, got %d", MaxStateCacheMiB, v)
			}
			s.CacheMiB = v
		}
	} else if s.Backend == StatePebble {
		s.CacheMiB = DefaultStateCacheMiB
	}
	s.Incremental = s.Backend == StatePebble
	if x := f["incremental"]; x != nil {
		if s.Backend != StatePebble {
			p.add("", x.Line, prefix+"incremental", "only with backend: %s (memory-backend checkpoints are copy-on-write cuts, always full)", StatePebble)
		} else {
			s.Incremental = p.bool("", prefix+"incremental", x)
		}
	}
	return s
}

// checkpointMode reads checkpoint.mode and checkpoint.aligned_timeout; a
// section that sets neither takes the configuration's (Options).
func (p *parser) checkpointMode(c *CheckpointSettings, f map[string]*yaml.Node) {
	const prefix = "checkpoint."
	c.Mode = ModeAligned
	mode, timeout := f["mode"], f["aligned_timeout"]
	if mode == nil && timeout == nil {
		if m := p.opts.CheckpointMode; m != "" {
			c.Mode = m
		}
		c.AlignedTimeout = p.opts.AlignedTimeout
		return
	}
	if mode != nil {
		c.Mode = p.str("", prefix+"mode", mode)
		if c.Mode != ModeAligned && c.Mode != ModeUnaligned {
			p.add("", mode.Line, prefix+"mode", "%q: want aligned or unaligned", c.Mode)
		}
	}
	p.durationAtLeast(f, prefix, "aligned_timeout", 0, "must not be negative", &c.AlignedTimeout)
	if timeout != nil && c.Mode == ModeUnaligned && c.AlignedTimeout > 0 {
		p.add("", timeout.Line, prefix+"aligned_timeout", "only with mode: aligned (it switches a late alignment to unaligned; with mode: unaligned every checkpoint is unaligned from its first barrier)")
	}
}

// intAtLeast sets *dst from field key of f, if present, and reports a value
// below min ("must be <want>, got N"; want defaults to "at least <min>").
func (p *parser) intAtLeast(f map[string]*yaml.Node, prefix, key string, min int, want string, dst *int) {
	x := f[key]
	if x == nil {
		return
	}
	if v, ok := p.int("", prefix+key, x); ok {
		if v < min {
			if want == "" {
				want = fmt.Sprintf("at least %d", min)
			}
			p.add("", x.Line, prefix+key, "must be %s, got %d", want, v)
		}
		*dst = v
	}
}

// durationAtLeast sets *dst from field key of f, if present, and reports a
// value below min with the message must.
func (p *parser) durationAtLeast(f map[string]*yaml.Node, prefix, key string, min time.Duration, must string, dst *time.Duration) {
	p.opDurationAtLeast("", f, prefix, key, min, must, dst)
}

// opDurationAtLeast is durationAtLeast for a field of operator op.
func (p *parser) opDurationAtLeast(op string, f map[string]*yaml.Node, prefix, key string, min time.Duration, must string, dst *time.Duration) {
	x := f[key]
	if x == nil {
		return
	}
	if d, ok := p.duration(op, prefix+key, x); ok {
		if d < min {
			p.add(op, x.Line, prefix+key, "%s, got %v", must, d)
		}
		*dst = d
	}
}

// restartFields are the restart section's fields; restartFieldOf says which
// strategies each field other than strategy belongs to.
var (
	restartFields = []string{"strategy", "attempts", "delay", "max_failures", "failure_interval",
		"initial_delay", "max_delay", "multiplier", "jitter", "reset_after"}
	restartFieldOf = map[string][]string{
		"attempts":         {RestartFixedDelay, RestartExponentialDelay},
		"delay":            {RestartFixedDelay, RestartFailureRate},
		"max_failures":     {RestartFailureRate},
		"failure_interval": {RestartFailureRate},
		"initial_delay":    {RestartExponentialDelay},
		"max_delay":        {RestartExponentialDelay},
		"multiplier":       {RestartExponentialDelay},
		"jitter":           {RestartExponentialDelay},
		"reset_after":      {RestartExponentialDelay},
	}
)

// restart reads the restart section into r, which holds the default
// strategy (checkpoint: whether the job has a checkpoint section, for the
// messages). A strategy given starts from that strategy's defaults.
func (p *parser) restart(n *yaml.Node, r *RestartSettings, checkpoint bool) {
	const prefix = "restart."
	if n.Kind != yaml.MappingNode {
		p.add("", n.Line, "restart", "want a mapping like {strategy: fixed-delay, attempts: 3, delay: 1s}")
		return
	}
	f := p.fields("", prefix, n, restartFields)
	known := true
	if x := f["strategy"]; x != nil {
		s := p.str("", prefix+"strategy", x)
		if contains(RestartStrategies, s) {
			*r = DefaultRestart(s)
		} else {
			known = false
			if x.Kind == yaml.ScalarNode && x.Tag != "!!null" {
				p.add("", x.Line, prefix+"strategy", "unknown strategy %q (want %s)", s, orList(RestartStrategies))
			}
		}
	}
	for _, k := range restartFields[1:] {
		x := f[k]
		if x == nil || !known || contains(restartFieldOf[k], r.Strategy) {
			continue
		}
		msg := "only for strategy " + orList(restartFieldOf[k])
		if f["strategy"] == nil {
			if checkpoint {
				msg += fmt.Sprintf(" (the strategy is %s, the default with a checkpoint section)", r.Strategy)
			} else {
				msg += fmt.Sprintf(" (the strategy is %s, the default without a checkpoint section)", r.Strategy)
			}
		}
		p.add("", x.Line, prefix+k, "%s", msg)
		delete(f, k)
	}
	attempts := "at least 0"
	if r.Strategy == RestartExponentialDelay {
		attempts = "at least 0 (0: unlimited)"
	}
	p.intAtLeast(f, prefix, "attempts", 0, attempts, &r.Attempts)
	p.durationAtLeast(f, prefix, "delay", 0, "must not be negative", &r.Delay)
	p.intAtLeast(f, prefix, "max_failures", 1, "", &r.MaxFailures)
	p.durationAtLeast(f, prefix, "failure_interval", time.Nanosecond, "must be positive", &r.FailureInterval)
	p.durationAtLeast(f, prefix, "initial_delay", 0, "must not be negative", &r.InitialDelay)
	p.durationAtLeast(f, prefix, "max_delay", 0, "must not be negative", &r.MaxDelay)
	p.durationAtLeast(f, prefix, "reset_after", time.Nanosecond, "must be positive", &r.ResetAfter)
	if x := f["multiplier"]; x != nil {
		if v, ok := p.float("", prefix+"multiplier", x); ok {
			if !(v >= 1) || math.IsInf(v, 1) {
				p.add("", x.Line, prefix+"multiplier", "must be at least 1, got %s", x.Value)
			}
			r.Multiplier = v
		}
	}
	if x := f["jitter"]; x != nil {
		if v, ok := p.float("", prefix+"jitter", x); ok {
			if !(v >= 0 && v <= 1) {
				p.add("", x.Line, prefix+"jitter", "must be between 0 and 1 (a fraction of the delay), got %s", x.Value)
			}
			r.Jitter = v
		}
	}
	if r.Strategy == RestartExponentialDelay && r.MaxDelay < r.InitialDelay && r.MaxDelay >= 0 {
		key, line := resolveKey(f, "max_delay", "initial_delay"), n.Line
		if x := f[key]; x != nil {
			line = x.Line
		}
		p.add("", line, prefix+key, "max_delay %v is below initial_delay %v", r.MaxDelay, r.InitialDelay)
	}
}

// resolveKey returns the first of keys present in f.
func resolveKey(f map[string]*yaml.Node, keys ...string) string {
	for _, k := range keys {
		if f[k] != nil {
			return k
		}
	}
	return keys[0]
}

// config flattens a YAML mapping into strings: scalars as written (null as
// ""), lists and mappings as JSON.
func (p *parser) config(op, field string, n *yaml.Node) map[string]string {
	out := map[string]string{}
	if n.Kind != yaml.MappingNode {
		if n.Tag == "!!null" {
			return out
		}
		p.add(op, n.Line, field, "want a mapping of names to values, like {min_length: 3}")
		return out
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := resolve(n.Content[i]), resolve(n.Content[i+1])
		if k.Kind != yaml.ScalarNode {
			p.add(op, k.Line, field, "keys must be strings")
			continue
		}
		name := field + "." + k.Value
		if _, dup := out[k.Value]; dup {
			p.add(op, k.Line, name, "given twice")
			continue
		}
		switch v.Kind {
		case yaml.ScalarNode:
			if v.Tag == "!!null" {
				out[k.Value] = ""
			} else {
				out[k.Value] = v.Value
			}
		default:
			var x any
			if err := v.Decode(&x); err != nil {
				p.add(op, v.Line, name, "%v", err)
				continue
			}
			b, err := json.Marshal(x)
			if err != nil {
				p.add(op, v.Line, name, "cannot be written as JSON: %v", err)
				continue
			}
			out[k.Value] = string(b)
		}
	}
	return out
}

// fields returns the values of mapping n by key, reporting unknown and repeated keys.
func (p *parser) fields(op, prefix string, n *yaml.Node, known []string) map[string]*yaml.Node {
	out := map[string]*yaml.Node{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k := resolve(n.Content[i])
		if k.Kind != yaml.ScalarNode {
			p.add(op, k.Line, strings.TrimSuffix(prefix, "."), "field names must be strings")
			continue
		}
		if !contains(known, k.Value) {
			p.add(op, k.Line, prefix+k.Value, "unknown field%s", suggest(k.Value, known))
			continue
		}
		if _, dup := out[k.Value]; dup {
			p.add(op, k.Line, prefix+k.Value, "given twice")
			continue
		}
		out[k.Value] = resolve(n.Content[i+1])
	}
	return out
}

func findKey(n *yaml.Node, key string) *yaml.Node {
	for i := 0; i+1 < len(n.Content); i += 2 {
		if k := resolve(n.Content[i]); k.Kind == yaml.ScalarNode && k.Value == key {
			return resolve(n.Content[i+1])
		}
	}
	return nil
}

func resolve(n *yaml.Node) *yaml.Node {
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	return n
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func (p *parser) str(op, field string, n *yaml.Node) string {
	if n.Kind != yaml.ScalarNode || n.Tag == "!!null" {
		p.add(op, n.Line, field, "want a string")
		return ""
	}
	return n.Value
}

func (p *parser) int(op, field string, n *yaml.Node) (int, bool) {
	x, ok := p.int64(op, field, n)
	if ok && (x > math.MaxInt32 || x < math.MinInt32) {
		p.add(op, n.Line, field, "%d is out of range", x)
		return 0, false
	}
	return int(x), ok
}

func (p *parser) int64(op, field string, n *yaml.Node) (int64, bool) {
	var x int64
	if n.Kind != yaml.ScalarNode || n.Tag != "!!int" || n.Decode(&x) != nil {
		p.add(op, n.Line, field, "want an integer, got %s", describe(n))
		return 0, false
	}
	return x, true
}

func (p *parser) float(op, field string, n *yaml.Node) (float64, bool) {
	var x float64
	if n.Kind != yaml.ScalarNode || (n.Tag != "!!int" && n.Tag != "!!float") || n.Decode(&x) != nil {
		p.add(op, n.Line, field, "want a number, got %s", describe(n))
		return 0, false
	}
	return x, true
}

func (p *parser) bool(op, field string, n *yaml.Node) bool {
	var x bool
	if n.Kind != yaml.ScalarNode || n.Tag != "!!bool" || n.Decode(&x) != nil {
		p.add(op, n.Line, field, "want true or false, got %s", describe(n))
		return false
	}
	return x
}

// duration accepts Go durations ("500ms", "5s", "1m30s") and the integer 0.
func (p *parser) duration(op, field string, n *yaml.Node) (time.Duration, bool) {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!int" && n.Value == "0" {
		return 0, true
	}
	if d, ok := goDuration(n); ok {
		return d, true
	}
	p.add(op, n.Line, field, "want a duration like 500ms, 5s or 1m, got %s", describe(n))
	return 0, false
}

func goDuration(n *yaml.Node) (time.Duration, bool) {
	if n.Kind != yaml.ScalarNode || n.Tag != "!!str" {
		return 0, false
	}
	d, err := time.ParseDuration(n.Value)
	return d, err == nil
}

// durationOrMillis accepts what duration accepts and an integer, read as
// milliseconds.
func (p *parser) durationOrMillis(op, field string, n *yaml.Node) (time.Duration, bool) {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!int" {
		var ms int64
		if err := n.Decode(&ms); err == nil && ms >= math.MinInt64/int64(time.Millisecond) && ms <= math.MaxInt64/int64(time.Millisecond) {
			return time.Duration(ms) * time.Millisecond, true
		}
		p.add(op, n.Line, field, "milliseconds out of range, got %s", describe(n))
		return 0, false
	}
	if d, ok := goDuration(n); ok {
		return d, true
	}
	p.add(op, n.Line, field, "want a duration like 500ms, 5s or 1m, or an integer number of milliseconds, got %s", describe(n))
	return 0, false
}

func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	}
	return strconv.Quote(n.Value)
}

// path resolves a path against the job file's directory.
func (p *parser) path(op, field string, n *yaml.Node) string {
	s := p.str(op, field, n)
	if s == "" {
		if n.Kind == yaml.ScalarNode && n.Tag != "!!null" {
			p.add(op, n.Line, field, "empty path")
		}
		return ""
	}
	if strings.HasPrefix(s, "~/") {
		if home, err := os.UserHomeDir(); err == nil {
			s = filepath.Join(home, s[2:])
		}
	}
	if !filepath.IsAbs(s) {
		s = filepath.Join(p.baseDir, s)
	}
	return filepath.Clean(s)
}

func (p *parser) checkReadableFile(op, field string, line int, path, what string) bool {
	f, err := os.Open(path)
	if err != nil {
		p.add(op, line, field, "cannot read %s %s: %v", what, path, unwrapPathError(err))
		return false
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		p.add(op, line, field, "cannot read %s %s: %v", what, path, unwrapPathError(err))
		return false
	}
	if fi.IsDir() {
		p.add(op, line, field, "%s %s is a directory", what, path)
		return false
	}
	return true
}

// checkModule checks that the module file exists, is readable and starts with
// the WebAssembly magic number. The host checks the rest before the job starts.
func (p *parser) checkModule(op, field string, line int, path string) {
	if !p.checkReadableFile(op, field, line, path, "module") {
		return
	}
	f, err := os.Open(path)
	if err != nil {
		p.add(op, line, field, "cannot read module %s: %v", path, unwrapPathError(err))
		return
	}
	defer f.Close()
	var magic [4]byte
	if _, err := io.ReadFull(f, magic[:]); err != nil || magic != [4]byte{0, 'a', 's', 'm'} {
		p.add(op, line, field, "%s is not a WebAssembly module (no \\0asm header)", path)
	}
}

func unwrapPathError(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}
